"""Store micro-benchmark: puts per second by store and batch size (`make bench`).

What it shows: with sync on, every `apply` costs one fsync, so throughput
scales with the batch size until the fsync is amortised; that is why the node
group-commits. The memory store is the ceiling (no I/O at all), and LMDB with
sync off separates the fsync's cost from LMDB's own.

All cases run side by side in one process and the figures (plus the ratios
that matter) go to bench-results/store.json. Nothing here asserts on speed.
Each case stops at a time budget or an op cap, whichever comes first, so the
whole file runs in roughly 15 s on any disk.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from storage.lmdb_store import LmdbStore
from storage.memory import MemoryStore
from node.core.store import TABLE_EVENTS, Put, Store

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_PATH = REPO_ROOT / "bench-results" / "store.json"
CASE_BUDGET_S = 2.0  # wall time per case; the last batch may overrun it slightly
CASE_MAX_OPS = 300_000  # keeps fast cases from filling memory or disk
KEY_BYTES = 40  # topic id (32) + an 8-byte suffix, like the core's composite keys
VALUE_BYTES = 512  # a typical small event record
LMDB_BATCH_SIZES = (1, 100, 1000)


@dataclass(frozen=True, slots=True)
class Case:
    store: str  # "lmdb" or "memory"
    sync: bool
    batch_ops: int


@dataclass(frozen=True, slots=True)
class Result:
    store: str
    sync: bool
    batch_ops: int
    ops: int
    batches: int
    seconds: float
    puts_per_s: float
    batches_per_s: float


CASES = (
    *(Case("lmdb", True, size) for size in LMDB_BATCH_SIZES),
    Case("lmdb", False, 1000),
    Case("memory", False, 1),
    Case("memory", False, 1000),
)


def key(n: int) -> bytes:
    return b"\x42" * (KEY_BYTES - 8) + n.to_bytes(8, "big")


def run_case(case: Case, data_dir: Path) -> Result:
    store: Store
    if case.store == "lmdb":
        store = LmdbStore(data_dir, sync=case.sync)
    else:
        store = MemoryStore()
    value = b"\x5a" * VALUE_BYTES
    ops = batches = 0
    started = time.perf_counter()
    deadline = started + CASE_BUDGET_S
    while ops + case.batch_ops <= CASE_MAX_OPS and time.perf_counter() < deadline:
        store.apply([Put(TABLE_EVENTS, key(ops + i), value) for i in range(case.batch_ops)])
        ops += case.batch_ops
        batches += 1
    seconds = time.perf_counter() - started
    # The figures only count if every put really landed.
    assert sum(1 for _ in store.scan(TABLE_EVENTS, b"")) == ops
    store.close()
    return Result(
        store=case.store,
        sync=case.sync,
        batch_ops=case.batch_ops,
        ops=ops,
        batches=batches,
        seconds=round(seconds, 4),
        puts_per_s=round(ops / seconds, 1),
        batches_per_s=round(batches / seconds, 1),
    )


def ratio(results: dict[Case, Result], faster: Case, slower: Case) -> float:
    return round(results[faster].puts_per_s / results[slower].puts_per_s, 2)


def test_store_put_throughput(tmp_path: Path) -> None:
    results = {case: run_case(case, tmp_path / f"case-{n}") for n, case in enumerate(CASES)}
    lmdb_sync = {size: Case("lmdb", True, size) for size in LMDB_BATCH_SIZES}
    report = {
        "benchmark": "store puts/s by batch size",
        "key_bytes": KEY_BYTES,
        "value_bytes": VALUE_BYTES,
        "case_budget_s": CASE_BUDGET_S,
        "results": [asdict(result) for result in results.values()],
        "ratios": {
            "lmdb_sync_batch_100_vs_1": ratio(results, lmdb_sync[100], lmdb_sync[1]),
            "lmdb_sync_batch_1000_vs_1": ratio(results, lmdb_sync[1000], lmdb_sync[1]),
            "lmdb_nosync_vs_sync_batch_1000": ratio(
                results, Case("lmdb", False, 1000), lmdb_sync[1000]
            ),
            "memory_vs_lmdb_sync_batch_1000": ratio(
                results, Case("memory", False, 1000), lmdb_sync[1000]
            ),
        },
    }
    RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_PATH.write_text(json.dumps(report, indent=2) + "\n")

    for result in results.values():
        print(
            f"{result.store:6} sync={result.sync!s:5} batch={result.batch_ops:5}: "
            f"{result.puts_per_s:>12,.0f} puts/s {result.batches_per_s:>10,.0f} commits/s"
        )
    print(f"ratios: {report['ratios']} -> {RESULTS_PATH}")
    assert json.loads(RESULTS_PATH.read_text())["results"]
