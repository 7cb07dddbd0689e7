"""Benchmark "Spark vs pandas": the dissemination job on generated logs, side by side.

What: generate dissemination logs in the real format (JSON lines, one file per
node, 20 nodes, 64-hex ids) of MEGNODE_SPARK_BENCH_RECORDS records (default
10 million) and of 1/100 and 1/10 of that; on each, run the dissemination
analysis in Spark local mode and the same computation in pandas, and report
rows/s for both and their ratio. Figures go to bench-results/spark.json;
`make bench` runs it, CI does not.

Two timings per engine:
- end to end: read the JSON lines and compute (Spark also validates every line
  against the schema; the pandas side trusts the generated data), which is
  what a user waits for;
- compute only: the data already in memory (Spark: the loader's cache; pandas:
  the DataFrame).

"The same computation": latency per (event, node) from `created` to the first
`delivered`; count/mean/p50/p90/p99/max overall, per channel and per node;
duplicates per delivery; (event, member) pairs never delivered; the coverage
curve. Both sides must agree on the numbers, or the comparison means nothing.

Why: Spark pays a fixed cost per query (planning, task launch, JVM) and wins
on volume and cores; pandas is single-threaded with nothing to start. The ratio
at three sizes shows where Spark starts to pay off on this machine.

Env: MEGNODE_SPARK_BENCH_RECORDS (largest size), MEGNODE_SPARK_BENCH_MEMORY
(Spark driver memory, default 6g), MEGNODE_SPARK_BENCH_MASTER (default local[*]).
"""

from __future__ import annotations

import glob
import hashlib
import math
import os
import platform
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.spark

RECORDS = int(os.environ.get("MEGNODE_SPARK_BENCH_RECORDS", "10000000"))
SIZE_DIVISORS = (100, 10, 1)
MIN_RECORDS = 10_000
DRIVER_MEMORY = os.environ.get("MEGNODE_SPARK_BENCH_MEMORY", "6g")
MASTER = os.environ.get("MEGNODE_SPARK_BENCH_MASTER", "local[*]")
SEED = 20240602
PANDAS_CHUNK_LINES = 1_000_000  # read_json chunk: bounds pandas' peak memory

# The generated world: what a 20-node topic under light loss looks like.
NODES = 20
TOPICS = 2
EVENT_INTERVAL_MS = 5
GOSSIP_FRACTION = 0.9  # the rest arrives by anti-entropy sync
GOSSIP_MEDIAN_MS = 20
SYNC_MIN_MS, SYNC_MAX_MS = 500, 3_000
DUPLICATE_FRACTION = 0.3
LOSS_FRACTION = 0.001  # (event, node) pairs never delivered
WIDTH_INTERVAL_MS = 1_000
RECORDS_PER_EVENT = 1 + (NODES - 1) * (1 - LOSS_FRACTION) * (2 + DUPLICATE_FRACTION) + (
    NODES * EVENT_INTERVAL_MS / WIDTH_INTERVAL_MS
)


def _hex_id(label: str) -> str:
    return hashlib.blake2b(label.encode(), digest_size=32).hexdigest()


def _write(frame: pd.DataFrame, path: Path) -> None:
    text = frame.to_json(orient="records", lines=True)
    with open(path, "a", encoding="ascii") as out:
        out.write(text if text.endswith("\n") else text + "\n")  # pandas versions differ here


