"""The graph CRDT: convergence under any delivery order, the buffer, walks and delivery."""

import ast
import random
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.core.graph import GraphLimits
from node.core.outcomes import AddStatus
from node.replica.replica import Replica, ReplicaConfig
from storage.memory import MemoryStore
from node.core.store import TABLE_AUTHORS
from tests.helpers import child, identity, new_topic, random_dag

NOW_MS = 10_000
WRITERS = [identity(n) for n in ("alice", "bob", "carol", "dave")]
CORE = Path(__file__).resolve().parents[2] / "node" / "core"


def graph_state(replica: Replica):
    """Everything the CRDT defines: vertices, edges, extremities, depths, buffer."""
    graph = replica.graph
    ids = sorted(e.id for _, e in graph.deliveries(limit=10_000))
    edges = sorted((p, i) for i in ids for p in graph.parents_of(i))
    return {
        "ids": ids,
        "edges": edges,
        "extremities": graph.extremities(),
        "depths": [graph.depth(i) for i in ids],
        "children": [sorted(graph.children(i)) for i in ids],
        "buffered": graph.buffered_count,
    }


def brute_extremities(replica: Replica):
    ids = [e.id for _, e in replica.graph.deliveries(limit=10_000)]
    with_children = {p for i in ids for p in replica.graph.parents_of(i)}
    return sorted(i for i in ids if i not in with_children)


def make_world(seed: int, count: int = 40):
    rng = random.Random(seed)
    origin = new_topic()
    root = origin.graph.get(origin.topic_id)
    events = [root] + random_dag(origin, WRITERS, count, rng)
    return origin.topic_id, events


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), order_seed=st.integers(0, 10_000),
       duplicates=st.integers(0, 20), commit_every=st.integers(1, 50))
def test_any_permutation_with_duplicates_gives_identical_state(seed, order_seed, duplicates,
                                                               commit_every):
    topic_id, events = make_world(seed)
    reference = Replica(MemoryStore(), topic_id, identity("ref"))
    for event in events:
        assert reference.receive(event.raw, NOW_MS).status is AddStatus.APPLIED
    rng = random.Random(order_seed)
    shuffled = events + [rng.choice(events) for _ in range(duplicates)]
    rng.shuffle(shuffled)
    replica = Replica(MemoryStore(), topic_id, identity("other"))
    for n, event in enumerate(shuffled):
        outcome = replica.receive(event.raw, NOW_MS)
        assert outcome.status in {AddStatus.APPLIED, AddStatus.BUFFERED, AddStatus.DUPLICATE}
        if n % commit_every == 0:
            replica.commit()
    replica.commit()
    assert graph_state(replica) == graph_state(reference)
    assert replica.graph.extremities() == brute_extremities(replica)


def test_same_state_on_lmdb_and_memory_after_reopen(store_factory):
    topic_id, events = make_world(7, count=80)
    rng = random.Random(3)
    shuffled = events[:]
    rng.shuffle(shuffled)
    store = store_factory("a")
    replica = Replica(store, topic_id, identity("x"))
    for event in shuffled[:50]:
        replica.receive(event.raw, NOW_MS)
    replica.commit()
    if store_factory.kind == "lmdb":  # restart: a new store on the same directory
        store.close()
        store = store_factory("a")
    replica = Replica(store, topic_id, identity("x"))
    for event in shuffled[50:]:
        replica.receive(event.raw, NOW_MS)
    replica.commit()
    reference = Replica(MemoryStore(), topic_id, identity("ref"))
    for event in events:
        reference.receive(event.raw, NOW_MS)
    assert graph_state(replica) == graph_state(reference)


