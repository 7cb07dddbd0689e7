"""Keeping a node in its fleet: the peer book on disk, dials from it, peer exchange, limits.

The runtime half of issue 12's self-healing fleet; each decision lives in a
sans-IO module and this one carries it out with trio and libp2p:

* the peer book (node.core.peer_book): loaded at start, its changes written
  through the committer (the one writer) at most every BOOK_FLUSH_S, and on
  start the most useful START_DIALS peers in it are dialled, as well as the
  bootstrap list, so a node restarted with no bootstrap list rejoins;
* peer exchange (node.core.peer_exchange): see `PeerExchange`;
* the connection manager (node.core.connection_manager): see `ConnectionKeeper`:
  limits checked as each connection comes up, trimming and filling every
  KEEP_INTERVAL_S.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable

import trio

from node.committer import CommitError, Committer, Records
from node.core.connection_manager import (REFUSED_LINGER_MS, Connection, Limits, admit,
                                          lingers, needs_more, to_trim, wants_more)
from node.core.peer_book import FAILURES_BEFORE_STALE, PeerBook
from node.core.peer_policy import PeerPolicy
from node.core.peer_exchange import (MAX_PX_TOPICS, PROTOCOL_PX, decode_answer,
                                     decode_request, encode_answer, encode_request, select)
from node.dialer import Dialer
from node.peer_ids import node_id_of, now_ms
from transport.libp2p_host import P2PHost

logger = logging.getLogger("megnode")

BOOK_FLUSH_S = 1.0  # the book's changes are written at most this often
START_DIALS = 16  # peers from the book dialled at start (the most useful first)


class BookKeeper:
    """Writes the peer book's changes through the committer; dials from it at start."""

    def __init__(self, book: PeerBook, committer: Committer, host: P2PHost,
                 dialer: Dialer, nursery: trio.Nursery, dial: bool = True) -> None:
        self.book = book
        self.dial = dial  # config `dial_known_peers`
        self._committer = committer
        self._host = host
        self._dialer = dialer
        self._nursery = nursery

    def start(self) -> None:
        self._nursery.start_soon(self._flush_loop)
        if not self.dial:
            return
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

PX_FIRST_DELAY_S = 0.5  # after a peer comes up (identify has told us its addresses by then)
PX_INTERVAL_MIN_S = 2.0  # a connected peer is asked again this soon while answers bring news,
PX_INTERVAL_MAX_S = 60.0  # doubling to this while they bring nothing new
PX_TIMEOUT_S = 5.0


