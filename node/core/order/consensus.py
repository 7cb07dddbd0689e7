"""Consensus: which nodes are confirmed, and in which order.

Theory of operation
-------------------
The design document's words: a *vote* is a reference by an indexer, a
*quorum* is a majority of the indexers (q of n), and a quorum has a *degree*
that rises each time a majority references it. Here those become rounds,
anchors and votes, all computed from the DAG alone (no messages of their own).

Rounds are degrees of quorum. Every indexer node X gets

    round(X) = 0   if X's strict past holds nodes of fewer than q indexers,
             = 1 + the largest r such that X's strict past holds
                   nodes of round >= r from q indexers.

A round r+1 node has seen a quorum of round r nodes, each of which saw a
quorum of round r-1 nodes, and so on. Rounds never decrease along a path.

Anchors. Each even round r has a leader (the indexers in key order take
turns); the leader's first node of round r, if it has one, is the anchor A_r.
The anchor's past is what gets confirmed when it commits, in Kahn order
(smallest (writer, seq) first): non-indexer nodes are ordered as dependencies
of indexer nodes.

Votes and commit. Indexer k votes for A_r if its first node that has seen A_r
comes no later than its first node of round r+1: then *every* node of k of
round >= r+1 has seen A_r. A_r is committed once q indexers voted for it.

Ordering. Take the highest committed anchor A_t above the last round
committed; walk down t-2, t-4, ...: an anchor the current one has seen is
kept and becomes the current one. Then, oldest first, each kept anchor
appends its not-yet-confirmed past.

Why correct replicas agree (the double-quorum rule with its caveat, made
concrete). Suppose A_r is committed somewhere. Any indexer node Z of round
>= r+2 has in its strict past round >= r+1 nodes of a quorum; that quorum
meets the quorum of voters in some indexer k, and k's nodes of round >= r+1
have seen A_r, so Z has seen A_r. Every anchor two degrees up references the
quorum over A_r, so a walk from any later anchor keeps A_r and continues
below it exactly as a walk from A_r does. Hence two replicas that committed
A_s and A_t (s <= t) order the same chain of anchors up to A_s, and so the
same nodes in the same order: confirmed prefixes are prefixes of each other.
That is why anchors are two rounds apart: a vote may be cast in round r+1,
and only round r+2 is sure to see a quorum of round r+1. An indexer change
starts a new epoch at the same point of the confirmed order everywhere, so
the argument holds epoch by epoch.

The design document's "Consistent Ordering" example, writers a < b < c:

    a0  b0        rounds: a0 b0 c0 = 0; a1 c1 b1 = 1. A_0 = a0 (leader a).
    |   |         votes for a0: a (a0 itself), c (c0). b0 never saw a0.
    c0  |         So a0 is committed at c0, by a in its view {a0, c0, a1}
    | \\ |         and by b and c in theirs {a0, b0, c0, c1, b1}:
    a1  c1        both order a0 before b0, and whatever b and c confirm
        |         later (c1 and below) comes after a0.
        b1

Liveness: once every indexer keeps appending nodes that reference all heads
(acknowledgements), rounds advance by one per exchange, every even round has
its leader's anchor and the next round votes for it; a crashed minority
only skips the rounds it leads.

Forks (equivocation). A writer with two nodes at one seq is forked from that
seq on (`CausalIndex.forks`). A forked indexer's nodes at or above the fork
seq neither vote nor serve as anchors; its earlier nodes, shared by both
branches, still do; its nodes still count for rounds (a round is a property
of a node's past, whatever the branch). Both branches are ordered like any
nodes, siblings by id. Replicas that know of the fork all apply this rule
identically. A replica that has received one branch only cannot tell, and
can count a vote the others do not: with majority quorums two quorums may
share only the equivocator, and no protocol can avoid that in an
asynchronous network (it needs n >= 3f + 1). The guarantee therefore
assumes that a replica learns of a fork no later than it receives the
forked nodes that vote: the graph layer hands both siblings of a flagged
event to one `Linearizer.extend` call. A sibling forged long after the
original was used cannot meet that assumption; such a writer should lose
its role.

`quorum_degree` computes the design document's degree of quorum over one
node, as seen from another; it explains rounds and backs the document's
examples in the tests, but confirmation uses rounds, anchors and votes only.
"""

from __future__ import annotations

from .clock import CausalIndex
from .values import OrderNode

ANCHOR_SPACING = 2  # rounds between anchors: a vote may come one round late
NO_ROUND = -1  # round of a node outside this epoch or not by an indexer
MAX_DEGREE = 64  # quorum_degree stops here (one indexer alone would climb forever)


def quorum_size(indexer_count: int) -> int:
    return indexer_count // 2 + 1


