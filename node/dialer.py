"""Dialling peers: on request (`connect`), bootstrap addresses, and peers mDNS finds.

Redials of peers whose connection died are the peer policy's (node.peer_executor);
this module makes the other dials. A bootstrap address is dialled until it
answers, backing off as the policy's BOOTSTRAP_BACKOFF says, and each failure
is a WARNING with its reason (a wrong bootstrap address is the commonest
mistake of a new fleet); `status` shows each bootstrap's state
(`bootstrap_status`). A `/dns4`, `/dns6` or `/dns` address is resolved at
each dial (transport.libp2p_dns), so a name that moved is followed. A peer
found on the LAN (config `mdns`, node.mdns) is dialled a few times. Every
address that answered is handed to the redialer (as given: a DNS name stays
a name), so a dead connection can be dialled again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

import trio

from node.core.peer_policy import BOOTSTRAP_BACKOFF
from node.errors import NodeError
from node.peer_ids import now_ms
from transport.libp2p_dns import ResolveError, resolve
from transport.libp2p_host import ConnectError, P2PHost
from transport.libp2p_redial import Redialer

logger = logging.getLogger("megnode")


class BootstrapState(str, Enum):
    """Where dialling one bootstrap address stands (the string is what `status` shows)."""

    DIALLING = "dialling"  # the first attempt is under way
    RETRYING = "retrying"  # an attempt failed; the next one waits (`error` says why)
    CONNECTED = "connected"  # it answered and the connection is up
    DISCONNECTED = "disconnected"  # it answered once; the connection is gone (redialled)


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """One bootstrap address as `status` shows it."""

    address: str
    state: BootstrapState = BootstrapState.DIALLING
    peer_id: str = ""
    attempts: int = 0
    error: str = ""
    since_ms: int = 0  # when `state` was entered
    retry_in_ms: int = 0  # RETRYING: the wait before the next attempt


class Dialer:
    """Makes one node's outgoing dials; background dials run in the node's nursery."""

    def __init__(self, host: P2PHost, redialer: Redialer, nursery: trio.Nursery) -> None:
        self._host = host
        self._redialer = redialer
        self._nursery = nursery
        self._bootstraps: dict[str, Bootstrap] = {}
        # Dials to peers we only heard of (mDNS announcements, peer exchange answers) are
        # untrusted input: one budget for all of them, a bound on dials per minute in total.
        from node.mdns import DiscoveryBudget  # node.mdns imports zeroconf only when run

        self.discovery_budget = DiscoveryBudget()

    async def connect(self, address: str) -> str:
        """Dial a peer by its /p2p/ multiaddr (a DNS name is resolved); returns its peer id.

        A peer we hold a connection to is checked first (P2PHost.connect): a
        dead connection is dropped and dialled anew, not taken as "connected".
        An explicit dial is the user's say: py-libp2p's memory of a failed dial
        does not refuse it (P2PHost.connect).
        """
        try:
            resolved = await resolve(address)
        except ResolveError as exc:
            raise NodeError(str(exc)) from None
        error: Exception | None = None
        for candidate in resolved:
            try:
                peer_id = await self._host.connect(candidate)
            except ValueError as exc:
                raise NodeError(str(exc)) from None
            except ConnectError as exc:
                error = exc
                continue
            self._redialer.remember(peer_id, [address])
            return peer_id
        raise NodeError(str(error))

    async def dial_with_retry(self, address: str) -> None:
        """Dial a bootstrap address until it answers (the policy's BOOTSTRAP_BACKOFF).

        Each failure is a WARNING with its reason; `bootstrap_status` shows the state.
        """
        delay_ms = BOOTSTRAP_BACKOFF.first()
        entry = self._bootstraps[address] = Bootstrap(address, since_ms=now_ms())
        while True:
            entry = replace(entry, attempts=entry.attempts + 1)
            self._bootstraps[address] = entry
            try:
                peer_id = await self.connect(address)
            except NodeError as exc:
                logger.warning("bootstrap %s cannot be dialled: %s (retrying in %.0f s)",
                               address, exc, delay_ms / 1_000)
                entry = self._bootstraps[address] = replace(
                    entry, state=BootstrapState.RETRYING, error=str(exc), since_ms=now_ms(),
                    retry_in_ms=delay_ms)
            else:
                self._bootstraps[address] = replace(
                    entry, state=BootstrapState.CONNECTED, peer_id=peer_id, error="",
                    since_ms=now_ms(), retry_in_ms=0)
                return
            await trio.sleep(delay_ms / 1_000)
            delay_ms = BOOTSTRAP_BACKOFF.next(delay_ms)

    def bootstrap_status(self) -> list[dict[str, Any]]:
        """Each bootstrap address: state, peer id, attempts, last error (for `status`)."""
        connected = self._host.peers()
        out = []
        for entry in self._bootstraps.values():
            state = entry.state
            if state == BootstrapState.CONNECTED and entry.peer_id not in connected:
                state = BootstrapState.DISCONNECTED  # the peer policy redials it
            out.append({"address": entry.address, "state": state.value,
                        "peer_id": entry.peer_id, "attempts": entry.attempts,
                        "error": entry.error, "since_ms": entry.since_ms,
                        "retry_in_ms": entry.retry_in_ms})
        return out

    def addresses_of(self, peer_id: str) -> tuple[str, ...]:
        """Where `peer_id` can be dialled: what its identify said, and what we dialled."""
        self._redialer.remember(peer_id, self._host.peer_addresses(peer_id))
        return self._redialer.addresses(peer_id)

    async def dial_known(self, peer_id: str, addresses: tuple[str, ...]) -> bool:
        """Dial a peer the book (or peer exchange) knows at `addresses`, each once; True
        once one answered. Its addresses go to the redialer either way: a peer that
        is down now is redialled when the policy says."""
        self._redialer.remember(peer_id, list(reversed(addresses)))  # keep their order
        if peer_id in self._host.peers():
            return True
        for address in addresses:
            try:
                await self.connect(address)
            except NodeError as exc:
                logger.info("known peer %s at %s: %s", peer_id, address, exc)
                continue
            return True
        return False

    async def discover_on_lan(self) -> None:
        """Dial the megnode peers mDNS finds on the LAN (config `mdns`); see node.mdns."""
        from node import mdns  # imported only when enabled: zeroconf is a heavy import

        # Announcements are untrusted: bounded peers and dials per minute (node.mdns),
        # shared with peer exchange.
        budget = self.discovery_budget
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
