"""The GossipSub topic validator on real libp2p hosts (127.0.0.1): junk stops at the first node.

Three hosts in a line, attacker A — victim B — honest C (A and C are not
connected). B validates with a real engine (`Disseminator.check_gossip`) over a
replica of C's public topic. A non-member's signed events, gossiped by A,
are refused by B: never forwarded to C, never handed to B's handler, and
A's misbehaviour score rises. C's member event passes B and reaches A.
"""

from __future__ import annotations

import random
from contextlib import AsyncExitStack

import trio

from node.core.identity import Identity, sign_event
from node.peer_ids import node_id_of
from node.replica.replica import Replica
from node.state.types import RULE_PUBLIC
from storage.memory import MemoryStore
from tests.transport.mesh import CONFIG, REPLICA_CONFIG
from tests.transport.test_libp2p_host import Recorder
from transport.dissemination import Disseminator
from transport.libp2p_host import P2PHost
from transport.messages import Push, encode
from transport.misbehaviour import UNAUTHORIZED_WEIGHT

NOW_MS = 1_000_000
TIMEOUT_S = 20.0
JUNK_MESSAGES = 5


def _seed(n: int) -> bytes:
    return bytes([40 + n]) * 32


async def test_junk_gossip_is_not_forwarded_and_counts_against_its_sender() -> None:
    rng = random.Random(5)
    creator = Replica.create_topic(MemoryStore(), Identity.from_seed(_seed(3)), NOW_MS,
                                   name="open", config=REPLICA_CONFIG, authorization=True,
                                   join_rule=RULE_PUBLIC, members_write=True)
    topic_id = creator.topic_id
    gossip_name = "megnode-test-validator"
    victim = Replica(MemoryStore(), topic_id, Identity.from_seed(_seed(2)), REPLICA_CONFIG)
    for _, event in creator.deliveries(include_rejected=True):
        victim.receive(event.raw, NOW_MS)
    victim.commit()
    engine = Disseminator(Identity.from_seed(_seed(2)).public_key.hex(), rng, CONFIG)
    engine.add_topic(victim)

    with trio.fail_after(TIMEOUT_S):
        async with AsyncExitStack() as stack:
            a, b, c = [await stack.enter_async_context(P2PHost(_seed(n))) for n in (1, 2, 3)]
            got = {host.peer_id: Recorder[bytes]() for host in (a, b, c)}
            for host in (a, b, c):
                async def on_gossip(topic: str, origin: str, data: bytes,
                                    record=got[host.peer_id]) -> None:
                    record(data)
                host.set_gossip_handler(on_gossip)
            b.set_gossip_validator(
                lambda topic, forwarder, data: engine.check_gossip(
                    node_id_of(forwarder) or "", data, NOW_MS)[0])
            await a.connect(b.listen_addrs()[0])
            await c.connect(b.listen_addrs()[0])
            for host in (a, b, c):
                await host.join(gossip_name)
            await b.wait_gossip_mesh_peer(gossip_name, a.peer_id, TIMEOUT_S)
            await b.wait_gossip_mesh_peer(gossip_name, c.peer_id, TIMEOUT_S)
            await a.wait_gossip_mesh_peer(gossip_name, b.peer_id, TIMEOUT_S)
            await c.wait_gossip_mesh_peer(gossip_name, b.peer_id, TIMEOUT_S)

            attacker = Identity.from_seed(_seed(1))
            for n in range(JUNK_MESSAGES):
                raws = tuple(sign_event(attacker, topic=topic_id, seq=10 * n + k + 1,
                                        parents=[topic_id], timestamp_ms=NOW_MS, kind="message",
                                        payload=b"junk", auth=(topic_id,)).raw
                             for k in range(10))
                await a.publish(gossip_name, encode(Push(topic_id, raws)))
            # B refuses inside the library's receive path, before it would forward.
            await _wait(lambda: b.gossip_stats().refused >= JUNK_MESSAGES)

            # The honest member's event passes B and is forwarded on to A.
            event, _ = creator.publish(b"honest", NOW_MS, rng)
            creator.commit()
            good = encode(Push(topic_id, (event.raw,)))
            await c.publish(gossip_name, good)
            await got[a.peer_id].wait_until(lambda items: good in items)

            assert got[c.peer_id].items == []  # nothing of A's reached C
            assert got[b.peer_id].items == [good]  # B's own handler never saw the junk
            assert b.gossip_stats().validated == 1
            score = engine.peer_misbehaviour[node_id_of(a.peer_id) or ""]
            assert score == JUNK_MESSAGES * UNAUTHORIZED_WEIGHT
            assert not victim.graph.has(event.id)  # judging inserted nothing


async def _wait(condition) -> None:
    while not condition():
        await trio.sleep(0.01)  # polling a counter; the test's fail_after bounds it
