"""A batch publish on the gossipsub fast path: gossiped, one message per chunk.

Two real nodes (`Node.open`: LMDB in tmp dirs, libp2p and gossipsub on
127.0.0.1) with fast_path "gossipsub". `Topic.publish_many` must hand the
batch to gossipsub (it once did not, so only anti-entropy carried it), and as
a few large messages, not one per event. Waits are bounded.
"""

from __future__ import annotations

from pathlib import Path

import trio

from node.config import NodeConfig
from node.runtime import GOSSIP_TOPIC_PREFIX, Node

LOOPBACK_LISTEN = ["/ip4/127.0.0.1/tcp/0"]
WAIT_S = 30.0
EVENTS = 300
GOSSIP = NodeConfig(fast_path="gossipsub")


async def test_publish_many_is_gossiped_in_one_message_per_chunk(tmp_path: Path) -> None:
    with trio.fail_after(WAIT_S * 2):
        async with Node.open(tmp_path / "a", listen=LOOPBACK_LISTEN, config=GOSSIP, seed=1) as a:
            topic_a = await a.create_topic("batch")
            async with Node.open(tmp_path / "b", listen=LOOPBACK_LISTEN, config=GOSSIP,
                                 bootstrap=[a.addresses[0]], seed=2) as b:
                topic_b = await b.join(topic_a.topic_id)
                await topic_b.wait_ready(WAIT_S)
                await a.host.wait_gossip_mesh_peer(GOSSIP_TOPIC_PREFIX + topic_a.id_hex,
                                                   b.host.peer_id, WAIT_S)
                published = a.host.gossip_stats().published
                received = b.disseminator.stats.get("received_gossip", 0)
                before = topic_b.replica.graph.delivered_count
                await topic_a.publish_many([f"event {n}".encode() for n in range(EVENTS)])
                await topic_b.wait_delivered(before + EVENTS, WAIT_S)
                assert 1 <= a.host.gossip_stats().published - published <= 2  # a chunk, not 300
                assert b.disseminator.stats.get("received_gossip", 0) > received