class Consensus:
    """Rounds, anchors and votes for one epoch: a fixed indexer set.

    An epoch begins with the nodes already confirmed as its base: they get no
    round and play no part, so a new epoch starts again from round 0.
    """

    def __init__(self, index: CausalIndex, indexers: frozenset[bytes]) -> None:
        self.indexers = indexers
        self.quorum = quorum_size(len(indexers))
        self.committed_round = -ANCHOR_SPACING
        self._index = index
        self._by_key = sorted(indexers)
        self._round: dict[bytes, int] = {}
        self._top = NO_ROUND
        self._forks: dict[bytes, int] = {}  # fork seqs the caches were computed with
        self._anchors: dict[int, bytes | None] = {}  # settled anchor lookups
        self._voters: dict[bytes, set[bytes]] = {}  # anchor -> indexers who voted

    def add(self, node: OrderNode) -> None:
        if node.writer not in self.indexers:
            return
        fork = self._index.forks.get(node.writer)
        if fork != self._forks.get(node.writer):
            # A newly seen fork voids anchors and votes at or above it.
            self._forks[node.writer] = fork
            self._anchors.clear()
            self._voters.clear()
        self._round[node.id] = self._compute_round(node)
        self._top = max(self._top, self._round[node.id])

    def round_of(self, node_id: bytes) -> int:
        return self._round.get(node_id, NO_ROUND)

    def _compute_round(self, node: OrderNode) -> int:
        index = self._index
        own_lane = index.lane_of(node.id)
        tops: list[int] = []
        for indexer in self.indexers:
            top = NO_ROUND
            for lane in index.lanes_of(indexer):
                seq = index.latest(node.id, lane) - (1 if lane == own_lane else 0)
                if seq >= index.lanes[lane].start:
                    top = max(top, self.round_of(index.node_at(lane, seq)))
            if top != NO_ROUND:
                tops.append(top)
        if len(tops) < self.quorum:
            return 0
        tops.sort(reverse=True)
        return tops[self.quorum - 1] + 1

    def _voting_lane(self, indexer: bytes) -> tuple[int, int] | None:
        """The lane whose nodes vote for `indexer`, and the seq where voting stops."""
        lanes = self._index.lanes_of(indexer)
        if not lanes:
            return None
        main = self._index.lanes[lanes[0]]
        return lanes[0], min(main.end, self._index.forks.get(indexer, main.end))

    def leader(self, round_: int) -> bytes | None:
        if not self._by_key:
            return None
        return self._by_key[(round_ // ANCHOR_SPACING) % len(self._by_key)]

    def anchor(self, round_: int) -> bytes | None:
        if round_ in self._anchors:
            return self._anchors[round_]
        leader = self.leader(round_)
        voting = self._voting_lane(leader) if leader is not None else None
        if voting is None:
            return None
        lane, stop = voting
        start = self._index.lanes[lane].start
        seq = self._index.first_where(lane, start, stop, lambda n: self.round_of(n) >= round_)
        if seq is None:
            return None  # the leader has not reached this round (yet)
        node = self._index.node_at(lane, seq)
        found = node if self.round_of(node) == round_ else None
        self._anchors[round_] = found
        return found

    def _votes_for(self, indexer: bytes, anchor: bytes, round_: int) -> bool:
        voting = self._voting_lane(indexer)
        if voting is None:
            return False
        lane, stop = voting
        start = self._index.lanes[lane].start
        seq = self._index.first_where(lane, start, stop, lambda n: self._index.sees(n, anchor))
        if seq is None:
            return False
        return seq == start or self.round_of(self._index.node_at(lane, seq - 1)) <= round_

    def is_committed(self, anchor: bytes, round_: int) -> bool:
        voters = self._voters.setdefault(anchor, set())
        for indexer in self._by_key:
            if len(voters) >= self.quorum:
                break
            if indexer not in voters and self._votes_for(indexer, anchor, round_):
                voters.add(indexer)
        return len(voters) >= self.quorum

    def next_commit(self) -> list[tuple[int, bytes]]:
        """The anchors to order next, oldest first, as (round, anchor id); [] if none."""
        top = self._top - self._top % ANCHOR_SPACING
        for round_ in range(top, self.committed_round, -ANCHOR_SPACING):
            anchor = self.anchor(round_)
            if anchor is not None and self.is_committed(anchor, round_):
                return self._walk_down(round_, anchor)
        return []

    def _walk_down(self, top: int, anchor: bytes) -> list[tuple[int, bytes]]:
        chain = [(top, anchor)]
        for round_ in range(top - ANCHOR_SPACING, self.committed_round, -ANCHOR_SPACING):
            earlier = self.anchor(round_)
            if earlier is not None and self._index.sees(chain[-1][1], earlier):
                chain.append((round_, earlier))
        chain.reverse()
        return chain


def quorum_degree(index: CausalIndex, indexers: frozenset[bytes], target: bytes, at: bytes) -> int:
    """The degree of the quorum over `target` that node `at` has seen.

    -1: `at` has not seen target; 0: seen, no quorum; 1: a majority of indexers
    have referenced target (a quorum); 2: a majority have referenced a quorum
    (a double quorum); and so on, as in the design document. A node counts its
    own writer's vote. Recursive over the indexers' latest nodes: meant for
    analysis and tests on small graphs, not for the hot path.
    """
    quorum = quorum_size(len(indexers))
    memo: dict[bytes, int] = {}

    def degree(node: bytes) -> int:
        if node in memo:
            return memo[node]
        if not index.sees(node, target):
            memo[node] = -1
            return -1
        writer = index.lanes[index.lane_of(node)].writer
        others: list[int] = []
        for indexer in indexers - {writer}:
            best = -1
            for lane in index.lanes_of(indexer):
                seq = index.latest(node, lane)
                if seq >= index.lanes[lane].start:
                    best = max(best, degree(index.node_at(lane, seq)))
            others.append(best)
        level = 0
        while level < MAX_DEGREE:
            count = sum(1 for d in others if d >= level) + (1 if writer in indexers else 0)
            if count < quorum:
                break
            level += 1
        memo[node] = level
        return level

    return degree(at)
