"""Persisted state groups: the state before and after every event, shared, on disk.

Theory of operation
-------------------
Most events do not change topic state (messages, dummies), and most state
events change one key. So states are stored once, as *state groups*, and
events point at them:

    event record   T|"e"|event id -> before gid (8) | after gid (8) | reason
    group          T|"g"|gid      -> msgpack [base gid | None, chain length,
                                              extra chunks, changes]
    group chunk    T|"G"|gid|i    -> msgpack [changes ...]   (big groups only)
    resolution     T|"c"|digest   -> gid   (memo: sorted input gids -> result)
    rejected index T|"r"|event id -> b""
    next gid       T|"n"          -> u64

(T is the topic id; `Graph.table(TABLE_STATE)` adds it.) An event that does
not change state has after == before == its parent's group: a long chain of
messages writes one 16-byte record per event and no group at all.

A group is either a *snapshot* (base None, the whole map) or a *delta*
against a base group: the keys it sets, and keys it removes (id None; a
resolution can drop a key one fork had). Loading a delta loads its base
first, so the chain of deltas is bounded: a group whose chain would exceed
`max_chain` is written as a snapshot instead. Deltas keep a state change
O(1) on disk - a full map per change would make N joins cost O(N^2) bytes,
and a topic of a few thousand members would write hundreds of KiB per join
(`tests/bench/test_state_bench.py` measures both) - while the bound keeps a
cold load at most `max_chain` reads. Loaded maps are cached (LRU), so the
usual case - a group derived from the one just computed - reads nothing.

Values are limited by the store (`MAX_VALUE_BYTES`); a group with more than
`MAX_ENTRIES_PER_RECORD` changes spills into chunk records, so a snapshot of
any state size fits.

Group id 0 is the empty state (before the create event); it has no record.
Gids are local to this store (a counter), never sent anywhere: two replicas
hold the same *maps*, not the same numbering.

Every write goes through the graph's write-set, so groups and records
commit in the same transaction as the events they describe. Nothing here
reads a clock or does IO of its own.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import msgpack

from node.core.store import DamagedTopicError
from node.state.types import StateKey

EMPTY_GROUP = 0

# Deltas between two snapshots. Loading a cold group reads at most this many
# records; writing a snapshot costs the whole state. 64 keeps snapshots rare
# for states of thousands of keys (see the module docstring and the bench).
MAX_DELTA_CHAIN = 64
# A record of changes holds at most this many entries. An entry is at most
# ~360 bytes (type <= 64, state key <= 255, id 32, msgpack framing), so a
# record stays under 750 KiB, below the store's 1 MiB value limit.
MAX_ENTRIES_PER_RECORD = 2_048
# Loaded group maps kept in memory. Each is a whole map (a few thousand keys
# in a big topic), so this bounds memory per topic; a miss costs at most
# MAX_DELTA_CHAIN reads. The working set is the groups of the current heads.
GROUP_CACHE_SIZE = 64
RECORD_CACHE_SIZE = 16_384  # event records: the parents of what arrives next
MEMO_CACHE_SIZE = 4_096  # resolution memo entries kept in memory
MEMO_DIGEST_BYTES = 16

_EVENT = b"e"
_GROUP = b"g"
_CHUNK = b"G"
_MEMO = b"c"
_REJECTED = b"r"
_NEXT = b"n"


class Table(Protocol):
    """A topic's slice of one table (`node.core.graph.TopicTable`)."""

    def get(self, key: bytes) -> bytes | None: ...
    def put(self, key: bytes, value: bytes) -> None: ...
    def scan(self, prefix: bytes, *, reverse: bool = False,
             limit: int | None = None) -> list[tuple[bytes, bytes]]: ...


@dataclass(frozen=True, slots=True)
class EventState:
    """Where an applied event stands: its state groups, and why it was rejected (if it was)."""

    before: int
    after: int
    reason: str | None = None

    @property
    def rejected(self) -> bool:
        return self.reason is not None


def _u64(value: int) -> bytes:
    return value.to_bytes(8, "big")


def _remember(cache: OrderedDict, key, value, size: int) -> None:
    cache[key] = value
    cache.move_to_end(key)
    if len(cache) > size:
        cache.popitem(last=False)


Change = tuple[str, str, bytes | None]


