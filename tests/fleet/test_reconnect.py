"""Fast reconnects: py-libp2p's negative dial cache never keeps out a peer that came back."""

from __future__ import annotations

import socket

import trio

from node.runtime import Node, NodeError

WAIT_S = 15.0
POLL_S = 0.05


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def negative_cached(node: Node, peer_id: str) -> bool:
    from libp2p.peer.id import ID

    cache = node.host.libp2p.get_network()._negative_peer_cache
    return cache.is_blocked(str(ID.from_base58(peer_id)))


async def test_a_restarted_peer_is_dialled_at_once_despite_the_negative_cache(tmp_path) -> None:
    listen = f"/ip4/127.0.0.1/tcp/{free_port()}"
    async with Node.open(tmp_path / "a", seed=1) as a:
        async with Node.open(tmp_path / "b", listen=[listen], seed=2) as b:
            b_address, b_peer = b.addresses[0], b.host.peer_id
            await a.connect(b_address)
        # b is gone: a's redial fails and py-libp2p remembers the failure (60 s).
        with trio.fail_after(WAIT_S):
            while not negative_cached(a, b_peer):
                await trio.sleep(POLL_S)
        async with Node.open(tmp_path / "b", listen=[listen], seed=2) as b:
            with trio.fail_after(5.0):
                assert await a.connect(b_address) == b_peer  # not refused
            assert b_peer in a.host.peers()


async def test_connect_to_a_closed_port_fails_with_a_reason(tmp_path) -> None:
    async with Node.open(tmp_path / "a", seed=1) as a, Node.open(tmp_path / "b", seed=2) as b:
        gone = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{b.host.peer_id}"
        try:
            await a.connect(gone)
        except NodeError as exc:
            assert "connect" in str(exc)
        else:
            raise AssertionError("connected to a closed port")
