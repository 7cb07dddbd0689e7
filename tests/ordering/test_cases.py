"""The ordering examples of issue 5, through real Replicas that exchange raw events.

Every world starts from a settled topic whose indexer set has just been
switched by the creator's power levels event, so the next indexer node is
the first of a new epoch (round 0), as in the design document's examples.
"""

from __future__ import annotations

import random

import pytest

from node.core.event import KIND_MESSAGE
from node.replica.replica import OrderingDisabledError, RoleError
from node.replica.ordering import KIND_ACK
from node.state.roles import Role
from tests.helpers import new_topic
from tests.ordering.world import ACK_INTERVAL_MS, Net


def test_two_indexers_a0_is_confirmed_at_b0() -> None:
    net = Net(1, creator="carol", indexers=["alice", "bob"], writers=["xavier"])
    assert net.key("alice") < net.key("bob")  # alice leads round 0
    a0 = net.publish("alice", b"a0")
    assert net.replicas["alice"].ordering.tentative == (a0.id,)
    net.exchange("bob", "alice")
    b0, received = net.replicas["bob"].publish(b"b0", net.tick(), net.rng)
    net.observe("bob", received)
    assert b0.parents == (a0.id,)
    assert received.order.confirmed_appended == (a0.id,)
    assert received.order.tentative == (b0.id,)
    assert net.receive("alice", b0.raw).order.confirmed_appended == (a0.id,)
    for name in ("carol", "xavier"):
        net.exchange(name, "bob")
        assert net.replicas[name].ordering.confirmed[-1] == a0.id


def test_non_indexer_events_wait_and_are_confirmed_with_the_indexer_event_referencing_them(
) -> None:
    net = Net(2, creator="carol", indexers=["alice"], writers=["xavier"])
    x0, x1 = net.publish("xavier", b"x0"), net.publish("xavier", b"x1")
    assert net.replicas["xavier"].ordering.tentative == (x0.id, x1.id)
    net.exchange("alice", "xavier")
    alice = net.replicas["alice"].ordering
    assert alice.tentative == (x0.id, x1.id) and not alice.is_confirmed(x0.id)
    a0, received = net.replicas["alice"].publish(b"a0", net.tick(), net.rng)
    net.observe("alice", received)
    assert x1.id in a0.parents
    assert received.order.confirmed_appended == (x0.id, x1.id, a0.id)
    assert net.receive("xavier", a0.raw).order.confirmed_appended == (x0.id, x1.id, a0.id)


def test_a_lone_indexer_acks_once_after_writing_then_falls_silent() -> None:
    # A lone indexer's nodes alternate between anchor rounds and the rounds
    # between them. After a settled state (its last node an anchor) one write
    # is confirmed by the single ack that follows it; of two writes in a row,
    # the second is an anchor and confirms both: no ack.
    net = Net(3, creator="alice", indexers=["alice"], writers=["xavier"])
    alice = net.replicas["alice"]
    acks_before = alice.counters["acks"]
    for burst in (1, 2, 1, 2):
        events = [net.publish("alice", b"m%d" % n) for n in range(burst)]
        net.now_ms += ACK_INTERVAL_MS
        made = net.ack("alice")
        assert (made is None) == (burst == 2)
        assert all(alice.ordering.is_confirmed(e.id) for e in events)
        net.now_ms += ACK_INTERVAL_MS
        assert net.ack("alice") is None
    assert alice.counters["acks"] - acks_before == 2


def test_acks_are_rate_limited_and_stop_when_only_acks_are_unconfirmed() -> None:
    net = Net(4, creator="alice", indexers=["alice", "bob", "dave"], writers=["xavier"])
    net.publish("xavier", b"hello")
    net.sync_all()
    assert net.ack("bob") is not None
    assert net.ack("bob") is None  # same instant: rate-limited
    rounds = net.settle()
    assert rounds >= 1
    net.now_ms += 10 * ACK_INTERVAL_MS
    assert [net.ack(n) for n in sorted(net.replicas)] == [None] * len(net.replicas)
    tentative = net.replicas["alice"].ordering.tentative
    assert all(net.replicas["alice"].graph.get(i).kind == KIND_ACK for i in tentative)


