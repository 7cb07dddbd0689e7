"""Counting what subscribers were handed (`status`'s `delivered` and `acks`) from the
verdicts the replica noted when it applied each event, instead of reading every
event back (`node.replica.delivery_verdicts`).

What must hold: the count from the notes is the count of what `Replica.deliveries`
hands out, in worlds where events are withheld (history), soft-failed (a banned
writer), acknowledged and restarted from the store, and after a step's writes
were discarded.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from node.core.identity import Identity
from node.replica.delivery_verdicts import ACK, VISIBLE, DeliveryVerdicts
from node.replica.ordering import KIND_ACK
from node.replica.replica import Replica
from storage.memory import MemoryStore
from transport.sim import Cluster, Scenario

BANNED = Scenario(seed=0, nodes=20, rounds=12, writers=3, banned_writer=True, loss=0.05,
                  partition_at_ms=1_000, heal_at_ms=2_000, crashes=1)
LATE = Scenario(seed=11, nodes=20, outsiders=5, invite=True, history="joined", late=3,
                rounds=10, writers=3, loss=0.05, partition_at_ms=500, heal_at_ms=2_000)


def counted(replica: Replica, seed: int = 0) -> tuple[int, int]:
    """(delivered, acks) by `count_delivered`, over ranges of random lengths."""
    rng = random.Random(seed)
    position = delivered = acks = 0
    while position < replica.graph.delivered_count:
        count = replica.count_delivered(position, position + rng.randint(1, 700))
        assert count.start == position < count.end
        delivered, acks, position = delivered + count.delivered, acks + count.acks, count.end
    return delivered, acks


def handed_out(replica: Replica) -> tuple[int, int]:
    """(delivered, acks) of what `deliveries` hands out, read back from the store."""
    events = [e for _, e in replica.deliveries(0, limit=replica.graph.delivered_count + 1)]
    return len(events), sum(e.kind == KIND_ACK for e in events)


# ------------------------------------------------------------------ the notes


def test_the_notes_count_visible_positions_and_acks_among_them() -> None:
    notes = DeliveryVerdicts()
    assert notes.count(0, 10) is None  # nothing noted: read back
    notes.note(5, bytes([VISIBLE, VISIBLE | ACK, 0, ACK, VISIBLE]))
    assert notes.count(4, 10) is None  # position 4 was not noted
    count = notes.count(5, 100)
    assert (count.start, count.end, count.delivered, count.acks) == (5, 10, 3, 1)
    notes.hide(6)  # soft-failed after all
    notes.hide(99)  # not noted: nothing to hide
    count = notes.count(6, 8)
    assert (count.end, count.delivered, count.acks) == (8, 0, 0)
    notes.note(10, bytes([VISIBLE]))  # continues the run
    assert (notes.start, notes.end) == (5, 11)
    notes.note(20, bytes([VISIBLE]))  # a gap: the new run replaces the old
    assert (notes.start, notes.end) == (20, 21) and notes.count(5, 10) is None
    notes.clear()
    assert notes.count(20, 21) is None


def test_the_notes_keep_the_newest_positions_within_their_bound() -> None:
    notes = DeliveryVerdicts(kept=100)
    for start in range(0, 1_000, 7):
        notes.note(start, bytes([VISIBLE]) * 7)
    assert notes.end == 1_001 and 100 <= notes.end - notes.start <= 125
    assert notes.count(notes.start, notes.end).delivered == notes.end - notes.start


# ------------------------------------------------------- against deliveries()


@pytest.mark.parametrize("scenario", [BANNED, replace(BANNED, seed=1), LATE],
                         ids=["banned-0", "banned-1", "history-11"])
def test_the_count_is_what_subscribers_are_handed_in_seeded_worlds(scenario: Scenario) -> None:
    cluster = Cluster.from_scenario(scenario)
    assert cluster.run().converged
    hidden = 0  # applied but not handed out: withheld or soft-failed
    for node in cluster.nodes:
        replica = node.replica
        notes = replica.delivery_verdicts
        # Noted from its create event, or, for the world's crashed node, from its
        # restart on: what came before is read back.
        assert notes.end == replica.graph.delivered_count
        assert notes.start == 0 or scenario.crashes and notes.start < notes.end
        assert counted(replica, node.index) == handed_out(replica)
        hidden += replica.graph.delivered_count - handed_out(replica)[0]
    assert hidden > 0  # the worlds had events to leave out
    assert any(handed_out(node.replica)[1] for node in cluster.nodes)  # and acks


def test_the_count_holds_after_pending_writes_are_discarded() -> None:
    store = MemoryStore()
    rng = random.Random(3)
    replica = Replica.create_topic(store, Identity.from_seed(bytes(32)), now_ms=0, authorization=True)
    for n in range(20):
        replica.publish(b"kept %d" % n, now_ms=n, rng=rng)
    replica.commit()
    for n in range(10):
        replica.publish(b"lost %d" % n, now_ms=100 + n, rng=rng)
    replica.graph.discard_pending()  # a failed commit: these positions are reused
    assert replica.delivery_verdicts.count(21, 40) is None
    for n in range(5):
        replica.publish(b"again %d" % n, now_ms=200 + n, rng=rng)
    replica.commit()
    assert counted(replica) == handed_out(replica)
    assert handed_out(replica)[0] == replica.graph.delivered_count  # all handed out here
    assert replica.delivery_verdicts.count(replica.graph.delivered_count - 5, 10**6) is not None
