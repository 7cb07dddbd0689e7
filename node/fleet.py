"""Keeping a node in its fleet: the peer book on disk, dials from it, peer exchange, limits.

The runtime half of issue 12's self-healing fleet; each decision lives in a
sans-IO module and this one carries it out with trio and libp2p:

* the peer book (node.core.peer_book): loaded at start, its changes written
  through the committer (the one writer) at most every BOOK_FLUSH_S, and on
  start the most useful START_DIALS peers in it are dialled, as well as the
  bootstrap list, so a node restarted with no bootstrap list rejoins;
* peer exchange (node.core.peer_exchange): see `PeerExchange`;
* the connection manager (node.core.connection_manager): see `ConnectionKeeper`.
"""

from __future__ import annotations

import logging

import trio

from node.committer import CommitError, Committer, Records
from node.core.peer_book import PeerBook
from node.dialer import Dialer
from node.peer_ids import now_ms
from transport.libp2p_host import P2PHost

logger = logging.getLogger("megnode")

BOOK_FLUSH_S = 1.0  # the book's changes are written at most this often
START_DIALS = 16  # peers from the book dialled at start (the most useful first)


class BookKeeper:
    """Writes the peer book's changes through the committer; dials from it at start."""

    def __init__(self, book: PeerBook, committer: Committer, host: P2PHost,
                 dialer: Dialer, nursery: trio.Nursery) -> None:
        self.book = book
        self._committer = committer
        self._host = host
        self._dialer = dialer
        self._nursery = nursery

    def start(self) -> None:
        self._nursery.start_soon(self._flush_loop)
        for entry in self.book.most_useful(now_ms(), START_DIALS,
                                           exclude=self._host.peers()):
            self._nursery.start_soon(self._dial, entry.peer_id, entry.addresses)

    def status(self) -> dict[str, object]:
        """For `status`: how many peers the book holds, and whether all of it is stored."""
        return {"peers": len(self.book), "unsaved": self.book.changed,
                "evicted": self.book.evicted}

    async def _dial(self, peer_id: str, addresses: tuple[str, ...]) -> None:
        if not await self._dialer.dial_known(peer_id, addresses):
            self.book.failed(peer_id, now_ms())

    async def _flush_loop(self) -> None:
        while True:
            await trio.sleep(BOOK_FLUSH_S)
            await self.flush()

    async def flush(self) -> None:
        """Write what changed since the last flush (one committer step)."""
        if not self.book.changed:
            return
        try:
            await self._committer.submit(Records(tuple(self.book.ops())))
        except CommitError as exc:  # the next change writes the entries again
            logger.warning("peer book not stored: %s", exc)