def test_an_indexer_added_mid_run_counts_once_its_promotion_is_confirmed() -> None:
    net = Net(5, creator="alice", indexers=["alice", "bob"], writers=["dave", "xavier"])
    for n in range(4):
        net.publish("xavier", b"before %d" % n)
        net.exchange("bob", "xavier", share=0.7)
        net.ack("bob")
        net.sync_all(["alice", "bob"])
        net.ack("alice")
    made = net.replicas["alice"].set_role(net.key("dave"), Role.INDEXER, net.tick(), net.rng)
    promotion = made[-1][0]
    net.observe("alice", made[-1][1])
    assert net.replicas["alice"].ordering.indexers == {net.key("alice"), net.key("bob")}
    for n in range(6):
        net.publish("dave", b"after %d" % n)
        net.sync_all()
        for name in sorted(net.replicas):
            net.ack(name)
            net.now_ms += ACK_INTERVAL_MS
    net.settle()
    want = frozenset(net.key(n) for n in ("alice", "bob", "dave"))
    switch_points = set()
    for name, replica in net.replicas.items():
        assert replica.ordering.indexers == want
        point, indexers = net.switches[name][-1]
        assert indexers == want
        confirmed = replica.ordering.confirmed
        assert confirmed.index(promotion.id) < point  # effective only once confirmed
        switch_points.add(confirmed[:point])
    assert len(switch_points) == 1  # the same point of the confirmed order everywhere


def test_an_indexer_that_steps_down_stops_counting_once_that_is_confirmed() -> None:
    net = Net(12, creator="alice", indexers=["alice", "bob", "dave"], writers=["xavier"])
    made = net.replicas["dave"].set_role(net.key("dave"), Role.WRITER, net.tick(), net.rng)
    net.observe("dave", made[-1][1])
    step_down = made[-1][0]
    assert net.replicas["dave"].ordering.indexers == {net.key(n) for n in ("alice", "bob", "dave")}
    net.settle()
    want = frozenset(net.key(n) for n in ("alice", "bob"))
    points = {r.ordering.confirmed[:net.switches[n][-1][0]] for n, r in net.replicas.items()}
    assert len(points) == 1 and step_down.id in points.pop()
    assert all(r.ordering.indexers == want for r in net.replicas.values())
    # dave is silent from now on; alice and bob alone (a quorum of two) confirm.
    note = net.publish("xavier", b"after dave left")
    for _ in range(4):
        net.sync_all(["alice", "bob", "xavier"])
        net.now_ms += ACK_INTERVAL_MS
        net.ack("alice")
        net.ack("bob")
    assert net.replicas["xavier"].ordering.is_confirmed(note.id)


def test_relayed_events_are_ordered_once_a_writer_references_them() -> None:
    net = Net(6, creator="alice", indexers=["alice"], writers=["xavier"], relayed=["rhea"])
    device = net.replicas["rhea"]
    r0 = device.sign_relayed(b"r0", net.tick(), net.rng)
    r1 = device.sign_relayed(b"r1", net.tick(), net.rng)
    assert r0.id in r1.parents  # a relayed chain
    assert device.ordering.pending_relayed() == sorted([r0.id, r1.id])
    assert r0.id not in device.ordering.tentative
    net.receive("xavier", r0.raw)
    net.receive("xavier", r1.raw)  # xavier is the relay
    xavier = net.replicas["xavier"].ordering
    assert xavier.pending_relayed() == sorted([r0.id, r1.id]) and xavier.tentative == ()
    ack = net.ack("xavier")  # the relay duty: reference them promptly
    assert ack is not None and r1.id in ack.parents
    assert xavier.tentative == (r0.id, r1.id, ack.id) and xavier.pending_relayed() == []
    net.settle()
    for replica in net.replicas.values():
        assert {r0.id, r1.id} <= set(replica.ordering.confirmed)


def test_a_relayed_event_nobody_references_is_never_ordered() -> None:
    net = Net(7, creator="alice", indexers=["alice", "bob"], writers=["xavier"], relayed=["rhea"],
              readers=["olga"])
    lost = net.replicas["rhea"].sign_relayed(b"nobody relays me", net.tick(), net.rng)
    net.receive("olga", lost.raw)  # a reader: no relay duty, never writes
    assert net.ack("olga") is None
    active = ["alice", "bob", "xavier"]
    for n in range(5):
        net.publish("xavier", b"m%d" % n)
        net.sync_all(active)
        for name in active:
            net.ack(name)
        net.now_ms += ACK_INTERVAL_MS
        net.sync_all(active)
        net.exchange("olga", "alice")
    olga = net.replicas["olga"]
    assert olga.graph.has(lost.id)
    assert olga.ordering.pending_relayed() == [lost.id]
    assert lost.id not in olga.ordering.confirmed + olga.ordering.tentative
    assert olga.ordering.confirmed == net.replicas["alice"].ordering.confirmed[
        :olga.ordering.confirmed_length]
    assert olga.ordering.confirmed_length > 20


def test_sign_relayed_is_for_relayed_writers_only() -> None:
    net = Net(8, creator="alice", indexers=["alice"], writers=["xavier"])
    with pytest.raises(RoleError, match="relayed"):
        net.replicas["xavier"].sign_relayed(b"x", net.tick(), net.rng)


