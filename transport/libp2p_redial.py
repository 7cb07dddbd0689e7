"""Redialling peers whose connection died: the node's side of stale-connection recovery.

py-libp2p's own auto-connector is off (`transport.libp2p_host`: it would undo
the node's deliberate disconnects), so nothing reconnects a peer whose
connection died — aborted because it stalled (`libp2p_patches`), found
stale by the message streams, or dropped by the peer's restart. `Redialer`
does, for the peers the owner says it still wants (not banned, not a relayed
device):

* it remembers dialable addresses per peer: those the owner dialled
  successfully (bootstrap, `connect`, mDNS) and the ones the peerstore holds
  while the peer is connected (for a peer that dialled us: its identify);
* when such a peer goes down it dials them again, with exponential backoff
  from `REDIAL_FIRST_S` (jittered: both sides of a dead connection redial,
  and the jitter keeps them from crossing dials every time) to
  `REDIAL_MAX_S`, until the peer is up again, the owner no longer wants it,
  or `REDIAL_GIVE_UP_S` passed (a peer gone that long has left; bootstrap,
  `connect` or mDNS bring it back).

At most one redial task runs per peer, and at most `MAX_REMEMBERED_PEERS`
peers' addresses (`MAX_ADDRESSES_PER_PEER` each) are kept.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import trio

from transport.libp2p_host import ConnectError, P2PHost

logger = logging.getLogger(__name__)

REDIAL_FIRST_S = 1.0
REDIAL_JITTER = 1.0  # the first delay is REDIAL_FIRST_S * (1 + up to this fraction)
REDIAL_MAX_S = 30.0
REDIAL_GIVE_UP_S = 15 * 60.0
MAX_REMEMBERED_PEERS = 4_096
MAX_ADDRESSES_PER_PEER = 8

WantsPeer = Callable[[str], bool]  # peer id -> should we still be connected to it?


class Redialer:
    """Addresses of peers we were connected to, and a redial loop for each one that went down."""

    def __init__(self, host: P2PHost, nursery: trio.Nursery, rng: random.Random,
                 wants: WantsPeer) -> None:
        self._host = host
        self._nursery = nursery
        self._rng = rng
        self._wants = wants
        self._addresses: dict[str, list[str]] = {}
        self._redialling: set[str] = set()
        self.redials = 0  # successful redials

    def remember(self, peer_id: str, addresses: tuple[str, ...] | list[str]) -> None:
        """Add dialable `/…/p2p/<peer_id>` addresses for `peer_id` (newest first)."""
        known = self._addresses.get(peer_id)
        if known is None:
            if len(self._addresses) >= MAX_REMEMBERED_PEERS:
                self._addresses.pop(next(iter(self._addresses)))  # the oldest entry
            known = self._addresses[peer_id] = []
        for address in addresses:
            if address in known:
                known.remove(address)
            known.insert(0, address)
        del known[MAX_ADDRESSES_PER_PEER:]

    def addresses(self, peer_id: str) -> tuple[str, ...]:
        return tuple(self._addresses.get(peer_id, ()))

    def peer_up(self, peer_id: str) -> None:
        self.remember(peer_id, self._host.peer_addresses(peer_id))

    def peer_down(self, peer_id: str) -> None:
        """Start redialling `peer_id` if it is wanted and has an address."""
        self.remember(peer_id, self._host.peer_addresses(peer_id))  # identify may have added some
        if peer_id in self._redialling or not self._addresses.get(peer_id) or not self._wants(peer_id):
            return
        self._redialling.add(peer_id)
        self._nursery.start_soon(self._redial, peer_id)

    async def _redial(self, peer_id: str) -> None:
        try:
            delay = REDIAL_FIRST_S * (1 + REDIAL_JITTER * self._rng.random())
            deadline = trio.current_time() + REDIAL_GIVE_UP_S
            while trio.current_time() < deadline:
                await trio.sleep(delay)
                if peer_id in self._host.peers() or not self._wants(peer_id):
                    return  # the peer dialled us, or we no longer want it
                for address in self.addresses(peer_id):
                    try:
                        await self._host.connect(address)
                    except (ConnectError, ValueError) as exc:
                        logger.info("redial %s: %s", address, exc)
                        continue
                    self.redials += 1
                    logger.info("redialled %s at %s", peer_id, address)
                    return
                delay = min(delay * 2, REDIAL_MAX_S)
            logger.info("gave up redialling %s after %s s", peer_id, REDIAL_GIVE_UP_S)
        finally:
            self._redialling.discard(peer_id)
