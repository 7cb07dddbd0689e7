"""Causal clocks: "has node y seen node x?" in O(1), derived locally.

Theory of operation
-------------------
Every writer's nodes form a chain: node `seq` has the writer's node `seq - 1`
among its ancestors. So what y has seen of writer w is a *prefix* of w's
chain, and one number describes it: the highest seq of w in y's past. A
node's clock maps each writer to that number; it is the element-wise max of
its dependencies' clocks, plus its own (writer, seq). Then

    y has seen x   <=>   clock(y)[x.writer] >= x.seq

Nothing is taken from the wire: the clock of a node is a pure function of
its past, so every replica computes the same answer.

      a0 ── a1 ──────────── a2        clock(a2) = {a: 2, b: 1}
              \\            /          a2 has seen b0, b1 and a0, a1;
      b0 ─────── b1 ───────            b1 has not seen a2.

The clock keeps one entry per writer, not only per indexer: the linearizer
asks whether an indexer's node has seen *any* node (a non-indexer's as well)
and the chain argument above is what makes that a lookup.

Forks. An equivocating writer signs two nodes with one seq; then its nodes no
longer form one chain and a single number per writer would say y has seen a
node it has only a sibling of. The index therefore counts in *lanes*: a lane
is a chain of one writer's nodes, each seeing the previous one. An honest
writer has exactly one lane (its "main lane", numbered like a writer); a
node that cannot extend a lane unambiguously (a second node at an occupied
seq, or a node merging two of its writer's branches) opens a new lane. The
equivalence above holds per lane, so answers stay exact for forked writers.
Which sibling lands in the main lane, and whether `forks` knows of a fork
at all, depends on arrival order; callers that need replica-independent
answers ask `sees_fork` (is a fork in this node's past?) instead.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from .paged import PAGE_MASK, PAGE_SHIFT, PagedList
from .values import OrderError, OrderNode

UNSEEN = -1  # clock value for a lane of which nothing has been seen


# Where a node sits, packed in one int (lane * _LANE_STRIDE + seq): one dict
# entry and one int per node instead of two of each (issue 17: flat memory).
_LANE_STRIDE = 1 << 48
LANE_STRIDE = _LANE_STRIDE  # for directories that store the packed position

# Positions and ids kept in memory when a directory holds them all: two
# generations of this many entries each (the newest nodes are what new nodes
# reference; older ones are read back from the directory).
WHERE_CACHE_SIZE = 1 << 15


class NodeDirectory(Protocol):
    """Where every node added to a `CausalIndex` sits, kept outside memory.

    A replica's directory is its store (node.replica.order_records): the
    index then keeps only a bounded cache of positions and ids (issue 17:
    flat memory). `record` is called for every node in add order, with its
    add ordinal, so a directory that already holds the first n (a restart
    replaying the same nodes) can skip them. Answers must be what was
    recorded: the index checks that a position it reads back is one of its
    lanes' occupied slots.
    """

    def locate(self, node_id: bytes) -> int | None:
        """The packed position (lane * LANE_STRIDE + seq) recorded for `node_id`."""
        ...

    def node_at(self, lane: int, seq: int) -> bytes:
        """The id recorded at (lane, seq)."""
        ...

    def record(self, ordinal: int, node_id: bytes, lane: int, seq: int) -> None:
        ...

@dataclass(slots=True)
class Lane:
    """A chain of one writer's nodes; `ids[i]` has seq `start + i`.

    `clocks[i]` is node i's clock without its own lane (whose entry is its
    seq): a node that saw nothing new of other lanes shares its predecessor's
    dict object, so a writer's plain chain costs one list slot per node.
    Stored clocks are never mutated.
    """

    writer: bytes
    start: int
    ids: list[bytes]  # empty when the index has a directory (then `length` counts)
    clocks: PagedList[dict[int, int]]  # paged: one slot per node, never reallocated
    length: int = field(default=0)

    @property
    def end(self) -> int:
        return self.start + self.length


class CausalIndex:
    """Lanes and clocks for every node added, in causal order.

    Without a directory every node's position and id stay in memory. With
    one (`NodeDirectory`), they are recorded there and only the newest
    `cache_size` to 2 * `cache_size` stay in memory; per node the index then
    keeps one clock slot in its lane.
    """

    def __init__(self, directory: NodeDirectory | None = None,
                 cache_size: int | None = None) -> None:
        self.lanes: list[Lane] = []
        self.forks: dict[bytes, int] = {}  # writer -> lowest seq holding two nodes
        self.size = 0  # nodes added
        self._lanes_of: dict[bytes, list[int]] = {}
        self._where: dict[bytes, int] = {}  # id -> lane * _LANE_STRIDE + seq (young generation)
        self._directory = directory
        self._cache_size = WHERE_CACHE_SIZE if cache_size is None else cache_size
        self._old_where: dict[bytes, int] = {}
        self._ids: dict[int, bytes] = {}  # packed position -> id (with a directory)
        self._old_ids: dict[int, bytes] = {}

    def resize_cache(self, cache_size: int) -> None:
        """Keep the newest `cache_size` to 2 * `cache_size` positions (with a directory)."""
        self._cache_size = cache_size
        if self._directory is None:
            return  # every position is only here
        if len(self._where) > cache_size:
            self._old_where, self._where = self._where, {}
        if len(self._ids) > cache_size:
            self._old_ids, self._ids = self._ids, {}
        # Dicts keep insertion order: the newest entries are the last ones.
        if len(self._old_where) > cache_size:
            self._old_where = dict(list(self._old_where.items())[-cache_size:])
        if len(self._old_ids) > cache_size:
            self._old_ids = dict(list(self._old_ids.items())[-cache_size:])

    def __contains__(self, node_id: bytes) -> bool:
        return node_id in self._where or self._locate(node_id) is not None

    def _locate(self, node_id: bytes) -> int | None:
        """A node's packed position past the young cache: old cache, then directory."""
        if self._directory is None:
            return None
        at = self._old_where.get(node_id)
        if at is None:
            at = self._directory.locate(node_id)
            if at is None:
                return None
            lane, seq = divmod(at, _LANE_STRIDE)
            # Recorded by an earlier run past what this index holds yet (a replay):
            # not in the index until it is added again.
            if lane >= len(self.lanes) or not self.lanes[lane].start <= seq < self.lanes[lane].end:
                return None
        self._remember(node_id, at)
        return at

    def _at(self, node_id: bytes) -> int:
        at = self._where.get(node_id)
        if at is None:
            at = self._locate(node_id)
            if at is None:
                raise KeyError(node_id)
        return at

    def _remember(self, node_id: bytes, at: int) -> None:
        where = self._where
        where[node_id] = at
        if self._directory is not None and len(where) > self._cache_size:
            self._old_where = where
            self._where = {}

    def where(self, node_id: bytes) -> tuple[int, int]:
        """(lane, seq) of a node added here."""
        return divmod(self._at(node_id), _LANE_STRIDE)

    def add(self, node: OrderNode) -> None:
        clock: dict[int, int] = {}
        where = self._where
        lanes = self.lanes
        for dep in node.deps:
            at = where.get(dep)
            if at is None:
                at = self._locate(dep)
                if at is None:
                    raise OrderError(f"node {node.id.hex()} references unknown {dep.hex()}")
            dep_lane, dep_seq = divmod(at, _LANE_STRIDE)
            chain = lanes[dep_lane]
            i = dep_seq - chain.start
            for lane, seq in chain.clocks.pages[i >> PAGE_SHIFT][i & PAGE_MASK].items():
                if clock.get(lane, UNSEEN) < seq:
                    clock[lane] = seq
            if clock.get(dep_lane, UNSEEN) < dep_seq:
                clock[dep_lane] = dep_seq
        lane = self._place(node, clock)
        clock.pop(lane, None)  # its own lane's entry is its seq
        clocks = lanes[lane].clocks
        previous = clocks.last()
        clocks.append(previous if previous == clock else clock)  # type: ignore[arg-type]
        at = lane * _LANE_STRIDE + node.seq
        directory = self._directory
        if directory is not None:
            directory.record(self.size, node.id, lane, node.seq)
            self._ids[at] = node.id
            if len(self._ids) > self._cache_size:
                self._old_ids = self._ids
                self._ids = {}
        self.size += 1
        self._remember(node.id, at)

    def _place(self, node: OrderNode, clock: dict[int, int]) -> int:
        mine = self._lanes_of.setdefault(node.writer, [])
        lanes = [self.lanes[i] for i in mine]
        previous = node.seq - 1
        # Each writer is a chain: its previous node must be an ancestor.
        if node.seq > 0 and not any(
            lane.start <= previous <= clock.get(i, UNSEEN) for i, lane in zip(mine, lanes)
        ):
            raise OrderError(f"node {node.id.hex()}: seq {node.seq} without seq {previous} in its past")
        if any(lane.start <= node.seq < lane.end for lane in lanes):
            self.forks[node.writer] = min(self.forks.get(node.writer, node.seq), node.seq)
        extendable = [
            i for i, lane in zip(mine, lanes) if lane.end == node.seq and clock.get(i, UNSEEN) == previous
        ]
        keep_ids = self._directory is None
        if len(extendable) == 1:
            chain = self.lanes[extendable[0]]
            chain.length += 1
            if keep_ids:
                chain.ids.append(node.id)
            return extendable[0]
        self.lanes.append(Lane(node.writer, node.seq, [node.id] if keep_ids else [], PagedList(), 1))
        mine.append(len(self.lanes) - 1)
        return len(self.lanes) - 1

    def sees(self, y: bytes, x: bytes) -> bool:
        """True if x is y or an ancestor of y."""
        x_lane, x_seq = divmod(self._at(x), _LANE_STRIDE)
        return self.latest(y, x_lane) >= x_seq

    def sees_fork(self, y: bytes, writer: bytes, upto: int) -> bool:
        """True if y's past (y included) holds two nodes of `writer` with one seq <= `upto`.

        A function of y's past alone, unlike `forks` (what this replica has
        received): every replica answers alike. Lanes are disjoint, so two
        lanes whose seen seq ranges overlap hold two nodes at one seq.
        """
        fork = self.forks.get(writer)
        if fork is None or fork > upto:
            return False
        spans = []
        for lane in self._lanes_of.get(writer, ()):
            start = self.lanes[lane].start
            top = min(self.latest(y, lane), upto)
            if top >= start:
                spans.append((start, top))
        spans.sort()
        reach = UNSEEN
        for start, top in spans:
            if start <= reach:
                return True
            reach = max(reach, top)
        return False

    def seq_of(self, node_id: bytes) -> int:
        return self._at(node_id) % _LANE_STRIDE

    def lanes_of(self, writer: bytes) -> list[int]:
        return self._lanes_of.get(writer, [])

    def lane_of(self, node_id: bytes) -> int:
        return self._at(node_id) // _LANE_STRIDE

    def latest(self, y: bytes, lane: int) -> int:
        """Highest seq of `lane` in y's past (y included), or UNSEEN."""
        return self.latest_at(*divmod(self._at(y), _LANE_STRIDE), lane)

    def latest_at(self, y_lane: int, y_seq: int, lane: int) -> int:
        """`latest` for the node at (y_lane, y_seq), without reading its id."""
        if y_lane == lane:
            return y_seq
        chain = self.lanes[y_lane]
        i = y_seq - chain.start
        return chain.clocks.pages[i >> PAGE_SHIFT][i & PAGE_MASK].get(lane, UNSEEN)

    def node_at(self, lane: int, seq: int) -> bytes:
        chain = self.lanes[lane]
        if self._directory is None:
            return chain.ids[seq - chain.start]
        if not chain.start <= seq < chain.end:
            raise IndexError(f"lane {lane} holds no seq {seq}")
        at = lane * _LANE_STRIDE + seq
        node_id = self._ids.get(at) or self._old_ids.get(at)
        if node_id is None:
            node_id = self._directory.node_at(lane, seq)
        return node_id

    def first_where(self, lane: int, lo: int, hi: int, test: Callable[[int], bool]) -> int | None:
        """Lowest seq in [lo, hi) of `lane` that passes `test` (given the seq), for a
        test that, once true along the chain, stays true (seeing a node, reaching
        a round). It tests positions, so old nodes' ids are never read."""
        found = bisect_left(range(lo, hi), True, key=test)
        return lo + found if lo + found < hi else None
