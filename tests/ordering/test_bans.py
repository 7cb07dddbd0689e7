"""Bans that hold in the total order (node.replica.order_bans), through real Replicas.

A banned writer that has not heard of its ban (or pretends not to) keeps
writing on parents from before it. Those events are valid in their own past,
so every replica keeps them in its graph; the order must still leave out
every one of them that it places after the ban, on every replica alike,
and a replay must leave out the same.
"""

from __future__ import annotations

from node.core.event import KIND_MESSAGE
from storage.memory import MemoryStore
from node.state.types import AuthReason
from tests.ordering.world import ACK_INTERVAL_MS, Net


def _confirm_on_alice(net: Net, event_id: bytes) -> None:
    """Let alice (the lone indexer) confirm `event_id` before anything else reaches her."""
    for _ in range(4):
        if net.replicas["alice"].ordering.is_confirmed(event_id):
            return
        net.now_ms += ACK_INTERVAL_MS
        net.ack("alice")
    raise AssertionError("the ban was not confirmed")


def _ban_and_keep_writing(seed: int, writes: int = 5,
                          stores: dict | None = None) -> tuple[Net, list[bytes], list[bytes]]:
    """alice (the indexer) bans xavier; xavier, not told, writes on and rejoins itself;
    bob takes xavier's writes before he hears of the ban, and builds on them."""
    net = Net(seed, creator="alice", indexers=["alice"], writers=["bob", "xavier"],
              stores=stores)
    before = [net.publish("xavier", b"before %d" % n).id for n in range(2)]
    net.sync_all()
    ban, received = net.replicas["alice"].ban(net.key("xavier"), net.tick(), net.rng)
    net.observe("alice", received)
    _confirm_on_alice(net, ban.id)
    after = [net.publish("xavier", b"after %d" % n).id for n in range(writes)]
    rejoin, received = net.replicas["xavier"].join(net.tick(), net.rng)
    net.observe("xavier", received)
    after.append(rejoin.id)
    after.append(net.publish("xavier", b"after the rejoin").id)
    net.exchange("bob", "xavier")
    net.publish("bob", b"bob saw xavier's writes")
    net.settle()
    return net, before, after


def test_a_banned_writer_s_later_events_leave_every_view_on_every_replica() -> None:
    net, before, after = _ban_and_keep_writing(31)
    confirmed = {r.ordering.confirmed for r in net.replicas.values()}
    assert len(confirmed) == 1
    view = confirmed.pop()
    assert all(b in view for b in before)  # ordered before the ban: they stay
    for name, replica in net.replicas.items():
        order = replica.ordering
        for event_id in after:
            assert replica.graph.has(event_id), f"{name}: the graph keeps every valid vertex"
            assert not replica.is_rejected(event_id)  # valid in its own past
            assert order.is_excluded(event_id) and not order.is_confirmed(event_id)
            assert event_id not in order.tentative
            assert event_id not in view
        assert order.stats["excluded"] == len(after)
        assert order.stats[f"excluded.{AuthReason.BANNED}"] == 1  # the self-rejoin
        positions = [p for p, _ in replica.ordered("confirmed", 0, 10**9)]
        assert positions == list(range(len(view)))  # positions count only what stays
        net.audit(name)  # a replay leaves out the same events
    # Soft fail is per node: alice had the ban when xavier's events came, so she
    # keeps them out of her causal view; bob took them before he heard of it.
    causal = {n: {e.id for _, e in r.ordered("causal", 0, 10**9)} for n, r in net.replicas.items()}
    assert all(net.replicas["alice"].is_soft_failed(e) for e in after)
    assert not causal["alice"] & set(after)
    assert set(after) <= causal["bob"]