class PeerExchange:
    """Asks connected peers for the peers of shared topics, answers their asks (node.core.peer_exchange).

    `topics()` gives the node's topics as (id, may_read(key)); `wanted()`
    says whether another connection is welcome (the connection manager's high
    water mark); `is_banned(peer_id)` keeps banned peers out of answers and dials.
    Dials from answers share one DiscoveryBudget with mDNS (node.mdns): a bound
    on dials per minute from unverified sources, in total.
    """

    def __init__(self, book: PeerBook, host: P2PHost, dialer: Dialer, nursery: trio.Nursery,
                 topics: Callable[[], Iterable[tuple[bytes, Callable[[bytes], bool]]]],
                 wanted: Callable[[], bool], is_banned: Callable[[str], bool],
                 reset_redial: Callable[[str], None], stats: dict[str, int]) -> None:
        self._book = book
        self._host = host
        self._dialer = dialer
        self._nursery = nursery
        self._topics = topics
        self._wanted = wanted
        self._is_banned = is_banned
        self._reset_redial = reset_redial
        self._stats = stats
        self._interval_s = PX_INTERVAL_MIN_S
        for name in ("px_asked", "px_answered", "px_heard", "px_dialled", "px_bad",
                     "px_bytes_sent", "px_bytes_received"):
            stats.setdefault(name, 0)

    def start(self) -> None:
        self._host.set_request_handler(PROTOCOL_PX, self._on_request)
        self._nursery.start_soon(self._ask_loop)

    def peer_up(self, peer_id: str) -> None:
        self._nursery.start_soon(self._ask_soon, peer_id)

    def topics_for(self, peer_id: str) -> list[bytes]:
        """Our topics `peer_id` may hear of: open ones, and private ones it may read."""
        key = _key_of(peer_id)
        return [topic_id for topic_id, may_read in self._topics()
                if key is not None and may_read(key)][:MAX_PX_TOPICS]

    # ------------------------------------------------------------------ asking

    async def _ask_soon(self, peer_id: str) -> None:
        await trio.sleep(PX_FIRST_DELAY_S)
        if peer_id in self._host.peers():
            await self.ask(peer_id)

    async def _ask_loop(self) -> None:
        rng = random.Random()
        while True:
            await trio.sleep(self._interval_s * (0.5 + rng.random()))  # spread the fleet's asks
            peers = sorted(self._host.peers())
            if not peers:
                continue
            news = await self.ask(rng.choice(peers))
            self._interval_s = PX_INTERVAL_MIN_S if news else min(
                self._interval_s * 2, PX_INTERVAL_MAX_S)

    async def ask(self, peer_id: str) -> bool:
        """Ask `peer_id` for peers of our shared topics; True if its answer told us news."""
        # identify has told us the peer's listen addresses by now: keep them in the book
        self._book.connected(peer_id, self._dialer.addresses_of(peer_id), now_ms())
        topics = self.topics_for(peer_id)
        if not topics:
            return False
        self._stats["px_asked"] += 1
        request = encode_request(topics)
        self._stats["px_bytes_sent"] += len(request)
        try:
            data = await self._host.request(peer_id, PROTOCOL_PX, request, PX_TIMEOUT_S)
        except Exception as exc:  # RequestError, a connection gone: ask another later
            logger.info("peer exchange with %s: %s", peer_id, exc)
            return False
        self._stats["px_bytes_received"] += len(data)
        answer = decode_answer(data, [t.hex() for t in topics])
        if answer is None:
            self._stats["px_bad"] += 1
            logger.info("peer exchange: %s sent an answer that does not parse", peer_id)
            return False
        self._stats["px_bad"] += answer.dropped
        # (What the answerer itself serves we learn when it asks us.)
        news = False
        for peer in answer.peers:
            if peer.peer_id in (self._host.peer_id, peer_id) or self._is_banned(peer.peer_id):
                continue
            self._stats["px_heard"] += 1
            known = self._book.get(peer.peer_id)
            self._book.heard(peer.peer_id, peer.addresses, now_ms(), peer.topics)
            if peer.peer_id in self._host.peers():
                continue
            news = news or known is None
            self._reset_redial(peer.peer_id)
            if self._wanted():
                self._nursery.start_soon(self._dial, peer.peer_id)
        return news

    async def _dial(self, peer_id: str) -> None:
        budget = self._dialer.discovery_budget
        if not budget.admit(peer_id):
            return
        try:
            while (wait_ms := budget.dial_delay_ms(now_ms())):
                await trio.sleep(wait_ms / 1_000)
            entry = self._book.get(peer_id)
            if entry is None or peer_id in self._host.peers() or not self._wanted():
                return
            self._stats["px_dialled"] += 1
            if not await self._dialer.dial_known(peer_id, entry.addresses):
                self._book.failed(peer_id, now_ms())
        finally:
            budget.release(peer_id)

    # ------------------------------------------------------------------ answering

    async def _on_request(self, peer_id: str, data: bytes) -> bytes:
        self._stats["px_bytes_received"] += len(data)
        answer = self._answer(peer_id, data)
        self._stats["px_bytes_sent"] += len(answer)
        return answer

    def _answer(self, peer_id: str, data: bytes) -> bytes:
        named = decode_request(data)
        if named is None:
            self._stats["px_bad"] += 1
            return encode_answer([])
        self._stats["px_answered"] += 1
        ours = set(self.topics_for(peer_id))  # and it may read them here
        shared = [t.hex() for t in named if t in ours]
        self._book.served(peer_id, shared, now_ms())  # what it serves, for others' asks
        peers = select(self._book, peer_id, shared, self._host.peers(), now_ms(),
                       may_list=lambda p: not self._is_banned(p))
        return encode_answer(peers)


