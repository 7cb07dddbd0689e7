"""The count of what subscribers are handed (`status`'s `delivered` and `acks`), kept by
the replica as it applies events and stored with them (`node.replica.delivery_count`),
instead of reading every event back.

What must hold: the kept count is the count of what `Replica.deliveries` hands
out, in worlds where events are withheld (history), soft-failed (a banned
writer), acknowledged, and a node crashes and restarts from its store; after a
step's writes were discarded; and for a topic stored before the count was kept,
once its history was read back and adopted.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from node.core.identity import Identity
from node.core.store import TABLE_STATE
from node.core.topic_table import TopicTable
from node.core.pending import PendingWrites
from node.replica.delivery_count import HANDED_KEY, DeliveryCount, HandedCount
from node.replica.ordering import KIND_ACK
from node.replica.replica import Replica, ReplicaConfig
from storage.memory import MemoryStore
from transport.sim import Cluster, Scenario

BANNED = Scenario(seed=0, nodes=20, rounds=12, writers=3, banned_writer=True, loss=0.05,
                  partition_at_ms=1_000, heal_at_ms=2_000, crashes=1)
LATE = Scenario(seed=11, nodes=20, outsiders=5, invite=True, history="joined", late=3,
                rounds=10, writers=3, loss=0.05, partition_at_ms=500, heal_at_ms=2_000)


def handed_out(replica: Replica) -> tuple[int, int]:
    """(delivered, acks) of what `deliveries` hands out, read back from the store."""
    events = [e for _, e in replica.deliveries(0, limit=replica.graph.delivered_count + 1)]
    return len(events), sum(e.kind == KIND_ACK for e in events)


def kept(replica: Replica) -> tuple[int, int]:
    count = replica.handed_count
    if count is None and replica.graph.delivered_count == 0:
        return 0, 0  # nothing applied yet (an outsider): no record either
    assert count is not None and count.end == replica.graph.delivered_count
    return count.delivered, count.acks


def read_back(replica: Replica, seed: int = 0) -> DeliveryCount:
    """`count_delivered` over the whole history, in ranges of random lengths."""
    rng = random.Random(seed)
    position = delivered = acks = 0
    while position < replica.graph.delivered_count:
        count = replica.count_delivered(position, replica.graph.delivered_count,
                                        rng.randint(1, 700))
        assert count.start == position < count.end
        delivered, acks, position = delivered + count.delivered, acks + count.acks, count.end
    return DeliveryCount(0, position, delivered, acks)


IDENTITY = Identity.from_seed(bytes(32))


def authorized_topic(seed: int) -> tuple[Replica, MemoryStore, random.Random]:
    """A new authorized topic created here, in a store of its own."""
    store = MemoryStore()
    replica = Replica.create_topic(store, IDENTITY, now_ms=0, authorization=True)
    return replica, store, random.Random(seed)


def publish(replica: Replica, rng: random.Random, name: bytes, count: int, at_ms: int) -> None:
    for n in range(count):
        replica.publish(b"%s %d" % (name, n), now_ms=at_ms + n, rng=rng)


def reopened(store: MemoryStore, replica: Replica) -> Replica:
    """The topic as a node opening the store again sees it."""
    return Replica(store, replica.topic_id, IDENTITY, ReplicaConfig(authorization=True))


# ------------------------------------------------------------------ the record


def test_the_record_counts_runs_from_the_first_position_and_takes_soft_fails_off() -> None:
    store = MemoryStore()
    table = TopicTable(PendingWrites(store), TABLE_STATE, bytes(32))
    count = HandedCount(table)
    assert count.value is None
    count.extend(3, 2, 2, 0)  # not from position 0: an older store's topic, left out
    assert count.value is None
    count.extend(0, 5, 4, 1)  # a topic's first events start it
    count.extend(7, 1, 1, 0)  # positions 5 and 6 were never counted: left out
    count.extend(5, 3, 3, 1)
    assert count.value == DeliveryCount(0, 8, 7, 2)
    count.hide(6, True)  # soft-failed after all
    count.hide(8, True)  # not counted yet: nothing to take off
    assert count.value == DeliveryCount(0, 8, 6, 1)
    count.forget()  # read again from the (pending) record
    assert count.value == DeliveryCount(0, 8, 6, 1)
    table.put(HANDED_KEY, b"junk")
    count.forget()
    assert count.value is None  # a record not ours to trust: counted again
    with pytest.raises(ValueError):
        count.set(DeliveryCount(2, 8, 6, 1))


# ------------------------------------------------------- against deliveries()


@pytest.mark.parametrize("scenario", [BANNED, replace(BANNED, seed=1), LATE],
                         ids=["banned-0", "banned-1", "history-11"])
def test_the_kept_count_is_what_subscribers_are_handed_in_seeded_worlds(
        scenario: Scenario) -> None:
    cluster = Cluster.from_scenario(scenario)
    assert cluster.run().converged
    hidden = 0  # applied but not handed out: withheld or soft-failed
    for node in cluster.nodes:
        replica = node.replica
        assert kept(replica) == handed_out(replica)  # the crashed node's too: it was stored
        count = read_back(replica, node.index)
        assert (count.delivered, count.acks) == handed_out(replica)
        hidden += replica.graph.delivered_count - handed_out(replica)[0]
    assert hidden > 0  # the worlds had events to leave out
    assert any(handed_out(node.replica)[1] for node in cluster.nodes)  # and acks


def test_discarded_writes_take_their_counts_with_them() -> None:
    replica, _, rng = authorized_topic(3)
    publish(replica, rng, b"kept", 20, 0)
    replica.commit()
    committed = replica.handed_count
    publish(replica, rng, b"lost", 10, 100)
    replica.graph.discard_pending()  # a failed commit
    assert replica.handed_count == committed
    publish(replica, rng, b"again", 5, 200)
    replica.commit()
    assert kept(replica) == handed_out(replica)
    assert handed_out(replica)[0] == replica.graph.delivered_count  # all handed out here


def test_a_topic_stored_before_the_count_was_kept_adopts_its_history_read_back() -> None:
    replica, store, rng = authorized_topic(4)
    publish(replica, rng, b"old", 30, 0)
    replica.graph.table(TABLE_STATE).delete(HANDED_KEY)  # as an older build stored it
    replica.commit()
    older = reopened(store, replica)
    assert older.handed_count is None
    counted = read_back(older)
    publish(older, rng, b"new", 7, 100)  # applied between the count and the step adopting it
    assert older.handed_count is None  # not counted: the record is missing
    assert older.adopt_count(counted) == DeliveryCount(0, older.graph.delivered_count,
                                                       *handed_out(older))
    publish(older, rng, b"later", 1, 200)
    older.commit()
    assert kept(older) == handed_out(older)
    assert kept(reopened(store, older)) == handed_out(older)  # stored


def test_a_count_left_behind_by_an_older_build_is_caught_up_from_where_it_stopped() -> None:
    # A downgrade and an upgrade again: the older build applied events without
    # counting them, so the record stops short of the delivery positions.
    replica, store, rng = authorized_topic(5)
    publish(replica, rng, b"counted", 10, 0)
    replica.commit()
    record = replica.graph.table(TABLE_STATE).get(HANDED_KEY)
    publish(replica, rng, b"uncounted", 6, 50)
    replica.graph.table(TABLE_STATE).put(HANDED_KEY, record)  # as the older build left it
    replica.commit()
    upgraded = reopened(store, replica)
    behind = upgraded.handed_count
    assert behind is not None and behind.end == upgraded.graph.delivered_count - 6
    publish(upgraded, rng, b"new", 1, 100)  # not counted on a count left behind
    assert upgraded.handed_count == behind
    more = upgraded.count_delivered(behind.end, upgraded.graph.delivered_count)
    assert more.end == upgraded.graph.delivered_count
    caught_up = upgraded.adopt_count(DeliveryCount(0, more.end, behind.delivered + more.delivered,
                                                   behind.acks + more.acks))
    assert (caught_up.delivered, caught_up.acks) == handed_out(upgraded)
    publish(upgraded, rng, b"later", 1, 200)
    assert kept(upgraded) == handed_out(upgraded)
