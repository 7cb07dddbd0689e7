"""Dialling peers: on request (`connect`), bootstrap addresses, and peers mDNS finds.

Redials of peers whose connection died are the peer policy's (node.peer_executor);
this module makes the other dials. A bootstrap address is dialled until it
answers, backing off as the policy's BOOTSTRAP_BACKOFF says; a peer found on
the LAN (config `mdns`, node.mdns) is dialled a few times. Every address that
answered is handed to the redialer, so a dead connection can be dialled again.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from node.core.peer_policy import BOOTSTRAP_BACKOFF
from node.errors import NodeError
from transport.libp2p_host import ConnectError, P2PHost
from transport.libp2p_redial import Redialer

logger = logging.getLogger("megnode")


class Dialer:
    """Makes one node's outgoing dials; background dials run in the node's nursery."""

    def __init__(self, host: P2PHost, redialer: Redialer, nursery: trio.Nursery) -> None:
        self._host = host
        self._redialer = redialer
        self._nursery = nursery

    async def connect(self, address: str) -> str:
        """Dial a peer by its /p2p/ multiaddr; returns its peer id.

        A peer we hold a connection to is checked first (P2PHost.connect): a
        dead connection is dropped and dialled anew, not taken as "connected".
        """
        try:
            peer_id = await self._host.connect(address)
        except ValueError as exc:
            raise NodeError(str(exc)) from None
        except ConnectError as exc:
            raise NodeError(str(exc)) from None
        self._redialer.remember(peer_id, [address])
        return peer_id

    async def dial_with_retry(self, address: str) -> None:
        """Dial a bootstrap address until it answers (the policy's BOOTSTRAP_BACKOFF)."""
        delay_ms = BOOTSTRAP_BACKOFF.first()
        while True:
            try:
                await self.connect(address)
                return
            except NodeError as exc:
                logger.info("bootstrap %s: %s (retrying in %.0f s)", address, exc,
                            delay_ms / 1_000)
            await trio.sleep(delay_ms / 1_000)
            delay_ms = BOOTSTRAP_BACKOFF.next(delay_ms)

    async def discover_on_lan(self) -> None:
        """Dial the megnode peers mDNS finds on the LAN (config `mdns`); see node.mdns."""
        from node import mdns  # imported only when enabled: zeroconf is a heavy import

        # Announcements are untrusted: bounded peers and dials per minute (node.mdns).
        budget = mdns.DiscoveryBudget()
        try:
            async with mdns.mdns_discovery(self._host.libp2p, self._host.listen_addrs()) as found:
                async for peer in found:
                    if peer.peer_id not in self._host.peers() and budget.admit(peer.peer_id):
                        self._nursery.start_soon(self._dial_discovered, peer, budget)
        except mdns.MdnsError as exc:
            logger.warning("mDNS discovery is off: %s", exc)

    async def _dial_discovered(self, peer: Any, budget: Any) -> None:
        from node import mdns

        try:
            # Both sides find each other at about the same time; one dial is enough.
            if peer.peer_id > self._host.peer_id:
                await trio.sleep(mdns.DIAL_DEFER_S)
            delay = mdns.DIAL_RETRY_S
            for _ in range(mdns.DIAL_ATTEMPTS):
                for address in peer.addresses:
                    if peer.peer_id in self._host.peers():
                        return
                    while (wait_ms := budget.dial_delay_ms(int(trio.current_time() * 1_000))):
                        await trio.sleep(wait_ms / 1_000)
                    try:
                        await self.connect(address)
                        return
                    except NodeError as exc:
                        logger.info("mDNS peer %s: %s", address, exc)
                await trio.sleep(delay)
                delay *= 2
        finally:
            budget.release(peer.peer_id)  # found again later, it is dialled again