def _key_of(peer_id: str) -> bytes | None:
    node_id = node_id_of(peer_id)
    return None if node_id is None else bytes.fromhex(node_id)


KEEP_INTERVAL_S = 5.0  # how often the connection manager trims or fills
FILL_REDIAL_S = 60.0  # a book entry dialled to fill up is not dialled again sooner


class ConnectionKeeper:
    """Carries out the connection manager's rules (node.core.connection_manager)."""

    def __init__(self, limits: Limits, book: PeerBook, host: P2PHost, dialer: Dialer,
                 nursery: trio.Nursery, our_topics: Callable[[], set[str]],
                 remote_ip: Callable[[str], str | None], stats: dict[str, int],
                 fill: bool = True) -> None:
        self.limits = limits
        self._fill = fill  # config `dial_known_peers`
        self._book = book
        self._host = host
        self._dialer = dialer
        self._nursery = nursery
        self._our_topics = our_topics
        self._remote_ip = remote_ip
        self._stats = stats
        self._since: dict[str, tuple[int, str | None]] = {}  # peer -> (up at, its IP)
        self._closing: set[str] = set()
        # Refused at the node-wide limit, left open to answer the peer's peer-exchange
        # request first (connection_manager.lingers); not counted as connections.
        self._lingering: set[str] = set()
        # Peers this manager disconnected (refused or trimmed): not redialled when they
        # go down. Emptied as each goes down.
        self._dropped: set[str] = set()
        self._filled: dict[str, float] = {}  # peer -> when it was last dialled to fill up
        for name in ("connections_refused", "connections_trimmed"):
            stats.setdefault(name, 0)

    def start(self) -> None:
        self._nursery.start_soon(self._keep_loop)

    def wants_more(self) -> bool:
        return wants_more(len(self._host.peers()), self.limits)

    def needs_more(self) -> bool:
        """Below the low water mark: a lost peer is redialled only then (a peer that
        trimmed us would otherwise be redialled at once, and trim us again)."""
        return needs_more(len(self._host.peers()), self.limits)

    def peer_up(self, peer_id: str) -> bool:
        """A connection came up: False if it must be closed now (a limit; logged, counted)."""
        ip = self._remote_ip(peer_id)
        others = [c for c in self._connections() if c.peer != peer_id]
        refusal = admit(Connection(peer_id, ip, now_ms()), others, self.limits)
        if refusal is not None:
            self._stats["connections_refused"] += 1
            if peer_id not in self._lingering and lingers(refusal, len(self._lingering)):
                logger.info("closing the connection of %s from %s in %d s: %s (it may ask "
                            "for peers first)", peer_id, ip, REFUSED_LINGER_MS // 1_000,
                            refusal.value)
                self._lingering.add(peer_id)
                self._dropped.add(peer_id)  # not redialled when it goes down
                self._nursery.start_soon(self._linger_then_close, peer_id)
            elif peer_id not in self._lingering:
                logger.info("closing the connection of %s from %s: %s", peer_id, ip,
                            refusal.value)
                self._close(peer_id)
            return False
        self._dropped.discard(peer_id)
        self._since[peer_id] = (now_ms(), ip)
        return True

    def peer_down(self, peer_id: str) -> bool:
        """A peer's last connection closed; True if this manager closed it (no redial)."""
        self._since.pop(peer_id, None)
        if peer_id in self._dropped:
            self._dropped.discard(peer_id)
            return True
        return False

    def _connections(self) -> list[Connection]:
        ours = self._our_topics()
        out = []
        for peer in self._host.peers():
            if peer in self._lingering:
                continue
            since, ip = self._since.get(peer, (now_ms(), None))
            entry = self._book.get(peer)
            shares = entry is not None and any(t in ours for t in entry.topics)
            out.append(Connection(peer, ip, since, shares))
        return out

    async def _linger_then_close(self, peer_id: str) -> None:
        """Leave a refused connection open for REFUSED_LINGER_MS (the peer asks for peers
        half a second after it comes up, and is answered), then close it."""
        try:
            await trio.sleep(REFUSED_LINGER_MS / 1_000)
        finally:
            self._lingering.discard(peer_id)
        if peer_id in self._host.peers():
            self._close(peer_id)
        # (gone meanwhile: peer_down has already forgotten it)

    def _close(self, peer_id: str) -> None:
        self._dropped.add(peer_id)
        if peer_id in self._closing:
            return
        self._closing.add(peer_id)
        self._nursery.start_soon(self._disconnect, peer_id)

    async def _disconnect(self, peer_id: str) -> None:
        try:
            await self._host.abort(peer_id)
        except Exception as exc:
            logger.debug("closing %s failed: %s", peer_id, exc)
        finally:
            self._closing.discard(peer_id)

    async def _keep_loop(self) -> None:
        while True:
            await trio.sleep(KEEP_INTERVAL_S)
            self.keep()

    def keep(self) -> None:
        """One round: trim above the high water mark, dial from the book below the low one."""
        connections = self._connections()
        for peer in to_trim(connections, now_ms(), self.limits):
            self._stats["connections_trimmed"] += 1
            logger.info("closing the connection of %s: above the high water mark (%d)",
                        peer, self.limits.high_water)
            self._close(peer)
        count = len(connections)
        now = trio.current_time()
        self._filled = {p: t for p, t in self._filled.items() if now - t < FILL_REDIAL_S}
        if self._fill and needs_more(count, self.limits):
            recent = set(self._filled) | self._host.peers()
            for entry in self._book.most_useful(now_ms(), self.limits.low_water - count,
                                                exclude=recent):
                # Hearsay is peer exchange's to dial (budgeted); a peer failing again and
                # again is left to its redial backoff.
                if entry.last_success_ms and entry.failures < FAILURES_BEFORE_STALE:
                    self._filled[entry.peer_id] = now
                    self._nursery.start_soon(self._dial, entry.peer_id, entry.addresses)

    async def _dial(self, peer_id: str, addresses: tuple[str, ...]) -> None:
        if not await self._dialer.dial_known(peer_id, addresses):
            self._book.failed(peer_id, now_ms())

    def status(self) -> dict[str, object]:
        limits = self.limits
        return {"connections": len(self._host.peers()), "low_water": limits.low_water,
                "high_water": limits.high_water, "max": limits.max_connections,
                "max_per_ip": limits.max_per_ip}


