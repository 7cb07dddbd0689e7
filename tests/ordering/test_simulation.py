"""Seeded multi-replica runs: k indexers, m non-indexers, partial random deliveries.

Each run has a fault phase - writers publish (odd seeds add a relayed device
whose signed events go to one random writer), replicas pull random parts of
each other's graphs in random order (so events wait in the buffer and come
out as cascades), indexers acknowledge at random, and for a while the
replicas are split in two groups - then a healed phase: everyone syncs and
acknowledges until every non-ack event is confirmed everywhere. `Net.observe`
checks after every step that confirmed prefixes agree and never change; now
and then a replica's order is rebuilt from its graph (what a restart does)
and must equal the live one; the healed phase adds that everything is
confirmed and the sequences are equal.
d_max is small, so parent selection often has to choose (and must keep each
writer's chain: nothing is renumbered).

Forked runs: one of four indexers runs on two devices with one key, so its
events fork, and the siblings travel apart like any event; replicas decide
while holding one sibling. Under the former fork rule (a fork this replica
knew of voided the forker's votes) 32 of 300 such runs split replicas.
"""

from __future__ import annotations

import pytest

from node.core.order import clock
from node.replica.replica import Replica
from storage.memory import MemoryStore
from tests.ordering.world import ACK_INTERVAL_MS, Net

STEPS = 300
PARTITION = (100, 200)  # steps during which the replicas form two groups
# seed % 4 picks the configuration (1 + seed % 4 indexers, a relayed device on odd
# seeds): 12 seeds run each of the four three times; more repeat the same property.
SEEDS = range(12)


def run(seed: int) -> Net:
    indexers = [f"i{k}" for k in range(1 + seed % 4)]
    writers = ["w0", "w1"]
    relayed = ["r0"] if seed % 2 else []
    net = Net(seed, creator="i0", indexers=indexers, writers=writers, relayed=relayed, d_max=3)
    rng = net.rng
    names = sorted(net.replicas)
    groups = None
    for step in range(STEPS):
        if step == PARTITION[0]:
            shuffled = rng.sample(names, len(names))
            cut = rng.randint(1, len(names) - 1)
            groups = [set(shuffled[:cut]), set(shuffled[cut:])]
        elif step == PARTITION[1]:
            groups = None
        roll = rng.random()
        if roll < 0.3:
            author = rng.choice(indexers + writers + relayed)
            if author in relayed:  # a small device: its events wait for a writer's reference
                event = net.replicas[author].sign_relayed(b"step %d" % step, net.tick(), rng)
                net.observe(author)
                net.receive(rng.choice(writers + indexers), event.raw)
            else:
                net.publish(author, b"step %d" % step)
        elif roll < 0.8:
            into, source = rng.sample(names, 2)
            if groups is None or any(into in g and source in g for g in groups):
                net.exchange(into, source, share=rng.choice((0.3, 0.6, 1.0)))
        elif roll < 0.98:
            net.ack(rng.choice(names))
        else:
            net.audit(rng.choice(names))  # a restart now would rebuild the same order
        net.tick()
    net.now_ms += ACK_INTERVAL_MS
    net.settle()
    for name in names:
        net.audit(name)
    return net


@pytest.mark.parametrize("seed", SEEDS)
def test_confirmed_prefixes_agree_and_healing_confirms_everything(seed: int) -> None:
    net = run(seed)
    lengths = {r.ordering.confirmed_length for r in net.replicas.values()}
    assert len(lengths) == 1, net.fail("settled replicas hold different confirmed lengths")
    for name, replica in net.replicas.items():
        assert replica.ordering.pending_relayed() == [], net.fail(f"{name}: relayed left aside")
        stats = replica.ordering.stats
        assert stats["renumbered"] == 0, net.fail(f"{name}: a writer's chain was broken")
        assert replica.graph.buffered_count == 0
    assert lengths.pop() > 60, net.fail("too little was confirmed to mean anything")


FORK_STEPS = 200
FORKED_SEEDS = range(12)  # 7 and 9 split replicas under the former fork rule
FORKED_INDEXERS = ["i0", "i1", "i2", "i3"]  # four: two quorums share an honest indexer


def run_forked(seed: int) -> Net:
    """Four indexers, one of which (i1) runs on two devices that diverge: both
    publish with one key, so i1's events fork. Siblings travel apart, like any
    event, in random parts of random exchanges."""
    net = Net(seed, creator="i0", indexers=FORKED_INDEXERS, writers=["w0"], d_max=3)
    rng = net.rng
    twin = Replica(MemoryStore(), net.replicas["i1"].topic_id, net.replicas["i1"].identity,
                   net.config)
    net.replicas["i1b"] = twin
    net.exchange("i1b", "i1")
    names = sorted(net.replicas)
    for step in range(FORK_STEPS):
        roll = rng.random()
        if roll < 0.3:
            authors = [*FORKED_INDEXERS[:2], "i1b", *FORKED_INDEXERS[2:], "w0"]
            net.publish(rng.choice(authors), b"step %d" % step)
        elif roll < 0.8:
            into, source = rng.sample(names, 2)
            net.exchange(into, source, share=rng.choice((0.3, 0.6, 1.0)))
        else:
            net.ack(rng.choice(names))
        net.tick()
    net.now_ms += ACK_INTERVAL_MS
    net.settle()
    return net


@pytest.mark.parametrize("seed", FORKED_SEEDS)
def test_an_indexer_on_two_devices_does_not_split_replicas(seed: int) -> None:
    net = run_forked(seed)
    assert net.replicas["i0"].graph.equivocation_count > 0, net.fail("nothing forked")
    lengths = {r.ordering.confirmed_length for r in net.replicas.values()}
    assert len(lengths) == 1, net.fail("settled replicas hold different confirmed lengths")


# Issue 17 (flat memory): a replica's causal index keeps node positions and ids
# in the store (node.replica.order_records) behind a bounded cache. With a
# cache of two entries nearly every lookup of an older node is read back from
# the store, restarts included: the runs above must come out the same.
SMALL_CACHE_SEEDS = (1, 2, 3, 7, 9)


@pytest.mark.parametrize("seed", SMALL_CACHE_SEEDS)
def test_positions_read_back_from_the_store_give_the_same_order(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = run(seed)
    forked = run_forked(seed)
    monkeypatch.setattr(clock, "WHERE_CACHE_SIZE", 2)
    for reference, again in ((plain, run(seed)), (forked, run_forked(seed))):
        for name, replica in reference.replicas.items():
            assert again.replicas[name].ordering.confirmed == replica.ordering.confirmed, name
            assert again.replicas[name].ordering.tentative == replica.ordering.tentative, name
