"""The one validation that needs an event's ancestry: its parents must form an antichain.

No parent may be an ancestor of another (a redundant edge). The graph asks
when it applies an event with two or more parents, because only then are the
parents known; the verdict must be identical on every correct replica, so it
depends on the ancestry alone.

The search visits only ancestors deep enough to be a parent, in an order
fixed by the ancestry, and at most ANTICHAIN_SEARCH_VISITS of them; a search
that runs out of that budget without finding a violation *accepts* the event.
Rejecting instead would refuse honest merges: once a topic holds more events
than the budget, a device back from a long absence publishes on an old head,
and every merge of that head with a deep one — every later local publish
names all the extremities — would be refused for good. Accepting is just as
deterministic (the budget is a protocol constant, not a node setting: nodes
with different budgets would decide differently and their graphs diverge),
and a non-antichain accepted that way only adds a redundant edge: depths,
extremities and delivery stay well defined. The graph counts exhausted
searches (`Graph.antichain_searches_exhausted`).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

# A protocol constant, not a per-node limit: every replica of a topic must use
# the same value, because it decides which events are accepted (module docstring).
ANTICHAIN_SEARCH_VISITS = 65_536

# (depth, parents, ...) of an applied event: the graph's node lookup.
NodeOf = Callable[[bytes], "tuple | None"]


class Verdict(Enum):
    ANTICHAIN = "antichain"  # no parent is an ancestor of another
    NOT_ANTICHAIN = "not_antichain"  # one is: reject (RejectReason.PARENTS_NOT_ANTICHAIN)
    SEARCH_EXHAUSTED = "search_exhausted"  # out of budget, none found: accepted


def check(parents: tuple[bytes, ...], node_of: NodeOf) -> Verdict:
    """Whether `parents` (all applied here, so `node_of` knows them) form an antichain.

    Only ancestors deeper than the shallowest parent can lead to a parent,
    so the walk goes no lower. Its order (parents in event order, then depth
    first) and so the ancestors it visits within the budget are fixed by the
    ancestry alone: every replica reaches the same verdict.
    """
    if len(parents) < 2:
        return Verdict.ANTICHAIN
    parent_set = set(parents)
    # Nodes (depth, parents, ...) rather than ids: each is looked up once.
    nodes = [node_of(p) for p in parents]
    floor = min(node[0] for node in nodes)  # type: ignore[index]
    stack = [node for node in nodes if node[0] > floor]  # type: ignore[index]
    seen: set[bytes] = set()
    budget = ANTICHAIN_SEARCH_VISITS  # read per call: tests scale it down
    while stack:
        current = stack.pop()
        for ancestor in current[1]:  # type: ignore[index]
            if ancestor in seen:
                continue
            if ancestor in parent_set:
                return Verdict.NOT_ANTICHAIN
            seen.add(ancestor)
            if len(seen) > budget:
                return Verdict.SEARCH_EXHAUSTED
            node = node_of(ancestor)
            if node[0] > floor:  # type: ignore[index]
                stack.append(node)
    return Verdict.ANTICHAIN
