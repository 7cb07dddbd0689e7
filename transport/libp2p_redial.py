"""Redialling peers whose connection died: the addresses, and one attempt at a time.

py-libp2p's own auto-connector is off (`transport.libp2p_host`: it would undo
the node's deliberate disconnects), so nothing reconnects a peer whose
connection died — aborted because it stalled (`libp2p_patches`), found
stale by the message streams, or dropped by the peer's restart. The node
does, and its peer policy (`node.core.peer_policy`) decides *when*: whether a peer
is still wanted, the jittered exponential backoff, when to give up. This
module is the part that touches libp2p:

* it remembers dialable addresses per peer: those the owner dialled
  successfully (bootstrap, `connect`, mDNS) and the ones the peerstore holds
  while the peer is connected (for a peer that dialled us: its identify);
* `dial(peer_id)` tries each remembered address once and says whether one
  answered; a DNS name is resolved anew at each dial (transport.libp2p_dns),
  and an unspecified address (0.0.0.0, ::, which an old peer may announce) is
  never remembered.

At most `MAX_REMEMBERED_PEERS` peers' addresses (`MAX_ADDRESSES_PER_PEER`
each) are kept; the oldest peer goes first.
"""

from __future__ import annotations

import logging

from transport.libp2p_dns import ResolveError, resolve
from transport.libp2p_host import ConnectError, P2PHost
from transport.libp2p_listen import is_unspecified

logger = logging.getLogger(__name__)

MAX_REMEMBERED_PEERS = 4_096
MAX_ADDRESSES_PER_PEER = 8


class Redialer:
    """Addresses of peers we were connected to, and a one-shot redial of any of them."""

    def __init__(self, host: P2PHost) -> None:
        self._host = host
        self._addresses: dict[str, list[str]] = {}
        self.redials = 0  # successful redials

    def remember(self, peer_id: str, addresses: tuple[str, ...] | list[str]) -> None:
        """Add dialable `/…/p2p/<peer_id>` addresses for `peer_id` (newest first)."""
        known = self._addresses.get(peer_id)
        if known is None:
            if len(self._addresses) >= MAX_REMEMBERED_PEERS:
                self._addresses.pop(next(iter(self._addresses)))  # the oldest entry
            known = self._addresses[peer_id] = []
        for address in addresses:
            if is_unspecified(address):
                continue
            if address in known:
                known.remove(address)
            known.insert(0, address)
        del known[MAX_ADDRESSES_PER_PEER:]

    def addresses(self, peer_id: str) -> tuple[str, ...]:
        return tuple(self._addresses.get(peer_id, ()))

    def peer_up(self, peer_id: str) -> None:
        self.remember(peer_id, self._host.peer_addresses(peer_id))

    def peer_down(self, peer_id: str) -> None:
        """Keep the addresses a peer that went down had (identify may have added some)."""
        self.remember(peer_id, self._host.peer_addresses(peer_id))

    async def dial(self, peer_id: str) -> bool:
        """Try each remembered address of `peer_id` once; True once one connected."""
        if peer_id in self._host.peers():
            return True  # it dialled us meanwhile
        for address in self.addresses(peer_id):
            try:
                resolved = await resolve(address)
            except ResolveError as exc:
                logger.info("redial %s: %s", address, exc)
                continue
            for candidate in resolved:
                try:
                    await self._host.connect(candidate)
                except (ConnectError, ValueError) as exc:
                    logger.info("redial %s: %s", candidate, exc)
                    continue
                self.redials += 1
                logger.info("redialled %s at %s", peer_id, candidate)
                return True
        return False
