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
"""

from __future__ import annotations

import pytest

from tests.ordering.world import ACK_INTERVAL_MS, Net

STEPS = 300
PARTITION = (100, 200)  # steps during which the replicas form two groups
SEEDS = range(24)


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
