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


async def test_two_peers_restarted_together_on_new_ports_find_each_other(tmp_path) -> None:
    """b and c, connected to each other and to a, restart at once on new ports with their
    peer books: each knows the other only at its old address, and learns the new one
    from a by peer exchange. It used to fail twice over: a skipped identify for a peer
    it had identified before (so it knew them at their old addresses), and a dial of
    the new address dialled the old one the peerstore still held."""
    async with Node.open(tmp_path / "a", seed=1) as a:
        topic = await a.create_topic("fleet")
        async with Node.open(tmp_path / "b", seed=2) as b, \
                Node.open(tmp_path / "c", seed=3) as c:
            await b.connect(a.addresses[0])
            await c.connect(a.addresses[0])
            await b.join(topic.topic_id)
            await c.join(topic.topic_id)
            with trio.fail_after(WAIT_S):  # peer exchange joined b and c
                while c.host.peer_id not in b.host.peers():
                    await trio.sleep(POLL_S)
            b_id, c_id, old = b.host.peer_id, c.host.peer_id, set(b.addresses + c.addresses)
            await b._book_keeper.flush()
            await c._book_keeper.flush()
        async with Node.open(tmp_path / "b", seed=2) as b, \
                Node.open(tmp_path / "c", seed=3) as c:  # any free port: new ones
            assert not old & set(b.addresses + c.addresses)
            with trio.fail_after(WAIT_S):
                while c_id not in b.host.peers() or b_id not in c.host.peers():
                    await trio.sleep(POLL_S)
