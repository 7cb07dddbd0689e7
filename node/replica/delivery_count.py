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

from dataclasses import dataclass

from node.core.topic_table import TopicTable

COUNT_READ_BACK_PAGE = 1_024  # positions read back per `Replica.count_delivered` call
HANDED_KEY = b"H"  # the record's key in the topic's state table (no other key starts so)
_FIELD_BYTES = 8


@dataclass(frozen=True, slots=True)
class DeliveryCount:
    """Counted over delivery positions [start, end): the events handed to subscribers,
    and the acknowledgements among them."""

    start: int
    end: int
    delivered: int
    acks: int


class HandedCount:
    """The stored count of what subscribers are handed: delivery positions [0, `upto`)."""

    def __init__(self, table: TopicTable) -> None:
        self._table = table
        self._loaded = False
        self._value: DeliveryCount | None = None

    @property
    def value(self) -> DeliveryCount | None:
        """The count (start 0, end `upto`), or None when the topic has no record yet."""
        if not self._loaded:
            raw = self._table.get(HANDED_KEY)
            self._value = None if raw is None else _decode(raw)
            self._loaded = True
        return self._value

    def forget(self) -> None:
        """Pending writes were discarded: read the record again on next use."""
        self._loaded = False
        self._value = None

    def extend(self, start: int, positions: int, delivered: int, acks: int) -> None:
        """Count `positions` more, applied from delivery position `start` on. A topic's
        first events (from position 0) start its record; a topic without one (an older
        store's, until `set`) and a run that does not continue the count are left out."""
        value = self.value
        if value is None:
            if start != 0:
                return
            value = DeliveryCount(0, 0, 0, 0)
        if value.end != start:
            return
        self._store(DeliveryCount(0, start + positions, value.delivered + delivered,
                                  value.acks + acks))

    def hide(self, position: int, ack: bool) -> None:
        """The event at `position`, counted as handed out, is not after all (soft-failed)."""
        value = self.value
        if value is not None and position < value.end:
            self._store(DeliveryCount(0, value.end, value.delivered - 1, value.acks - ack))

    def set(self, count: DeliveryCount) -> None:
        """Adopt a count made by reading the history back (`Replica.adopt_count`)."""
        if count.start != 0:
            raise ValueError("a stored count covers the positions from 0")
        self._store(count)

    def _store(self, value: DeliveryCount) -> None:
        self._value, self._loaded = value, True
        self._table.put(HANDED_KEY, b"".join(
            n.to_bytes(_FIELD_BYTES, "big") for n in (value.end, value.delivered, value.acks)))


def _decode(raw: bytes) -> DeliveryCount | None:
    if len(raw) != 3 * _FIELD_BYTES:
        return None  # not ours to trust: counted again, as for a store without it
    end, delivered, acks = (int.from_bytes(raw[i:i + _FIELD_BYTES], "big")
                            for i in range(0, len(raw), _FIELD_BYTES))
    return DeliveryCount(0, end, delivered, acks)