class StateGroups:
    """State groups and per-event state records of one topic, over a write-through table."""

    def __init__(self, table: Table, max_chain: int = MAX_DELTA_CHAIN) -> None:
        if max_chain < 0:
            raise ValueError("max_chain must be >= 0 (0: every group is a snapshot)")
        self._table = table
        # Named in a DamagedTopicError (a TopicTable knows its topic; a bare test table not).
        self._topic_id: bytes | None = getattr(table, "topic_id", None)
        self.max_chain = max_chain
        self._maps: OrderedDict[int, tuple[dict[StateKey, bytes], int]] = OrderedDict()
        self._records: OrderedDict[bytes, EventState] = OrderedDict()
        self._record_cache_size = RECORD_CACHE_SIZE  # a node's cache budget may shrink them
        self._memo_cache_size = MEMO_CACHE_SIZE
        self._memo: OrderedDict[bytes, int] = OrderedDict()
        self._next: int | None = None

    def resize_caches(self, records: int, memo: int) -> None:
        """Hold at most `records` event records and `memo` memo entries (the oldest dropped)."""
        self._record_cache_size = records
        self._memo_cache_size = memo
        for cache, size in ((self._records, records), (self._memo, memo)):
            while len(cache) > size:
                cache.popitem(last=False)

    def clear_caches(self) -> None:
        """Forget everything cached (pending writes were discarded)."""
        self._maps.clear()
        self._records.clear()
        self._memo.clear()
        self._next = None

    # ------------------------------------------------------------- event records

    def event_state(self, event_id: bytes) -> EventState | None:
        cached = self._records.get(event_id)
        if cached is not None:
            return cached
        raw = self._table.get(_EVENT + event_id)
        if raw is None:
            return None
        reason = raw[16:].decode() if len(raw) > 16 else None
        record = EventState(int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:16], "big"),
                            reason)
        _remember(self._records, event_id, record, self._record_cache_size)
        return record

    def record_event(self, event_id: bytes, record: EventState) -> None:
        value = _u64(record.before) + _u64(record.after)
        if record.reason is not None:
            value += record.reason.encode()
            self._table.put(_REJECTED + event_id, b"")
        self._table.put(_EVENT + event_id, value)
        _remember(self._records, event_id, record, self._record_cache_size)

    def rejected_ids(self, limit: int | None = None) -> list[bytes]:
        """Ids of rejected events (in id order), at most `limit`."""
        return [key[len(_REJECTED):] for key, _ in self._table.scan(_REJECTED, limit=limit)]

    # ------------------------------------------------------------------ groups

    def load(self, gid: int) -> dict[StateKey, bytes]:
        """The state map of a group. Shared with the cache: callers must not mutate it."""
        return self._load(gid)[0]

    def _load(self, gid: int) -> tuple[dict[StateKey, bytes], int]:
        """(map, chain length): walk down to a cached group or a snapshot, apply deltas up."""
        cached = self._maps.get(gid)
        if cached is not None:
            self._maps.move_to_end(gid)
            return cached
        if gid == EMPTY_GROUP:
            return {}, 0
        path: list[tuple[int, int, list[Change]]] = []
        state: dict[StateKey, bytes] = {}
        current: int | None = gid
        while current is not None:
            base, chain, changes = self._read(current)
            path.append((current, chain, changes))
            below = None if base is None else self._maps.get(base)
            if below is not None:
                state = below[0]
                break
            current = None if base == EMPTY_GROUP else base
        loaded = (state, 0)
        for group, chain, changes in reversed(path):
            loaded = (_applied(loaded[0], changes), chain)
            _remember(self._maps, group, loaded, GROUP_CACHE_SIZE)
        return loaded

    def derive(self, base: int, changes: Mapping[StateKey, bytes | None]) -> int:
        """A new group: `base` with `changes` applied (None removes a key)."""
        base_state, base_chain = self._load(base)
        listed: list[Change] = [(t, k, v) for (t, k), v in sorted(changes.items())]
        state = _applied(base_state, listed)
        chain = base_chain + 1
        if base == EMPTY_GROUP or chain > self.max_chain:
            return self._write(None, 0, state, _entries(state))
        return self._write(base, chain, state, listed)

    def store_state(self, state: Mapping[StateKey, bytes], candidates: Sequence[int]) -> int:
        """A group holding `state`: an equal candidate if any, else a delta on the closest."""
        best: tuple[int, int] | None = None
        for gid in candidates:
            base = self.load(gid)
            size = _difference_size(base, state)
            if size == 0:
                return gid
            if best is None or size < best[0]:
                best = (size, gid)
        base_gid = EMPTY_GROUP if best is None else best[1]
        base = self.load(base_gid)
        changes: dict[StateKey, bytes | None] = dict(state.items() - base.items())
        changes.update(dict.fromkeys(base.keys() - state.keys()))
        return self.derive(base_gid, changes)

    def _allocate(self) -> int:
        if self._next is None:
            raw = self._table.get(_NEXT)
            self._next = EMPTY_GROUP + 1 if raw is None else int.from_bytes(raw, "big")
        gid = self._next
        self._next += 1
        self._table.put(_NEXT, _u64(self._next))
        return gid

    def _write(self, base: int | None, chain: int, state: dict[StateKey, bytes],
               changes: list[Change]) -> int:
        gid = self._allocate()
        chunks = [changes[i:i + MAX_ENTRIES_PER_RECORD]
                  for i in range(0, len(changes), MAX_ENTRIES_PER_RECORD)] or [[]]
        self._table.put(_GROUP + _u64(gid),
                        msgpack.packb([base, chain, len(chunks) - 1, chunks[0]]))
        for index, chunk in enumerate(chunks[1:], start=1):
            self._table.put(_CHUNK + _u64(gid) + index.to_bytes(4, "big"), msgpack.packb(chunk))
        _remember(self._maps, gid, (state, chain), GROUP_CACHE_SIZE)
        return gid

    def _read(self, gid: int) -> tuple[int | None, int, list[Change]]:
        raw = self._table.get(_GROUP + _u64(gid))
        if raw is None:
            raise DamagedTopicError(f"state group {gid} missing", self._topic_id)
        try:
            base, chain, extra, changes = msgpack.unpackb(raw, raw=False)
            for index in range(1, extra + 1):
                chunk = self._table.get(_CHUNK + _u64(gid) + index.to_bytes(4, "big"))
                if chunk is None:
                    raise DamagedTopicError(f"state group {gid} lost chunk {index}",
                                            self._topic_id)
                changes.extend(msgpack.unpackb(chunk, raw=False))
        except DamagedTopicError:
            raise
        except Exception as exc:  # msgpack raises many types for a garbled record
            raise DamagedTopicError(f"state group {gid} does not decode ({type(exc).__name__})",
                                    self._topic_id) from None
        return base, chain, changes

    # ---------------------------------------------------------- resolution memo

    def memo(self, gids: Iterable[int]) -> int | None:
        """The group a resolution of exactly these groups produced before, if any."""
        key = _memo_key(gids)
        cached = self._memo.get(key)
        if cached is not None:
            return cached
        raw = self._table.get(_MEMO + key)
        if raw is None:
            return None
        gid = int.from_bytes(raw, "big")
        _remember(self._memo, key, gid, self._memo_cache_size)
        return gid

    def remember(self, gids: Iterable[int], result: int) -> None:
        key = _memo_key(gids)
        self._table.put(_MEMO + key, _u64(result))
        _remember(self._memo, key, result, self._memo_cache_size)


def _memo_key(gids: Iterable[int]) -> bytes:
    joined = b"".join(_u64(g) for g in sorted(set(gids)))
    return hashlib.blake2b(joined, digest_size=MEMO_DIGEST_BYTES).digest()


def _applied(state: Mapping[StateKey, bytes], changes: Iterable[Change]) -> dict[StateKey, bytes]:
    result = dict(state)
    for kind, key, event_id in changes:
        if event_id is None:
            result.pop((kind, key), None)
        else:
            result[(kind, key)] = event_id
    return result


def _entries(state: Mapping[StateKey, bytes]) -> list[Change]:
    return [(t, k, v) for (t, k), v in sorted(state.items())]


def _difference_size(a: Mapping[StateKey, bytes], b: Mapping[StateKey, bytes]) -> int:
    # The items both hold, intersected in C (keys and ids are hashable): a merge of a
    # thousand-member topic compares thousands of items per candidate.
    shared = len(a.items() & b.items())
    return len(a) + len(b) - 2 * shared
