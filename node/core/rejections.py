"""Remembered application-time rejections: what the graph refused for good, and why.

Why: an event rejected at application time (its parents do not form an
antichain, `node.core.antichain`, or the graph's gate refused it: the
topic's auth rules on its own past, `Graph.set_gate`) can never become a vertex on any correct
replica — the verdict depends on its ancestry alone — and neither can
anything built on it. So the graph remembers such rejections, persistently
and the newest `GraphLimits.rejected_remembered` only, and:

* rejects a descendant with reason `parent_rejected`, at once when it
  arrives after the rejection, and by dropping it from the buffer
  (`reject`, breadth first through the waiting events) when it was waiting;
* never lists a rejected id among the parents to fetch
  (`Graph.missing_parents`): fetching it would only reject it again, forever.

Both arrival orders end in the same state. A rejection forgotten beyond the
bound only costs one re-fetch: the parent is rejected again and its waiting
children with it.

Key layout (T the 32-byte topic id)::

    buffer_index  T|"r"|id        -> ordinal (8 bytes) + reason (UTF-8)
    meta          T|"rejections"  -> ordinal of the next remembered rejection

(The rest of `buffer_index` is the delivery buffer's: `node.core.buffer`.)
"""

from __future__ import annotations

from collections import OrderedDict

from node.core.buffer import DeliveryBuffer
from node.core.outcomes import RejectReason, Rejection
from node.core.pending import PendingWrites
from node.core.store import TABLE_BUFFER_INDEX, TABLE_META

# Per-node bound (`GraphLimits` may choose another): rejections kept per topic.
MAX_REJECTED_REMEMBERED = 4_096

_REJECTED = b"r"
_META_REJECTIONS = b"rejections"


def _reason_of(text: str) -> RejectReason | str:
    """The member for a stored reason (kept as text if no member has it: a newer store)."""
    try:
        return RejectReason(text)
    except ValueError:
        return text


class RememberedRejections:
    """One topic's remembered rejections, oldest first, through the graph's write-set.

    `entries` (id -> (ordinal, reason)) is the whole bounded memory, held in
    memory: `Graph.add` looks every event up in it. `reload()` re-reads it
    after the write-set was discarded (in place: readers may hold it).
    """

    def __init__(self, writes: PendingWrites, topic_id: bytes, bound: int) -> None:
        self._w = writes
        self._t = topic_id
        self._bound = bound
        self.entries: OrderedDict[bytes, tuple[int, RejectReason | str]] = OrderedDict()
        self.reload()

    def reload(self) -> None:
        prefix = self._t + _REJECTED
        loaded = []
        for key, value in self._w.scan(TABLE_BUFFER_INDEX, prefix):
            loaded.append((int.from_bytes(value[:8], "big"), key[len(prefix):],
                           _reason_of(value[8:].decode("utf-8", "replace"))))
        loaded.sort()
        self.entries.clear()
        self.entries.update((event_id, (ordinal, reason)) for ordinal, event_id, reason in loaded)

    def reason(self, event_id: bytes) -> RejectReason | str | None:
        entry = self.entries.get(event_id)
        return None if entry is None else entry[1]

    def __len__(self) -> int:
        return len(self.entries)

    def remember(self, event_id: bytes, reason: RejectReason | str) -> None:
        """Persist an application-time rejection; forget the oldest beyond the bound."""
        entries = self.entries
        if event_id in entries:
            return
        t, w = self._t, self._w
        raw = w.get(TABLE_META, t + _META_REJECTIONS)
        ordinal = 0 if raw is None else int.from_bytes(raw, "big")
        w.put(TABLE_META, t + _META_REJECTIONS, (ordinal + 1).to_bytes(8, "big"))
        w.put(TABLE_BUFFER_INDEX, t + _REJECTED + event_id,
              ordinal.to_bytes(8, "big") + reason.encode())
        entries[event_id] = (ordinal, reason)
        while len(entries) > self._bound:
            forgotten, _ = entries.popitem(last=False)
            w.delete(TABLE_BUFFER_INDEX, t + _REJECTED + forgotten)

    def reject(self, event_id: bytes, reason: RejectReason | str, buffer: DeliveryBuffer,
               out: list[Rejection]) -> None:
        """Reject `event_id` with every buffered event built on it; append them all to `out`.

        Breadth first, children in id order: the same rejections, in the same
        order, on every replica holding the same buffer.
        """
        queue: list[tuple[bytes, RejectReason | str]] = [(event_id, reason)]
        for current, why in queue:  # the list grows while it is walked
            out.append(Rejection(current, why))
            self.remember(current, why)
            if not buffer.count:
                continue
            for waiting_id in buffer.waiting_on(current):
                waiting = buffer.event(waiting_id)
                if waiting is None:  # a stale index entry: nothing waits any more
                    buffer.stop_waiting(current, waiting_id)
                    continue
                buffer.remove(waiting)
                queue.append((waiting_id, RejectReason.PARENT_REJECTED))
