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
parents must form an antichain (no parent is an ancestor of another). The
search visits only ancestors deep enough to be a parent, in an order fixed by
the ancestry, and at most ANTICHAIN_SEARCH_VISITS of them; a search that
runs out of that budget without finding a violation *accepts* the event.
Rejecting instead would refuse honest merges: once a topic holds more
events than the budget, a device back from a long absence publishes on an
old head, and every merge of that head with a deep one — every later local
publish names all the extremities — would be refused for good. Accepting
is just as deterministic (the budget is a protocol constant, not a node
setting: nodes with different budgets would decide differently and their
graphs diverge), and a non-antichain accepted that way only adds a
redundant edge: depths, extremities and delivery stay well defined.
Exhausted searches are counted (`antichain_searches_exhausted`).
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

An event rejected at application time can never become a vertex on any
correct replica (the verdict depends on its ancestry alone), and neither
can anything built on it. So the graph remembers such rejections
(persistently, the newest `GraphLimits.rejected_remembered`), rejects a
descendant with reason `parent_rejected` — at once when it arrives after
the rejection, and by dropping it from the buffer when it was waiting
there — and never lists a rejected id in `missing_parents()` (fetching it
would only reject it again, forever). Both arrival orders end in the same
state. A rejection forgotten beyond the bound only costs one re-fetch:
the parent is rejected again and its waiting children with it.