def test_buffered_event_applies_with_a_cascade_when_the_gap_fills():
    topic_id, events = make_world(1, count=30)
    replica = Replica(MemoryStore(), topic_id, identity("x"))
    for event in reversed(events[1:]):
        outcome = replica.receive(event.raw, NOW_MS)
        assert outcome.status is AddStatus.BUFFERED
    assert replica.graph.missing_parents() == [topic_id]
    outcome = replica.receive(events[0].raw, NOW_MS)
    assert outcome.status is AddStatus.APPLIED
    assert len(outcome.applied) == len(events)
    assert replica.graph.buffered_count == 0
    assert replica.graph.missing_parents() == []


def test_delivery_order_never_puts_an_event_before_its_parents(store_factory):
    topic_id, events = make_world(11, count=60)
    rng = random.Random(5)
    shuffled = events[:]
    rng.shuffle(shuffled)
    replica = Replica(store_factory(), topic_id, identity("x"))
    for event in shuffled:
        replica.receive(event.raw, NOW_MS)
    replica.commit()
    delivered = replica.graph.deliveries(limit=1_000)
    assert [p for p, _ in delivered] == list(range(len(events)))
    position = {e.id: p for p, e in delivered}
    for _, event in delivered:
        assert all(position[parent] < position[event.id] for parent in event.parents)
    # resumable from a cursor
    assert replica.graph.deliveries(since=10, limit=5) == delivered[10:15]


def test_buffer_caps_drop_the_oldest_per_author_and_in_total():
    origin = new_topic()
    limits = GraphLimits(buffered_per_author=3, buffered_total=5)
    replica = Replica(MemoryStore(), origin.topic_id, identity("x"), ReplicaConfig(limits=limits))
    bob, carol = identity("bob"), identity("carol")
    ghost = b"\x99" * 32  # a parent nobody has: forged-parent DoS
    bobs = [child(bob, origin.topic_id, [ghost], seq=s) for s in range(1, 6)]
    dropped = []
    for event in bobs:
        outcome = replica.receive(event.raw, NOW_MS)
        dropped += outcome.dropped
    assert dropped == [bobs[0].id, bobs[1].id]
    assert sorted(replica.graph.buffered_ids()) == sorted(e.id for e in bobs[2:])
    carols = [child(carol, origin.topic_id, [ghost], seq=s) for s in range(1, 4)]
    for event in carols:
        dropped += replica.receive(event.raw, NOW_MS).dropped
    assert replica.graph.buffered_count == 5
    assert dropped[2] == bobs[2].id  # globally oldest goes first once the total is reached
    # a dropped event is not remembered: it can be received (fetched) again later
    assert not replica.graph.is_buffered(bobs[0].id)
    assert replica.receive(bobs[0].raw, NOW_MS).status in {AddStatus.BUFFERED, AddStatus.REJECTED}


def test_buffer_survives_restart(store_factory):
    if store_factory.kind != "lmdb":
        return
    origin = new_topic()
    bob = identity("bob")
    first = child(bob, origin.topic_id, [origin.topic_id], seq=1)
    second = child(bob, origin.topic_id, [first.id], seq=2)
    store = store_factory("s")
    replica = Replica(store, origin.topic_id, identity("x"))
    replica.receive(origin.graph.get(origin.topic_id).raw, NOW_MS)
    assert replica.receive(second.raw, NOW_MS).status is AddStatus.BUFFERED
    replica.commit()
    store.close()
    replica = Replica(store_factory("s"), origin.topic_id, identity("x"))
    assert replica.graph.is_buffered(second.id)
    outcome = replica.receive(first.raw, NOW_MS)
    assert [e.id for e in outcome.applied] == [first.id, second.id]


