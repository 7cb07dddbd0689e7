"""Ordering core: cost per node, confirmation latency, and Autobase's comparison scenario.

Not part of CI (`make bench`). Figures go to bench-results/order.json.

* scaling: n indexers (3, 7, 15) and one non-indexer each append one node per
  round referencing every head they know, then everyone syncs. Per-node cost
  of the linearizer, set against the cost of causal clocks alone
  (`CausalIndex.add`, the least any causal-order layer pays) on the same
  nodes in the same run; confirmation latency in rounds, from the round a
  node is written to the round after whose sync every replica has confirmed it.
* autobase: 3 indexers in one process, each appending 2,000 entries in rounds
  of 20 interleaved with syncing, then acknowledging until the three views
  are equal and everything is confirmed: appends/s (all work of the three
  replicas included), acks needed. Autobase 7.28.1 does ~90 appends/s here
  (quoted in issue 5, storage-bound; not measured in this run).
"""

import hashlib
import random
import statistics
import time

from node.core.order import Linearizer, OrderNode
from node.core.order.clock import CausalIndex

AUTOBASE_APPENDS_PER_S = 90  # quoted in issue 5, not measured here
SCALING_ROUNDS = 40
SCALING_INDEXERS = (3, 7, 15)
ENTRIES_PER_WRITER = 2_000
BATCH = 20
ACK_ROUNDS_MAX = 10


def key(label: str) -> bytes:
    return hashlib.blake2b(label.encode(), digest_size=32).digest()


class Peer:
    """A writer and its replica: a linearizer fed by local appends and syncs."""

    def __init__(self, writer: bytes, indexers: frozenset[bytes]) -> None:
        self.writer = writer
        self.linearizer = Linearizer(indexers)
        self.have: set[bytes] = set()
        self.heads: set[bytes] = set()
        self.seq = 0
        self.seconds = 0.0  # time spent inside the linearizer
        self.adds = 0

    def receive(self, nodes: list[OrderNode]) -> None:
        fresh = [n for n in nodes if n.id not in self.have]
        if not fresh:
            return
        start = time.perf_counter()
        self.linearizer.extend(fresh)
        self.seconds += time.perf_counter() - start
        self.adds += len(fresh)
        for n in fresh:
            self.have.add(n.id)
            self.heads.difference_update(n.deps)
            self.heads.add(n.id)

    def append(self, log: list[OrderNode]) -> OrderNode:
        node_id = key(f"{self.writer.hex()}/{self.seq}")
        made = OrderNode(node_id, self.writer, self.seq, tuple(sorted(self.heads)))
        self.seq += 1
        log.append(made)
        self.receive([made])
        return made


def sync(peers: list[Peer], log: list[OrderNode], since: int) -> int:
    """Everyone gets everything written since `since` (the log's order is causal);
    one `extend` per peer, as one replication batch. Returns the new cursor."""
    fresh = log[since:]
    for peer in peers:
        peer.receive(fresh)
    return len(log)


def scaling(indexer_count: int) -> dict:
    writers = [key(f"indexer-{k}") for k in range(indexer_count)] + [key("writer")]
    indexers = frozenset(writers[:-1])
    peers = [Peer(w, indexers) for w in writers]
    log: list[OrderNode] = []
    written: dict[bytes, int] = {}
    latency: list[int] = []
    cursor = 0
    for round_ in range(SCALING_ROUNDS):
        for peer in peers:
            written[peer.append(log).id] = round_
        cursor = sync(peers, log, cursor)
        done = set.intersection(*(set(p.linearizer.confirmed) for p in peers))
        for node_id in [n for n in written if n in done]:
            latency.append(round_ - written.pop(node_id))
    adds = sum(p.adds for p in peers)
    seconds = sum(p.seconds for p in peers)
    baseline = clock_cost(log) * len(peers)
    return {
        "indexers": indexer_count,
        "nodes": len(log),
        "us_per_node": round(seconds / adds * 1e6, 1),
        "clock_only_us_per_node": round(baseline / adds * 1e6, 1),
        "cost_vs_clock_only": round(seconds / baseline, 2),
        "latency_rounds_mean": round(statistics.mean(latency), 2),
        "latency_rounds_max": max(latency),
        "unconfirmed_at_end": len(written),
    }


def clock_cost(log: list[OrderNode]) -> float:
    """One replica's cost of causal clocks alone for the same nodes."""
    index = CausalIndex()
    start = time.perf_counter()
    for n in log:
        index.add(n)
    return time.perf_counter() - start


def autobase_scenario(seed: int = 1) -> dict:
    rng = random.Random(seed)
    writers = [key(f"autobase-{k}") for k in range(3)]
    peers = [Peer(w, frozenset(writers)) for w in writers]
    log: list[OrderNode] = []
    cursor = 0
    start = time.perf_counter()
    for _ in range(ENTRIES_PER_WRITER // BATCH):
        for peer in rng.sample(peers, len(peers)):
            for _ in range(BATCH):
                peer.append(log)
        cursor = sync(peers, log, cursor)
    entries = {n.id for n in log}
    acks = 0
    for _ in range(ACK_ROUNDS_MAX):
        views = {p.linearizer.confirmed + p.linearizer.tentative for p in peers}
        if len(views) == 1 and all(entries <= set(p.linearizer.confirmed) for p in peers):
            break
        for peer in peers:
            peer.append(log)
            acks += 1
        cursor = sync(peers, log, cursor)
    seconds = time.perf_counter() - start
    assert all(entries <= set(p.linearizer.confirmed) for p in peers), "not all entries confirmed"
    assert len({p.linearizer.confirmed for p in peers}) == 1
    appends_per_s = len(entries) / seconds
    return {
        "entries": len(entries),
        "seconds_to_equal_views": round(seconds, 3),
        "appends_per_s": round(appends_per_s),
        "vs_autobase_quoted": round(appends_per_s / AUTOBASE_APPENDS_PER_S, 1),
        "acks_needed": acks,
        "linearizer_share_of_time": round(sum(p.seconds for p in peers) / seconds, 2),
    }


def test_order_bench(record_figures):
    figures = {
        "scaling": [scaling(n) for n in SCALING_INDEXERS],
        "autobase_scenario": autobase_scenario(),
        "autobase_quoted_appends_per_s": AUTOBASE_APPENDS_PER_S,
    }
    record_figures("order", figures)
    for row in figures["scaling"]:
        assert row["unconfirmed_at_end"] <= 3 * (row["indexers"] + 1), row  # only the last rounds wait
