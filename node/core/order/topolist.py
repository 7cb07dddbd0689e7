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
rewind.

Confirmation. It removes a set of nodes closed under dependencies (an
anchor's unconfirmed past) from the list, which can change the order of the
rest: a node freed of a removed dependency may now sort first. A full `kahn`
after each confirmation cost the whole tail each time (a thousand ids per
replica at 1000 nodes), so `remove` finds the new order from the old one.
With the removed nodes left out, the old order is a *stream*: its next id is
always available (its dependencies sit before it), and every other available
id sorts after it - unless that id had a removed dependency (it is freed) or
has a dependency emitted ahead of the stream. Only those are *watched*: each
waits until its last dependency is emitted, then competes with the stream's
head; the smaller key goes first. Everything between is copied from the old
order by slices. So a confirmation costs the removed nodes' children and
what moved, plus C-speed copies, and gives exactly `kahn`'s list (seeded
randomised tests against the reference, `tests/core/order/test_topolist.py`).
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence, Set
from itertools import accumulate, chain, compress, count, islice
from operator import not_
from typing import Any, overload

from .values import SortKey

TOPO_BLOCK = 64  # ids per block of the tentative list (a block splits past twice this)

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


class TailView(Sequence[bytes]):
    """An immutable snapshot of a `TopoList`, sharing its blocks (copy on write).

    The linearizer hands out the tentative tail after every feed, and a tuple
    of it cost the tail's length each time: on every event while the tail
    grows unconfirmed (tests/bench/test_engine_step_bench.py). A view costs
    a tuple of block references, and the list copies a block before it
    changes one a view holds. It answers what a tuple answers (length,
    iteration, indexing, slices as tuples, `index`, equality with any
    sequence, `+`); indexing finds the block by bisection.
    """

    __slots__ = ("_blocks", "_length", "_starts")

    def __init__(self, blocks: tuple[list[bytes], ...], length: int) -> None:
        self._blocks = blocks
        self._length = length
        self._starts: list[int] | None = None  # each block's first position, on first use

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[bytes]:
        return chain.from_iterable(self._blocks)

    def __reversed__(self) -> Iterator[bytes]:
        return chain.from_iterable(map(reversed, reversed(self._blocks)))

    def _block_at(self, position: int) -> tuple[int, int]:
        """(block, offset in it) of `position` (0 <= position < len)."""
        starts = self._starts
        if starts is None:
            starts = self._starts = list(accumulate((len(b) for b in self._blocks), initial=0))
        b = bisect_right(starts, position) - 1
        while not self._blocks[b]:  # (empty blocks share their start with the next)
            b += 1
        return b, position - starts[b]

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[bytes, ...]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._length)
            if step != 1:
                return tuple(self)[index]
            return tuple(self._range(start, stop))
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("tail index out of range")
        b, i = self._block_at(index)
        return self._blocks[b][i]

    def _range(self, start: int, stop: int) -> Iterator[bytes]:
        if start >= stop:
            return iter(())
        b, i = self._block_at(start)
        return islice(chain(islice(self._blocks[b], i, None),
                            chain.from_iterable(self._blocks[b + 1:])), stop - start)

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        start, stop, _ = slice(start, stop).indices(self._length)
        if start < stop:
            b, i = self._block_at(start)
            position = start - i
            for block in self._blocks[b:]:
                if position >= stop:
                    break
                try:
                    found = position + block.index(value, i, stop - position)
                except ValueError:
                    pass
                else:
                    return found
                position += len(block)
                i = 0
        raise ValueError("id not in the tail")

    def __contains__(self, value: object) -> bool:
        return any(value in block for block in self._blocks)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if isinstance(other, TailView):
            if len(other) != self._length:
                return False
            if len(other._blocks) == len(self._blocks) and all(
                    a is b for a, b in zip(self._blocks, other._blocks)):
                return True
            return tuple(self) == tuple(other)
        if isinstance(other, (tuple, list)):
            return len(other) == self._length and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __add__(self, other: Sequence[bytes]) -> tuple[bytes, ...]:
        return (*self, *other)

    def __radd__(self, other: Sequence[bytes]) -> tuple[bytes, ...]:
        return (*other, *self)

    def __repr__(self) -> str:
        return f"TailView({tuple(self)!r})"


