"""Anonymous memory against stored events (issue 17, "flat memory"); `make bench`.

One topic in a real LmdbStore (temp dir, fsync on) takes N events through
the path a node's committer drives: `Replica.publish` (auth rules, parents,
signing, graph add, state tracker, total order), `maybe_ack` and one group
commit per BATCH events. At each checkpoint it reads RssAnon from
/proc/self/status: the process's anonymous memory, which is what grows if the
node keeps per-event structures (the memory-mapped store's pages are the
kernel's page cache and are not counted).

Sizes are a parameter: MEGNODE_MEMORY_BENCH_SIZES="10000,100000,1000000"
(the default stops at 300k, about a minute on the 2-core test machine, and
the growth per stored event is extrapolated to 1M). Figures go to
bench-results/memory.json: RssAnon at each size, the growth per stored event
between the two largest sizes, and the 100k -> 1M growth (measured when 1M
ran, else extrapolated from that per-event figure).

What it asserts: the issue's bound, the growth from 100k to 1M under 50 MB
(measured when 1M ran, else the growth per event between the two largest
sizes times 900k), also reported as `target_met`. docs/graph.md ("Memory")
says what per-event memory remains and where.
"""

from __future__ import annotations

import gc
import os
import random
import time
from pathlib import Path

from node.core.identity import Identity
from node.replica.replica import Replica, ReplicaConfig
from node.state.types import RULE_PUBLIC
from storage.lmdb_store import LmdbStore

DEFAULT_SIZES = (10_000, 100_000, 300_000)
BATCH = 1_024  # events per group commit, as the committer's step
PAYLOAD = b"r" * 100  # a small reading
TARGET_GROWTH_BYTES = 50 * 2**20  # issue 17: from 100k to 1M stored events
TARGET_FROM, TARGET_TO = 100_000, 1_000_000


def sizes() -> tuple[int, ...]:
    raw = os.environ.get("MEGNODE_MEMORY_BENCH_SIZES")
    if not raw:
        return DEFAULT_SIZES
    return tuple(sorted({int(part) for part in raw.split(",") if part.strip()}))


def rss_anon_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def publish_and_measure(data_dir: Path, checkpoints: tuple[int, ...]) -> dict[int, dict]:
    store = LmdbStore(data_dir)
    now = 1_700_000_000_000
    replica = Replica.create_topic(store, Identity.generate(), now, name="readings",
                                   config=ReplicaConfig(), authorization=True,
                                   join_rule=RULE_PUBLIC, members_write=True)
    rng = random.Random(17)
    figures: dict[int, dict] = {}
    started = time.perf_counter()
    published = 0
    for target in checkpoints:
        while published < target:
            now += 1
            replica.publish(PAYLOAD, now, rng)
            published += 1
            if published % BATCH == 0:
                replica.maybe_ack(now, rng)
                replica.commit()
        replica.commit()
        gc.collect()
        figures[target] = {
            "rss_anon_mb": round(rss_anon_bytes() / 2**20, 1),
            "stored_events": replica.graph.delivered_count,
            "seconds": round(time.perf_counter() - started, 1),
        }
        print(f"{target:>9,} events: RssAnon {figures[target]['rss_anon_mb']} MB "
              f"({figures[target]['seconds']} s)", flush=True)
    store.close()
    return figures


def test_anonymous_memory_by_stored_events(tmp_path, record_figures):
    checkpoints = sizes()
    assert len(checkpoints) >= 2, "the growth needs two sizes"
    baseline = rss_anon_bytes()
    figures = publish_and_measure(tmp_path / "store", checkpoints)
    low, high = checkpoints[-2], checkpoints[-1]
    grown = (figures[high]["rss_anon_mb"] - figures[low]["rss_anon_mb"]) * 2**20
    per_event = grown / (figures[high]["stored_events"] - figures[low]["stored_events"])
    if TARGET_FROM in figures and TARGET_TO in figures:
        target_growth = (figures[TARGET_TO]["rss_anon_mb"]
                         - figures[TARGET_FROM]["rss_anon_mb"]) * 2**20
        measured = True
    else:
        target_growth = per_event * (TARGET_TO - TARGET_FROM)
        measured = False
    report = {
        "benchmark": "RssAnon by stored events, one topic, publish path, LMDB",
        "batch": BATCH,
        "payload_bytes": len(PAYLOAD),
        "rss_anon_before_mb": round(baseline / 2**20, 1),
        "by_size": {str(size): values for size, values in figures.items()},
        "growth_bytes_per_event": round(per_event, 1),
        "growth_between": [low, high],
        "growth_100k_to_1m_mb": round(target_growth / 2**20, 1),
        "growth_100k_to_1m_measured": measured,
        "target_growth_mb": TARGET_GROWTH_BYTES // 2**20,
        "target_met": target_growth < TARGET_GROWTH_BYTES,
        "target_bytes_per_event": round(TARGET_GROWTH_BYTES / (TARGET_TO - TARGET_FROM), 1),
    }
    record_figures("memory", report)
    assert report["target_met"], report