def test_exclusions_survive_a_restart_and_new_events_after_it() -> None:
    store = MemoryStore()
    net, _, after = _ban_and_keep_writing(32, writes=3, stores={"bob": store})
    net.commit_all()
    reopened = net.restart("bob", store)
    assert reopened.ordering.confirmed == net.replicas["alice"].ordering.confirmed
    assert all(reopened.ordering.is_excluded(e) for e in after)
    assert reopened.ordering.stats["excluded"] == len(after)
    later = net.publish("alice", b"later")
    net.settle()
    assert later.kind == KIND_MESSAGE and reopened.ordering.is_confirmed(later.id)


def test_a_ban_concurrent_with_writes_keeps_those_ordered_before_it() -> None:
    # Two indexers; xavier's writes reach bob, whose anchor orders them, before
    # alice's ban is placed: whatever the order places before the ban stays,
    # whatever it places after goes, and every replica agrees on which is which.
    net = Net(33, creator="alice", indexers=["alice", "bob"], writers=["xavier"])
    writes = [net.publish("xavier", b"w%d" % n).id for n in range(3)]
    net.exchange("bob", "xavier")
    net.ack("bob")
    net.replicas["alice"].ban(net.key("xavier"), net.tick(), net.rng)
    net.settle()
    views = {r.ordering.confirmed for r in net.replicas.values()}
    assert len(views) == 1
    excluded = {tuple(r.ordering.is_excluded(w) for w in writes) for r in net.replicas.values()}
    assert len(excluded) == 1
    for name in net.replicas:
        net.audit(name)


def test_soft_failed_events_are_kept_but_not_built_on_delivered_or_acked() -> None:
    net = Net(34, creator="alice", indexers=["alice"], writers=["xavier"])
    net.sync_all()
    ban, received = net.replicas["alice"].ban(net.key("xavier"), net.tick(), net.rng)
    net.observe("alice", received)
    _confirm_on_alice(net, ban.id)
    late = net.publish("xavier", b"after the ban")
    alice = net.replicas["alice"]
    received = net.receive("alice", late.raw)
    assert received.soft_failed == ((late.id, "banned"),) and not received.unauthorized
    assert alice.counters["soft_failed"] == 1 and alice.counters["soft_failed.banned"] == 1
    assert alice.graph.has(late.id) and late.id in alice.graph.extremities()
    assert late.id not in {e.id for _, e in alice.deliveries(0, 10**6)}
    assert late.id in {e.id for _, e in alice.deliveries(0, 10**6, include_rejected=True)}
    after = net.publish("alice", b"on the honest heads only")
    assert late.id not in after.parents
    net.now_ms += 10 * ACK_INTERVAL_MS
    net.ack("alice")  # may confirm alice's own message
    net.now_ms += 10 * ACK_INTERVAL_MS
    assert net.ack("alice") is None  # nothing left that alice could ever vote for


def test_a_local_event_keeps_our_chain_when_only_a_soft_failed_head_covers_it() -> None:
    """bob's latest event has one event above it: xavier's write, made before xavier heard
    of its ban and soft-failed at bob, who had the ban first (so never a parent there).
    The ban itself does not cover bob's event. bob's next event names its own latest
    one beside the ban, so bob's events stay a chain (the linearizer's writer numbering
    assumes one), and the state it is checked in holds what bob's own events set (seed
    11 of the 40-node private banned world: a join; regression)."""
    net = Net(41, creator="alice", indexers=["alice"], writers=["bob", "xavier"])
    net.sync_all()
    latest = net.publish("bob", b"bob's latest").id
    net.exchange("xavier", "bob")
    ban, received = net.replicas["alice"].ban(net.key("xavier"), net.tick(), net.rng)
    net.observe("alice", received)
    write = net.publish("xavier", b"on bob's latest, before hearing of the ban")
    assert latest in write.parents
    net.exchange("bob", "alice")  # the ban first: xavier's write is soft-failed at bob
    net.exchange("bob", "xavier")
    bob = net.replicas["bob"]
    assert bob.is_soft_failed(write.id) and set(bob.graph.extremities()) == {ban.id, write.id}
    after = net.publish("bob", b"bob again")
    assert sorted(after.parents) == sorted([ban.id, latest])
    assert bob.counters["own_chain_kept_below_soft_failed"] == 1