class TopoList:
    """The tentative order: a Kahn list kept up to date one insertion at a time.

    Kept in blocks of at most 2 * TOPO_BLOCK ids, each with its ids' keys and
    their maximum, and a map from id to its block: an insertion skips every
    block whose maximum does not sort after the new key and finds its
    dependencies' blocks by lookup, so it costs about (length / TOPO_BLOCK +
    TOPO_BLOCK) steps, not the length of the list (a thousand-node join
    storm holds a thousand unconfirmed joins, and each replica inserts every
    one of them). The position found is the one the single-pass scan of the
    module docstring gives.
    """

    def __init__(self, key_of: KeyOf) -> None:
        self._key_of = key_of
        self._blocks: list[list[bytes]] = []
        self._block_keys: list[list[SortKey]] = []  # parallel to _blocks
        self._block_max: list[SortKey] = []  # the largest key of each block
        self._block_of: dict[bytes, list[bytes]] = {}  # id -> the block holding it
        self._length = 0
        self._snapshot: Sequence[bytes] | None = ()  # None: changed since the last one
        # Blocks no snapshot holds, by id: changed in place. Any other is copied first.
        self._owned: set[int] = set()

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[bytes]:
        return chain.from_iterable(self._blocks)

    def snapshot(self) -> Sequence[bytes]:
        """The list as an immutable view (`TailView`), kept until the next change (the
        linearizer asks for it before and after each insertion)."""
        if self._snapshot is None:
            self._snapshot = TailView(tuple(self._blocks), self._length)
            self._owned.clear()  # the view holds every block now
        return self._snapshot

    def _own(self, b: int) -> list[bytes]:
        """Block `b`, copied first if a snapshot holds it."""
        block = self._blocks[b]
        if id(block) not in self._owned:
            block = list(block)
            self._blocks[b] = block
            block_of = self._block_of
            for node in block:
                block_of[node] = block
            self._owned.add(id(block))
        return block

    def insert(self, node: bytes, deps: Iterable[bytes]) -> int:
        """Insert a node none of the listed nodes depends on; return its position.

        `deps` are the node's dependencies that are in the list (confirmed ones
        are done and must be left out). The position is the shared-prefix length.
        """
        key = self._key_of(node)
        self._snapshot = None
        blocks, block_keys, block_max = self._blocks, self._block_keys, self._block_max
        # The first place the new node may go: right after its last dependency.
        b, i = 0, 0
        for dep in set(deps):
            block = self._block_of[dep]
            at = blocks.index(block) if blocks[b] is not block else b
            if at > b:
                b, i = at, block.index(dep) + 1
            elif at == b:
                i = max(i, block.index(dep) + 1)
        # Then the first later key that sorts after the new one, found in C within a
        # block, and only in blocks whose largest key does.
        count_blocks = len(blocks)
        while b < count_blocks:
            if key < block_max[b]:
                keys = block_keys[b]
                i = next(compress(count(i), map(key.__lt__, islice(keys, i, None))), len(keys))
                if i < len(keys):
                    break
            b, i = b + 1, 0
        if b == count_blocks:  # at the end
            if b and len(blocks[b - 1]) < 2 * TOPO_BLOCK:
                b -= 1
                i = len(blocks[b])
            else:
                blocks.append([])
                self._owned.add(id(blocks[-1]))
                block_keys.append([])
                block_max.append(key)
        position = sum(map(len, blocks[:b])) + i
        block, keys = self._own(b), block_keys[b]
        block.insert(i, node)
        keys.insert(i, key)
        if block_max[b] < key:
            block_max[b] = key
        self._block_of[node] = block
        self._length += 1
        if len(block) > 2 * TOPO_BLOCK:
            self._split(b)
        return position

    def _split(self, b: int) -> None:
        block, keys = self._own(b), self._block_keys[b]
        half = len(block) // 2
        tail, tail_keys = block[half:], keys[half:]
        self._owned.add(id(tail))
        del block[half:], keys[half:]
        self._blocks.insert(b + 1, tail)
        self._block_keys.insert(b + 1, tail_keys)
        self._block_max[b] = max(keys)
        self._block_max.insert(b + 1, max(tail_keys))
        block_of = self._block_of
        for node in tail:
            block_of[node] = tail

    def rebuild(self, ids: Collection[bytes], deps_of: DepsOf) -> None:
        """The list of `ids` in Kahn order, computed from scratch (the reference)."""
        self._set(kahn(ids, deps_of, self._key_of))

    def remove(self, gone: Set[bytes], deps_of: DepsOf, children_of: DepsOf) -> None:
        """Drop `gone` and reorder the rest as `kahn` over it would (module docstring).

        `gone` must be closed under dependencies within the list (a confirmed
        batch: an anchor's unconfirmed past). `deps_of` gives a remaining id's
        dependencies, `children_of` the listed ids depending on an id (gone or
        not; ids not in the list are ignored).
        """
        ids = list(chain.from_iterable(self._blocks))
        keep = list(map(not_, map(gone.__contains__, ids)))
        old = list(compress(ids, keep))
        keys = list(compress(chain.from_iterable(self._block_keys), keep))
        self._set(_reordered(old, keys, gone, deps_of, children_of))

    def _set(self, order: list[bytes]) -> None:
        key_of = self._key_of
        self._blocks = [order[at:at + TOPO_BLOCK] for at in range(0, len(order), TOPO_BLOCK)]
        self._block_keys = [[key_of(i) for i in block] for block in self._blocks]
        self._block_max = [max(keys) for keys in self._block_keys]
        self._block_of = {node: block for block in self._blocks for node in block}
        self._length = len(order)
        self._owned = {id(block) for block in self._blocks}
        self._snapshot = None


