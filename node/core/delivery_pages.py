"""Pages in delivery order for a peer lagging past the walk bound (`page_by_position`).

A depth-ordered walk (`node.core.walks`) finds at most `max_found` events,
and those are the *deepest*: when more are missing, the shallowest — the
only ones the peer can apply — are not among them. Such a query is answered
in delivery order instead, which this module reads; a concept of its own
because it walks by delivery position, not by depth, and keeps no memo.

Theory of operation
-------------------
Delivery positions are a topological order, so every ancestor of the peer's
heads H lies at a lower position than some head, and every event after the
newest head is missing (which tells, before any walk, that a walk could not
finish). A second walk goes down from H in decreasing position, marking
below(H); it visits only events the peer has, and once its highest queued
event is at position p it knows below(H) at or above p + 1. The page is read
forwards from there: an unmarked event is missing, and it joins the page if
each of its parents is marked (the peer has it) or already in the page — so
whatever the page holds, the peer can apply in order. The walk first goes
down to just after the newest head (for a peer that simply lags, nothing:
the page is the next `limit` events, at the cost of one page). A read stops
at the first event with a parent further down than the walk has decided; the
walk then goes at least that far (and at least twice as far as last time)
and the page is read again. A peer back from a partition whose own events
came here last costs one stretch of its own events to walk, then the page.
All of it shares one bound; if that runs short (a parent very far down), a
last read passes over the events it cannot send and keeps the rest, and what
it passed over is sent once the lag is within a full walk's bound. A query
may so get a short page, or none: bounded work per query comes first.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# (delivery position, parents) of an event here, or None.
LocateOf = Callable[[bytes], "tuple[int, tuple[bytes, ...]] | None"]
# (id, parents) of the event at a delivery position (0 <= position < end).
EventAt = Callable[[int], "tuple[bytes, tuple[bytes, ...]]"]


@dataclass(frozen=True, slots=True)
class DeliveryLog:
    """The graph's delivery order, as `page_by_position` reads it."""

    locate: LocateOf
    at: EventAt
    end: int  # events applied: positions 0 .. end - 1

    def newest(self, ids: Iterable[bytes]) -> int:
        """The highest delivery position of `ids` (ids here), -1 if there are none."""
        newest = -1
        for event_id in ids:
            info = self.locate(event_id)
            if info is not None and info[0] > newest:
                newest = info[0]
        return newest


class _BelowByPosition:
    """below(known), discovered by walking down in decreasing delivery position.

    Every ancestor of `known` sits below one of its descendants in the
    delivery order, so the walk meets it before the heap's top drops under
    its position: every ancestor at or above `exact_from` is in `marked`
    (and everything in `marked` is an ancestor or one of `known`). Under
    `exact_from`, an unmarked event may still be below.
    """

    def __init__(self, locate: LocateOf, known: Iterable[bytes]) -> None:
        self._locate = locate
        self.marked: set[bytes] = set()
        self.positions: set[int] = set()  # of the marked events: a read can skip them
        # (-position, id, parents): positions are unique, so ids are never compared.
        self._heap: list[tuple[int, bytes, tuple[bytes, ...]]] = []
        for event_id in known:
            info = locate(event_id)
            if info is not None and event_id not in self.marked:
                self.marked.add(event_id)
                self.positions.add(info[0])
                self._heap.append((-info[0], event_id, info[1]))
        heapq.heapify(self._heap)
        self.visits = 0

    @property
    def exact_from(self) -> int:
        return 1 - self._heap[0][0] if self._heap else 0

    def lower(self, floor: int, budget: int) -> None:
        """Walk on until `exact_from` <= `floor`, or for `budget` more visits at most."""
        heap, marked, positions, locate = self._heap, self.marked, self.positions, self._locate
        stop = self.visits + max(budget, 0)
        while heap and -heap[0][0] >= floor and self.visits < stop:
            _, _, parents = heapq.heappop(heap)
            self.visits += 1
            for parent in parents:
                if parent not in marked:
                    info = locate(parent)
                    if info is not None:
                        marked.add(parent)
                        positions.add(info[0])
                        heapq.heappush(heap, (-info[0], parent, info[1]))


# Of a `page_by_position` budget, the share kept for a last read that passes
# over events it cannot send yet rather than walking down to prove them.
PAGE_FINAL_READ_SHARE = 4  # one quarter


def page_by_position(log: DeliveryLog, known: set[bytes], limit: int,
                     budget: int) -> list[bytes]:
    """Up to `limit` events not below `known` (ids here), in delivery order.

    Each event's parents are below `known` or earlier in the page, so a
    peer with heads `known` applies the page in order without waiting. For
    peers lagging beyond a walk's reach (module docstring); at most about
    `budget` event lookups, and about one page's worth for a peer that
    simply lags. The page may hold fewer than `limit` events (none, if the
    budget runs out first) even when more are missing.

    Reads stop at the first event that cannot be sent yet, and the walk
    goes down far enough to decide its parents, then reads again: the page
    is then what is missing from the lowest position on. If the budget runs
    short (a parent far down), a last read keeps the events that do not
    depend on such a parent.
    """
    below = _BelowByPosition(log.locate, known)
    final_share = budget // PAGE_FINAL_READ_SHARE
    budget -= final_share
    target = log.newest(known) + 1  # everything from here on is missing
    step = max(limit, 1)
    best: list[bytes] = []
    reads = 0
    while True:
        below.lower(target, budget - reads - below.visits)
        # The walk only visits events the peer has: across a stretch the peer
        # lacks, what it knows exactly reaches far below the target at no cost.
        start = below.exact_from
        page, read, needed = _page_from(log, below, start, limit,
                                        budget - reads - below.visits, pass_held=False)
        reads += read
        if len(page) > len(best):
            best = page
        if len(best) >= limit or start == 0:
            return best
        if reads + below.visits >= budget:
            break
        # Short: walk down at least to the parent that stopped the read.
        target = max(0, min(start - step, start if needed is None else needed))
        step *= 2
    page, _, _ = _page_from(log, below, below.exact_from, limit, final_share, pass_held=True)
    return page if len(page) > len(best) else best


def _page_from(log: DeliveryLog, below: _BelowByPosition, start: int, limit: int,
               budget: int, pass_held: bool) -> tuple[list[bytes], int, int | None]:
    """The page read forwards from `start`, where `below` is exact; (page, reads, needed).

    Only missing events are read: the marked positions are skipped (there
    are no more of them than the walk visited). A missing event joins the
    page if each parent is marked (the peer has it) or in the page already.
    It is held back if a parent was, or if a parent is unmarked under
    `start`, where the walk does not know yet whether the peer has it:
    `needed` is the highest such position (None if there is none). The
    read stops at the page's size, at the end, after `budget` reads, and,
    unless `pass_held`, at the first event held back.
    """
    marked, skip = below.marked, below.positions
    page: list[bytes] = []
    in_page: set[bytes] = set()
    held: set[bytes] = set()
    needed: int | None = None
    reads = 0
    position, end = start, log.end
    while position < end and len(page) < limit and reads < budget:
        if position in skip:  # the peer has it
            position += 1
            continue
        event_id, parents = log.at(position)
        position += 1
        reads += 1
        sendable = True
        for parent in parents:
            if parent in marked or parent in in_page:
                continue
            sendable = False
            if parent not in held:  # under `start`: unknown yet
                info = log.locate(parent)
                if info is not None and (needed is None or info[0] > needed):
                    needed = info[0]
        if sendable:
            page.append(event_id)
            in_page.add(event_id)
        elif pass_held:
            held.add(event_id)
        else:
            break
    return page, reads, needed
