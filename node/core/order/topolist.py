"""The deterministic topological order of the nodes not yet confirmed.

Theory of operation
-------------------
Kahn's algorithm with one rule for choices: among the nodes whose
dependencies have all been emitted, emit the smallest (writer key, seq). Any
two replicas holding the same nodes get the same list. The design document's
example, writers a < b < c:

    a0   c0            available {a0, c0}  -> a0
     | X |             available {c0}      -> c0
    b0   a1            available {b0, a1}  -> a1
     | \\ |             available {b0}      -> b0
    c1   b1            available {c1, b1}  -> b1, then c1, then b2
     | /
    b2                 order: [a0, c0, a1, b0, b1, c1, b2]

Incremental insertion. Nodes arrive in causal order, so a new node has no
dependents yet. Running Kahn again with it would choose exactly as before
until the new node becomes available (right after its last dependency), and
from then on it is emitted at the first step whose old choice sorts after
it; afterwards nothing else changes, because nothing waits on it. So a new
node goes in at

    p = first index k after its last dependency with key(new) < key(list[k])

(or at the end), in one pass, and p is also the length of the prefix the old
and new lists share: how far back a subscriber to the tentative order must
rewind. Confirmation removes a set of nodes from the front of the causal
order, which can change the order of the rest (a node freed earlier may now
sort first), so the linearizer rebuilds the list with `kahn` after each
confirmation instead.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable
from itertools import compress, count, islice

from .values import SortKey

DepsOf = Callable[[bytes], Iterable[bytes]]
KeyOf = Callable[[bytes], SortKey]


def kahn(ids: Collection[bytes], deps_of: DepsOf, key_of: KeyOf) -> list[bytes]:
    """Kahn's algorithm over `ids`, smallest key first; deps outside `ids` count as done."""
    members = set(ids)
    waiting: dict[bytes, int] = {}
    dependents: dict[bytes, list[bytes]] = {}
    ready: list[tuple[SortKey, bytes]] = []
    for node in members:
        inside = {dep for dep in deps_of(node) if dep in members}
        waiting[node] = len(inside)
        for dep in inside:
            dependents.setdefault(dep, []).append(node)
        if not inside:
            ready.append((key_of(node), node))
    heapq.heapify(ready)
    order: list[bytes] = []
    while ready:
        _, node = heapq.heappop(ready)
        order.append(node)
        for child in dependents.get(node, ()):
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, (key_of(child), child))
    if len(order) != len(members):
        raise ValueError("dependency cycle among the nodes to order")
    return order


class TopoList:
    """The tentative order: a Kahn list kept up to date one insertion at a time."""

    def __init__(self, key_of: KeyOf) -> None:
        self._key_of = key_of
        self._ids: list[bytes] = []
        self._keys: list[SortKey] = []  # parallel to _ids: the scan compares without calls

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self):
        return iter(self._ids)

    def snapshot(self) -> tuple[bytes, ...]:
        return tuple(self._ids)

    def insert(self, node: bytes, deps: Iterable[bytes]) -> int:
        """Insert a node none of the listed nodes depends on; return its position.

        `deps` are the node's dependencies that are in the list (confirmed ones
        are done and must be left out). The position is the shared-prefix length.
        """
        key = self._key_of(node)
        keys = self._keys
        start = max(map((1).__add__, map(self._ids.index, set(deps))), default=0)
        # The first k >= start with key < keys[k], found in C (a tail of a thousand
        # unconfirmed joins made the Python loop this was the linearizer's main cost).
        later = compress(count(start), map(key.__lt__, islice(keys, start, None)))
        position = next(later, len(keys))
        self._ids.insert(position, node)
        keys.insert(position, key)
        return position

    def rebuild(self, ids: Collection[bytes], deps_of: DepsOf) -> None:
        self._ids = kahn(ids, deps_of, self._key_of)
        self._keys = [self._key_of(i) for i in self._ids]
