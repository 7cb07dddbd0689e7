"""The delivery-precondition buffer: events waiting for their parents, persisted and capped.

Why: the MEG applies an event only once every parent is present (the
delivery precondition). An event that arrives before a parent waits here,
and the moment its last missing parent is applied, the graph applies it
(`Graph._apply_cascade` asks `waiting_on`). The buffer is persistent — a
restart loses nothing a peer sent — and bounded per author and in total;
beyond a cap the oldest buffered events are dropped (they can be fetched
again: whoever sent a child still has its ancestry). This bounds the
forged-parent DoS of the MEG paper's Theorem 3 proof: forged parents never
arrive, so their children would otherwise wait forever.

Key layout (every key starts with the 32-byte topic id T)::

    buffer        T|id                      -> msgpack [arrival, raw]
    buffer_index  T|"w"|missing parent|id   -> b""   (who waits on a parent)
                  T|"a"|author|arrival|id   -> b""   (per-author age order)
                  T|"o"|arrival|id          -> b""   (global age order)
    meta          T|"arrivals"              -> next arrival number
                  T|"buffer_total"          -> buffered events
                  T|"buffer_author"|author  -> buffered events of that author

(`buffer_index` also holds the graph's remembered rejections under
T|"r": `node.core.rejections`.) All writes go through the graph's
write-set, so they commit with the events that cause them.
"""

from __future__ import annotations

from collections.abc import Callable

import msgpack

from node.core.event import ID_BYTES, Event, pack, trusted_event
from node.core.pending import PendingWrites
from node.core.store import TABLE_BUFFER, TABLE_BUFFER_INDEX, TABLE_META

# Per-node bounds (`GraphLimits` may choose others): how many events a peer
# can make this node hold waiting, per author and in total.
MAX_BUFFERED_PER_AUTHOR = 1_024
MAX_BUFFERED_TOTAL = 16_384

_WAIT = b"w"
_BY_AUTHOR = b"a"
_BY_AGE = b"o"
_META_BUFFER_TOTAL = b"buffer_total"
_META_BUFFER_AUTHOR = b"buffer_author"
_META_ARRIVALS = b"arrivals"


def _u64(value: int) -> bytes:
    return value.to_bytes(8, "big")


def _from_u64(raw: bytes | None) -> int:
    return 0 if raw is None else int.from_bytes(raw, "big")


