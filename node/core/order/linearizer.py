"""The linearizer: one topic's total order, a confirmed prefix and a tentative tail.

Theory of operation
-------------------
Feed it nodes in causal order (dependencies first); each `add` returns an
`OrderUpdate`. The full order is `confirmed + tentative`:

* confirmed: append-only. A node joins it when an anchor whose past holds it
  commits (`consensus`); every correct replica confirms the same sequence,
  whatever order it received the nodes in.
* tentative: every other node, in the deterministic Kahn order (`topolist`).
  It may reorder as nodes arrive; `rewind_to` says how much of the previous
  full order survived.

    writers a (indexer), x (non-indexer):

    x0 ── x1 ── a0        add x0 -> confirmed [],           tentative [x0]
                          add x1 -> confirmed [],           tentative [x0, x1]
                          add a0 -> confirmed [x0, x1, a0], tentative []

Relayed writers' nodes (`add(node, relayed=True)`) are kept aside: they are
never heads and never ordered until a non-relayed node references them; then
they enter the graph just before it (with their own relayed ancestors). A
relayed node nobody references stays aside forever. A batch that mixes
relayed and other nodes passes the relayed ids as a set:
`extend(nodes, relayed={...})`.

Indexer changes take effect between decisions. `set_indexers` switches at
once; to switch at the same point of the confirmed order on every replica,
pass `role_change`: it is asked about each newly confirmed node, and a
non-None answer becomes the indexer set right after the batch holding that
node (the rest of the anchors found in the same step are dropped and
searched again under the new set). Either way a new epoch begins:
rounds restart from the confirmed prefix (see `consensus`). `role_change` is
asked after the batch has joined the confirmed prefix, so `last_confirmed` is
the batch's anchor while it is asked (the anchor has the whole batch in its
past: a caller that reads "the state at the newest confirmed node" answers
for that node only).

Sans-IO and deterministic: no clock, no randomness, no I/O; two linearizers
fed the same nodes in any causal order hold the same confirmed sequence
(prefixes of each other while they differ in what they have seen).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence

from .clock import LANE_STRIDE, CausalIndex, NodeDirectory
from .consensus import Consensus, quorum_degree
from .paged import PagedInts
from .topolist import TopoList, kahn
from .values import OrderError, OrderNode, OrderUpdate, SortKey, sort_key

RoleChange = Callable[[OrderNode], "frozenset[bytes] | None"]


class Linearizer:
    def __init__(self, indexers: frozenset[bytes], role_change: RoleChange | None = None,
                 directory: NodeDirectory | None = None, cache_size: int | None = None) -> None:
        # With a directory (a replica's store) the index keeps positions and ids
        # of old nodes there, behind a bounded cache (`clock.NodeDirectory`).
        self._index = CausalIndex(directory, cache_size)
        # The unconfirmed nodes and their sort keys: a node leaves both when it is
        # confirmed (only the causal index keeps it), so they hold the tentative
        # tail, not the history (issue 17: flat memory).
        self._nodes: dict[bytes, OrderNode] = {}
        self._keys: dict[bytes, SortKey] = {}
        self._aside: dict[bytes, OrderNode] = {}  # relayed, not referenced yet
        # Unconfirmed node -> the unconfirmed nodes depending on it: what a
        # confirmation frees, so the tail is reordered from its old order
        # (`TopoList.remove`) instead of rebuilt.
        self._children: dict[bytes, list[bytes]] = {}
        # The confirmed prefix as packed (lane, seq) positions, 8 bytes a node:
        # ids are read back through the index (which may keep them on disk).
        self._confirmed = PagedInts()
        self._last_confirmed: bytes | None = None
        # The confirmed nodes of a lane are a prefix of it (a confirmed node's
        # past is confirmed, and each lane node sees the one before): lane -> end
        # of that prefix, instead of a set of every confirmed id.
        self._confirmed_end: dict[int, int] = {}
        self._tentative = TopoList(self._keys.__getitem__)
        self._role_change = role_change
        self._consensus = Consensus(self._index, frozenset(indexers))

    # -- reading -------------------------------------------------------------

    def resize_cache(self, cache_size: int) -> None:
        """Resize the causal index's position cache (`CausalIndex.resize_cache`)."""
        self._index.resize_cache(cache_size)

    @property
    def confirmed(self) -> tuple[bytes, ...]:
        """The whole confirmed prefix (O(n): reads every id; see `confirmed_length`)."""
        node_at = self._index.node_at
        return tuple(node_at(*divmod(at, LANE_STRIDE)) for at in self._confirmed)

    @property
    def tentative(self) -> Sequence[bytes]:
        """The unconfirmed nodes in order: an immutable view (`topolist.TailView`)."""
        return self._tentative.snapshot()

    @property
    def indexers(self) -> frozenset[bytes]:
        return self._consensus.indexers

    def __contains__(self, node_id: bytes) -> bool:
        """True for nodes in the order (relayed nodes still aside are not)."""
        return node_id in self._index

    def is_confirmed(self, node_id: bytes) -> bool:
        if node_id not in self._index:
            return False
        lane, seq = self._index.where(node_id)
        return seq < self._confirmed_end.get(lane, 0)

    @property
    def confirmed_length(self) -> int:
        return len(self._confirmed)

    @property
    def last_confirmed(self) -> bytes | None:
        """The newest confirmed node (O(1)), None before the first confirmation."""
        return self._last_confirmed

    @property
    def forks(self) -> dict[bytes, int]:
        """Forked writers: writer -> lowest seq holding two nodes (a copy)."""
        return dict(self._index.forks)

    def is_aside(self, node_id: bytes) -> bool:
        """True for a relayed node nobody has referenced yet."""
        return node_id in self._aside

    def sees(self, y: bytes, x: bytes) -> bool:
        """True if x is y or an ancestor of y; both must be in the order (O(1))."""
        return self._index.sees(y, x)

    def latest_seen(self, node_id: bytes, writer: bytes) -> int:
        """Highest seq of `writer` among `node_id` and its ancestors (-1: none).

        `node_id` must be in the order. Over every lane of the writer, so a
        forked writer's branches count too.
        """
        index = self._index
        best = -1
        for lane in index.lanes_of(writer):
            best = max(best, index.latest(node_id, lane))
        return best

    def round_of(self, node_id: bytes) -> int:
        """The node's round in the current epoch (-1 for non-indexers and older nodes)."""
        return self._consensus.round_of(node_id)

    def leader(self, round_: int) -> bytes | None:
        """The indexer whose node anchors even round `round_` (current epoch)."""
        return self._consensus.leader(round_)

    def quorum_degree(self, target: bytes, at: bytes) -> int:
        """The design document's degree of the quorum over `target` as seen from `at`."""
        return quorum_degree(self._index, self.indexers, target, at)

    # -- writing -------------------------------------------------------------

    def add(self, node: OrderNode, relayed: bool = False) -> OrderUpdate:
        """Add one node (its dependencies were added before); see `extend`."""
        return self.extend((node,), relayed)

    def extend(self, nodes: Iterable[OrderNode],
               relayed: bool | Collection[bytes] = False) -> OrderUpdate:
        """Add nodes in causal order, then decide once.

        Nodes that arrive together (a cascade released by one event, the two
        siblings of an equivocation) should come in one call: no decision is
        taken on part of them. `relayed` is True (all are relayed), False
        (none), or the ids of the relayed ones. A known id is a no-op. On a
        bad node, `OrderError` is raised after the nodes before it were added
        and decided; its `update` attribute reports them.
        """
        before = self.tentative
        rewind = len(before)
        try:
            for node in nodes:
                flag = relayed if isinstance(relayed, bool) else node.id in relayed
                rewind = min(rewind, self._accept(node, flag))
        except OrderError as error:
            error.update = self._settle(before, rewind)
            raise
        return self._settle(before, rewind)

    def _accept(self, node: OrderNode, relayed: bool) -> int:
        """Take one node in; return the tentative position from which it changed things."""
        unchanged = len(self._tentative)
        known = self._nodes.get(node.id) or self._aside.get(node.id)
        if known is not None:
            if known != node:
                raise OrderError(f"id {node.id.hex()} reused for a different node")
            return unchanged
        if node.id in self._index:  # confirmed: its node is no longer kept to compare
            return unchanged
        index = self._index
        missing = [dep for dep in node.deps if dep not in index and dep not in self._aside]
        if missing:
            raise OrderError(f"node {node.id.hex()} before its dependency {missing[0].hex()}")
        if relayed:
            self._aside[node.id] = node
            return unchanged
        entering = self._with_relayed_ancestors(node)
        return min(self._insert(n) for n in entering)

    def set_indexers(self, indexers: frozenset[bytes]) -> OrderUpdate:
        """Switch the indexer set now; the next decision uses it."""
        before = self.tentative
        self._new_epoch(frozenset(indexers))
        return self._settle(before, len(before))

    # -- internals -----------------------------------------------------------

    def _with_relayed_ancestors(self, node: OrderNode) -> list[OrderNode]:
        """`node` preceded by the relayed nodes it brings in, dependencies first."""
        if not self._aside:
            return [node]
        entering: list[OrderNode] = []
        stack: list[tuple[OrderNode, bool]] = [(node, False)]
        while stack:
            current, expanded = stack.pop()
            if expanded:
                entering.append(current)
                continue
            stack.append((current, True))
            for dep in current.deps:
                relayed = self._aside.pop(dep, None)
                if relayed is not None:
                    stack.append((relayed, False))
        return entering

    def _insert(self, node: OrderNode) -> int:
        self._index.add(node)  # validates the node before anything records it
        self._nodes[node.id] = node
        self._keys[node.id] = sort_key(node)
        self._consensus.add(node)
        is_confirmed = self.is_confirmed
        open_deps = [dep for dep in node.deps if not is_confirmed(dep)]
        children = self._children
        for dep in open_deps:
            children[dep].append(node.id)
        children[node.id] = []
        return self._tentative.insert(node.id, open_deps)

    def _settle(self, before: Sequence[bytes], rewind: int) -> OrderUpdate:
        """Confirm whatever committed anchors allow; report the change."""
        confirmed_before = len(self._confirmed)
        appended_ids: list[bytes] = []
        while self._confirm_next(appended_ids):
            pass
        appended = tuple(appended_ids)
        if appended:
            self._tentative.remove(set(appended), self._deps_of, self._children_of)
            for node_id in appended:
                del self._children[node_id]
            rewind = common_prefix(before, appended + self.tentative)
        # Without a confirmation `rewind` is exact: the tail before the first
        # insertion is untouched, and what sits there now is a new node.
        return OrderUpdate(appended, self.tentative, confirmed_before + rewind,
                           previous=before, shared=rewind)

    def _confirm_next(self, appended: list[bytes]) -> bool:
        chain = self._consensus.next_commit()
        for round_, anchor in chain:
            batch = kahn(self._unconfirmed_past(anchor), self._deps_of, self._keys.__getitem__)
            appended.extend(batch)
            where = self._index.where
            self._confirmed.extend(lane * LANE_STRIDE + seq for lane, seq in map(where, batch))
            self._last_confirmed = batch[-1]
            self._consensus.committed_round = round_
            change = self._role_change_in(batch)
            self._forget(batch)
            if change is not None:
                self._new_epoch(change)
                break
        return bool(chain)

    def _forget(self, batch: list[bytes]) -> None:
        """Mark `batch` confirmed and drop what only unconfirmed nodes need."""
        ends = self._confirmed_end
        where = self._index.where
        for node_id in batch:
            lane, seq = where(node_id)
            if seq >= ends.get(lane, 0):
                ends[lane] = seq + 1
            del self._nodes[node_id]
            del self._keys[node_id]

    def _role_change_in(self, batch: list[bytes]) -> frozenset[bytes] | None:
        change = None
        if self._role_change is not None:
            for node_id in batch:
                answer = self._role_change(self._nodes[node_id])
                if answer is not None:
                    change = frozenset(answer)  # the last change in the batch wins
        return change

    def _new_epoch(self, indexers: frozenset[bytes]) -> None:
        self._consensus = Consensus(self._index, indexers)
        for node_id in self._tentative:  # a topological order of the unconfirmed nodes
            if node_id in self._nodes:
                self._consensus.add(self._nodes[node_id])

    def _unconfirmed_past(self, anchor: bytes) -> set[bytes]:
        past = {anchor}
        stack = [anchor]
        while stack:
            for dep in self._nodes[stack.pop()].deps:
                if dep not in past and dep in self._nodes:
                    past.add(dep)
                    stack.append(dep)
        return past

    def _deps_of(self, node_id: bytes) -> tuple[bytes, ...]:
        return self._nodes[node_id].deps

    def _children_of(self, node_id: bytes) -> list[bytes]:
        return self._children[node_id]


def common_prefix(a: Sequence[bytes], b: Sequence[bytes]) -> int:
    """Length of the longest common prefix of two tuples (or two lists: slices compare
    by type), by slice comparisons (C speed, logarithmic steps): after each
    confirmation it spans the whole tail, a thousand ids at 1000 nodes. The order's
    ban check (node.replica.order_bans) and view (node.replica.ordering) use it too."""
    low, high = 0, min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    while low < high:  # the prefix is at least low and at most high long
        middle = (low + high + 1) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low