def generate_log_set(directory: Path, target_records: int, seed: int) -> int:
    """Write about `target_records` records (one file per node); returns the exact count."""
    rng = np.random.default_rng(seed)
    events = max(1, round(target_records / RECORDS_PER_EVENT))
    nodes = np.array([_hex_id(f"node{i}") for i in range(NODES)], dtype=object)
    topics = np.array([_hex_id(f"topic{i}") for i in range(TOPICS)], dtype=object)
    event_ids = np.array([_hex_id(f"event{i}") for i in range(events)], dtype=object)
    author = rng.integers(0, NODES, events)
    topic = rng.integers(0, TOPICS, events)
    created = np.arange(events) * EVENT_INTERVAL_MS + rng.integers(0, EVENT_INTERVAL_MS, events)

    # Every (event, node) pair except the author's own and the lost ones.
    pair_event = np.repeat(np.arange(events), NODES)
    pair_node = np.tile(np.arange(NODES), events)
    keep = (pair_node != author[pair_event]) & (rng.random(pair_event.size) >= LOSS_FRACTION)
    pair_event, pair_node = pair_event[keep], pair_node[keep]
    gossip = rng.random(pair_event.size) < GOSSIP_FRACTION
    latency = np.where(
        gossip,
        np.rint(rng.lognormal(math.log(GOSSIP_MEDIAN_MS), 0.6, pair_event.size)).astype(np.int64) + 1,
        rng.integers(SYNC_MIN_MS, SYNC_MAX_MS, pair_event.size),
    )
    channel = np.where(gossip, "gossip", "sync").astype(object)
    delivered = created[pair_event] + latency
    dup = rng.random(pair_event.size) < DUPLICATE_FRACTION

    written = 0
    duration = int(created.max()) + SYNC_MAX_MS
    for n in range(NODES):
        path = directory / f"{nodes[n]}.000000.jsonl"
        own = np.flatnonzero(author == n)
        frames = [
            pd.DataFrame({"v": 1, "ts_ms": created[own], "node": nodes[n], "topic": topics[topic[own]],
                          "type": "created", "event": event_ids[own], "author": nodes[n], "kind": "message"}),
        ]
        mine = np.flatnonzero(pair_node == n)
        for record_type in ("received", "delivered"):
            frames.append(pd.DataFrame({
                "v": 1, "ts_ms": delivered[mine], "node": nodes[n], "topic": topics[topic[pair_event[mine]]],
                "type": record_type, "event": event_ids[pair_event[mine]], "channel": channel[mine],
            }))
        dups = mine[dup[mine]]
        frames.append(pd.DataFrame({
            "v": 1, "ts_ms": delivered[dups] + rng.integers(1, 200, dups.size), "node": nodes[n],
            "topic": topics[topic[pair_event[dups]]], "type": "duplicate", "event": event_ids[pair_event[dups]],
            "channel": np.where(rng.random(dups.size) < 0.5, "gossip", "sync").astype(object),
        }))
        samples = np.arange(n, duration, WIDTH_INTERVAL_MS)  # offset by n: nodes do not tick in step
        frames.append(pd.DataFrame({
            "v": 1, "ts_ms": samples, "node": nodes[n], "topic": topics[np.arange(samples.size) % TOPICS],
            "type": "width", "width": NODES + rng.poisson(3, samples.size), "buffered": 0,
        }))
        for frame in frames:
            if len(frame):
                _write(frame, path)
                written += len(frame)
    return written


# --------------------------------------------------------------------------- the computation, twice


@dataclass(frozen=True)
class Numbers:
    """What the dissemination job answers; both engines must give the same."""

    deliveries: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    channel_p99_ms: tuple[tuple[str, float], ...]
    node_p99_ms_sum: float  # all 20 nodes' p99, summed: one number that moves if any differs
    duplicates: int
    never_delivered: int
    final_coverage: float
    coverage_steps: int


def spark_numbers(records: Any) -> Numbers:
    from analytics.jobs import coverage, dissemination, events

    records = events.basis(records)  # shared building blocks once, as the pandas side does
    latencies = dissemination.latencies(records).cache()
    overall = dissemination.overall_latency(latencies)
    channels = dissemination.latency_summary(latencies, ("channel",)).collect()
    nodes = dissemination.latency_summary(latencies, ("node",)).collect()
    totals = dissemination.duplicate_totals(dissemination.duplicates_per_event(records))
    missing = dissemination.never_delivered(records).count()
    curve = coverage.coverage_curve(records).collect()
    latencies.unpersist()
    records.release()
    return Numbers(
        deliveries=overall.count, mean_ms=overall.mean, p50_ms=overall.p50, p90_ms=overall.p90,
        p99_ms=overall.p99, max_ms=overall.max,
        channel_p99_ms=tuple((r["channel"], r["p99_ms"]) for r in channels),
        node_p99_ms_sum=sum(r["p99_ms"] for r in nodes),
        duplicates=totals.duplicates, never_delivered=missing,
        final_coverage=curve[-1]["coverage"], coverage_steps=len(curve),
    )


