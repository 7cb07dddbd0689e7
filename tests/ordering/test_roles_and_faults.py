"""Faults around the order: an equivocating indexer, a restart, a damaged order record."""

from __future__ import annotations

import pytest

from node.replica.replica import Replica
from node.replica.ordering import OrderIntegrityError
from storage.lmdb_store import LmdbStore
from storage.memory import MemoryStore
from node.core.store import TABLE_ORDER, Put
from tests.ordering.world import ACK_INTERVAL_MS, Net

ROUNDS_APART = 6  # publish-sync-ack rounds the two groups spend apart


def test_an_indexer_on_two_devices_equivocates_and_replicas_still_agree() -> None:
    net = Net(21, creator="alice", indexers=["alice", "bob", "dave"], writers=["xavier"])
    # bob's key on a second device: a copy of bob's replica that diverges.
    twin = Replica(MemoryStore(), net.replicas["bob"].topic_id, net.replicas["bob"].identity,
                   net.config)
    net.replicas["bob2"] = twin
    net.exchange("bob2", "bob")
    parent = net.publish("bob", b"bob's last common event")
    net.exchange("bob2", "bob")
    one = net.publish("bob", b"one")
    other = net.publish("bob2", b"other")
    assert (one.author, one.seq) == (other.author, other.seq) and one.id != other.id
    # The siblings reach each replica together: both wait for their parent and
    # come out of the buffer in one cascade, so one batch shows the fork.
    for name in ("alice", "dave", "xavier"):
        net.receive(name, one.raw)
        net.receive(name, other.raw)
        received = net.receive(name, parent.raw)
        assert {e.id for e in received.equivocations} & {one.id, other.id}
    for n in range(4):
        net.publish("xavier", b"x%d" % n)
        net.sync_all()
        for name in ("alice", "dave", "xavier"):
            net.ack(name)
        net.now_ms += ACK_INTERVAL_MS
    del net.replicas["bob2"]  # the twin goes away; bob's own node carries on
    net.settle()
    confirmed = {r.ordering.confirmed for r in net.replicas.values()}
    assert len(confirmed) == 1
    assert {one.id, other.id} <= set(confirmed.pop())


def test_an_equivocating_indexer_whose_siblings_arrive_in_different_batches() -> None:
    # Four indexers (two quorums of three share two: one honest). bob's twin
    # signs a sibling of bob's event. For a while {alice, bob, carol, xavier}
    # hold one sibling and confirm with it; {dave, bob2} hold the other. Then all
    # meet: each replica gets the second sibling as a batch of its own, after
    # it decided. `Net.observe` checks after every arrival that confirmed
    # prefixes agree and never change.
    net = Net(24, creator="alice", indexers=["alice", "bob", "carol", "dave"], writers=["xavier"])
    twin = Replica(MemoryStore(), net.replicas["bob"].topic_id, net.replicas["bob"].identity,
                   net.config)
    net.replicas["bob2"] = twin
    net.exchange("bob2", "bob")
    one = net.publish("bob", b"one")
    other = net.publish("bob2", b"other")
    groups = (["alice", "bob", "carol", "xavier"], ["dave", "bob2"])
    before = net.replicas["alice"].ordering.confirmed_length
    for _ in range(ROUNDS_APART):
        net.publish("xavier", b"x")
        for group in groups:
            net.sync_all(group)
            for name in group:
                net.ack(name)
        net.now_ms += ACK_INTERVAL_MS
    assert not net.replicas["alice"].graph.has(other.id)
    assert not net.replicas["dave"].graph.has(one.id)
    assert net.replicas["alice"].ordering.confirmed_length > before  # decided on one sibling
    del net.replicas["bob2"]  # its events travel on with dave
    net.settle()
    confirmed = {r.ordering.confirmed for r in net.replicas.values()}
    assert len(confirmed) == 1
    assert {one.id, other.id} <= set(confirmed.pop())


def test_a_restart_keeps_the_confirmed_prefix(tmp_path) -> None:
    stores = {name: LmdbStore(tmp_path / name) for name in ("alice", "bob", "xavier")}
    net = Net(22, creator="alice", indexers=["alice", "bob"], writers=["xavier"], stores=stores)
    for n in range(30):
        net.publish("xavier", b"x%d" % n)
        net.exchange("bob", "xavier", share=0.5)
        net.exchange("alice", "bob", share=0.5)
        net.exchange("bob", "alice", share=0.5)
        net.ack(["alice", "bob"][n % 2])
        net.tick()
    net.commit_all()
    before = net.replicas["bob"].ordering
    confirmed, tentative = before.confirmed, before.tentative
    assert len(confirmed) > 20 and tentative
    stores["bob"].close()
    bob = net.restart("bob", LmdbStore(tmp_path / "bob"))
    assert bob.ordering.confirmed == confirmed and bob.ordering.tentative == tentative
    assert bob.ordering.stats["persisted_on_replay"] == 0  # nothing was missing on disk
    net.settle()  # and it carries on, still agreeing with the others
    assert bob.ordering.confirmed[:len(confirmed)] == confirmed
    for store in stores.values():
        store.close()


def test_a_damaged_order_record_is_refused_on_restart() -> None:
    store = MemoryStore()
    net = Net(23, creator="alice", indexers=["alice"], writers=["xavier"],
              stores={"alice": store})
    net.publish("xavier", b"x")
    net.sync_all()
    net.settle()
    net.commit_all()
    topic = net.replicas["alice"].topic_id
    store.apply([Put(TABLE_ORDER, topic + b"c" + (3).to_bytes(8, "big"), b"\x07" * 32)])
    with pytest.raises(OrderIntegrityError, match="position 3"):
        Replica(store, topic, net.replicas["alice"].identity, net.config).ordering
