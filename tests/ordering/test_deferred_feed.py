"""A topic's order fed once per driver step (`Replica.defer_order`) equals the order fed
once per frame, and nobody reads it behind the graph.

Why: each feed of the order costs the unconfirmed tail's length besides its
events (tests/bench/test_engine_step_bench.py), so the node's committer and
`Disseminator.on_batch` feed each topic once per step. Deferring must change
nothing a reader sees: the same confirmed and tentative views, and a read
inside the step (authoring, acks, status) sees every event applied so far.
"""

from __future__ import annotations

import random

from node.core.event import Event
from node.replica.ordering import KIND_ACK
from node.replica.replica import Replica, ReplicaConfig
from node.replica.order_views import ORDER_CONFIRMED, ORDER_TENTATIVE
from storage.memory import MemoryStore
from tests.helpers import authorized_topic, identity, joined_writer, sync

NOW_MS = 10**12
WRITES = 40


def topic_with_a_writer() -> tuple[Replica, list[Event]]:
    """An indexer (the creator) and a writer that is not one; the writer writes WRITES
    events and the indexer acknowledges them twice along the way."""
    rng = random.Random(7)
    creator = authorized_topic(now_ms=NOW_MS)
    writer = joined_writer(creator, "writer", rng, NOW_MS)
    for n in range(WRITES):
        writer.publish(b"reading %d" % n, NOW_MS, rng)
        if n in (WRITES // 2, WRITES - 1):
            writer.commit()
            sync(writer, creator, NOW_MS)
            creator.publish(b"", NOW_MS, rng, kind=KIND_ACK)
            creator.commit()
            sync(creator, writer, NOW_MS)
    writer.commit()
    return creator, [e for _, e in writer.graph.deliveries(0, limit=10 * WRITES)]


def views(replica: Replica) -> tuple[list[bytes], list[bytes]]:
    return ([e.id for _, e in replica.ordered(ORDER_CONFIRMED, limit=10 * WRITES)],
            [e.id for _, e in replica.ordered(ORDER_TENTATIVE, limit=10 * WRITES)])


def test_an_order_fed_once_per_step_equals_one_fed_per_event() -> None:
    creator, events = topic_with_a_writer()
    one_by_one = Replica(MemoryStore(), creator.topic_id, identity("a"), ReplicaConfig())
    stepped = Replica(MemoryStore(), creator.topic_id, identity("b"), ReplicaConfig())
    for event in events:
        one_by_one.receive(event.raw, NOW_MS)
    for start in range(0, len(events), 7):  # steps of 7 frames
        stepped.defer_order()
        for event in events[start:start + 7]:
            assert stepped.receive(event.raw, NOW_MS).order is None  # fed at the step's end
        stepped.flush_order()
    confirmed, tentative = views(one_by_one)
    assert 0 < len(confirmed) < len(tentative)  # something confirmed, something not yet
    assert views(stepped) == (confirmed, tentative)
    assert stepped.order_status() == one_by_one.order_status()


def test_reading_the_order_inside_a_step_sees_every_event_applied() -> None:
    creator, events = topic_with_a_writer()
    replica = Replica(MemoryStore(), creator.topic_id, identity("c"), ReplicaConfig())
    replica.defer_order()
    for event in events:
        replica.receive(event.raw, NOW_MS)
    status = replica.order_status()  # read inside the step: fed first
    assert status is not None
    assert status.confirmed_length + status.tentative_length == replica.graph.delivered_count
    assert replica.flush_order() is None  # nothing waited any more


def test_a_discarded_step_drops_what_waited_and_the_order_follows_the_store() -> None:
    creator, events = topic_with_a_writer()
    replica = Replica(MemoryStore(), creator.topic_id, identity("d"), ReplicaConfig())
    half = len(events) // 2
    for event in events[:half]:
        replica.receive(event.raw, NOW_MS)
    replica.commit()
    before = views(replica)
    replica.defer_order()
    for event in events[half:]:
        replica.receive(event.raw, NOW_MS)
    replica.graph.discard_pending()  # a failed commit: the step's writes are gone
    replica.flush_order(feed=False)
    assert replica.graph.delivered_count == half
    assert views(replica) == before


def test_each_update_rewinds_exactly_to_the_prefix_the_views_share() -> None:
    """The shared prefix an update reports, found without comparing the tails where the
    order's parts could tell it (`OrderUpdate.shared`, `OrderBans.advance(previous=)`),
    is exactly the one a comparison of the full views finds, through reorderings of
    the tail and confirmations."""
    from node.core.order.linearizer import common_prefix
    from tests.ordering.world import ACK_INTERVAL_MS, Net

    net = Net(11, creator="alice", indexers=["alice", "bob"], writers=["xavier", "yuri"])
    bob = net.replicas["bob"]
    full = list(bob.ordering.confirmed + bob.ordering.tentative)
    rewinds: list[int] = []

    def check(update) -> None:
        nonlocal full
        order = bob.ordering
        new = list(order.confirmed + order.tentative)
        assert update.rewind_to == common_prefix(full, new)
        rewinds.append(len(full) - update.rewind_to)
        full = new

    net.listeners["bob"] = check
    for n in range(10):
        for writer in ("xavier", "yuri", "alice"):
            net.publish(writer, b"%s %d" % (writer.encode(), n))
        net.exchange("bob", "yuri", share=0.5)
        net.exchange("bob", "xavier", share=0.5)
        net.exchange("bob", "alice", share=0.5)
        net.ack("bob")
        net.now_ms += ACK_INTERVAL_MS
        net.sync_all(["alice", "xavier", "yuri"])
    net.settle()
    assert len(rewinds) > 20 and any(rewinds)  # the tail reordered, not only grew


def test_an_indexer_checks_its_vote_without_walking_a_quiet_tail_again() -> None:
    """While another indexer is away nothing confirms and the tail grows; the online
    indexer's ack check (every tick until an ack is due) gives the answer a fresh
    walk gives, and walks a tail it already judged no more (`_vote_memo`)."""
    from node.state.roles import Role

    rng = random.Random(3)
    alice = authorized_topic(now_ms=NOW_MS)
    joined_writer(alice, "bob", rng, NOW_MS, role=Role.INDEXER)  # an indexer, then away
    writer = joined_writer(alice, "writer", rng, NOW_MS)
    me = alice.identity.public_key
    order = alice.ordering
    assert len(order.indexers) == 2

    def due() -> bool:
        order._last_ack_ms = None  # the rate limit is not what is tested here
        answer = order.ack_due(me, NOW_MS, lambda: Role.INDEXER)
        memo, order._vote_memo = order._vote_memo, None
        assert order.ack_due(me, NOW_MS, lambda: Role.INDEXER) == answer  # a fresh walk
        order._vote_memo = memo
        return answer

    for _ in range(6):
        for n in range(30):
            writer.publish(b"reading %d" % n, NOW_MS, rng)
        writer.commit()
        sync(writer, alice, NOW_MS)
        alice.commit()
        assert due()  # unseen events: vote
        assert alice.maybe_ack(NOW_MS, rng) is not None
        alice.commit()
        assert not due()  # the ack saw everything: nothing to vote on
        walks: list[int] = []
        walk = order._vote_due_now
        order._vote_due_now = lambda *a: walks.append(1) or walk(*a)
        order._last_ack_ms = None
        for tick in range(5):  # the ticks until the next write: the same tail
            assert not order.ack_due(me, NOW_MS + tick, lambda: Role.INDEXER)
        del order._vote_due_now
        assert walks == []
    assert alice.order_status().tentative_length > 180  # nothing confirmed meanwhile