def pandas_load(directory: Path) -> pd.DataFrame:
    """All records, the columns the job needs; strings as categories per chunk (memory)."""
    columns = ["ts_ms", "node", "topic", "type", "event", "channel"]
    chunks = []
    for path in sorted(glob.glob(str(directory / "*.jsonl"))):
        reader = pd.read_json(path, lines=True, dtype=False, convert_dates=False, chunksize=PANDAS_CHUNK_LINES)
        for chunk in reader:
            chunk = chunk.reindex(columns=columns)
            for name in columns[1:]:
                chunk[name] = chunk[name].astype("category")
            chunks.append(chunk)
    frame = pd.concat(chunks, ignore_index=True)
    for name in columns[1:]:  # categories differ per chunk; make them plain strings again
        frame[name] = frame[name].astype(object)
    return frame


def pandas_numbers(df: pd.DataFrame) -> Numbers:
    created = df[df["type"] == "created"].sort_values(["ts_ms", "node"])
    origins = created.drop_duplicates(["topic", "event"])[["topic", "event", "node", "ts_ms"]].rename(
        columns={"node": "origin_node", "ts_ms": "created_ms"}
    )
    delivered = df[df["type"] == "delivered"].sort_values(["ts_ms", "channel"])
    first = delivered.drop_duplicates(["topic", "event", "node"])[["topic", "event", "node", "ts_ms", "channel"]]
    lat = first.merge(origins, on=["topic", "event"])
    lat = lat[lat["node"] != lat["origin_node"]]
    lat = lat.assign(latency_ms=lat["ts_ms"] - lat["created_ms"])
    values = lat["latency_ms"]
    quantiles = values.quantile([0.5, 0.9, 0.99])
    by_channel = lat.groupby("channel")["latency_ms"].quantile(0.99)
    by_node = lat.groupby("node")["latency_ms"].quantile(0.99)

    members = df[df["topic"].notna()][["topic", "node"]].drop_duplicates()
    known = pd.concat([origins[["topic", "event"]], first[["topic", "event"]]]).drop_duplicates()
    known = known.merge(origins[["topic", "event", "origin_node"]], on=["topic", "event"], how="left")
    known_deliveries = first.merge(known, on=["topic", "event"])
    remote = known_deliveries[
        known_deliveries["origin_node"].isna() | (known_deliveries["node"] != known_deliveries["origin_node"])
    ]
    dup_events = df[df["type"] == "duplicate"][["topic", "event"]]
    duplicates = len(dup_events.merge(known[["topic", "event"]], on=["topic", "event"]))
    expected = known.merge(members, on="topic")
    expected = expected[expected["origin_node"].isna() | (expected["node"] != expected["origin_node"])]
    missing = len(expected) - len(expected.merge(remote[["topic", "event", "node"]], on=["topic", "event", "node"]))

    sizes = members.groupby("topic").size().rename("members").reset_index()
    held = pd.concat([
        origins.rename(columns={"origin_node": "node"}).assign(offset_ms=0)[["topic", "event", "node", "offset_ms"]],
        lat[["topic", "event", "node", "latency_ms"]].rename(columns={"latency_ms": "offset_ms"}),
    ]).merge(members, on=["topic", "node"]).merge(sizes, on="topic")
    held["w"] = 1.0 / (held["members"] * len(origins))
    curve = held.groupby("offset_ms")["w"].sum().cumsum()
    return Numbers(
        deliveries=int(values.size), mean_ms=float(values.mean()), p50_ms=float(quantiles[0.5]),
        p90_ms=float(quantiles[0.9]), p99_ms=float(quantiles[0.99]), max_ms=float(values.max()),
        channel_p99_ms=tuple((str(c), float(v)) for c, v in by_channel.sort_index().items()),
        node_p99_ms_sum=float(by_node.sum()), duplicates=duplicates, never_delivered=int(missing),
        final_coverage=float(curve.iloc[-1]), coverage_steps=int(curve.size),
    )