class DeliveryBuffer:
    """One topic's buffered events, through the graph's write-set. Single-threaded.

    `count` mirrors the persistent total (read on every `Graph.add`);
    `reload()` re-reads it after the write-set was discarded.
    """

    def __init__(self, writes: PendingWrites, topic_id: bytes,
                 per_author_cap: int, total_cap: int) -> None:
        self._w = writes
        self._t = topic_id
        self._per_author_cap = per_author_cap
        self._total_cap = total_cap
        self.count = 0
        self.reload()

    def reload(self) -> None:
        self.count = _from_u64(self._w.get(TABLE_META, self._t + _META_BUFFER_TOTAL))

    # ------------------------------------------------------------------ queries

    def holds(self, event_id: bytes) -> bool:
        if not self.count:
            return False
        return self._w.get(TABLE_BUFFER, self._t + event_id) is not None

    def event(self, event_id: bytes) -> Event | None:
        record = self._w.get(TABLE_BUFFER, self._t + event_id)
        return None if record is None else trusted_event(msgpack.unpackb(record)[1])

    def ids(self) -> list[bytes]:
        """Buffered ids, oldest arrival first."""
        prefix = self._t + _BY_AGE
        return [key[len(prefix) + 8:] for key, _ in self._w.scan(TABLE_BUFFER_INDEX, prefix)]

    def waiting_on(self, parent_id: bytes) -> list[bytes]:
        """Ids of buffered events that wait for `parent_id` (in id order)."""
        prefix = self._t + _WAIT + parent_id
        return [key[len(prefix):] for key, _ in self._w.scan(TABLE_BUFFER_INDEX, prefix)]

    def missing_parents(self, limit: int, settled: Callable[[bytes], bool]) -> list[bytes]:
        """Parents buffered events wait for that are neither buffered nor `settled`, in id order.

        `settled(parent)`: the caller knows the parent already (applied, or
        rejected: fetching it would only reject it again).
        """
        prefix = self._t + _WAIT
        wanted: list[bytes] = []
        last = None
        for key, _ in self._w.scan(TABLE_BUFFER_INDEX, prefix):
            parent = key[len(prefix):len(prefix) + ID_BYTES]
            if parent == last:
                continue
            last = parent
            if not settled(parent) and not self.holds(parent):
                wanted.append(parent)
                if len(wanted) >= limit:
                    break
        return wanted

    # ------------------------------------------------------------------ updates

    def add(self, event: Event, missing: list[bytes]) -> list[bytes]:
        """Buffer `event`, waiting on `missing`; returns ids evicted to respect the caps."""
        t, w = self._t, self._w
        arrival = _from_u64(w.get(TABLE_META, t + _META_ARRIVALS))
        w.put(TABLE_META, t + _META_ARRIVALS, _u64(arrival + 1))
        w.put(TABLE_BUFFER, t + event.id, pack([arrival, event.raw]))
        for parent in missing:
            w.put(TABLE_BUFFER_INDEX, t + _WAIT + parent + event.id, b"")
        w.put(TABLE_BUFFER_INDEX, t + _BY_AUTHOR + event.author + _u64(arrival) + event.id, b"")
        w.put(TABLE_BUFFER_INDEX, t + _BY_AGE + _u64(arrival) + event.id, b"")
        self._bump_counts(event.author, +1)
        dropped: list[bytes] = []
        author_prefix = t + _BY_AUTHOR + event.author
        while self._author_count(event.author) > self._per_author_cap:
            oldest = w.scan(TABLE_BUFFER_INDEX, author_prefix, limit=1)[0][0]
            dropped.append(self._evict(oldest[len(author_prefix) + 8:]))
        age_prefix = t + _BY_AGE
        while self.count > self._total_cap:
            oldest = w.scan(TABLE_BUFFER_INDEX, age_prefix, limit=1)[0][0]
            dropped.append(self._evict(oldest[len(age_prefix) + 8:]))
        return dropped

    def remove(self, event: Event) -> None:
        """Take a buffered `event` out (applied, rejected or evicted), with its index entries."""
        t, w = self._t, self._w
        record = w.get(TABLE_BUFFER, t + event.id)
        assert record is not None
        arrival = msgpack.unpackb(record)[0]
        w.delete(TABLE_BUFFER, t + event.id)
        for parent in event.parents:
            w.delete(TABLE_BUFFER_INDEX, t + _WAIT + parent + event.id)
        w.delete(TABLE_BUFFER_INDEX, t + _BY_AUTHOR + event.author + _u64(arrival) + event.id)
        w.delete(TABLE_BUFFER_INDEX, t + _BY_AGE + _u64(arrival) + event.id)
        self._bump_counts(event.author, -1)

    def stop_waiting(self, parent_id: bytes, waiting_id: bytes) -> None:
        """Drop the index entry saying `waiting_id` waits on `parent_id` (present or stale)."""
        self._w.delete(TABLE_BUFFER_INDEX, self._t + _WAIT + parent_id + waiting_id)

    # ----------------------------------------------------------------- internals

    def _author_count(self, author: bytes) -> int:
        return _from_u64(self._w.get(TABLE_META, self._t + _META_BUFFER_AUTHOR + author))

    def _bump_counts(self, author: bytes, delta: int) -> None:
        t = self._t
        total = self.count + delta
        self.count = total
        self._w.put(TABLE_META, t + _META_BUFFER_TOTAL, _u64(total))
        per_author = self._author_count(author) + delta
        if per_author:
            self._w.put(TABLE_META, t + _META_BUFFER_AUTHOR + author, _u64(per_author))
        else:
            self._w.delete(TABLE_META, t + _META_BUFFER_AUTHOR + author)

    def _evict(self, event_id: bytes) -> bytes:
        event = self.event(event_id)
        assert event is not None
        self.remove(event)
        return event_id
