"""What walking every table costs `megnode check`: the graph walk alone against the full check.

Not part of CI (`make bench` runs it). One authorized topic of N published
events (MEGNODE_CHECK_BENCH_EVENTS, default 20,000: every event has a state
record, an order position and a confirmed position) in a real LMDB store;
the check runs with the walks of node.check.tables switched off (the graph
walk: what the check did before they existed) and on, side by side in one
run, CPU time best of RUNS. Figures go to bench-results/check.json.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import node.check
from node.check import check_data_dir
from storage.lmdb_store import LmdbStore
from tests.helpers import authorized_topic

EVENTS = int(os.environ.get("MEGNODE_CHECK_BENCH_EVENTS", "20000"))
COMMIT_EVERY = 1_000
RUNS = 5


def _build(store_dir: Path) -> None:
    rng = random.Random(1)
    with LmdbStore(store_dir) as store:
        replica = authorized_topic(store)
        for i in range(EVENTS):
            replica.publish(b"m%d" % i, 2_000 + i, rng)
            if i % COMMIT_EVERY == COMMIT_EVERY - 1:
                replica.commit()
        replica.commit()


def _cpu_s(store_dir: Path) -> float:
    runs = []
    for _ in range(RUNS):
        start = time.process_time()
        report = check_data_dir(store_dir)
        runs.append(time.process_time() - start)
        assert report.ok
    return min(runs)


def test_check_cost_of_every_table(tmp_path: Path, monkeypatch, record_figures) -> None:
    store_dir = tmp_path / "store"
    _build(store_dir)
    full = _cpu_s(store_dir)
    monkeypatch.setattr(node.check, "walk_tables", lambda *args: None)
    graph_only = _cpu_s(store_dir)
    record_figures("check", {
        "events": EVENTS + 4,  # the create event and the bootstrap state events
        "graph_walk_cpu_s": round(graph_only, 3),
        "full_check_cpu_s": round(full, 3),
        "full_over_graph_walk": round(full / graph_only, 3),
        "full_us_per_event": round(full / EVENTS * 1e6, 1),
    })
