"""The connection gate on real py-libp2p hosts (127.0.0.1): a banned peer that redials is cut off.

A banned flooder's host dials again on its next send. Without the gate, a
connection opened while its old one was being aborted made no "up" (the old
one was still counted) and was served until the next policy tick. With it,
`P2PHost.set_connection_gate` is asked of every new connection as py-libp2p
reports it: a refused one is closed at once, never counted, makes no "up",
and no frame of the refused peer reaches the message handler.
"""

from __future__ import annotations

import trio

from transport.libp2p_gossip import GossipConfig
from transport.libp2p_host import P2PHost
from transport.libp2p_liveness import PeerEvent

TEST_TIMEOUT_S = 30.0
GATE_CLOSE_BOUND_S = 2.0  # a refused connection is gone from the victim within this
FLOOD_S = 2.0  # how long the banned peer keeps sending (and so redialling)
MSG = "/megnode-test/gate/1"
NO_GOSSIP = GossipConfig(enabled=False)


def seed(n: int) -> bytes:
    return bytes([n]) * 32


async def _wait_for(predicate, bound_s: float) -> None:
    with trio.fail_after(bound_s):
        while not predicate():
            await trio.sleep(0.01)


async def test_a_banned_peer_that_redials_is_closed_at_once_and_never_read() -> None:
    banned: set[str] = set()
    ups: list[PeerEvent] = []
    received: list[bytes] = []

    async def on_message(peer_id: str, data: bytes) -> None:
        received.append(data)

    with trio.fail_after(TEST_TIMEOUT_S):
        async with P2PHost(seed(1), gossip=NO_GOSSIP,
                           on_peer=lambda e: ups.append(e) if e.up else None) as victim, \
                P2PHost(seed(2), gossip=NO_GOSSIP) as flooder:
            victim.set_connection_gate(lambda peer_id: peer_id in banned)
            victim.set_message_handler(MSG, on_message)
            await flooder.connect(victim.listen_addrs()[0])
            await flooder.send(victim.peer_id, MSG, b"before the ban")
            await _wait_for(lambda: received == [b"before the ban"], 5)
            assert [e.peer_id for e in ups] == [flooder.peer_id]

            # Banned: its connection is aborted while it keeps sending (and redialling).
            banned.add(flooder.peer_id)
            sent_after_ban = 0

            async def flood() -> None:
                nonlocal sent_after_ban
                deadline = trio.current_time() + FLOOD_S
                while trio.current_time() < deadline:
                    try:
                        await flooder.send(victim.peer_id, MSG, b"after the ban")
                        sent_after_ban += 1
                    except Exception:
                        pass  # reset by the victim: the next send dials again
                    await trio.sleep(0.005)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(flood)
                await victim.abort(flooder.peer_id)
                read_by_abort = len(received)  # the old connection's frames end here
                await _wait_for(lambda: victim.connections_gated >= 1, FLOOD_S + 5)

            # Every redial was refused: none outlives the bound, none made an "up",
            # and nothing the banned peer sent after its connection was aborted was read.
            await _wait_for(lambda: flooder.peer_id not in victim.peers(), GATE_CLOSE_BOUND_S)
            assert victim.connections_gated >= 1
            assert [e.peer_id for e in ups] == [flooder.peer_id]
            assert sent_after_ban > 0 and len(received) == read_by_abort

            # Lifted: the same peer is let in again (the gate is asked afresh each time).
            banned.clear()
            gated = victim.connections_gated
            await flooder.connect(victim.listen_addrs()[0])
            await _wait_for(lambda: flooder.peer_id in victim.peers(), 5)
            assert victim.connections_gated == gated


async def test_a_refused_connection_never_counts_and_never_makes_an_up() -> None:
    ups: list[PeerEvent] = []
    received: list[bytes] = []

    async def on_message(peer_id: str, data: bytes) -> None:
        received.append(data)

    with trio.fail_after(TEST_TIMEOUT_S):
        async with P2PHost(seed(3), gossip=NO_GOSSIP, on_peer=ups.append) as victim, \
                P2PHost(seed(4), gossip=NO_GOSSIP) as banned:
            victim.set_connection_gate(lambda peer_id: peer_id == banned.peer_id)
            victim.set_message_handler(MSG, on_message)
            start = trio.current_time()
            for _ in range(5):
                try:
                    await banned.connect(victim.listen_addrs()[0], timeout_s=5)
                    await banned.send(victim.peer_id, MSG, b"junk")
                except Exception:
                    pass  # closed under it
                await _wait_for(lambda: banned.peer_id not in victim.peers(), GATE_CLOSE_BOUND_S)
            assert victim.connections_gated >= 1
            assert ups == [] and received == []
            assert trio.current_time() - start < 5 * (GATE_CLOSE_BOUND_S + 5)
