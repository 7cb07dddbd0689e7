"""Bans hold while a peer is connected, however its connection came about.

Two real nodes (`Node.open`, LMDB in tmp dirs, libp2p on 127.0.0.1). A ban
used to be enforced only on a peer's "up" event, which fires for its first
connection: a banned peer that dialled again while its old connection was
being torn down got no new "up" and stayed (the adversary end-to-end test
caught it in CI). The node now looks at who is connected on every tick.
"""

from __future__ import annotations

from pathlib import Path

import trio

from node.runtime import Node

LOOPBACK_LISTEN = ["/ip4/127.0.0.1/tcp/0"]
WAIT_S = 30.0
POLL_S = 0.05


async def test_a_banned_peer_that_is_connected_without_a_new_up_event_is_dropped(
        tmp_path: Path) -> None:
    with trio.fail_after(WAIT_S * 2):
        async with Node.open(tmp_path / "a", listen=LOOPBACK_LISTEN, seed=1) as a:
            async with Node.open(tmp_path / "b", listen=LOOPBACK_LISTEN,
                                 bootstrap=[a.addresses[0]], seed=2) as b:
                while b.host.peer_id not in a.host.peers():
                    await trio.sleep(POLL_S)
                # The ban lands while b is connected, with no event about b to follow.
                a.peer_policy.record_ban(b.node_id, until_ms=2**62, now_ms=0, reason="test")
                with trio.fail_after(WAIT_S):
                    while b.host.peer_id in a.host.peers():
                        await trio.sleep(POLL_S)


async def test_expired_bans_are_forgotten(tmp_path: Path) -> None:
    async with Node.open(tmp_path / "a", listen=LOOPBACK_LISTEN, seed=1) as a:
        a.peer_policy.record_ban("00" * 32, until_ms=1, now_ms=0, reason="test")  # expired long ago
        with trio.fail_after(WAIT_S):
            while a.peer_policy.bans():
                await trio.sleep(POLL_S)
