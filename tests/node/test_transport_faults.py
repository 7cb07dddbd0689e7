"""The node's ban policy for what the transport reports about a peer's streams.

A real node (`Node.open`: LMDB in a tmp dir, libp2p on 127.0.0.1) and a real
adversary host that writes raw bytes on the node's dissemination protocol.
Streams cut mid-frame are what dying connections look like, so no number of
them bans anyone; protocol faults ban at TRANSPORT_FAULTS_BEFORE_BAN. Every
wait polls a condition under a bound.
"""

from __future__ import annotations

from pathlib import Path

import trio
from libp2p.custom_types import TProtocol

from node.runtime import PROTOCOL_DISSEMINATION, TRANSPORT_FAULTS_BEFORE_BAN, Node
from transport.framing import encode_uvarint
from transport.libp2p_gossip import GossipConfig
from transport.libp2p_host import P2PHost
from transport.libp2p_streams import close_quietly, parse_peer_id
from transport.messages import MAX_FRAME_BYTES

LOOPBACK_LISTEN = ["/ip4/127.0.0.1/tcp/0"]
TEST_TIMEOUT_S = 30.0
POLL_S = 0.02
BREAKAGES = 2 * TRANSPORT_FAULTS_BEFORE_BAN  # more than would ban, were they counted


async def write_raw(adversary: P2PHost, node: Node, data: bytes, *, reset: bool) -> None:
    """Open a dissemination stream to `node`, write `data`, then close or reset it."""
    stream = await adversary.libp2p.new_stream(parse_peer_id(node.host.peer_id),
                                               [TProtocol(PROTOCOL_DISSEMINATION)])
    await stream.write(data)
    await close_quietly(stream, reset=reset)


async def wait_stat(node: Node, name: str, value: int) -> None:
    while node.stats.get(name, 0) < value:
        await trio.sleep(POLL_S)


async def test_cut_streams_never_ban_protocol_faults_do(tmp_path: Path) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with Node.open(tmp_path / "node", listen=LOOPBACK_LISTEN, seed=1) as node, \
                P2PHost(bytes([7]) * 32, gossip=GossipConfig(enabled=False)) as adversary:
            await adversary.connect(node.addresses[0])
            # A frame that announces 100 bytes and ends after 10: a stream cut mid-frame.
            cut = encode_uvarint(100) + b"x" * 10
            for _ in range(BREAKAGES):
                await write_raw(adversary, node, cut, reset=False)
            await wait_stat(node, "transport_breakages", BREAKAGES)
            assert node.stats.get("transport_faults", 0) == 0
            assert adversary.peer_id in node.host.peers()

            # A length prefix longer than any varint: a protocol fault of weight 1.
            malformed = b"\xff" * 11
            for count in range(1, TRANSPORT_FAULTS_BEFORE_BAN):
                await write_raw(adversary, node, malformed, reset=True)
                await wait_stat(node, "transport_faults", count)
            assert node.stats.get("transport_bans", 0) == 0
            assert adversary.peer_id in node.host.peers()

            await write_raw(adversary, node, malformed, reset=True)
            await wait_stat(node, "transport_bans", 1)
            while adversary.peer_id in node.host.peers():  # disconnected, and stays out
                await trio.sleep(POLL_S)


async def test_one_oversized_frame_bans_at_once(tmp_path: Path) -> None:
    """Our own encoder never makes a frame over the bound, so one is proof enough
    (OVERSIZED_FRAME_WEIGHT faults at once: node.core.peer_policy)."""
    with trio.fail_after(TEST_TIMEOUT_S):
        async with Node.open(tmp_path / "node", listen=LOOPBACK_LISTEN, seed=1) as node, \
                P2PHost(bytes([7]) * 32, gossip=GossipConfig(enabled=False)) as adversary:
            await adversary.connect(node.addresses[0])
            await write_raw(adversary, node, encode_uvarint(MAX_FRAME_BYTES + 1), reset=True)
            await wait_stat(node, "transport_bans", 1)
            assert node.stats.get("transport_faults", 0) == 1
            while adversary.peer_id in node.host.peers():  # disconnected, and stays out
                await trio.sleep(POLL_S)