def _assert_same(spark_side: Numbers, pandas_side: Numbers) -> None:
    for name, value in asdict(spark_side).items():
        other = getattr(pandas_side, name)
        if isinstance(value, tuple):
            assert [c for c, _ in value] == [c for c, _ in other], name
            assert [v for _, v in value] == pytest.approx([v for _, v in other]), name
        else:
            assert value == pytest.approx(other), name


# --------------------------------------------------------------------------- the bench


def _timed(action):
    started = time.perf_counter()
    result = action()
    return result, time.perf_counter() - started


def test_spark_vs_pandas_dissemination(tmp_path, record_figures):
    from analytics.jobs.load import load_logs
    from analytics.spark import create_session

    spark = create_session(MASTER, driver_memory=DRIVER_MEMORY)
    sizes = sorted({max(MIN_RECORDS, RECORDS // divisor) for divisor in SIZE_DIVISORS})
    runs = []
    try:
        # Warm the JVM on the smallest set first, so the first measured size does
        # not pay for class loading and JIT compilation alone.
        for index, size in enumerate([sizes[0], *sizes]):
            directory = tmp_path / f"logs-{index}"
            directory.mkdir()
            records, generate_s = _timed(lambda: generate_log_set(directory, size, SEED + index))
            loaded, spark_load_s = _timed(lambda: load_logs(spark, str(directory)))
            assert loaded.report.malformed_total == 0 and loaded.report.records == records
            spark_side, spark_compute_s = _timed(lambda: spark_numbers(loaded.records))
            loaded.release()
            frame, pandas_load_s = _timed(lambda: pandas_load(directory))
            pandas_side, pandas_compute_s = _timed(lambda: pandas_numbers(frame))
            del frame
            _assert_same(spark_side, pandas_side)
            if index == 0:
                continue  # the warm-up run
            spark_total = spark_load_s + spark_compute_s
            pandas_total = pandas_load_s + pandas_compute_s
            runs.append({
                "records": records,
                "generate_s": round(generate_s, 2),
                "spark_load_s": round(spark_load_s, 2),
                "spark_compute_s": round(spark_compute_s, 2),
                "pandas_load_s": round(pandas_load_s, 2),
                "pandas_compute_s": round(pandas_compute_s, 2),
                "spark_rows_per_s": round(records / spark_total),
                "pandas_rows_per_s": round(records / pandas_total),
                "spark_over_pandas": round(pandas_total / spark_total, 3),
                "spark_compute_rows_per_s": round(records / spark_compute_s),
                "pandas_compute_rows_per_s": round(records / pandas_compute_s),
                "spark_over_pandas_compute": round(pandas_compute_s / spark_compute_s, 3),
                "p99_ms": spark_side.p99_ms,
                # This process holds pandas' data (the JVM is another process): its peak so far.
                "pandas_process_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            })
    finally:
        spark.stop()
    pays_off = [run["records"] for run in runs if run["spark_over_pandas"] >= 1.0]
    record_figures("spark", {
        "what": "dissemination job, Spark local mode vs pandas, same data, same numbers",
        "master": MASTER,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "driver_memory": DRIVER_MEMORY,
        "runs": runs,
        "spark_pays_off_from_records": pays_off[0] if pays_off else None,
        "note": "spark_over_pandas > 1: Spark faster (end to end incl. reading JSON lines); "
                "Spark also validates every line, pandas trusts the generated data.",
    })
    assert runs and all(run["spark_rows_per_s"] > 0 and run["pandas_rows_per_s"] > 0 for run in runs)
