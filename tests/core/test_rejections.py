"""Rejections at application time: remembered, bounded, and fatal to everything built on them.

An event rejected when applied (its parents are not an antichain) can never be
a vertex on any correct replica, so neither can its descendants. Before this,
a buffered child of such an event waited forever and `missing_parents()` kept
asking for the rejected parent.
"""

import itertools

import pytest

from node.core.graph import GraphLimits
from node.core.outcomes import AddStatus, RejectReason
from node.replica.replica import Replica, ReplicaConfig
from storage.memory import MemoryStore
from node.core.store import TABLE_BUFFER_INDEX
from tests.core.test_graph import graph_state
from tests.helpers import child, identity, new_topic

NOW_MS = 10_000
MALLORY = identity("mallory")


class World:
    """root <- first <- second, and mallory's `bad` naming both first and second.

    `kid` and `grandkid` are built on `bad`; `orphan` waits on `bad` and on a
    parent nobody has; `good` is an honest event concurrent with all of it.
    """

    def __init__(self) -> None:
        self.origin = new_topic()
        topic = self.origin.topic_id
        bob = identity("bob")
        self.root = self.origin.graph.get(topic)
        self.first = child(bob, topic, [topic], seq=1)
        self.second = child(bob, topic, [self.first.id], seq=2)
        self.bad = child(MALLORY, topic, sorted([self.first.id, self.second.id]), seq=1)
        self.kid = child(MALLORY, topic, [self.bad.id], seq=2)
        self.grandkid = child(MALLORY, topic, [self.kid.id], seq=3)
        self.orphan = child(identity("olive"), topic, [self.bad.id, b"\x77" * 32], seq=1)
        self.good = child(identity("carol"), topic, [self.second.id], seq=1)
        self.doomed = [self.bad, self.kid, self.grandkid, self.orphan]

    def replica(self, store=None, limits: GraphLimits = GraphLimits()) -> Replica:
        replica = Replica(store or MemoryStore(), self.origin.topic_id, identity("x"),
                          ReplicaConfig(limits=limits))
        for event in (self.root, self.first, self.second):
            assert replica.receive(event.raw, NOW_MS).status is AddStatus.APPLIED
        return replica


def remembered(replica: Replica, events) -> dict:
    return {event.id: replica.graph.rejected_reason(event.id) for event in events}


def test_buffered_descendants_are_dropped_when_their_parent_is_rejected():
    world = World()
    replica = world.replica()
    for event in (world.grandkid, world.kid, world.orphan):
        assert replica.receive(event.raw, NOW_MS).status is AddStatus.BUFFERED
    assert set(replica.graph.missing_parents()) == {world.bad.id, b"\x77" * 32}

    outcome = replica.receive(world.bad.raw, NOW_MS)

    assert outcome.status is AddStatus.REJECTED
    assert outcome.reason is RejectReason.PARENTS_NOT_ANTICHAIN
    # breadth first, children in id order: the same list on every replica
    assert outcome.rejected_ids[0] == (world.bad.id, RejectReason.PARENTS_NOT_ANTICHAIN)
    assert set(outcome.rejected_ids[1:]) == {(world.kid.id, RejectReason.PARENT_REJECTED),
                                             (world.orphan.id, RejectReason.PARENT_REJECTED),
                                             (world.grandkid.id, RejectReason.PARENT_REJECTED)}
    assert outcome.rejected_ids.index((world.grandkid.id, RejectReason.PARENT_REJECTED)) == 3
    assert replica.graph.buffered_count == 0 and replica.graph.buffered_ids() == []
    assert replica.graph.missing_parents() == []  # neither bad nor the orphan's ghost parent
    assert replica.counters[f"rejected.{RejectReason.PARENT_REJECTED}"] == 3


def test_a_descendant_arriving_after_the_rejection_is_rejected_at_once():
    world = World()
    replica = world.replica()
    assert replica.receive(world.bad.raw, NOW_MS).reason is RejectReason.PARENTS_NOT_ANTICHAIN
    for event in (world.kid, world.grandkid, world.orphan):
        outcome = replica.receive(event.raw, NOW_MS)
        assert outcome.status is AddStatus.REJECTED
        assert outcome.reason is RejectReason.PARENT_REJECTED
    assert replica.graph.buffered_count == 0 and replica.graph.missing_parents() == []
    # again: the memory answers, the verdict is the same
    assert replica.receive(world.bad.raw, NOW_MS).reason is RejectReason.PARENTS_NOT_ANTICHAIN
    assert replica.receive(world.kid.raw, NOW_MS).reason is RejectReason.PARENT_REJECTED


