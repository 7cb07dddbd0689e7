"""The Matrix Event Graph of one topic: the CRDT of the MEG paper, on a Store.

Theory of operation
-------------------
The state is a rooted DAG of events (paper, Listing 1). `add(event)` is the
effector: if every parent is present (the delivery precondition), the event
becomes a vertex, its parents stop being forward extremities and it becomes
one; otherwise it waits in the *buffer* until its parents arrive, and the
moment the last one does, it is applied, which may release more buffered
events (a cascade). `add` is idempotent (a known or buffered id is a
duplicate) and commutative (the set of applied events, and so the edges and
extremities, does not depend on arrival order) — the property tests check
both.

Validation that needs the parents happens at application time, identically
on every correct replica because it looks only at the event's ancestry:
parents must form an antichain (no parent is an ancestor of another; the
search is bounded by depth and by MAX_ANTICHAIN_VISITS and visits exactly the
ancestors whose depth could matter, so the verdict is the same everywhere).
Stateless validation (encoding, signature, topic, clock) is the Reference
Monitor's job and happens before `add`.

Depth is computed locally (create = 0, else 1 + max parent depth) and never
taken from the wire. The delivery table records the order in which events
were applied: a topological order (never an event before its parents) that
subscribers resume from a cursor.

The buffer is persistent and bounded per author and in total; beyond a cap
the oldest buffered events are dropped (they can be fetched again: whoever
sent a child still has its ancestry). This bounds the forged-parent DoS of
the paper's Theorem 3 proof.

Writes collect in a PendingWrites set; `commit()` makes them durable in one
store transaction (group commit). Reads always see pending writes.

Key layout (every key starts with the 32-byte topic id T)::

    events        T|id                      -> msgpack [depth, delivery position, raw]
    children      T|parent|child            -> b""
    extremities   T|id                      -> b""
    buffer        T|id                      -> msgpack [arrival, raw]
    buffer_index  T|"w"|missing parent|id   -> b""   (who waits on a parent)
                  T|"a"|author|arrival|id   -> b""   (per-author age order)
                  T|"o"|arrival|id          -> b""   (global age order)
    authors       T|author|seq|id           -> b""   (per-author sequence index)
    delivery      T|position                -> id
    meta          T|name[|...]              -> counters (8-byte big-endian)

Layers built on the graph (topic state, the linearizer) keep their records in
the tables the graph does not own (`EXTENSION_TABLES`) through `table(name)`:
a topic-prefixed view over the same PendingWrites, so their writes commit in
the same transaction as the events they describe and can never disagree with
the graph after a crash.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgpack

from node.core.event import ID_BYTES, Event, trusted_event
from node.core.pending import PendingWrites
from storage.protocol import (
    TABLE_AUTHORS,
    TABLE_BUFFER,
    TABLE_BUFFER_INDEX,
    TABLE_CHILDREN,
    TABLE_DELIVERY,
    TABLE_EVENTS,
    TABLE_EXTREMITIES,
    TABLE_META,
    TABLE_ORDER,
    TABLE_STATE,
    Store,
)

# Tables the graph itself never writes: layers above it own them (`Graph.table`).
EXTENSION_TABLES = frozenset({TABLE_STATE, TABLE_ORDER})

# Limits. Each is a named bound on memory, time or disk that a peer could
# otherwise push without end.
MAX_BUFFERED_PER_AUTHOR = 1_024
MAX_BUFFERED_TOTAL = 16_384
MAX_ANTICHAIN_VISITS = 65_536
MAX_WALK = 100_000  # default bound for ancestor/descendant walks
NODE_CACHE_SIZE = 65_536  # (depth, parents) of recently used events
EVENT_CACHE_SIZE = 4_096  # decoded events
MAX_REJECTED_REMEMBERED = 4_096
LATEST_SEQ_CACHE_SIZE = 4_096  # authors whose latest sequence number is cached

_WAIT = b"w"
_BY_AUTHOR = b"a"
_BY_AGE = b"o"
_META_BUFFER_TOTAL = b"buffer_total"
_META_BUFFER_AUTHOR = b"buffer_author"
_META_ARRIVALS = b"arrivals"
_META_DELIVERED = b"delivered"
_META_EQUIVOCATIONS = b"equivocations"


def _u64(value: int) -> bytes:
    return value.to_bytes(8, "big")


def _from_u64(raw: bytes | None) -> int:
    return 0 if raw is None else int.from_bytes(raw, "big")


@dataclass(frozen=True, slots=True)
class GraphLimits:
    buffered_per_author: int = MAX_BUFFERED_PER_AUTHOR
    buffered_total: int = MAX_BUFFERED_TOTAL
    antichain_visits: int = MAX_ANTICHAIN_VISITS


@dataclass(frozen=True, slots=True)
class Rejection:
    event_id: bytes
    reason: str


@dataclass(frozen=True, slots=True)
class AddResult:
    """What one `add` did.

    `status` is about the event passed in: "applied", "buffered", "duplicate"
    or "rejected". `applied` lists every event that became part of the graph
    (the event itself and any buffered descendants it released), in
    application order; `rejected` the ones that failed application checks.
    `missing` are parents the caller should fetch; `dropped` buffered events
    evicted by the caps; `equivocations` applied events whose (author, seq)
    was already taken by another event.
    """

    status: str
    event_id: bytes
    applied: tuple[Event, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    missing: tuple[bytes, ...] = ()
    dropped: tuple[bytes, ...] = ()
    equivocations: tuple[Event, ...] = ()

    @property
    def reason(self) -> str | None:
        for rejection in self.rejected:
            if rejection.event_id == self.event_id:
                return rejection.reason
        return None


class TopicTable:
    """One extension table of one topic, read and written through the graph's write-set.

    Keys are given without the topic prefix; writes are pending until
    `Graph.commit()`, reads see them at once (as for the graph's own tables).
    """

    def __init__(self, writes: PendingWrites, table: str, topic_id: bytes) -> None:
        self._w = writes
        self._table = table
        self._t = topic_id

    def get(self, key: bytes) -> bytes | None:
        return self._w.get(self._table, self._t + key)

    def put(self, key: bytes, value: bytes) -> None:
        self._w.put(self._table, self._t + key, value)

    def delete(self, key: bytes) -> None:
        self._w.delete(self._table, self._t + key)

    def scan(self, prefix: bytes, *, reverse: bool = False,
             limit: int | None = None) -> list[tuple[bytes, bytes]]:
        """(key without the topic prefix, value) pairs under `prefix`, in key order."""
        cut = len(self._t)
        pairs = self._w.scan(self._table, self._t + prefix, reverse=reverse, limit=limit)
        return [(key[cut:], value) for key, value in pairs]


@dataclass
class _Cascade:
    applied: list[Event] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    equivocations: list[Event] = field(default_factory=list)


class Graph:
    """One topic's MEG over a Store. Single-threaded; not safe to share across threads."""

    def __init__(self, store: Store, topic_id: bytes, limits: GraphLimits = GraphLimits()) -> None:
        if len(topic_id) != ID_BYTES:
            raise ValueError("topic id must be 32 bytes")
        self.topic_id = topic_id
        self.limits = limits
        self._w = PendingWrites(store)
        self._t = topic_id
        self._extremities: set[bytes] = {
            key[ID_BYTES:] for key, _ in store.scan(TABLE_EXTREMITIES, topic_id)
        }
        self._nodes: OrderedDict[bytes, tuple[int, tuple[bytes, ...]]] = OrderedDict()
        self._events: OrderedDict[bytes, Event] = OrderedDict()
        self._rejected: OrderedDict[bytes, str] = OrderedDict()
        self._latest_seq: OrderedDict[bytes, int | None] = OrderedDict()
        self._discard_listeners: list[Callable[[], None]] = []

    # ------------------------------------------------------------ extensions

    def table(self, name: str) -> TopicTable:
        """This topic's slice of an extension table, written in the graph's transactions."""
        if name not in EXTENSION_TABLES:
            raise ValueError(f"{name!r} is not an extension table ({sorted(EXTENSION_TABLES)})")
        return TopicTable(self._w, name, self._t)

    def on_discard(self, listener: Callable[[], None]) -> None:
        """Call `listener` whenever pending writes are discarded (its caches are stale)."""
        self._discard_listeners.append(listener)

    # ------------------------------------------------------------------ queries

    def has(self, event_id: bytes) -> bool:
        if event_id in self._nodes:  # cached nodes are present: events are never removed
            return True
        return self._w.get(TABLE_EVENTS, self._t + event_id) is not None

    def get(self, event_id: bytes) -> Event | None:
        cached = self._events.get(event_id)
        if cached is not None:
            self._events.move_to_end(event_id)
            return cached
        record = self._w.get(TABLE_EVENTS, self._t + event_id)
        if record is None:
            return None
        event = trusted_event(msgpack.unpackb(record)[2])
        self._remember(self._events, event_id, event, EVENT_CACHE_SIZE)
        return event

    def depth(self, event_id: bytes) -> int | None:
        info = self._node(event_id)
        return None if info is None else info[0]

    def parents_of(self, event_id: bytes) -> tuple[bytes, ...] | None:
        info = self._node(event_id)
        return None if info is None else info[1]

    @property
    def has_root(self) -> bool:
        return self.has(self.topic_id)

    def extremities(self) -> list[bytes]:
        """Forward extremities (events with no children), sorted."""
        return sorted(self._extremities)

    @property
    def width(self) -> int:
        return len(self._extremities)

    def children(self, event_id: bytes) -> list[bytes]:
        prefix = self._t + event_id
        return [key[len(prefix):] for key, _ in self._w.scan(TABLE_CHILDREN, prefix)]

    def is_buffered(self, event_id: bytes) -> bool:
        if not self.buffered_count:
            return False
        return self._w.get(TABLE_BUFFER, self._t + event_id) is not None

    def buffered_event(self, event_id: bytes) -> Event | None:
        record = self._w.get(TABLE_BUFFER, self._t + event_id)
        return None if record is None else trusted_event(msgpack.unpackb(record)[1])

    @property
    def buffered_count(self) -> int:
        return _from_u64(self._w.get(TABLE_META, self._t + _META_BUFFER_TOTAL))

    def buffered_ids(self) -> list[bytes]:
        prefix = self._t + _BY_AGE
        return [key[len(prefix) + 8:] for key, _ in self._w.scan(TABLE_BUFFER_INDEX, prefix)]

    def missing_parents(self, limit: int = 1_024) -> list[bytes]:
        """Parents that buffered events wait for and that are neither here nor buffered."""
        prefix = self._t + _WAIT
        wanted: list[bytes] = []
        last = None
        for key, _ in self._w.scan(TABLE_BUFFER_INDEX, prefix):
            parent = key[len(prefix):len(prefix) + ID_BYTES]
            if parent == last:
                continue
            last = parent
            if not self.has(parent) and not self.is_buffered(parent):
                wanted.append(parent)
                if len(wanted) >= limit:
                    break
        return wanted

    def rejected_reason(self, event_id: bytes) -> str | None:
        """Why this replica rejected `event_id` at application time (recent ones only)."""
        return self._rejected.get(event_id)

    @property
    def delivered_count(self) -> int:
        return _from_u64(self._w.get(TABLE_META, self._t + _META_DELIVERED))

    def deliveries(self, since: int = 0, limit: int = 1_000) -> list[tuple[int, Event]]:
        """Applied events from delivery position `since` on: a causal order, resumable."""
        out: list[tuple[int, Event]] = []
        end = min(self.delivered_count, since + limit)
        for position in range(max(since, 0), end):
            event_id = self._w.get(TABLE_DELIVERY, self._t + _u64(position))
            assert event_id is not None, "delivery table has a hole"
            event = self.get(event_id)
            assert event is not None
            out.append((position, event))
        return out

    def author_latest_seq(self, author: bytes) -> int | None:
        if author in self._latest_seq:
            return self._latest_seq[author]
        latest = self._scan_latest_seq(author)
        self._remember(self._latest_seq, author, latest, LATEST_SEQ_CACHE_SIZE)
        return latest

    def _scan_latest_seq(self, author: bytes) -> int | None:
        found = self._w.scan(TABLE_AUTHORS, self._t + author, reverse=True, limit=1)
        if not found:
            return None
        key = found[0][0]
        return int.from_bytes(key[ID_BYTES + len(author):ID_BYTES + len(author) + 8], "big")

    def events_by(self, author: bytes, seq: int) -> list[bytes]:
        prefix = self._t + author + _u64(seq)
        return [key[len(prefix):] for key, _ in self._w.scan(TABLE_AUTHORS, prefix)]

    @property
    def equivocation_count(self) -> int:
        return _from_u64(self._w.get(TABLE_META, self._t + _META_EQUIVOCATIONS))

    def ancestors(self, ids: Iterable[bytes], limit: int = MAX_WALK) -> list[bytes]:
        """Strict ancestors of `ids` present here, newest (deepest) first, at most `limit`."""
        return self._walk(ids, limit, self.parents_of)

    def descendants(self, ids: Iterable[bytes], limit: int = MAX_WALK) -> list[bytes]:
        """Strict descendants of `ids` present here, breadth first, at most `limit`."""
        return self._walk(ids, limit, lambda i: tuple(self.children(i)))

    def _walk(self, ids: Iterable[bytes], limit: int, step) -> list[bytes]:
        frontier = sorted(i for i in set(ids) if self.has(i))
        seen: set[bytes] = set(frontier)
        out: list[bytes] = []
        while frontier and len(out) < limit:
            next_frontier: list[bytes] = []
            for event_id in frontier:
                for neighbour in step(event_id) or ():
                    if neighbour not in seen:
                        seen.add(neighbour)
                        out.append(neighbour)
                        next_frontier.append(neighbour)
                        if len(out) >= limit:
                            return out
            frontier = sorted(next_frontier)
        return out

    def not_below(self, heads: Iterable[bytes], limit: int = MAX_WALK) -> list[bytes]:
        """Events here that are neither `heads` nor their ancestors, parents first.

        This is what a peer whose forward extremities are `heads` lacks (heads
        unknown here are ignored). It walks back from our extremities in order
        of decreasing depth, marking everything reachable from the peer's
        heads; a node is popped only after every deeper node, so its mark is
        final when popped, and the walk visits the missing events plus a
        frontier about the size of the heads, not the whole graph. At most
        MAX_WALK events are visited; the `limit` shallowest are returned, in
        (depth, id) order, which is a valid delivery order.
        """
        known = {h for h in heads if self.has(h)}
        heap: list[tuple[int, bytes]] = []
        below: set[bytes] = set(known)
        queued: set[bytes] = set()
        unmarked_in_heap = 0

        def push(event_id: bytes) -> None:
            nonlocal unmarked_in_heap
            if event_id in queued:
                return
            queued.add(event_id)
            if event_id not in below:
                unmarked_in_heap += 1
            heapq.heappush(heap, (-(self.depth(event_id) or 0), event_id))

        for event_id in sorted(known | self._extremities):
            push(event_id)
        found: list[tuple[int, bytes]] = []
        while heap and unmarked_in_heap > 0 and len(found) < MAX_WALK:
            negative_depth, event_id = heapq.heappop(heap)
            is_below = event_id in below
            if not is_below:
                unmarked_in_heap -= 1
                found.append((-negative_depth, event_id))
            for parent in self.parents_of(event_id) or ():
                if is_below and parent not in below:
                    below.add(parent)
                    if parent in queued:
                        unmarked_in_heap -= 1  # queued unmarked, marked now
                push(parent)
        found.sort()
        return [event_id for _, event_id in found[:limit]]

    # ------------------------------------------------------------------ updates

    def add(self, event: Event) -> AddResult:
        """Apply `event` (or buffer it until its parents arrive). Never raises on bad events."""
        event_id = event.id
        if self.has(event_id) or self.is_buffered(event_id):
            return AddResult("duplicate", event_id)
        if event.is_create:
            if event_id != self.topic_id:
                return self._reject_only(event_id, "wrong_topic")
        elif event.topic != self.topic_id:
            return self._reject_only(event_id, "wrong_topic")
        missing = tuple(p for p in event.parents if not self.has(p))
        if missing:
            dropped = self._buffer(event, missing)
            if event_id in dropped:
                return AddResult("rejected", event_id, rejected=(Rejection(event_id, "buffer_full"),),
                                 dropped=tuple(d for d in dropped if d != event_id))
            wanted = tuple(p for p in missing if not self.is_buffered(p))
            return AddResult("buffered", event_id, missing=wanted, dropped=tuple(dropped))
        cascade = _Cascade()
        self._apply_cascade(event, cascade)
        status = "rejected" if any(r.event_id == event_id for r in cascade.rejected) else "applied"
        return AddResult(status, event_id, applied=tuple(cascade.applied),
                         rejected=tuple(cascade.rejected),
                         equivocations=tuple(cascade.equivocations))

    def commit(self) -> int:
        """Make every pending write durable in one transaction; returns the op count."""
        ops = self._w.take_ops()
        if ops:
            self._w.store.apply(ops)
        return len(ops)

    @property
    def pending_ops(self) -> int:
        return len(self._w)

    def discard_pending(self) -> None:
        """Forget uncommitted writes (after a failed commit) and reload cached state."""
        self._w.discard()
        self._nodes.clear()
        self._events.clear()
        self._latest_seq.clear()
        self._extremities = {
            key[ID_BYTES:] for key, _ in self._w.store.scan(TABLE_EXTREMITIES, self._t)
        }
        for listener in self._discard_listeners:
            listener()

    # ----------------------------------------------------------------- internals

    def _reject_only(self, event_id: bytes, reason: str) -> AddResult:
        return AddResult("rejected", event_id, rejected=(Rejection(event_id, reason),))

    @staticmethod
    def _remember(cache: OrderedDict, key, value, size: int) -> None:
        cache[key] = value
        if len(cache) > size:
            cache.popitem(last=False)

    def _node(self, event_id: bytes) -> tuple[int, tuple[bytes, ...]] | None:
        info = self._nodes.get(event_id)
        if info is not None:
            return info
        record = self._w.get(TABLE_EVENTS, self._t + event_id)
        if record is None:
            return None
        depth, _, raw = msgpack.unpackb(record)
        info = (depth, tuple(msgpack.unpackb(raw)[4]))
        self._remember(self._nodes, event_id, info, NODE_CACHE_SIZE)
        return info

    def _antichain_violation(self, parents: tuple[bytes, ...]) -> str | None:
        """None if no parent is an ancestor of another, else the rejection reason.

        Only ancestors at depth >= the shallowest parent can be parents, so the
        walk stops there; the set it visits is fixed by the ancestry alone,
        which makes the verdict (including exhaustion) the same on every replica.
        """
        if len(parents) < 2:
            return None
        parent_set = set(parents)
        depths = {p: self._node(p)[0] for p in parents}  # type: ignore[index]
        floor = min(depths.values())
        stack = [p for p in parents if depths[p] > floor]
        seen: set[bytes] = set()
        while stack:
            current = stack.pop()
            for ancestor in self._node(current)[1]:  # type: ignore[index]
                if ancestor in seen:
                    continue
                if ancestor in parent_set:
                    return "parents_not_antichain"
                seen.add(ancestor)
                if len(seen) > self.limits.antichain_visits:
                    return "antichain_search_exhausted"
                depth = self._node(ancestor)[0]  # type: ignore[index]
                if depth > floor:
                    stack.append(ancestor)
        return None

    def _apply_cascade(self, first: Event, cascade: _Cascade) -> None:
        ready = [first]
        while ready:
            event = ready.pop()
            if not self._apply_one(event, cascade):
                continue
            if not self.buffered_count:
                continue  # nothing can be waiting: skip the index scan on the hot path
            for waiting_id in self._waiting_on(event.id):
                self._w.delete(TABLE_BUFFER_INDEX, self._t + _WAIT + event.id + waiting_id)
                waiting = self.buffered_event(waiting_id)
                if waiting is not None and all(self.has(p) for p in waiting.parents):
                    self._unbuffer(waiting)
                    ready.append(waiting)

    def _waiting_on(self, parent_id: bytes) -> list[bytes]:
        prefix = self._t + _WAIT + parent_id
        return [key[len(prefix):] for key, _ in self._w.scan(TABLE_BUFFER_INDEX, prefix)]

    def _apply_one(self, event: Event, cascade: _Cascade) -> bool:
        # Callers guarantee the event is new: `add` checked, and a buffered event
        # cannot also be in the graph.
        reason = self._antichain_violation(event.parents)
        if reason is not None:
            cascade.rejected.append(Rejection(event.id, reason))
            self._remember(self._rejected, event.id, reason, MAX_REJECTED_REMEMBERED)
            return False
        depth = 0 if not event.parents else 1 + max(self._node(p)[0] for p in event.parents)  # type: ignore[index]
        t = self._t
        position = self.delivered_count
        self._w.put(TABLE_EVENTS, t + event.id, msgpack.packb([depth, position, event.raw]))
        self._w.put(TABLE_DELIVERY, t + _u64(position), event.id)
        self._w.put(TABLE_META, t + _META_DELIVERED, _u64(position + 1))
        for parent in event.parents:
            self._w.put(TABLE_CHILDREN, t + parent + event.id, b"")
            if parent in self._extremities:
                self._extremities.discard(parent)
                self._w.delete(TABLE_EXTREMITIES, t + parent)
        self._extremities.add(event.id)
        self._w.put(TABLE_EXTREMITIES, t + event.id, b"")
        latest = self.author_latest_seq(event.author)
        # Only a sequence number at or below the author's latest can already be taken.
        if latest is not None and event.seq <= latest and self.events_by(event.author, event.seq):
            cascade.equivocations.append(event)
            count = _from_u64(self._w.get(TABLE_META, t + _META_EQUIVOCATIONS))
            self._w.put(TABLE_META, t + _META_EQUIVOCATIONS, _u64(count + 1))
        self._w.put(TABLE_AUTHORS, t + event.author + _u64(event.seq) + event.id, b"")
        if latest is None or event.seq > latest:
            self._remember(self._latest_seq, event.author, event.seq, LATEST_SEQ_CACHE_SIZE)
        self._remember(self._nodes, event.id, (depth, event.parents), NODE_CACHE_SIZE)
        self._remember(self._events, event.id, event, EVENT_CACHE_SIZE)
        cascade.applied.append(event)
        return True

    def _buffer(self, event: Event, missing: tuple[bytes, ...]) -> list[bytes]:
        """Put `event` in the buffer; returns ids evicted to respect the caps."""
        t = self._t
        arrival = _from_u64(self._w.get(TABLE_META, t + _META_ARRIVALS))
        self._w.put(TABLE_META, t + _META_ARRIVALS, _u64(arrival + 1))
        self._w.put(TABLE_BUFFER, t + event.id, msgpack.packb([arrival, event.raw]))
        for parent in missing:
            self._w.put(TABLE_BUFFER_INDEX, t + _WAIT + parent + event.id, b"")
        self._w.put(TABLE_BUFFER_INDEX, t + _BY_AUTHOR + event.author + _u64(arrival) + event.id, b"")
        self._w.put(TABLE_BUFFER_INDEX, t + _BY_AGE + _u64(arrival) + event.id, b"")
        self._bump_buffer_counts(event.author, +1)
        dropped: list[bytes] = []
        author_prefix = t + _BY_AUTHOR + event.author
        while self._author_buffered(event.author) > self.limits.buffered_per_author:
            oldest = self._w.scan(TABLE_BUFFER_INDEX, author_prefix, limit=1)[0][0]
            dropped.append(self._evict(oldest[len(author_prefix) + 8:]))
        age_prefix = t + _BY_AGE
        while self.buffered_count > self.limits.buffered_total:
            oldest = self._w.scan(TABLE_BUFFER_INDEX, age_prefix, limit=1)[0][0]
            dropped.append(self._evict(oldest[len(age_prefix) + 8:]))
        return dropped

    def _author_buffered(self, author: bytes) -> int:
        return _from_u64(self._w.get(TABLE_META, self._t + _META_BUFFER_AUTHOR + author))

    def _bump_buffer_counts(self, author: bytes, delta: int) -> None:
        t = self._t
        total = self.buffered_count + delta
        self._w.put(TABLE_META, t + _META_BUFFER_TOTAL, _u64(total))
        per_author = self._author_buffered(author) + delta
        if per_author:
            self._w.put(TABLE_META, t + _META_BUFFER_AUTHOR + author, _u64(per_author))
        else:
            self._w.delete(TABLE_META, t + _META_BUFFER_AUTHOR + author)

    def _evict(self, event_id: bytes) -> bytes:
        event = self.buffered_event(event_id)
        assert event is not None
        self._unbuffer(event)
        return event_id

    def _unbuffer(self, event: Event) -> None:
        t = self._t
        record = self._w.get(TABLE_BUFFER, t + event.id)
        assert record is not None
        arrival = msgpack.unpackb(record)[0]
        self._w.delete(TABLE_BUFFER, t + event.id)
        for parent in event.parents:
            self._w.delete(TABLE_BUFFER_INDEX, t + _WAIT + parent + event.id)
        self._w.delete(TABLE_BUFFER_INDEX, t + _BY_AUTHOR + event.author + _u64(arrival) + event.id)
        self._w.delete(TABLE_BUFFER_INDEX, t + _BY_AGE + _u64(arrival) + event.id)
        self._bump_buffer_counts(event.author, -1)
