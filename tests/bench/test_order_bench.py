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
* autobase through real Replicas (bench-results/order_replicas.json): the
  same scenario with signed events, raw-byte syncing, topic state, LMDB
  group commits (with and without fsync) and `maybe_ack`; appends/s
  (wall and CPU), the ordering's share of the CPU, acks needed; plus the
  time a restart takes to rebuild the order of ~10k events (replay).
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


# -- The same scenario through real Replicas (issue 5's comparison) -----------------
#
# Three indexers, each a Replica on its own LMDB store (fsync on, one group
# commit per replica per round: Autobase's storage-bound setting), append
# small signed entries in rounds of BATCH; after each round every replica
# receives the others' new events as raw bytes (decode, Reference Monitor,
# graph, topic state and auth rules, order) and commits. Then the indexers
# call maybe_ack (as the dissemination tick would) and sync until the three
# views are equal and every entry is confirmed. All work of the three
# replicas counts, single-threaded in one process.

REPLICA_NAMES = ("alice", "bob", "carol")
ENTRY = b"x" * 32  # a small entry
RESTART_EVENTS = 10_000


def _replica_world(tmp_path, names=REPLICA_NAMES, sync: bool = True):
    from node.replica.replica import Replica
    from storage.lmdb_store import LmdbStore
    from tests.helpers import identity
    from tests.ordering.world import Net

    stores = {n: LmdbStore(tmp_path / n, sync=sync) for n in names}
    net = Net(1, creator=names[0], indexers=list(names), stores=stores, check=False)
    net.commit_all()
    return net, stores, Replica, identity


class _OrderTimer:
    """Times TopicOrder.catch_up (feeding the order) while installed: its share of the run."""

    def __init__(self) -> None:
        from node.replica.ordering import TopicOrder

        self.cls, self.original, self.seconds = TopicOrder, TopicOrder.catch_up, 0.0

    def __enter__(self) -> "_OrderTimer":
        original = self.original

        def timed(order, applied=()):
            start = time.process_time()
            try:
                return original(order, applied)
            finally:
                self.seconds += time.process_time() - start

        self.cls.catch_up = timed
        return self

    def __exit__(self, *exc) -> None:
        self.cls.catch_up = self.original


def replica_autobase_scenario(tmp_path, fsync: bool = True) -> dict:
    with _OrderTimer() as timer:
        figures = _replica_autobase_scenario(tmp_path, fsync)
    figures["order_cpu_share"] = round(timer.seconds / figures["cpu_seconds"], 3)
    return figures


def _replica_autobase_scenario(tmp_path, fsync: bool) -> dict:
    net, stores, _, _ = _replica_world(tmp_path, sync=fsync)
    replicas = [net.replicas[n] for n in REPLICA_NAMES]
    rng = random.Random(1)
    outbox: dict[str, list[bytes]] = {n: [] for n in REPLICA_NAMES}
    entries: set[bytes] = set()
    now = net.now_ms

    def sync() -> None:
        for source in REPLICA_NAMES:
            raws, outbox[source] = outbox[source], []
            for target in REPLICA_NAMES:
                if target != source:
                    for raw in raws:
                        net.replicas[target].receive(raw, now)
        for replica in replicas:
            replica.commit()

    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(ENTRIES_PER_WRITER // BATCH):
        for name in rng.sample(REPLICA_NAMES, len(REPLICA_NAMES)):
            for _ in range(BATCH):
                now += 1
                event, _ = net.replicas[name].publish(ENTRY, now, rng)
                outbox[name].append(event.raw)
                entries.add(event.id)
        sync()
    appended = time.perf_counter() - start
    acks = 0
    for _ in range(ACK_ROUNDS_MAX * 4):
        views = {r.ordering.confirmed + r.ordering.tentative for r in replicas}
        if len(views) == 1 and all(entries <= set(r.ordering.confirmed[-len(entries) - 64:])
                                   for r in replicas):
            break
        now += net.config.ordering.ack_interval_ms
        for name in REPLICA_NAMES:
            made = net.replicas[name].maybe_ack(now, rng)
            if made is not None:
                outbox[name].append(made[0].raw)
                acks += 1
        sync()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    confirmed = {r.ordering.confirmed for r in replicas}
    assert len(confirmed) == 1 and entries <= set(confirmed.pop()), "views did not converge"
    for store in stores.values():
        store.close()
    rate = len(entries) / seconds
    return {
        "entries": len(entries),
        "seconds_appending_and_syncing": round(appended, 3),
        "seconds_to_equal_views": round(seconds, 3),
        "appends_per_s": round(rate),
        "vs_autobase_quoted": round(rate / AUTOBASE_APPENDS_PER_S, 1),
        "target_ratio": 10,
        "cpu_seconds": round(cpu, 3),
        "appends_per_cpu_s": round(len(entries) / cpu),
        "acks_needed": acks,
        "store": "lmdb, " + ("fsync per replica per round" if fsync else "no fsync"),
    }


def replica_restart_replay(tmp_path) -> dict:
    """Time to rebuild one replica's order from its store (replay) for ~10k events."""
    net, stores, Replica, identity = _replica_world(tmp_path, ("alice", "bob"))
    alice, bob = net.replicas["alice"], net.replicas["bob"]
    rng = random.Random(2)
    now = net.now_ms
    while alice.graph.delivered_count < RESTART_EVENTS:
        for replica, other in ((alice, bob), (bob, alice)):
            for _ in range(BATCH):
                now += 1
                event, _ = replica.publish(ENTRY, now, rng)
                other.receive(event.raw, now)
        alice.commit()
        bob.commit()
    confirmed = alice.ordering.confirmed
    events = alice.graph.delivered_count
    stores["alice"].close()
    from storage.lmdb_store import LmdbStore

    start = time.perf_counter()
    reopened = Replica(LmdbStore(tmp_path / "alice"), alice.topic_id, identity("alice"), net.config)
    order = reopened.ordering
    seconds = time.perf_counter() - start
    assert order.confirmed == confirmed
    return {"events": events, "confirmed": len(confirmed), "replay_seconds": round(seconds, 3),
            "replay_us_per_event": round(seconds / events * 1e6, 1)}


def test_order_bench_replicas(tmp_path, record_figures):
    figures = {
        "autobase_scenario_replicas": replica_autobase_scenario(tmp_path / "scenario"),
        "autobase_scenario_replicas_nosync": replica_autobase_scenario(tmp_path / "nosync", False),
        "restart_replay": replica_restart_replay(tmp_path / "restart"),
        "autobase_quoted_appends_per_s": AUTOBASE_APPENDS_PER_S,
    }
    record_figures("order_replicas", figures)