MAX_PEERS_SHOWN = 256  # `megnode peers` lists at most this many (connected first)


def peers_report(book: PeerBook, connected: Iterable[str], policy: PeerPolicy,
                 now: int, limit: int = MAX_PEERS_SHOWN) -> dict[str, object]:
    """What `megnode peers` prints: each connected or known peer's addresses, topics,
    last seen, failures and redial backoff; connected peers first, bounded."""
    live = set(connected)
    known = {e.peer_id: e for e in book.entries()}
    order = sorted(live) + sorted((p for p in known if p not in live),
                                  key=lambda p: -known[p].last_seen_ms)
    rows = []
    for peer_id in order[:limit]:
        entry = known.get(peer_id)
        node_id = node_id_of(peer_id)
        redial = policy.redial_state(node_id) if node_id is not None else None
        banned_until = policy.bans().get(node_id or "", 0)
        rows.append({
            "peer_id": peer_id,
            "node": node_id,
            "connected": peer_id in live,
            "addresses": list(entry.addresses) if entry else [],
            "topics": list(entry.topics) if entry else [],
            "last_connected_ms": entry.last_success_ms if entry else 0,
            "last_seen_ms": entry.last_seen_ms if entry else 0,
            "failures": entry.failures if entry else 0,
            "redial": None if redial is None else {
                "down_since_ms": redial[0], "backoff_ms": redial[1],
                "next_dial_in_ms": max(0, redial[2] - now)},
            "banned_for_s": round((banned_until - now) / 1000, 1) if banned_until > now else 0,
        })
    return {"connected": len(live), "known": len(known), "shown": len(rows), "peers": rows}