Writes collect in a PendingWrites set and reads always see them. They
become durable in one store transaction (group commit): `commit()` hands
them to the store and returns once the store has them, or `take_writes()`
hands them to a caller that commits several write-sets in one transaction
(the node's committer, node.committer, the only writer in a running node).
Nothing of a batch may be acknowledged to anyone before that commit
returned; after a failed one, `discard_pending()` forgets the batch and
reloads what the store holds. The graph starts no thread and never waits on
a clock: the store does the I/O.

Key layout (every key starts with the 32-byte topic id T)::

    delivery      T|position                -> msgpack [depth, raw]  (the events themselves)
    events        T|id                      -> position (8 bytes)    (the id index)
    children      T|parent position|child   -> b""
    extremities   T|id                      -> b""
    buffer        T|id                      -> msgpack [arrival, raw]
    buffer_index  T|"w"|missing parent|id   -> b""   (who waits on a parent)
                  T|"a"|author|arrival|id   -> b""   (per-author age order)
                  T|"o"|arrival|id          -> b""   (global age order)
                  T|"r"|id                  -> ordinal (8 bytes) + reason (rejected ids)
    authors       T|author|seq|id           -> b""   (per-author sequence index)
    meta          T|name[|...]              -> counters (8-byte big-endian)

Why events live under their delivery position: a group commit writes its
events at the end of the log and its children entries next to their
(recent) parents' positions, so it dirties a few pages per table that the
fsync writes out. Keyed by their random ids, the same events and children
entries would land on a different B-tree page each, and the commit would
write (and fsync) most of both trees' pages every time: measured over 20
commits of 1,024 events, 12.7 KB written to disk per event keyed by id
against 3.1 KB in this layout, and the commit 2.5 times slower. Only the id
index keeps random keys, and its entries are small.

The walks anti-entropy needs (`not_below`, `recent`) live in
`node.core.walks`, with the memo that makes a long catch-up's continuations
cost one page each instead of the whole remaining gap, and the pages in
delivery order for a peer lagging by more than MAX_WALK events (the
delivery table is read by position for them: `_locate`, `_at`).

The counters read on every `add` (delivered, buffered) and the remembered
rejections are mirrored in memory; `discard_pending` reloads them.

Layers built on the graph (topic state, the linearizer) keep their records in
the tables the graph does not own (`EXTENSION_TABLES`) through `table(name)`:
a topic-prefixed view over the same PendingWrites, so their writes commit in
the same transaction as the events they describe and can never disagree with
the graph after a crash.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgpack

from node.core import walks
from node.core.event import ID_BYTES, Event, event_id_of, pack, trusted_event
from node.core.fastinit import fast_init
from node.core.pending import PendingWrites, Writes, commit_writes
from node.core.store import (
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
# A protocol constant, not a per-node limit: every replica of a topic must use
# the same value, because it decides which events are accepted (module docstring).
ANTICHAIN_SEARCH_VISITS = 65_536
MAX_WALK = 100_000  # default bound for ancestor/descendant walks
NODE_CACHE_SIZE = 65_536  # (depth, parents) of recently used events
EVENT_CACHE_SIZE = 4_096  # decoded events
MAX_REJECTED_REMEMBERED = 4_096  # application-time rejections kept (persistently) per topic
LATEST_SEQ_CACHE_SIZE = 4_096  # authors whose latest sequence number is cached

# The reason given to a descendant of an event rejected at application time.
PARENT_REJECTED = "parent_rejected"

# What the node cache holds per event: (depth, parents, delivery position as
# its 8-byte key part). The walks read the first two.
_NodeInfo = tuple[int, tuple[bytes, ...], bytes]

_UNCACHED = object()  # "not in the cache" (None is a cached "no events yet")

_WAIT = b"w"
_BY_AUTHOR = b"a"
_BY_AGE = b"o"
_REJECTED = b"r"
_META_REJECTIONS = b"rejections"  # ordinal of the next remembered rejection
_META_BUFFER_TOTAL = b"buffer_total"
_META_BUFFER_AUTHOR = b"buffer_author"
_META_ARRIVALS = b"arrivals"
_META_DELIVERED = b"delivered"
_META_EQUIVOCATIONS = b"equivocations"


def _u64(value: int) -> bytes:
    return value.to_bytes(8, "big")


def _from_u64(raw: bytes | None) -> int:
    return 0 if raw is None else int.from_bytes(raw, "big")


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphLimits:
    """Per-node bounds on memory and disk: each node may choose its own.

    Nothing here changes which events a graph accepts, only how much it keeps
    waiting or remembers (the antichain search bound, which does, is the
    protocol constant ANTICHAIN_SEARCH_VISITS). Keyword-only: a field was
    removed, and positional arguments would silently shift onto the next.
    """

    buffered_per_author: int = MAX_BUFFERED_PER_AUTHOR
    buffered_total: int = MAX_BUFFERED_TOTAL
    rejected_remembered: int = MAX_REJECTED_REMEMBERED


@fast_init
@dataclass(frozen=True, slots=True)
class Rejection:
    event_id: bytes
    reason: str


@fast_init
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


class _Cascade:
    """What one `add` did so far (a plain class: built for every event)."""

    __slots__ = ("applied", "rejected", "equivocations")

    def __init__(self) -> None:
        self.applied: list[Event] = []
        self.rejected: list[Rejection] = []
        self.equivocations: list[Event] = []


class Graph:
    """One topic's MEG over a Store. Single-threaded; not safe to share across threads."""

    def __init__(self, store: Store, topic_id: bytes, limits: GraphLimits = GraphLimits()) -> None:
        if len(topic_id) != ID_BYTES:
            raise ValueError("topic id must be 32 bytes")
        self.topic_id = topic_id
        self.limits = limits
        self._store = store
        self._w = PendingWrites(store)
        self._t = topic_id
        self._extremities: set[bytes] = {
            key[ID_BYTES:] for key, _ in store.scan(TABLE_EXTREMITIES, topic_id)
        }
        self._nodes: OrderedDict[bytes, _NodeInfo] = OrderedDict()
        self._events: OrderedDict[bytes, Event] = OrderedDict()
        self._latest_seq: OrderedDict[bytes, int | None] = OrderedDict()
        self._discard_listeners: list[Callable[[], None]] = []
        # Mirrors of persistent counters (None: read from the store on next use).
        self._delivered: int | None = None
        # The delivered count last handed to the store (None: not known here).
        self._delivered_saved: int | None = None
        self._buffered: int | None = None
        # id -> (ordinal, reason), oldest first: the whole (bounded) persistent memory.
        self._rejected: OrderedDict[bytes, tuple[int, str]] = self._load_rejections()
        self._memo = walks.NotBelowMemo()
        # Antichain searches that ran out of budget and accepted (since this
        # object was made; a statistic, not state: it is not persisted).
        self.antichain_searches_exhausted = 0
        # The last id `has` found absent in the store: the Reference Monitor's
        # duplicate test and `add` ask about each new event in turn. Reset when
        # any event is applied and when writes are discarded.
        self._absent: bytes | None = None
        self._root_seen = False
        # The extremities as the store holds them (as of the last commit). The
        # table is written once per commit, the difference from the live set
        # (`_seal_batch`), not once per event: a chain of a thousand events
        # would otherwise add and remove a thousand keys in the write-set.
        self._stored_extremities: set[bytes] = set(self._extremities)

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
        if event_id == self._absent:
            return False
        if self._w.get(TABLE_EVENTS, self._t + event_id) is None:
            self._absent = event_id
            return False
        return True

    def get(self, event_id: bytes) -> Event | None:
        cached = self._events.get(event_id)
        if cached is not None:
            self._events.move_to_end(event_id)
            return cached
        record = self._record(event_id)
        if record is None:
            return None
        event = trusted_event(msgpack.unpackb(record)[1])
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
        # Asked before every local event; once true it stays true (until
        # uncommitted writes are discarded), and the root may have left the
        # node cache long ago.
        if not self._root_seen:
            self._root_seen = self.has(self.topic_id)
        return self._root_seen

    def extremities(self) -> list[bytes]:
        """Forward extremities (events with no children), sorted."""
        return sorted(self._extremities)

    @property
    def width(self) -> int:
        return len(self._extremities)

    def children(self, event_id: bytes) -> list[bytes]:
        info = self._node(event_id)
        if info is None:
            return []
        prefix = self._t + info[2]
        return [key[len(prefix):] for key, _ in self._w.scan(TABLE_CHILDREN, prefix)]

    def is_buffered(self, event_id: bytes) -> bool:
        if not self.buffered_count:
            return False
        return self._w.get(TABLE_BUFFER, self._t + event_id) is not None

    def knows(self, event_id: bytes) -> bool:
        """True if `event_id` is applied or buffered here: receiving it again changes nothing.

        Ids are hashes of the bytes, so a caller holding bytes with a known id
        may skip decoding and verifying them (the Replica's duplicate path).
        """
        return self.has(event_id) or self.is_buffered(event_id)

    def buffered_event(self, event_id: bytes) -> Event | None:
        record = self._w.get(TABLE_BUFFER, self._t + event_id)
        return None if record is None else trusted_event(msgpack.unpackb(record)[1])

    @property
    def buffered_count(self) -> int:
        if self._buffered is None:
            self._buffered = _from_u64(self._w.get(TABLE_META, self._t + _META_BUFFER_TOTAL))
        return self._buffered

    def buffered_ids(self) -> list[bytes]:
        prefix = self._t + _BY_AGE
        return [key[len(prefix) + 8:] for key, _ in self._w.scan(TABLE_BUFFER_INDEX, prefix)]

    def missing_parents(self, limit: int = 1_024) -> list[bytes]:
        """Parents that buffered events wait for: not here, not buffered, not rejected."""
        prefix = self._t + _WAIT
        wanted: list[bytes] = []
        last = None
        rejected = self._rejected
        for key, _ in self._w.scan(TABLE_BUFFER_INDEX, prefix):
            parent = key[len(prefix):len(prefix) + ID_BYTES]
            if parent == last:
                continue
            last = parent
            if parent not in rejected and not self.has(parent) and not self.is_buffered(parent):
                wanted.append(parent)
                if len(wanted) >= limit:
                    break
        return wanted

    def rejected_reason(self, event_id: bytes) -> str | None:
        """Why this replica rejected `event_id` at application time, if it still remembers.

        Remembered across restarts, the newest `limits.rejected_remembered`.
        """
        entry = self._rejected.get(event_id)
        return None if entry is None else entry[1]

    @property
    def rejected_count(self) -> int:
        """How many application-time rejections are remembered now (bounded)."""
        return len(self._rejected)

    @property
    def delivered_count(self) -> int:
        if self._delivered is None:
            self._delivered = _from_u64(self._w.get(TABLE_META, self._t + _META_DELIVERED))
            self._delivered_saved = self._delivered
        return self._delivered

    def deliveries(self, since: int = 0, limit: int = 1_000) -> list[tuple[int, Event]]:
        """Applied events from delivery position `since` on: a causal order, resumable."""
        out: list[tuple[int, Event]] = []
        end = min(self.delivered_count, since + limit)
        for position in range(max(since, 0), end):
            record = self._w.get(TABLE_DELIVERY, self._t + _u64(position))
            assert record is not None, "delivery table has a hole"
            event = trusted_event(msgpack.unpackb(record)[1])
            cached = self._events.get(event.id)  # hand out the one object the graph holds
            out.append((position, event if cached is None else cached))
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

    def events_by(self, author: bytes, seq: int, limit: int | None = None) -> list[bytes]:
        """Applied events of `author` with sequence number `seq` (more than one: equivocation)."""
        prefix = self._t + author + _u64(seq)
        return [key[len(prefix):] for key, _ in self._w.scan(TABLE_AUTHORS, prefix, limit=limit)]

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
        unknown here are ignored). Up to MAX_WALK of them missing: the `limit`
        shallowest, in (depth, id) order, which is a valid delivery order. A
        query that continues an earlier one — the peer applied the page it
        got and asks again with its new heads — is answered from a memo at
        the cost of one page (`node.core.walks`); the answer is always the
        one a full walk gives. More missing than that: a page in delivery
        order whose every event has its parents below `heads` or earlier in
        the page, so the peer can still apply it as it comes
        (`walks.page_by_position`).
        """
        if limit <= 0:
            return []
        known = {h for h in heads if self.has(h)}
        log = walks.DeliveryLog(self._locate, self._at, self.delivered_count)
        return self._memo.not_below(self._node, self._extremities, known, limit, MAX_WALK, log)

    def _locate(self, event_id: bytes) -> tuple[int, tuple[bytes, ...]] | None:
        """(delivery position, parents) of an applied event: `walks.DeliveryLog.locate`."""
        info = self._node(event_id)
        return None if info is None else (int.from_bytes(info[2], "big"), info[1])

    def _at(self, position: int) -> tuple[bytes, tuple[bytes, ...]]:
        """(id, parents) of the event at a delivery position: `walks.DeliveryLog.at`."""
        record = self._w.get(TABLE_DELIVERY, self._t + _u64(position))
        assert record is not None, "delivery table has a hole"
        raw = msgpack.unpackb(record)[1]
        return event_id_of(raw), tuple(msgpack.unpackb(raw)[4])

    def recent(self, since: Iterable[bytes], floor: int = 0,
               cap: int = MAX_WALK) -> tuple[list[bytes], int]:
        """Ids not below `since` with depth >= `floor`, deepest first; (ids, floor covered).

        What an anti-entropy offer's Bloom filter holds. Beyond `cap` only the
        deepest whole depth levels that fit are kept and the returned floor
        is raised to match, so "every event at depth >= floor" stays true.
        """
        known = {s for s in since if self.has(s)}
        return walks.recent(self._node, self._extremities, known, floor, cap)

    # ------------------------------------------------------------------ updates

    def add(self, event: Event, fresh: bool = False) -> AddResult:
        """Apply `event` (or buffer it until its parents arrive). Never raises on bad events.

        `fresh`: the caller has just signed `event` with a sequence number
        above its author's latest here (`author_latest_seq`), so it cannot be
        applied here already (an applied event with its id would have its
        seq); that skips one store lookup per local event. The buffer is
        still checked: buffered events are not in the per-author index.
        """
        event_id = event.id
        buffered = self._buffered  # `is_buffered`, inline: this runs for every event
        if buffered is None:
            buffered = self.buffered_count
        if ((not fresh and self.has(event_id))
                or (buffered and self._w.get(TABLE_BUFFER, self._t + event_id) is not None)):
            return AddResult("duplicate", event_id)
        rejected = self._rejected
        if rejected and event_id in rejected:
            return self._reject_only(event_id, rejected[event_id][1])
        if event.is_create:
            if event_id != self.topic_id:
                return self._reject_only(event_id, "wrong_topic")
        elif event.topic != self.topic_id:
            return self._reject_only(event_id, "wrong_topic")
        parents = event.parents
        if rejected and any(p in rejected for p in parents):
            cascade = _Cascade()
            self._reject(event_id, PARENT_REJECTED, cascade)
            return AddResult("rejected", event_id, rejected=tuple(cascade.rejected))
        nodes = self._nodes
        missing = [p for p in parents if p not in nodes and not self.has(p)]
        if missing:
            dropped = self._buffer(event, missing)
            if event_id in dropped:
                return AddResult("rejected", event_id, rejected=(Rejection(event_id, "buffer_full"),),
                                 dropped=tuple(d for d in dropped if d != event_id))
            wanted = tuple(p for p in missing if not self.is_buffered(p))
            return AddResult("buffered", event_id, missing=wanted, dropped=tuple(dropped))
        cascade = _Cascade()
        self._apply_cascade(event, cascade)
        if not cascade.rejected:  # the common case, built without keywords or empty copies
            return AddResult("applied", event_id, tuple(cascade.applied), (), (), (),
                             tuple(cascade.equivocations) if cascade.equivocations else ())
        if any(r.event_id == event_id for r in cascade.rejected):
            status = "rejected"
        else:
            status = "applied"
        return AddResult(status, event_id, applied=tuple(cascade.applied),
                         rejected=tuple(cascade.rejected),
                         equivocations=tuple(cascade.equivocations))

    def commit(self) -> int:
        """Make every pending write durable in one transaction; returns the write count.

        If the store raises, nothing of the batch is in it, but the graph still
        shows the lost writes: call `discard_pending()`.
        """
        return commit_writes(self._store, self.take_writes())

    def take_writes(self) -> Writes:
        """Every pending write as a write-set, for a caller that commits it; empties the set.

        The caller must commit it (`node.core.pending.commit_writes`) before
        anything of it is acknowledged, and call `discard_pending()` if that
        fails. Reads see the taken writes no more: take them only right
        before the commit, with nothing read in between.
        """
        self._seal_batch()
        return self._w.take_writes()

    def _seal_batch(self) -> None:
        """What every commit does before handing the write-set over: the deferred writes."""
        live, stored = self._extremities, self._stored_extremities
        if live != stored:
            t, w = self._t, self._w
            for gone in stored - live:
                w.delete(TABLE_EXTREMITIES, t + gone)
            for new in live - stored:
                w.put(TABLE_EXTREMITIES, t + new, b"")
            self._stored_extremities = set(live)
        if self._delivered is not None and self._delivered != self._delivered_saved:
            # One counter write per commit rather than one per applied event.
            self._w.put(TABLE_META, self._t + _META_DELIVERED, _u64(self._delivered))
            self._delivered_saved = self._delivered

    @property
    def pending_ops(self) -> int:
        return len(self._w)

    def discard_pending(self) -> None:
        """Forget uncommitted writes (after a failed commit) and reload cached state."""
        self._w.discard()
        self._nodes.clear()
        self._events.clear()
        self._latest_seq.clear()
        self._delivered = None
        self._delivered_saved = None
        self._buffered = None
        self._rejected = self._load_rejections()
        self._memo.clear()
        self._absent = None
        self._root_seen = False
        self._extremities = {
            key[ID_BYTES:] for key, _ in self._store.scan(TABLE_EXTREMITIES, self._t)
        }
        self._stored_extremities = set(self._extremities)
        for listener in self._discard_listeners:
            listener()

    # ----------------------------------------------------------------- internals

    def _reject_only(self, event_id: bytes, reason: str) -> AddResult:
        return AddResult("rejected", event_id, rejected=(Rejection(event_id, reason),))

    def _load_rejections(self) -> OrderedDict[bytes, tuple[int, str]]:
        prefix = self._t + _REJECTED
        entries = []
        for key, value in self._w.scan(TABLE_BUFFER_INDEX, prefix):
            entries.append((int.from_bytes(value[:8], "big"), key[len(prefix):],
                            value[8:].decode("utf-8", "replace")))
        entries.sort()
        return OrderedDict((event_id, (ordinal, reason)) for ordinal, event_id, reason in entries)

    def _remember_rejection(self, event_id: bytes, reason: str) -> None:
        """Persist an application-time rejection; forget the oldest beyond the bound."""
        if event_id in self._rejected:
            return
        t = self._t
        ordinal = _from_u64(self._w.get(TABLE_META, t + _META_REJECTIONS))
        self._w.put(TABLE_META, t + _META_REJECTIONS, _u64(ordinal + 1))
        self._w.put(TABLE_BUFFER_INDEX, t + _REJECTED + event_id, _u64(ordinal) + reason.encode())
        self._rejected[event_id] = (ordinal, reason)
        while len(self._rejected) > self.limits.rejected_remembered:
            forgotten, _ = self._rejected.popitem(last=False)
            self._w.delete(TABLE_BUFFER_INDEX, t + _REJECTED + forgotten)

    def _reject(self, event_id: bytes, reason: str, cascade: _Cascade) -> None:
        """Reject `event_id` at application time, with every buffered event built on it.

        Breadth first, children in id order: the same rejections, in the same
        order, on every replica holding the same buffer.
        """
        t = self._t
        queue = [(event_id, reason)]
        for current, why in queue:  # the list grows while it is walked
            cascade.rejected.append(Rejection(current, why))
            self._remember_rejection(current, why)
            if not self.buffered_count:
                continue
            for waiting_id in self._waiting_on(current):
                waiting = self.buffered_event(waiting_id)
                if waiting is None:  # a stale index entry: nothing waits any more
                    self._w.delete(TABLE_BUFFER_INDEX, t + _WAIT + current + waiting_id)
                    continue
                self._unbuffer(waiting)
                queue.append((waiting_id, PARENT_REJECTED))

    @staticmethod
    def _remember(cache: OrderedDict, key, value, size: int) -> None:
        cache[key] = value
        if len(cache) > size:
            cache.popitem(last=False)

    def _record(self, event_id: bytes) -> bytes | None:
        """The stored record [depth, raw] of an applied event, through the id index."""
        position = self._w.get(TABLE_EVENTS, self._t + event_id)
        if position is None:
            return None
        record = self._w.get(TABLE_DELIVERY, self._t + position)
        assert record is not None, "the id index names a position the delivery table lacks"
        return record

    def _node(self, event_id: bytes) -> _NodeInfo | None:
        info = self._nodes.get(event_id)
        if info is not None:
            return info
        position = self._w.get(TABLE_EVENTS, self._t + event_id)
        if position is None:
            return None
        record = self._w.get(TABLE_DELIVERY, self._t + position)
        assert record is not None, "the id index names a position the delivery table lacks"
        depth, raw = msgpack.unpackb(record)
        info = (depth, tuple(msgpack.unpackb(raw)[4]), position)
        self._remember(self._nodes, event_id, info, NODE_CACHE_SIZE)
        return info

    def _antichain_violation(self, parents: tuple[bytes, ...]) -> str | None:
        """None if no parent is found to be an ancestor of another, else the rejection reason.

        Only ancestors deeper than the shallowest parent can lead to a parent,
        so the walk goes no lower. Its order (parents in event order, then
        depth first) and so the ancestors it visits within the budget
        ANTICHAIN_SEARCH_VISITS are fixed by the ancestry alone: every replica
        reaches the same verdict. Out of budget with no violation found, the
        parents are accepted as an antichain (module docstring: rejecting
        would refuse honest merges of an old head with a deep one).
        """
        if len(parents) < 2:
            return None
        parent_set = set(parents)
        depths = {p: self._node(p)[0] for p in parents}  # type: ignore[index]
        floor = min(depths.values())
        stack = [p for p in parents if depths[p] > floor]
        seen: set[bytes] = set()
        budget = ANTICHAIN_SEARCH_VISITS  # read per call: tests scale it down
        while stack:
            current = stack.pop()
            for ancestor in self._node(current)[1]:  # type: ignore[index]
                if ancestor in seen:
                    continue
                if ancestor in parent_set:
                    return "parents_not_antichain"
                seen.add(ancestor)
                if len(seen) > budget:
                    self.antichain_searches_exhausted += 1
                    return None
                depth = self._node(ancestor)[0]  # type: ignore[index]
                if depth > floor:
                    stack.append(ancestor)
        return None

    def _apply_cascade(self, first: Event, cascade: _Cascade) -> None:
        if not self._apply_one(first, cascade) or not self.buffered_count:
            return  # nothing can be waiting: the hot path ends here
        ready = [first]
        while ready:
            event = ready.pop()
            if event is not first and not self._apply_one(event, cascade):
                continue
            if not self.buffered_count:
                continue  # nothing can be waiting: skip the index scan
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
        # cannot also be in the graph. Every event passes here, so the caches
        # are used inline rather than through their helpers (a call each).
        parents = event.parents
        if len(parents) > 1:
            reason = self._antichain_violation(parents)
            if reason is not None:
                self._reject(event.id, reason, cascade)
                return False
        nodes = self._nodes
        depth = 0
        infos = [nodes.get(parent) or self._node(parent) for parent in parents]
        for info in infos:
            if info[0] >= depth:  # type: ignore[index]
                depth = info[0] + 1  # type: ignore[index]
        event_id = event.id
        t = self._t
        w = self._w
        position = self._delivered
        if position is None:
            position = self.delivered_count
        self._delivered = position + 1  # written to the store by `commit`
        self._absent = None
        at = position.to_bytes(8, "big")
        w.put(TABLE_DELIVERY, t + at, pack([depth, event.raw]))
        w.put(TABLE_EVENTS, t + event_id, at)
        for info in infos:
            w.put(TABLE_CHILDREN, t + info[2] + event_id, b"")  # type: ignore[index]
        extremities = self._extremities  # the table follows at commit (`_seal_batch`)
        for parent in parents:
            extremities.discard(parent)
        extremities.add(event_id)
        author, seq = event.author, event.seq
        latest_seq = self._latest_seq
        latest = latest_seq.get(author, _UNCACHED)
        if latest is _UNCACHED:
            latest = self.author_latest_seq(author)
        # Only a sequence number at or below the author's latest can already be taken.
        # One entry answers "taken?": an author repeating one seq k times must
        # not cost k reads for each new copy (quadratic in k).
        if (latest is not None and seq <= latest  # type: ignore[operator]
                and self.events_by(author, seq, limit=1)):
            cascade.equivocations.append(event)
            count = _from_u64(w.get(TABLE_META, t + _META_EQUIVOCATIONS))
            w.put(TABLE_META, t + _META_EQUIVOCATIONS, _u64(count + 1))
        w.put(TABLE_AUTHORS, t + author + seq.to_bytes(8, "big") + event_id, b"")
        if latest is None or seq > latest:  # type: ignore[operator]
            latest_seq[author] = seq  # `_remember`, inline
            if len(latest_seq) > LATEST_SEQ_CACHE_SIZE:
                latest_seq.popitem(last=False)
        nodes[event_id] = (depth, parents, at)
        if len(nodes) > NODE_CACHE_SIZE:
            nodes.popitem(last=False)
        events = self._events
        events[event_id] = event
        if len(events) > EVENT_CACHE_SIZE:
            events.popitem(last=False)
        if self._memo.memos:
            self._memo.note_applied(depth, event_id)
        cascade.applied.append(event)
        return True

    def _buffer(self, event: Event, missing: list[bytes]) -> list[bytes]:
        """Put `event` in the buffer; returns ids evicted to respect the caps."""
        t = self._t
        arrival = _from_u64(self._w.get(TABLE_META, t + _META_ARRIVALS))
        self._w.put(TABLE_META, t + _META_ARRIVALS, _u64(arrival + 1))
        self._w.put(TABLE_BUFFER, t + event.id, pack([arrival, event.raw]))
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
        self._buffered = total
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
