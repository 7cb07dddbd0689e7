"""The Matrix Event Graph of one topic: the CRDT of the MEG paper, on a Store.

`Graph.add(event)` is the effector: an event whose parents are all here
becomes a vertex (and may release buffered children: a cascade); one that
lacks parents waits in the buffer (`node.core.buffer`). `add` is idempotent
and commutative, never raises on bad events, and validates what needs the
ancestry at application time (`node.core.antichain`, `node.core.rejections`);
its answer is an `AddResult` (`node.core.outcomes`). A *gate* (`set_gate`:
the replica's authorization, node.replica) judges each event about to become
a vertex; an event it refuses never does: it is remembered as rejected like
an antichain failure (`node.core.rejections`), so it is never an extremity,
a parent, forwarded, offered or delivered. Depth is computed here,
never taken from the wire; the delivery table is the order events were
applied in, a topological order subscribers resume from a cursor.

Writes collect in a PendingWrites set that reads see, and become durable in
one store transaction: `commit()`, or `take_writes()` for the node's
committer (the only writer; both in `GraphCommit`, `node.core.graph_commit`),
`discard_pending()` after a failed commit. Nothing of a batch may be
acknowledged before its commit returned.

Key layout (every key starts with the topic id T; docs/graph.md says why
events live under their delivery position)::

    delivery      T|position                -> msgpack [depth, raw]  (the events themselves)
    events        T|id                      -> position (8 bytes)    (the id index)
    children      T|parent position|child   -> b""
    extremities   T|id                      -> b""  (written once per commit)
    authors       T|author|seq|id           -> b""  (per-author sequence index)
    meta          T|"delivered", T|"equivocations" -> 8-byte big-endian counters

The walks anti-entropy asks for are `GraphWalks` (`node.core.graph_walks`),
a mixin of `Graph`. docs/graph.md has the whole theory of operation.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import msgpack

from node.core import antichain
from node.core.buffer import MAX_BUFFERED_PER_AUTHOR, MAX_BUFFERED_TOTAL, DeliveryBuffer
from node.core.event import ID_BYTES, Event, pack, trusted_event
from node.core.graph_commit import META_DELIVERED, GraphCommit
from node.core.graph_walks import GraphWalks
from node.core.add_result import AddResult
from node.core.outcomes import AddStatus, RejectReason, Rejection
from node.core.pending import PendingWrites
from node.core.rejections import MAX_REJECTED_REMEMBERED, RememberedRejections
from node.core.store import (
    TABLE_AUTHORS,
    TABLE_CHILDREN,
    TABLE_DELIVERY,
    TABLE_EVENTS,
    TABLE_EXTREMITIES,
    TABLE_META,
    DamagedTopicError,
    Store,
)
from node.core.topic_table import TopicTable
from node.core.walks import NotBelowMemo

# Limits. Each is a named bound on memory, time or disk that a peer could
# otherwise push without end (the buffer's and the rejections' are in their modules).
NODE_CACHE_SIZE = 65_536  # (depth, parents) of recently used events
EVENT_CACHE_SIZE = 4_096  # decoded events
LATEST_SEQ_CACHE_SIZE = 4_096  # authors whose latest sequence number is cached

# What the node cache holds per event: (depth, parents, delivery position as
# its 8-byte key part). The walks read the first two.
_NodeInfo = tuple[int, tuple[bytes, ...], bytes]

_UNCACHED = object()  # "not in the cache" (None is a cached "no events yet")

# The statuses `add` gives, bound once: on Python 3.11 every enum member lookup
# (`AddStatus.APPLIED`) goes through EnumType.__getattr__ and costs ~0.1 µs,
# which `add` would pay for every event.
_APPLIED = AddStatus.APPLIED
_DUPLICATE = AddStatus.DUPLICATE

_META_EQUIVOCATIONS = b"equivocations"


def _u64(value: int) -> bytes:
    return value.to_bytes(8, "big")


def _from_u64(raw: bytes | None) -> int:
    return 0 if raw is None else int.from_bytes(raw, "big")


def _damaged(topic_id: bytes, what: str) -> DamagedTopicError:
    return DamagedTopicError(what, topic_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphLimits:
    """Per-node bounds on memory and disk: each node may choose its own.

    Nothing here changes which events a graph accepts, only how much it keeps
    waiting or remembers (the antichain search bound, which does, is the
    protocol constant `node.core.antichain.ANTICHAIN_SEARCH_VISITS`).
    Keyword-only: a field was removed, and positional arguments would
    silently shift onto the next.
    """

    buffered_per_author: int = MAX_BUFFERED_PER_AUTHOR
    buffered_total: int = MAX_BUFFERED_TOTAL
    rejected_remembered: int = MAX_REJECTED_REMEMBERED


class _Cascade:
    """What one `add` did so far (a plain class: built for every event)."""

    __slots__ = ("applied", "rejected", "equivocations")

    def __init__(self) -> None:
        self.applied: list[Event] = []
        self.rejected: list[Rejection] = []
        self.equivocations: list[Event] = []


class Graph(GraphCommit, GraphWalks):
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
        # Sizes of the caches: a node's cache budget shrinks them
        # when it holds many topics (`resize_caches`, node.replica.cache_budget).
        self._node_cache_size = NODE_CACHE_SIZE
        self._event_cache_size = EVENT_CACHE_SIZE
        self._latest_seq_cache_size = LATEST_SEQ_CACHE_SIZE
        self._discard_listeners: list[Callable[[], None]] = []
        self._gate: Callable[[Event], str | None] | None = None
        # Mirrors of persistent counters (None: read from the store on next use).
        self._delivered: int | None = None
        # The delivered count last handed to the store (None: not known here).
        self._delivered_saved: int | None = None
        self._buffer = DeliveryBuffer(self._w, topic_id, limits.buffered_per_author,
                                      limits.buffered_total)
        self._rejections = RememberedRejections(self._w, topic_id, limits.rejected_remembered)
        self._memo = NotBelowMemo()
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
        # (`GraphCommit._seal_batch`), not once per event: a chain of a thousand events
        # would otherwise add and remove a thousand keys in the write-set.
        self._stored_extremities: set[bytes] = set(self._extremities)

    # ------------------------------------------------------------ extensions

    def table(self, name: str) -> TopicTable:
        """This topic's slice of an extension table, written in the graph's transactions."""
        return TopicTable(self._w, name, self._t)

    def resize_caches(self, nodes: int, events: int, latest_seq: int) -> None:
        """Hold at most `nodes` (depth, parents), `events` decoded events and
        `latest_seq` authors' latest seqs (the oldest dropped)."""
        self._node_cache_size = nodes
        self._event_cache_size = events
        self._latest_seq_cache_size = latest_seq
        for cache, size in ((self._nodes, nodes), (self._events, events),
                            (self._latest_seq, latest_seq)):
            while len(cache) > size:
                cache.popitem(last=False)

    def set_gate(self, gate: Callable[[Event], str | None] | None) -> None:
        """Judge every event about to become a vertex (parents applied): a reason keeps it
        out, remembered as rejected with its buffered descendants. The verdict must
        depend on the event's ancestry alone, or replicas would hold different graphs."""
        self._gate = gate

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
        self._remember(self._events, event_id, event, self._event_cache_size)
        return event

    def depth(self, event_id: bytes) -> int | None:
        info = self._node(event_id)
        return None if info is None else info[0]

    def position(self, event_id: bytes) -> int | None:
        """The event's delivery position here (None: not applied). An ancestor's is lower."""
        info = self._node(event_id)
        return None if info is None else int.from_bytes(info[2], "big")

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
        return self._buffer.holds(event_id)

    def knows(self, event_id: bytes) -> bool:
        """True if `event_id` is applied or buffered here: receiving it again changes nothing.

        Ids are hashes of the bytes, so a caller holding bytes with a known id
        may skip decoding and verifying them (the Replica's duplicate path).
        """
        return self.has(event_id) or self.is_buffered(event_id)

    def buffered_event(self, event_id: bytes) -> Event | None:
        return self._buffer.event(event_id)

    @property
    def buffered_count(self) -> int:
        return self._buffer.count

    def buffered_ids(self) -> list[bytes]:
        """Buffered ids, oldest arrival first."""
        return self._buffer.ids()

    def missing_parents(self, limit: int = 1_024) -> list[bytes]:
        """Parents that buffered events wait for: not here, not buffered, not rejected."""
        rejected = self._rejections.entries
        return self._buffer.missing_parents(
            limit, lambda parent: parent in rejected or self.has(parent))

    def rejected_reason(self, event_id: bytes) -> RejectReason | str | None:
        """Why this replica rejected `event_id` at application time, if it still remembers.

        Remembered across restarts, the newest `limits.rejected_remembered`.
        """
        return self._rejections.reason(event_id)

    def rejections(self) -> list[tuple[bytes, RejectReason | str]]:
        """The remembered application-time rejections (id, reason), oldest first (bounded)."""
        return [(event_id, reason) for event_id, (_, reason) in self._rejections.entries.items()]

    @property
    def rejected_count(self) -> int:
        """How many application-time rejections are remembered now (bounded)."""
        return len(self._rejections)

    @property
    def delivered_count(self) -> int:
        if self._delivered is None:
            self._delivered = _from_u64(self._w.get(TABLE_META, self._t + META_DELIVERED))
            self._delivered_saved = self._delivered
        return self._delivered

    def deliveries(self, since: int = 0, limit: int = 1_000) -> list[tuple[int, Event]]:
        """Applied events from delivery position `since` on: a causal order, resumable."""
        out: list[tuple[int, Event]] = []
        end = min(self.delivered_count, since + limit)
        for position in range(max(since, 0), end):
            record = self._w.get(TABLE_DELIVERY, self._t + _u64(position))
            if record is None:
                raise _damaged(self._t, f"the delivery table has a hole at position {position}")
            event = trusted_event(msgpack.unpackb(record)[1])
            cached = self._events.get(event.id)  # hand out the one object the graph holds
            out.append((position, event if cached is None else cached))
        return out

    def forms_antichain(self, parents: list[bytes]) -> bool:
        """Would `parents` (all applied here) pass the antichain check of `add`?"""
        return antichain.check(tuple(parents), self._node) is not antichain.Verdict.NOT_ANTICHAIN

    def author_latest_seq(self, author: bytes) -> int | None:
        if author in self._latest_seq:
            return self._latest_seq[author]
        latest = self._scan_latest_seq(author)
        self._remember(self._latest_seq, author, latest, self._latest_seq_cache_size)
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
        buffer = self._buffer
        if ((not fresh and self.has(event_id))
                or (buffer.count and buffer.holds(event_id))):
            return AddResult(_DUPLICATE, event_id)
        rejected = self._rejections.entries
        if rejected and event_id in rejected:
            return self._reject_only(event_id, rejected[event_id][1])
        if event.is_create:
            if event_id != self.topic_id:
                return self._reject_only(event_id, RejectReason.WRONG_TOPIC)
        elif event.topic != self.topic_id:
            return self._reject_only(event_id, RejectReason.WRONG_TOPIC)
        parents = event.parents
        if rejected and any(p in rejected for p in parents):
            cascade = _Cascade()
            self._rejections.reject(event_id, RejectReason.PARENT_REJECTED, buffer,
                                    cascade.rejected)
            return AddResult(AddStatus.REJECTED, event_id, rejected=tuple(cascade.rejected))
        nodes = self._nodes
        missing = [p for p in parents if p not in nodes and not self.has(p)]
        if missing:
            dropped = buffer.add(event, missing)
            if event_id in dropped:
                return AddResult(AddStatus.REJECTED, event_id,
                                 rejected=(Rejection(event_id, RejectReason.BUFFER_FULL),),
                                 dropped=tuple(d for d in dropped if d != event_id))
            wanted = tuple(p for p in missing if not buffer.holds(p))
            return AddResult(AddStatus.BUFFERED, event_id, missing=wanted, dropped=tuple(dropped))
        cascade = _Cascade()
        self._apply_cascade(event, cascade)
        if not cascade.rejected:  # the common case, built without keywords or empty copies
            return AddResult(_APPLIED, event_id, tuple(cascade.applied), (), (), (),
                             tuple(cascade.equivocations) if cascade.equivocations else ())
        if any(r.event_id == event_id for r in cascade.rejected):
            status = AddStatus.REJECTED
        else:
            status = AddStatus.APPLIED
        return AddResult(status, event_id, applied=tuple(cascade.applied),
                         rejected=tuple(cascade.rejected),
                         equivocations=tuple(cascade.equivocations))

    def discard_pending(self) -> None:
        """Forget uncommitted writes (after a failed commit) and reload cached state."""
        self._w.discard()
        self._nodes.clear()
        self._events.clear()
        self._latest_seq.clear()
        self._delivered = None
        self._delivered_saved = None
        self._buffer.reload()
        self._rejections.reload()
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

    def _reject_only(self, event_id: bytes, reason: RejectReason | str) -> AddResult:
        return AddResult(AddStatus.REJECTED, event_id, rejected=(Rejection(event_id, reason),))

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
        if record is None:
            raise _damaged(self._t, "the id index names a position the delivery table lacks")
        return record

    def _node(self, event_id: bytes) -> _NodeInfo | None:
        info = self._nodes.get(event_id)
        if info is not None:
            return info
        position = self._w.get(TABLE_EVENTS, self._t + event_id)
        if position is None:
            return None
        record = self._w.get(TABLE_DELIVERY, self._t + position)
        if record is None:
            raise _damaged(self._t, "the id index names a position the delivery table lacks")
        depth, raw = msgpack.unpackb(record)
        info = (depth, tuple(msgpack.unpackb(raw)[4]), position)
        self._remember(self._nodes, event_id, info, self._node_cache_size)
        return info

    def _apply_cascade(self, first: Event, cascade: _Cascade) -> None:
        buffer = self._buffer
        if not self._apply_one(first, cascade) or not buffer.count:
            return  # nothing can be waiting: the hot path ends here
        ready = [first]
        while ready:
            event = ready.pop()
            if event is not first and not self._apply_one(event, cascade):
                continue
            if not buffer.count:
                continue  # nothing can be waiting: skip the index scan
            for waiting_id in buffer.waiting_on(event.id):
                buffer.stop_waiting(event.id, waiting_id)
                waiting = buffer.event(waiting_id)
                if waiting is not None and all(self.has(p) for p in waiting.parents):
                    buffer.remove(waiting)
                    ready.append(waiting)

    def _apply_one(self, event: Event, cascade: _Cascade) -> bool:
        # Callers guarantee the event is new: `add` checked, and a buffered event
        # cannot also be in the graph. Every event passes here, so the caches
        # are used inline rather than through their helpers (a call each).
        parents = event.parents
        # Parents that are all extremities here are an antichain without a walk: an
        # ancestor of another applied event has a child, so it is no extremity. The
        # walk would accept them too (it finds nothing, or runs out of budget, which
        # accepts), so every replica still decides alike (`node.core.antichain`).
        if len(parents) > 1 and not self._extremities.issuperset(parents):
            verdict = antichain.check(parents, self._node)
            if verdict is antichain.Verdict.NOT_ANTICHAIN:
                self._rejections.reject(event.id, RejectReason.PARENTS_NOT_ANTICHAIN,
                                        self._buffer, cascade.rejected)
                return False
            if verdict is antichain.Verdict.SEARCH_EXHAUSTED:
                self.antichain_searches_exhausted += 1
        if self._gate is not None:
            refused = self._gate(event)
            if refused is not None:
                self._rejections.reject(event.id, refused, self._buffer, cascade.rejected)
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
        extremities = self._extremities  # the table follows at commit (`GraphCommit._seal_batch`)
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
            if len(latest_seq) > self._latest_seq_cache_size:
                latest_seq.popitem(last=False)
        nodes[event_id] = (depth, parents, at)
        if len(nodes) > self._node_cache_size:
            nodes.popitem(last=False)
        events = self._events
        events[event_id] = event
        if len(events) > self._event_cache_size:
            events.popitem(last=False)
        if self._memo.memos:
            self._memo.note_applied(depth, event_id)
        cascade.applied.append(event)
        return True
