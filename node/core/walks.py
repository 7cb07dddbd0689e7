"""Walks over the MEG that anti-entropy asks for, and a memo that makes catch-ups linear.

"What do I have that a peer with heads H lacks?" is `not_below(H)`: every
event here that is neither in H nor an ancestor of one, returned shallowest
first in (depth, id) order — a parents-first order, so a peer can apply a
prefix of it as it arrives. `recent(since, floor, cap)` is its sibling for
the offerer's Bloom filter: the events not below `since` at depth >= `floor`.

Theory of operation
-------------------
Both walk down from our forward extremities (and H) in order of decreasing
depth, marking everything reachable from H as "below". A node is popped
only after every deeper node, so its mark is final when popped; the walk
ends once every queued node is marked, so it visits the missing events plus
a frontier about the size of H, not the whole graph (`walk_not_below`).

The shallowest events come out of that walk *last*, so one page of a long
answer costs the whole answer. A peer lagging by m events catches up in
m / page continuations, each offering its new heads; walking the remaining
gap each time made the catch-up quadratic (m = 100,000, pages of 1,024:
five million visits). `NotBelowMemo` remembers the full sorted answer of
a walk and, for a later query whose heads are that answer's prefix already
sent (plus anything), derives the new answer from the old one:

    M   the remembered missing set for heads H0 (complete, sorted)
    Q   the new query's heads; T = the greatest (depth, id) of Q in M
    D   the members of M at or below T that Q reaches (a walk inside M;
        an ancestor is shallower, so it lies at or below T as well)
    B   the parents met on that walk that are not in M: they are below H0

If every h0 in H0 is in Q, in B, or found below Q by a short bounded walk,
then below(Q) = below(H0) ∪ D, so not_below(Q) = (M \\ D) ∪ (events applied
since) — exactly what the full walk returns, at a cost proportional to
the part of M at or below T (one page for a continuation), not to M. If
the test fails the caller walks in full: the memo changes cost, never the
answer (the tests compare the two on random graphs).

Peers lagging beyond the walk bound
-----------------------------------
A walk finds at most `max_found` events, and those are the *deepest*: when
more are missing, the shallowest — the only ones the peer can apply — are
not among them. Such a query is answered in delivery order instead
(`node.core.delivery_pages`).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice

from node.core.delivery_pages import DeliveryLog, page_by_position

# (depth, parents) of an event here, or None.
NodeOf = Callable[[bytes], "tuple[int, tuple[bytes, ...]] | None"]

MAX_WALK_MEMOS = 4  # concurrent catch-ups remembered (one per lagging peer, LRU)
MAX_MEMO_EVENTS = 262_144  # (depth, id) pairs held by all memos together (~30 MB)
MAX_MEMO_EXTRA = 16_384  # events applied or skipped since a memo's walk before it is dropped
# A query is treated as a continuation of a memo only if the part of the memo
# it reaches is at most this many times the previous page (plus the slack):
# beyond that a full walk is about as cheap, and a stranger's query costs little.
MEMO_REACH_FACTOR = 2
MEMO_REACH_SLACK = 1_024
MAX_MEMO_VERIFY_VISITS = 4_096  # bounded walk proving the old heads lie below the new ones


def walk_not_below(node_of: NodeOf, tops: Iterable[bytes], known: set[bytes],
                   floor: int = 0) -> Iterator[tuple[int, bytes]]:
    """Yield (depth, id) of the events reachable from `tops` not below `known`, deepest first.

    `known` must hold only ids present here. The walk stops by itself once
    every queued node is marked below `known`, or at depth `floor`; a
    consumer that has enough simply stops iterating.
    """
    below: set[bytes] = set(known)
    queued: set[bytes] = set()
    # (-depth, id, parents): ids are unique in the heap, so parents are never compared.
    heap: list[tuple[int, bytes, tuple[bytes, ...]]] = []
    unmarked = 0
    for event_id in sorted(set(tops) | known):
        info = node_of(event_id)
        if info is None or event_id in queued:
            continue
        queued.add(event_id)
        unmarked += event_id not in below
        heap.append((-info[0], event_id, info[1]))
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush
    while heap and unmarked > 0 and -heap[0][0] >= floor:
        negative_depth, event_id, parents = pop(heap)
        is_below = event_id in below
        if not is_below:
            unmarked -= 1
            yield -negative_depth, event_id
        for parent in parents:
            if is_below and parent not in below:
                below.add(parent)
                if parent in queued:
                    unmarked -= 1  # queued unmarked, marked now
            if parent not in queued:
                parent_info = node_of(parent)
                if parent_info is None:
                    continue
                queued.add(parent)
                unmarked += parent not in below
                push(heap, (-parent_info[0], parent, parent_info[1]))


def recent(node_of: NodeOf, tops: Iterable[bytes], since: set[bytes], floor: int,
           cap: int) -> tuple[list[bytes], int]:
    """Ids not below `since` with depth >= `floor`, deepest first; (ids, floor covered).

    If more than `cap` qualify, the deepest whole depth levels that fit are
    kept and the floor is raised to match: "everything at depth >= covered"
    stays true, which is what a Bloom filter of them promises its reader.
    """
    found: list[tuple[int, bytes]] = []
    for depth, event_id in walk_not_below(node_of, tops, since, floor):
        if len(found) >= cap:
            while found and found[-1][0] == depth:
                found.pop()
            return [i for _, i in found], depth + 1
        found.append((depth, event_id))
    return [i for _, i in found], floor


@dataclass(eq=False)  # identity: two memos may hold equal state, and lists remove by ==
class _Memo:
    heads: frozenset[bytes]  # the query the remembered answer is relative to
    base: list[tuple[int, bytes]]  # a full walk's answer, sorted; shared, never mutated
    start: int  # base[start:] is still missing relative to `heads`
    extra: list[tuple[int, bytes]]  # sorted; missing too (skipped earlier, applied since)
    page: int  # size of the last page served from it
    applied: list[tuple[int, bytes]] = field(default_factory=list)  # since the last query

    @property
    def size(self) -> int:
        return len(self.base) - self.start + len(self.extra) + len(self.applied)


class NotBelowMemo:
    """Remembered `not_below` answers, so a catch-up's continuations cost one page each.

    The graph tells it about every applied event (`note_applied`) and drops
    it when pending writes are discarded (`clear`). Sans-IO and in memory:
    a restart only costs one full walk.
    """

    def __init__(self) -> None:
        # Most recently used last. Public for one reason: the graph tests it for
        # emptiness on every applied event, and an attribute is cheaper than a call.
        self.memos: list[_Memo] = []
        self.hits = 0  # statistics for tests and benchmarks
        self.misses = 0
        self.paged = 0  # queries answered in delivery order (`page_by_position`)

    def __bool__(self) -> bool:
        return bool(self.memos)

    def clear(self) -> None:
        self.memos = []

    def note_applied(self, depth: int, event_id: bytes) -> None:
        """A new event is here: it is missing for every remembered query."""
        for memo in self.memos:
            memo.applied.append((depth, event_id))
        if any(len(m.applied) > MAX_MEMO_EXTRA for m in self.memos):
            self.memos = [m for m in self.memos if len(m.applied) <= MAX_MEMO_EXTRA]

    def not_below(self, node_of: NodeOf, tops: Iterable[bytes], known: set[bytes],
                  limit: int, max_found: int, log: DeliveryLog) -> list[bytes]:
        """Up to `limit` events not below `known` (ids here), parents first.

        The `limit` shallowest in (depth, id) order when at most `max_found`
        are missing; otherwise a page in delivery order (`page_by_position`):
        a walk stopped at `max_found` holds the deepest missing events, whose
        parents the peer lacks.
        """
        heads = frozenset(known)
        for memo in reversed(self.memos):
            answer = self._resume(memo, node_of, heads, limit)
            if answer is not None:
                self.hits += 1
                return answer
        if log.end - 1 - log.newest(known) > max_found:
            # More events came after the newest head than a walk may find: it
            # could not finish, so do not start it.
            self.paged += 1
            return page_by_position(log, set(known), limit, max_found)
        self.misses += 1
        found: list[tuple[int, bytes]] = []
        for pair in walk_not_below(node_of, tops, set(known)):
            if len(found) >= max_found:
                # Incomplete: these are the deepest missing events, not a page
                # the peer can apply (nor a memo's seed).
                self.paged += 1
                return page_by_position(log, set(known), limit, max_found)
            found.append(pair)
        found.sort()
        if len(found) > limit:
            self._keep(_Memo(heads, found, 0, [], limit))
        return [event_id for _, event_id in found[:limit]]

    # ------------------------------------------------------------- internals

    def _keep(self, memo: _Memo) -> None:
        self.memos.append(memo)
        while len(self.memos) > MAX_WALK_MEMOS or (
                len(self.memos) > 1 and sum(m.size for m in self.memos) > MAX_MEMO_EVENTS):
            self.memos.pop(0)
        if memo.size > MAX_MEMO_EVENTS:
            self.memos.remove(memo)

    def _resume(self, memo: _Memo, node_of: NodeOf, heads: frozenset[bytes],
                limit: int) -> list[bytes] | None:
        """The answer for `heads` derived from `memo`, updating it; None if not derivable."""
        base, start, extra = memo.base, memo.start, memo.extra
        applied = sorted(memo.applied)
        applied_ids = {event_id for _, event_id in applied}
        # Where each head lies: in the remembered missing set, or below its heads.
        top: tuple[int, bytes] | None = None
        inside: list[bytes] = []
        for head in heads:
            if head in applied_ids:
                return None  # the peer has something newer than the walk: start afresh
            info = node_of(head)
            if info is None:
                return None
            key = (info[0], head)
            if _contains(base, key, start) or _contains(extra, key, 0):
                inside.append(head)
                if top is None or key > top:
                    top = key
        reach = start if top is None else bisect_right(base, top, start)
        if reach - start > MEMO_REACH_FACTOR * memo.page + MEMO_REACH_SLACK:
            return None
        candidates = {event_id for _, event_id in base[start:reach]}
        if top is not None:
            candidates.update(pair[1] for pair in extra if pair <= top)
        # D: what the new heads reach inside the missing set; B: what they reach outside it.
        reached = set(inside)
        boundary: set[bytes] = set()
        stack = list(inside)
        while stack:
            info = node_of(stack.pop())
            for parent in info[1] if info is not None else ():
                if parent in candidates:
                    if parent not in reached:
                        reached.add(parent)
                        stack.append(parent)
                else:
                    boundary.add(parent)
        if not self._old_heads_below(memo.heads, heads, inside, boundary, node_of):
            return None
        # The new missing set: what was missing, minus what the heads reach, plus new events.
        skipped = [pair for pair in base[start:reach] if pair[1] not in reached]
        kept_extra = [pair for pair in extra if pair[1] not in reached]
        memo.heads = heads
        memo.start = reach
        memo.extra = sorted(skipped + kept_extra + applied)
        memo.applied = []
        memo.page = limit
        if len(memo.extra) > MAX_MEMO_EXTRA or memo.start >= len(base) and not memo.extra:
            self.memos.remove(memo)  # too scattered to help, or nothing left to page through
        else:
            self.memos.remove(memo)
            self.memos.append(memo)  # most recently used
        page = islice(heapq.merge(memo.extra, base[reach:reach + limit]), limit)
        return [event_id for _, event_id in page]

    @staticmethod
    def _old_heads_below(old: frozenset[bytes], new: frozenset[bytes], inside: list[bytes],
                         boundary: set[bytes], node_of: NodeOf) -> bool:
        """True if every old head is below (or in) the new heads, proved within a bound.

        Usually immediate: an old head is still a head, or a parent of an
        event the new heads reach. Otherwise walk down from what the new
        heads reach outside the missing set, no deeper than the old heads
        still unproven, for at most MAX_MEMO_VERIFY_VISITS events.
        """
        unproven = {h for h in old if h not in new and h not in boundary}
        if not unproven:
            return True
        floor = min(node_of(h)[0] for h in unproven)  # type: ignore[index]
        heap: list[tuple[int, bytes]] = []
        seen: set[bytes] = set()
        for event_id in boundary | new.difference(inside):
            info = node_of(event_id)
            if info is not None and event_id not in seen:
                seen.add(event_id)
                heap.append((-info[0], event_id))
        heapq.heapify(heap)
        visits = 0
        while heap and unproven:
            negative_depth, event_id = heapq.heappop(heap)
            if -negative_depth < floor:
                break
            visits += 1
            if visits > MAX_MEMO_VERIFY_VISITS:
                return False
            info = node_of(event_id)
            for parent in info[1] if info is not None else ():
                unproven.discard(parent)
                if parent not in seen:
                    seen.add(parent)
                    parent_info = node_of(parent)
                    if parent_info is not None:
                        heapq.heappush(heap, (-parent_info[0], parent))
        return not unproven


def _contains(pairs: list[tuple[int, bytes]], key: tuple[int, bytes], lo: int) -> bool:
    index = bisect_left(pairs, key, lo)
    return index < len(pairs) and pairs[index] == key