def _reordered(old: list[bytes], keys: list[SortKey], gone: Set[bytes], deps_of: DepsOf,
               children_of: DepsOf) -> list[bytes]:
    """`kahn` over `old` (the list with `gone` left out, in its old order; `keys`
    aligned), found from the old order (module docstring, "Confirmation").

    The old order is a *stream*: its next id not emitted yet is always
    available, and no available id that is not *watched* sorts before it.
    Watched ids are those whose place may have moved: the children of `gone`
    (freed), and the children of any id emitted ahead of the stream. A watched
    id is gated until its last dependency is emitted (the stream passing a
    position, or an id moved ahead), then it competes with the stream head in
    a heap. Runs of the stream between two events are copied by slices.
    """
    length = len(old)
    position = dict(zip(old, range(length)))
    out: list[bytes] = []
    ahead: set[bytes] = set()  # emitted before the stream reached them
    ahead_at: list[int] = []  # their positions not yet passed by the stream (a heap)
    ready: list[tuple[SortKey, bytes]] = []  # watched ids whose dependencies are emitted
    gates: list[tuple[int, bytes]] = []  # (stream position that frees it, watched id)

    def watch(node: bytes, at: int) -> None:
        """Gate `node` on its dependencies not emitted yet (the stream is at `at`)."""
        last = -1
        for dep in deps_of(node):
            where = position.get(dep)
            if where is not None and where >= at and dep not in ahead and where > last:
                last = where
        if last < 0:
            heapq.heappush(ready, (keys[position[node]], node))
        else:
            heapq.heappush(gates, (last + 1, node))

    for node in set(chain.from_iterable(map(children_of, gone))):
        if node in position:
            watch(node, 0)
    at = 0  # the stream: old[:at] is emitted (some of it ahead of the stream)
    while True:
        while ahead_at and ahead_at[0] == at:  # the head was emitted ahead: pass it
            heapq.heappop(ahead_at)
            at += 1
        if at >= length:
            return out
        while gates and gates[0][0] <= at:
            _, node = heapq.heappop(gates)
            if node not in ahead and position[node] >= at:
                watch(node, at)
        while ready and (ready[0][1] in ahead or position[ready[0][1]] < at):
            heapq.heappop(ready)  # emitted since it was found ready
        if ready and ready[0][0] < keys[at]:
            _, node = heapq.heappop(ready)
            out.append(node)
            ahead.add(node)
            heapq.heappush(ahead_at, position[node])
            for child in children_of(node):
                if child in position and child not in ahead and position[child] >= at:
                    watch(child, at)
            continue
        # Copy the stream up to the next gate, or to the first key after the ready
        # one's (found in C), leaving out the ids already emitted ahead.
        stop = gates[0][0] if gates else length
        if ready:
            first = ready[0][0]
            stop = next(compress(count(at), map(first.__lt__, islice(keys, at, stop))), stop)
        stop = max(stop, at + 1)
        while ahead_at and ahead_at[0] < stop:
            skip = heapq.heappop(ahead_at)
            out.extend(old[at:skip])
            at = skip + 1
        if at < stop:
            out.extend(old[at:stop])
            at = stop
