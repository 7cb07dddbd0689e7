"""How many applied events subscribers are handed, kept as they are applied and stored with them.

`Replica.deliveries` hands subscribers the applied events that are not
rejected, soft-failed or withheld; `status` reports how many (`delivered`)
and how many of them are empty acknowledgements (`acks`). Counting them by
reading every event back from the store and asking those questions again
costs 7-14 us an event with the event loop held: ~45 ms for each of the
catch-up bench's status polls, and after a restart the first count went over
the topic's whole history, about 14 s per million events, before `megnode
status` could answer (docs/anti-entropy.md, s24 and s25).

The replica knows the answers when it applies an event: withheld is in the
event, a late rejection comes from the tracker in the same add
(`Replica._outcome`), a soft fail right after it (`Replica._soft_fail`), and
none changes afterwards. So it keeps the count itself, `HandedCount`: (the
delivery positions counted, delivered, acks), one record in the topic's
state table written through the graph's write-set, so it commits in the
same transaction as the events it counts and a failed step's writes take
their counts with them. A status call reads it: O(1), after a restart too.

A topic stored by a build from before this record has none. Its count is
then read back once (`Replica.count_delivered`, in slices: `Node.count_deliveries`)
and handed to the replica inside a step (`Replica.adopt_count`), which
counts what was applied since and stores the record; from then on it is
kept like any other.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from node.core.topic_table import TopicTable

COUNT_READ_BACK_PAGE = 1_024  # positions read back per `Replica.count_delivered` call
HANDED_KEY = b"H"  # the record's key in the topic's state table (no other key starts so)
_RECORD = struct.Struct(">QQQ")  # positions counted, delivered, acks


@dataclass(frozen=True, slots=True)
class DeliveryCount:
    """Counted over delivery positions [start, end): the events handed to subscribers,
    and the acknowledgements among them."""

    start: int
    end: int
    delivered: int
    acks: int


class HandedCount:
    """The stored count of what subscribers are handed: delivery positions [0, `end`)."""

    def __init__(self, table: TopicTable) -> None:
        self._table = table
        self._loaded = False
        self._count: list[int] | None = None  # [end, delivered, acks]

    @property
    def value(self) -> DeliveryCount | None:
        """The count (start 0), or None when the topic has no record yet."""
        count = self._load()
        return None if count is None else DeliveryCount(0, *count)

    def forget(self) -> None:
        """Pending writes were discarded: read the record again on next use."""
        self._loaded = False
        self._count = None

    def extend(self, start: int, positions: int, delivered: int, acks: int) -> None:
        """Count `positions` more, applied from delivery position `start` on. A topic's
        first events (from position 0) start its record; a topic without one (an older
        store's, until `set`) and a run that does not continue the count are left out.
        (Once per add, so kept lean: ~1 us.)"""
        count = self._count if self._loaded else self._load()
        if count is None:
            if start != 0:
                return
            count = self._count = [0, 0, 0]
        if count[0] != start:
            return
        count[0] = start + positions
        count[1] += delivered
        count[2] += acks
        self._table.put(HANDED_KEY, _RECORD.pack(*count))

    def hide(self, position: int, ack: bool) -> None:
        """The event at `position`, counted as handed out, is not after all (soft-failed)."""
        count = self._load()
        if count is not None and position < count[0]:
            count[1] -= 1
            count[2] -= ack
            self._table.put(HANDED_KEY, _RECORD.pack(*count))

    def set(self, count: DeliveryCount) -> None:
        """Adopt a count made by reading the history back (`Replica.adopt_count`)."""
        if count.start != 0:
            raise ValueError("a stored count covers the positions from 0")
        self._count, self._loaded = [count.end, count.delivered, count.acks], True
        self._table.put(HANDED_KEY, _RECORD.pack(*self._count))

    def _load(self) -> list[int] | None:
        if not self._loaded:
            raw = self._table.get(HANDED_KEY)
            # A record of another size is not ours to trust: counted again, as if absent.
            self._count = list(_RECORD.unpack(raw)) \
                if raw is not None and len(raw) == _RECORD.size else None
            self._loaded = True
        return self._count
