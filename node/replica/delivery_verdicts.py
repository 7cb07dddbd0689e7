"""What a subscriber is handed at each recent delivery position, noted when it was applied.

`Replica.deliveries` hands subscribers the applied events that are not
rejected, soft-failed or withheld. Counting them (`status`'s `delivered` and
`acks`) by reading every event back from the store and asking those three
questions again cost 6-14 us an event, with the event loop held: the catch-up
bench's status polls, every 0.3 s, spent ~45 ms each (docs/anti-entropy.md, s24
and s25).

The replica knows the three answers when it applies an event: withheld is in
the event, a late rejection comes from the tracker in the same add
(`Replica._outcome`), a soft fail right after it (`Replica._soft_fail`); none
changes afterwards. So each applied event's answer is noted here, one byte
per delivery position, and a count over positions noted here is two
`bytes.count` calls. Positions before the first noted one (history applied
before this process started) are still counted by reading them back.

The notes follow the graph's uncommitted writes: when they are discarded (a
failed commit, a refused `publish_many`) the positions are reused, so the
notes are dropped (`clear`) and those positions are read back instead. At
most `DELIVERY_VERDICTS_KEPT` positions are kept (one byte each); older ones
are read back too.
"""

from __future__ import annotations

from dataclasses import dataclass

DELIVERY_VERDICTS_KEPT = 65_536  # positions noted (80 KiB a busy topic at most: +1/4 before a trim)
COUNT_READ_BACK_PAGE = 1_024  # positions read back per `Replica.count_delivered` call

VISIBLE = 1  # handed to subscribers
ACK = 2  # an empty acknowledgement (counted among the delivered as `acks` too)


@dataclass(frozen=True, slots=True)
class DeliveryCount:
    """Counted over delivery positions [start, end): events handed to subscribers,
    and the acknowledgements among them; `read_back`: from the store, not the notes."""

    start: int
    end: int
    delivered: int
    acks: int
    read_back: bool = False


class DeliveryVerdicts:
    """One flag byte (`VISIBLE`, `ACK`) per delivery position, for a contiguous run."""

    def __init__(self, kept: int = DELIVERY_VERDICTS_KEPT) -> None:
        if kept < 1:
            raise ValueError("kept must be at least 1")
        self._kept = kept
        self._start = 0
        self._flags = bytearray()

    @property
    def start(self) -> int:
        """The first position noted (meaningless while nothing is)."""
        return self._start

    @property
    def end(self) -> int:
        """One past the last position noted."""
        return self._start + len(self._flags)

    def note(self, start: int, flags: bytes | bytearray) -> None:
        """Note the flags of positions start, start + 1, ... A run that does not continue
        the one noted (positions skipped) replaces it."""
        if start != self.end or not self._flags:
            self._start, self._flags = start, bytearray()
        self._flags += flags
        if len(self._flags) > self._kept + self._kept // 4:  # in chunks: `del` moves the rest
            excess = len(self._flags) - self._kept
            del self._flags[:excess]
            self._start += excess

    def hide(self, position: int) -> None:
        """The event at `position` is not handed to subscribers after all (soft-failed)."""
        at = position - self._start
        if 0 <= at < len(self._flags):
            self._flags[at] &= ~VISIBLE & 0xFF

    def clear(self) -> None:
        self._start, self._flags = 0, bytearray()

    def count(self, start: int, end: int) -> DeliveryCount | None:
        """The count over [start, min(end, self.end)), if `start` is noted; None if not."""
        if not self._flags or not self._start <= start < self.end:
            return None
        stop = min(end, self.end)
        flags = self._flags[start - self._start:stop - self._start]
        acks = flags.count(VISIBLE | ACK)
        return DeliveryCount(start, stop, flags.count(VISIBLE) + acks, acks)