def test_every_arrival_order_ends_in_the_same_state():
    world = World()
    reference = world.replica()
    for event in world.doomed + [world.good]:
        reference.receive(event.raw, NOW_MS)
    expected = (graph_state(reference), remembered(reference, world.doomed))
    assert expected[0]["buffered"] == 0
    assert set(expected[1].values()) == {RejectReason.PARENTS_NOT_ANTICHAIN,
                                         RejectReason.PARENT_REJECTED}
    for order in itertools.permutations(world.doomed + [world.good]):
        replica = world.replica()
        for n, event in enumerate(order + order[:2]):  # with duplicates
            assert replica.receive(event.raw, NOW_MS).status in set(AddStatus)
            if n % 2:
                replica.commit()
        assert (graph_state(replica), remembered(replica, world.doomed)) == expected
        assert replica.graph.missing_parents() == []


def test_rejections_survive_a_restart(store_factory):
    world = World()
    store = store_factory("s")
    replica = world.replica(store)
    replica.receive(world.bad.raw, NOW_MS)
    replica.commit()
    if store_factory.kind == "lmdb":
        store.close()
        store = store_factory("s")
    again = Replica(store, world.origin.topic_id, identity("x"))
    assert again.graph.rejected_reason(world.bad.id) is RejectReason.PARENTS_NOT_ANTICHAIN
    assert again.receive(world.kid.raw, NOW_MS).reason is RejectReason.PARENT_REJECTED
    assert again.graph.buffered_count == 0


def test_uncommitted_rejections_are_forgotten_with_the_writes():
    world = World()
    replica = world.replica()
    replica.commit()
    replica.receive(world.bad.raw, NOW_MS)
    assert replica.graph.rejected_reason(world.bad.id) is not None
    replica.graph.discard_pending()
    assert replica.graph.rejected_reason(world.bad.id) is None
    assert replica.graph.rejected_count == 0


def rejection_records(store, topic_id):
    return [key for key, _ in store.scan(TABLE_BUFFER_INDEX, topic_id + b"r")]


def test_the_memory_is_bounded_and_a_forgotten_rejection_costs_one_refetch(store_factory):
    world = World()
    topic = world.origin.topic_id
    store = store_factory("s")
    replica = world.replica(store, GraphLimits(rejected_remembered=2))
    # Three bad events (different authors), each naming first and second.
    bads = [child(identity(f"m{i}"), topic, sorted([world.first.id, world.second.id]), seq=1)
            for i in range(3)]
    for bad in bads:
        assert replica.receive(bad.raw, NOW_MS).reason is RejectReason.PARENTS_NOT_ANTICHAIN
    replica.commit()
    assert replica.graph.rejected_count == 2
    assert replica.graph.rejected_reason(bads[0].id) is None  # the oldest went first
    assert len(rejection_records(store, topic)) == 2
    # A child of the forgotten one waits, and its parent is wanted again ...
    kid = child(identity("m0"), topic, [bads[0].id], seq=2)
    assert replica.receive(kid.raw, NOW_MS).status is AddStatus.BUFFERED
    assert replica.graph.missing_parents() == [bads[0].id]
    # ... which, fetched, is rejected again and takes the child with it.
    outcome = replica.receive(bads[0].raw, NOW_MS)
    assert outcome.rejected_ids == ((bads[0].id, RejectReason.PARENTS_NOT_ANTICHAIN),
                                    (kid.id, RejectReason.PARENT_REJECTED))
    replica.commit()
    assert replica.graph.rejected_count == 2 and len(rejection_records(store, topic)) == 2
    assert replica.graph.buffered_count == 0 and replica.graph.missing_parents() == []


def test_graph_limits_hold_no_protocol_constant_and_take_keywords_only():
    # The antichain search bound decides which events are accepted, so it is
    # a protocol constant, not a per-node setting; with its field gone,
    # positional arguments would silently land on the wrong field.
    assert not hasattr(GraphLimits(), "antichain_visits")
    with pytest.raises(TypeError):
        GraphLimits(5, 6, 7)  # type: ignore[misc]
    assert GraphLimits(rejected_remembered=7).rejected_remembered == 7
    assert GraphLimits().rejected_remembered >= 1_024


def test_rejected_events_are_never_delivered_or_stored_as_vertices():
    world = World()
    replica = world.replica()
    for event in world.doomed:
        replica.receive(event.raw, NOW_MS)
    delivered = {event.id for _, event in replica.graph.deliveries()}
    assert delivered == {world.root.id, world.first.id, world.second.id}
    assert not any(replica.graph.has(e.id) or replica.graph.is_buffered(e.id)
                   for e in world.doomed)
