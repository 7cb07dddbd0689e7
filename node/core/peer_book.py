"""The peer book: every peer this node has met, kept across restarts. Sans-IO.

A node that knows only its bootstrap list loses the fleet when that node
dies, and a node restarted with an empty bootstrap list knows nobody. The
book remembers, per peer (named by its libp2p peer id): the addresses it
can be dialled at (newest first), when we last had a connection to it, how
many dials failed since, and the topics it told us it serves (peer exchange,
node.peer_exchange). On start the node dials from it as well as from its
bootstrap list; peer exchange answers from it.

It is bounded: MAX_BOOK_PEERS entries, MAX_BOOK_ADDRESSES addresses and
MAX_BOOK_TOPICS topics each. When full, the least useful entry goes
(`usefulness`: a peer we were connected to recently, with few failures and
shared topics, beats one we only heard of). The book never reads the clock
or the store itself: the runtime passes `now_ms`, and `ops()` hands the
changed entries to the committer (the one writer) as records in TABLE_META
under PEER_RECORD_PREFIX (a range of the meta table, not a new table: no
store format change); `load` reads them back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import msgpack

from node.core.store import TABLE_META, Delete, Op, Put, Store

PEER_RECORD_PREFIX = b"megnode/peer/"
MAX_BOOK_PEERS = 1_024  # peers remembered (the least useful goes first)
MAX_BOOK_ADDRESSES = 8  # addresses per peer (the oldest goes)
MAX_BOOK_TOPICS = 64  # topics per peer (the first ones told)
MAX_ADDRESS_CHARS = 256  # a longer address is not an address we dial
MAX_PEER_ID_CHARS = 128
# A peer whose dials failed this many times in a row since its last connection
# is kept (the book is its only trace) but dialled last and evicted first.
FAILURES_BEFORE_STALE = 8
RECORD_VERSION = 1


@dataclass(frozen=True, slots=True)
class PeerEntry:
    """What the book knows of one peer."""

    peer_id: str
    addresses: tuple[str, ...] = ()  # dialable `/…/p2p/<peer_id>` addresses, newest first
    last_success_ms: int = 0  # when a connection to it last came up (0: never)
    last_seen_ms: int = 0  # when we last heard of it at all (connection, peer exchange)
    failures: int = 0  # dials failed since the last connection
    topics: tuple[str, ...] = ()  # hex ids of the topics it told us it serves


def usefulness(entry: PeerEntry, now_ms: int) -> tuple[int, int, int, int]:
    """A sort key, higher is more useful: reachable, shares topics, recent, rarely failing."""
    reachable = int(entry.last_success_ms > 0 and entry.failures < FAILURES_BEFORE_STALE)
    return (reachable, min(len(entry.topics), 1), entry.last_success_ms or entry.last_seen_ms,
            -entry.failures)


def valid_address(address: str, peer_id: str) -> bool:
    """A bounded multiaddr string naming `peer_id`, over TCP, not 0.0.0.0 or ::."""
    if not isinstance(address, str) or len(address) > MAX_ADDRESS_CHARS:
        return False
    parts = address.split("/")
    if len(parts) < 7 or parts[0] or parts[1] not in ("ip4", "ip6", "dns4", "dns6", "dns"):
        return False
    if parts[2] in ("0.0.0.0", "::") or parts[3] != "tcp" or parts[-2] != "p2p":
        return False
    return parts[-1] == peer_id


class PeerBook:
    """The bounded book of peers (see the module doc)."""

    def __init__(self, max_peers: int = MAX_BOOK_PEERS) -> None:
        self._max_peers = max_peers
        self._entries: dict[str, PeerEntry] = {}
        self._dirty: set[str] = set()  # changed since the last `ops()`
        self._deleted: set[str] = set()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._entries

    def get(self, peer_id: str) -> PeerEntry | None:
        return self._entries.get(peer_id)

    def entries(self) -> tuple[PeerEntry, ...]:
        return tuple(self._entries.values())

    def most_useful(self, now_ms: int, limit: int,
                    exclude: Iterable[str] = ()) -> list[PeerEntry]:
        """Up to `limit` entries with addresses, the most useful first."""
        skip = set(exclude)
        found = [e for e in self._entries.values() if e.addresses and e.peer_id not in skip]
        found.sort(key=lambda e: (usefulness(e, now_ms), e.peer_id), reverse=True)
        return found[:max(0, limit)]

    # ------------------------------------------------------------------ updates

    def connected(self, peer_id: str, addresses: Iterable[str], now_ms: int) -> None:
        """A connection to `peer_id` came up; `addresses` are those it can be dialled at."""
        entry = self._entry(peer_id, now_ms)
        if entry is None:
            return
        self._put(replace(self._with_addresses(entry, addresses), last_success_ms=now_ms,
                          last_seen_ms=now_ms, failures=0))

    def heard(self, peer_id: str, addresses: Iterable[str], now_ms: int,
              topics: Iterable[str] = ()) -> bool:
        """Someone told us of `peer_id` (peer exchange); True if it gave us a new address."""
        entry = self._entry(peer_id, now_ms)
        if entry is None:
            return False
        updated = self._with_addresses(entry, addresses, append=True)
        updated = replace(updated, last_seen_ms=now_ms,
                          topics=_merge(entry.topics, topics))
        if updated != entry:
            self._put(updated)
        return len(updated.addresses) > len(entry.addresses) or (
            updated.addresses != entry.addresses and not entry.addresses)

    def served(self, peer_id: str, topics: Iterable[str], now_ms: int) -> None:
        """`peer_id` told us (peer exchange) the topics it serves; replaces what we knew."""
        entry = self._entry(peer_id, now_ms)
        if entry is None:
            return
        told = tuple(dict.fromkeys(t for t in topics if isinstance(t, str)))[:MAX_BOOK_TOPICS]
        if told != entry.topics:
            self._put(replace(entry, topics=told))

    def failed(self, peer_id: str, now_ms: int) -> None:
        """Every address of a dial of `peer_id` failed."""
        entry = self._entries.get(peer_id)
        if entry is not None:
            self._put(replace(entry, failures=entry.failures + 1))

    def forget(self, peer_id: str) -> None:
        if self._entries.pop(peer_id, None) is not None:
            self._dirty.discard(peer_id)
            self._deleted.add(peer_id)

    # ------------------------------------------------------------------ persistence

    def ops(self) -> list[Op]:
        """The changes since the last call, as store ops for the committer."""
        out: list[Op] = [Delete(TABLE_META, PEER_RECORD_PREFIX + p.encode()) for p in
                         sorted(self._deleted)]
        for peer_id in sorted(self._dirty):
            entry = self._entries[peer_id]
            out.append(Put(TABLE_META, PEER_RECORD_PREFIX + peer_id.encode(), encode(entry)))
        self._dirty.clear()
        self._deleted.clear()
        return out

    @property
    def changed(self) -> bool:
        return bool(self._dirty or self._deleted)

    @classmethod
    def load(cls, store: Store, max_peers: int = MAX_BOOK_PEERS) -> "PeerBook":
        """The book as stored; unreadable records are skipped (and deleted at the next
        `ops()`)."""
        book = cls(max_peers)
        for key, value in store.scan(TABLE_META, PEER_RECORD_PREFIX):
            peer_id = key[len(PEER_RECORD_PREFIX):].decode("utf-8", "replace")
            entry = decode(peer_id, value)
            if entry is None or len(book._entries) >= max_peers:
                book._deleted.add(peer_id)
                continue
            book._entries[peer_id] = entry
        return book

    # ------------------------------------------------------------------ internals

    def _entry(self, peer_id: str, now_ms: int) -> PeerEntry | None:
        if not isinstance(peer_id, str) or not 0 < len(peer_id) <= MAX_PEER_ID_CHARS:
            return None
        entry = self._entries.get(peer_id)
        if entry is not None:
            return entry
        if len(self._entries) >= self._max_peers:
            victim = min(self._entries.values(),
                         key=lambda e: (usefulness(e, now_ms), e.peer_id))
            self.forget(victim.peer_id)
            self.evicted += 1
        return PeerEntry(peer_id, last_seen_ms=now_ms)

    def _put(self, entry: PeerEntry) -> None:
        self._entries[entry.peer_id] = entry
        self._dirty.add(entry.peer_id)
        self._deleted.discard(entry.peer_id)

    @staticmethod
    def _with_addresses(entry: PeerEntry, addresses: Iterable[str],
                        append: bool = False) -> PeerEntry:
        fresh = [a for a in addresses if valid_address(a, entry.peer_id)][:MAX_BOOK_ADDRESSES]
        if append:  # hearsay: after what we dialled ourselves
            merged = list(entry.addresses) + [a for a in fresh if a not in entry.addresses]
        else:
            merged = fresh + [a for a in entry.addresses if a not in fresh]
        return replace(entry, addresses=tuple(merged[:MAX_BOOK_ADDRESSES]))


def _merge(known: tuple[str, ...], told: Iterable[str]) -> tuple[str, ...]:
    merged = dict.fromkeys(known)
    for topic in told:
        if len(merged) >= MAX_BOOK_TOPICS:
            break
        if isinstance(topic, str):
            merged[topic] = None
    return tuple(merged)


def encode(entry: PeerEntry) -> bytes:
    return msgpack.packb([RECORD_VERSION, list(entry.addresses), entry.last_success_ms,
                          entry.last_seen_ms, entry.failures, list(entry.topics)])


def decode(peer_id: str, value: bytes) -> PeerEntry | None:
    """A stored record, or None if it is not one this version wrote."""
    try:
        fields = msgpack.unpackb(value)
        version, addresses, last_success, last_seen, failures, topics = fields
        if version != RECORD_VERSION:
            return None
        entry = PeerEntry(peer_id, tuple(a for a in addresses if valid_address(a, peer_id))[
            :MAX_BOOK_ADDRESSES], int(last_success), int(last_seen), int(failures),
            tuple(t for t in topics if isinstance(t, str))[:MAX_BOOK_TOPICS])
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    return entry
