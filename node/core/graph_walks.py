"""The walks a graph answers: ancestors, descendants, and what a peer lacks.

`GraphWalks` is a mixin of `node.core.graph.Graph`: the graph's read side
for anti-entropy and tests, over the graph's caches and tables. The walks
themselves are elsewhere — depth-ordered with the catch-up memo in
`node.core.walks`, pages in delivery order for peers lagging past MAX_WALK
in `node.core.delivery_pages` — and this module hands them the graph's
view: (depth, parents) per event (`_node`), the forward extremities, and
the delivery table read by position (`_locate`, `_at`). Kept apart so the
graph module reads as the add/read core of the MEG. None of it runs per
applied event (the memo's `note_applied` is called from `Graph.add`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import msgpack

from node.core.delivery_pages import DeliveryLog
from node.core.event import event_id_of
from node.core.pending import PendingWrites
from node.core.store import TABLE_DELIVERY
from node.core.walks import NotBelowMemo, recent

MAX_WALK = 100_000  # default bound for ancestor/descendant walks and `not_below` answers


class GraphWalks:
    """Ancestor/descendant walks and anti-entropy's `not_below`/`recent`; a mixin of `Graph`."""

    # The graph's state these walks read (set by `Graph.__init__`).
    _w: PendingWrites
    _t: bytes
    _extremities: set[bytes]
    _memo: NotBelowMemo

    if TYPE_CHECKING:  # the graph's methods the walks call
        def has(self, event_id: bytes) -> bool: ...
        def parents_of(self, event_id: bytes) -> tuple[bytes, ...] | None: ...
        def children(self, event_id: bytes) -> list[bytes]: ...
        def _node(self, event_id: bytes) -> tuple[int, tuple[bytes, ...], bytes] | None: ...
        @property
        def delivered_count(self) -> int: ...

    def ancestors(self, ids: Iterable[bytes], limit: int = MAX_WALK) -> list[bytes]:
        """Strict ancestors of `ids` present here, newest (deepest) first, at most `limit`."""
        return self._walk(ids, limit, self.parents_of)

    def in_past_of(self, head: bytes, ids: Iterable[bytes], max_visits: int) -> set[bytes]:
        """Those of `ids` that are `head` or its ancestors here. The walk down from `head`
        goes no deeper than the shallowest of `ids` and visits at most `max_visits`
        events; what it did not reach by then is left out."""
        wanted = {i: d for i in set(ids) if (d := self.depth(i)) is not None}
        if head not in wanted and not self.has(head):
            return set()
        found = {head} & wanted.keys()
        if not wanted:
            return found
        floor = min(wanted.values())
        frontier, seen, visits = [head], {head}, 0
        while frontier and len(found) < len(wanted) and visits < max_visits:
            next_frontier: list[bytes] = []
            for event_id in frontier:
                for parent in self.parents_of(event_id) or ():
                    if parent in seen:
                        continue
                    seen.add(parent)
                    visits += 1
                    depth = self.depth(parent)
                    if depth is None or depth < floor:
                        continue
                    if parent in wanted:
                        found.add(parent)
                    next_frontier.append(parent)
            frontier = next_frontier
        return found

    def descendants(self, ids: Iterable[bytes], limit: int = MAX_WALK) -> list[bytes]:
        """Strict descendants of `ids` present here, breadth first, at most `limit`."""
        return self._walk(ids, limit, lambda i: tuple(self.children(i)))

    def _walk(self, ids: Iterable[bytes], limit: int,
              step: Callable[[bytes], tuple[bytes, ...] | None]) -> list[bytes]:
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
        (`node.core.delivery_pages`).
        """
        if limit <= 0:
            return []
        known = {h for h in heads if self.has(h)}
        log = DeliveryLog(self._locate, self._at, self.delivered_count)
        return self._memo.not_below(self._node, self._extremities, known, limit, MAX_WALK, log)

    def _locate(self, event_id: bytes) -> tuple[int, tuple[bytes, ...]] | None:
        """(delivery position, parents) of an applied event: `DeliveryLog.locate`."""
        info = self._node(event_id)
        return None if info is None else (int.from_bytes(info[2], "big"), info[1])

    def _at(self, position: int) -> tuple[bytes, tuple[bytes, ...]]:
        """(id, parents) of the event at a delivery position: `DeliveryLog.at`."""
        record = self._w.get(TABLE_DELIVERY, self._t + position.to_bytes(8, "big"))
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
        return recent(self._node, self._extremities, known, floor, cap)