def test_local_events_keep_their_chain_and_reference_pending_relayed_events_first() -> None:
    net = Net(9, creator="alice", indexers=["alice"], writers=["w1", "w2", "w3", "xavier"],
              relayed=["rhea"], d_max=2)
    for name in ("w1", "w2", "w3"):
        net.publish(name, b"concurrent")
    relayed = net.replicas["rhea"].sign_relayed(b"r", net.tick(), net.rng)
    mine = net.publish("xavier", b"mine")
    for name in ("w1", "w2", "w3", "rhea"):
        net.exchange("xavier", name)
    xavier = net.replicas["xavier"]
    assert xavier.graph.width == 5
    event, _ = xavier.publish(b"next", net.tick(), net.rng)
    assert set(event.parents) == {mine.id, relayed.id}
    net.settle()
    for replica in net.replicas.values():
        assert replica.ordering.stats["renumbered"] == 0  # every writer stayed a chain
        assert relayed.id in replica.ordering.confirmed


def test_views_and_status() -> None:
    net = Net(10, creator="alice", indexers=["alice", "bob"], writers=["xavier"])
    bob = net.replicas["bob"]
    base = bob.ordering.confirmed_length
    view = [e.id for _, e in bob.ordered("tentative", 0, 10**6)]
    rewinds = []

    def subscriber(update) -> None:
        # A tentative-view subscriber: truncate to rewind_to, re-read the rest.
        rewinds.append(len(view) - update.rewind_to)
        del view[update.rewind_to:]
        view.extend(e.id for _, e in bob.ordered("tentative", len(view), 10**6))

    net.listeners["bob"] = subscriber
    for n in range(8):
        net.publish("xavier", b"x%d" % n)
        net.publish("alice", b"a%d" % n)
        net.exchange("bob", "xavier", share=0.6)
        net.exchange("bob", "alice", share=0.6)
        net.ack("bob")
        net.now_ms += ACK_INTERVAL_MS
        net.sync_all(["alice", "xavier"])
    net.settle()
    order = bob.ordering
    assert view == list(order.confirmed + order.tentative)
    assert any(rewinds)  # the tentative tail did reorder at least once
    confirmed = bob.ordered("confirmed", base, 3)
    assert [p for p, _ in confirmed] == [base, base + 1, base + 2]
    assert [e.id for _, e in confirmed] == list(order.confirmed[base:base + 3])
    causal = bob.ordered("causal", 0, 5)
    assert [p for p, _ in causal] == [0, 1, 2, 3, 4] and causal[0][1].is_create
    status = bob.order_status()
    assert status.confirmed_length == order.confirmed_length
    assert status.tentative_length == order.tentative_length
    assert status.indexers == tuple(sorted(net.key(n).hex() for n in ("alice", "bob")))
    assert status.as_dict()["indexers"] == list(status.indexers)
    with pytest.raises(ValueError, match="order must be"):
        bob.ordered("random")


def test_a_pure_meg_topic_keeps_no_order() -> None:
    replica = new_topic()
    assert replica.ordering is None and replica.order_status() is None
    with pytest.raises(OrderingDisabledError):
        replica.ordered("confirmed")
    assert replica.ordered("causal")[0][1].is_create
    assert replica.maybe_ack(5_000, random.Random(1)) is None


def test_a_rejected_event_is_never_a_parent_nor_ordered() -> None:
    from node.core.identity import sign_event
    from node.state.auth_rules import EventFields, select_auth_refs

    net = Net(11, creator="alice", indexers=["alice"], writers=["xavier"], readers=["olga"])
    olga = net.replicas["olga"]
    state = olga._current_state()
    parents = olga.graph.extremities()
    refs = select_auth_refs(EventFields(KIND_MESSAGE, net.key("olga")), state)
    forged = sign_event(olga.identity, topic=olga.topic_id, seq=5, parents=parents,
                        timestamp_ms=net.tick(), kind=KIND_MESSAGE, payload=b"no power",
                        auth=refs)
    received = net.receive("xavier", forged.raw)
    assert received.unauthorized and received.order is None
    assert not net.replicas["xavier"].graph.has(forged.id)  # refused: never a vertex
    child = net.publish("xavier", b"written after the refusal")
    assert forged.id not in child.parents and set(child.parents) == set(parents)
    net.settle()
    for name in ("alice", "xavier"):
        order = net.replicas[name].ordering
        assert child.id in order.confirmed and forged.id not in order.confirmed
        assert order.stats["rejected_skipped"] == 0  # no proxy: nothing rejected was fed