def brute_ancestors(replica, ids):
    out, stack = set(), list(ids)
    while stack:
        for parent in replica.graph.parents_of(stack.pop()):
            if parent not in out:
                out.add(parent)
                stack.append(parent)
    return out


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), pick=st.integers(0, 10_000))
def test_not_below_is_exactly_what_a_peer_with_those_heads_lacks(seed, pick):
    topic_id, events = make_world(seed, count=50)
    full = Replica(MemoryStore(), topic_id, identity("full"))
    for event in events:
        full.receive(event.raw, NOW_MS)
    rng = random.Random(pick)
    prefix = events[: rng.randint(1, len(events))]  # a causally closed subset
    partial = Replica(MemoryStore(), topic_id, identity("partial"))
    for event in prefix:
        partial.receive(event.raw, NOW_MS)
    heads = partial.graph.extremities()
    lacking = full.graph.not_below(heads)
    have = {e.id for e in prefix}
    assert set(lacking) == {e.id for e in events} - have
    for event_id in lacking:  # parents first: applying in this order never buffers
        assert partial.receive(full.graph.get(event_id).raw, NOW_MS).status is AddStatus.APPLIED
    assert partial.graph.extremities() == full.graph.extremities()
    # ancestors agrees with a brute-force walk
    some = [rng.choice(events).id]
    assert set(full.graph.ancestors(some)) == brute_ancestors(full, some)


def test_walk_limits_are_respected():
    topic_id, events = make_world(3, count=60)
    replica = Replica(MemoryStore(), topic_id, identity("x"))
    for event in events:
        replica.receive(event.raw, NOW_MS)
    assert len(replica.graph.ancestors(replica.graph.extremities(), limit=7)) == 7
    assert len(replica.graph.descendants([topic_id], limit=9)) == 9
    assert len(replica.graph.not_below([topic_id], limit=4)) == 4


def test_publish_uses_all_extremities_up_to_d_max_then_the_policy():
    origin = new_topic(d_max=3)
    rng = random.Random(0)
    for n, writer in enumerate(WRITERS):
        event = child(writer, origin.topic_id, [origin.topic_id], seq=1, payload=bytes([n]))
        origin.receive(event.raw, NOW_MS)
    assert origin.graph.width == 4
    event, _ = origin.publish(b"merge", NOW_MS, rng)
    assert len(event.parents) == 3
    assert origin.graph.width == 2
    event, _ = origin.publish(b"merge again", NOW_MS, rng)
    assert len(event.parents) == 2 and origin.graph.width == 1
    assert event.seq == 3  # alice: create (0), the concurrent child (1), two merges


class AuthorIndexReads(MemoryStore):
    """A memory store that counts the author-index entries each scan hands out."""

    def __init__(self) -> None:
        super().__init__()
        self.author_reads: list[int] = []

    def scan(self, table, prefix, **options):
        pairs = list(super().scan(table, prefix, **options))
        if table == TABLE_AUTHORS:
            self.author_reads.append(len(pairs))
        return iter(pairs)


def test_detecting_an_equivocation_reads_one_index_entry_however_often_a_seq_repeats():
    # Regression: each new copy of (author, seq) read every earlier copy just
    # to learn that one exists, quadratic in the number of copies.
    store = AuthorIndexReads()
    origin = new_topic(store)
    bob = identity("bob")
    copies = 30
    for n in range(copies):
        twin = child(bob, origin.topic_id, [origin.topic_id], seq=1, payload=b"story %d" % n)
        assert origin.graph.add(twin).status is AddStatus.APPLIED
        origin.commit()  # in the store, where the scan reads them
    assert origin.graph.equivocation_count == copies - 1
    assert max(store.author_reads) <= 1
    assert len(origin.graph.events_by(bob.public_key, 1)) == copies


def test_the_sans_io_graph_imports_no_threads():
    # The store does the I/O, in the node's one writer (node.committer): a
    # writer thread in the core (there was one, storage.writer) would pull
    # concurrent.futures and threading into the sans-IO core.
    for module in ("graph", "walks", "monitor"):
        tree = ast.parse((CORE / f"{module}.py").read_text())
        imported = set()
        for node in tree.body:  # module level; `if TYPE_CHECKING:` blocks are not run
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                imported.add(node.module or "")
        assert not imported & {"storage.writer", "threading", "concurrent.futures", "trio"}, module
