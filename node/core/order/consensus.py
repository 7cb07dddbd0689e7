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
turns); the leader's first node of round r, if it has one, is the anchor A_r
(a *candidate*: a forked leader may have one per branch, see "Forks").
The anchor's past is what gets confirmed when it commits, in Kahn order
(smallest (writer, seq) first): non-indexer nodes are ordered as dependencies
of indexer nodes.

Votes and commit. Indexer k votes for A_r if its first node that has seen A_r
comes no later than its first node of round r+1: then *every* node of k of
round >= r+1 has seen A_r. A_r is committed once q indexers voted for it.
(docs/ordering.md maps these words onto the design's double-quorum rule.)

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

Forks (equivocation). A writer with two nodes at one seq is forked. Every
rule about forks is a fact of some node's past, never of which siblings this
replica has received, so replicas that hold one sibling and replicas that
hold both decide alike:

* a *candidate* anchor of round r is a leader node of round r whose past
  shows no fork of the leader and no earlier leader node of round r (an
  honest leader has one candidate per round; a forked one may have one per
  branch);
* a vote for candidate X is an indexer's first node on a branch that has
  seen X, before that branch passed round r, and whose past shows no fork
  of X's writer up to X's seq (`CausalIndex.sees_fork`). A node that has
  seen two candidates of one round has seen the leader's fork, so an honest
  indexer votes for one candidate per round at most; a forked indexer's
  branches vote each on their own;
* rounds count every node (a round is a property of a node's past);
* the walk down keeps the candidate the current anchor has seen. If it has
  seen two (the leader forked), it decides from the past of the anchor being
  committed: the candidate with a quorum of votes there; none if no
  candidate can still reach one (counting indexers without a round r+1 node
  yet, and the equivocators the bound below still allows); otherwise the
  round is undecided and that anchor waits (a lower one may commit). Both
  answers are facts about the whole DAG, so walks that decide agree. A tie
  broken by votes seen, or by id, is a guess: it split replicas in
  `test_a_forked_leader_round_waits_until_it_can_be_decided`.

The former rule voided a forked indexer's votes and anchors as soon as this
replica knew of the fork; a replica that had not received the second
sibling yet counted them, and the two confirmed different prefixes (about
1 run in 160 of `tests/core/order/test_simulation.py` with siblings
travelling apart).

What this guarantees, and its limit. The argument above needs the voters of
a committed anchor and the round r+1 quorum below any later anchor to share
an indexer that votes once per round: an honest one. Two majorities of n
share at least 2q - n indexers, so with f equivocating indexers safety holds
when 2q - n > f (`tolerated_forks`): one equivocator is tolerated by n = 4
and n = 6 (overlap 2), none by n = 3, 5, 7 (overlap 1). No rule can do
better with majority quorums in an asynchronous network: with n = 3, leader
a and equivocator c, a replica holding {a0, c0 -> a0} has a's and c's votes
for a0 and must commit it (b may have crashed), while one holding
{c0', b0 -> c0', ...} sees b and c' make progress without a0 and must commit
their anchors (a may have crashed): the two quorums share only c. Within
the bound, liveness holds once every live indexer has passed the forked
round; a forked leader plus a crashed indexer that never got there is two
faults, and can hold the order up. An indexer that forks should lose its
role (a state change the others confirm).

`quorum_degree` computes the design document's degree of quorum over one
node, as seen from another; it explains rounds and backs the document's
examples in the tests, but confirmation uses rounds, anchors and votes only.
"""

from __future__ import annotations


from .clock import CausalIndex
from .paged import PAGE_MASK, PAGE_SHIFT, PagedInts
from .values import OrderError, OrderNode

ANCHOR_SPACING = 2  # rounds between anchors: a vote may come one round late
NO_ROUND = -1  # round of a node outside this epoch or not by an indexer
MAX_DEGREE = 64  # quorum_degree stops here (one indexer alone would climb forever)
NO_FORK_LIMIT = 1 << 62  # "any seq" for CausalIndex.sees_fork
UNDECIDED = object()  # a forked round that a walk cannot decide yet


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
        # Two quorums share 2q - n indexers; one of them honest needs fewer forkers.
        self.tolerated_forks = max(0, 2 * self.quorum - len(indexers) - 1)
        self._committed_round = -ANCHOR_SPACING
        self._index = index
        self._by_key = sorted(indexers)
        # Rounds by lane position: lane -> (first seq, rounds). An indexer's nodes
        # of this epoch are a suffix of its lanes (the confirmed nodes before
        # them are a prefix) and arrive in seq order, so an array of 8-byte
        # rounds replaces a dict entry and an int object per node.
        self._rounds: dict[int, tuple[int, PagedInts]] = {}
        self._top = NO_ROUND
        self._lanes: dict[bytes, int] = {}  # indexer -> lanes the caches were computed with
        # Settled candidate lookups and votes, for rounds above the committed one
        # only: `next_commit` never asks about a round at or below it again.
        self._anchors: dict[int, tuple[bytes, ...]] = {}
        self._voters: dict[int, dict[bytes, set[bytes]]] = {}  # round -> anchor -> voters

    @property
    def committed_round(self) -> int:
        return self._committed_round

    @committed_round.setter
    def committed_round(self, round_: int) -> None:
        """Note a committed round and forget the anchors and votes at or below it."""
        self._committed_round = round_
        for settled in [r for r in self._anchors if r <= round_]:
            del self._anchors[settled]
        for settled in [r for r in self._voters if r <= round_]:
            del self._voters[settled]

    def add(self, node: OrderNode) -> None:
        if node.writer not in self.indexers:
            return
        lanes = len(self._index.lanes_of(node.writer))
        if lanes != self._lanes.get(node.writer, lanes):
            # A new branch of a forked indexer may hold another candidate anchor.
            self._anchors.clear()
        self._lanes[node.writer] = lanes
        round_ = self._compute_round(node)
        lane, seq = self._index.where(node.id)
        entry = self._rounds.get(lane)
        if entry is None:
            entry = self._rounds[lane] = (seq, PagedInts())
        if seq != entry[0] + len(entry[1]):
            raise OrderError(f"node {node.id.hex()}: round of seq {seq} out of lane order")
        entry[1].append(round_)
        self._top = max(self._top, round_)

    def round_of(self, node_id: bytes) -> int:
        if node_id not in self._index:
            return NO_ROUND
        return self.round_at(*self._index.where(node_id))

    def round_at(self, lane: int, seq: int) -> int:
        """The round of the node at (lane, seq): `round_of` without reading its id."""
        entry = self._rounds.get(lane)
        if entry is None:
            return NO_ROUND
        position = seq - entry[0]
        rounds = entry[1]
        if 0 <= position < rounds.length:
            return rounds.pages[position >> PAGE_SHIFT][position & PAGE_MASK]
        return NO_ROUND

    def _compute_round(self, node: OrderNode) -> int:
        index = self._index
        own_lane = index.lane_of(node.id)
        tops: list[int] = []
        for indexer in self.indexers:
            top = NO_ROUND
            for lane in index.lanes_of(indexer):
                seq = index.latest(node.id, lane) - (1 if lane == own_lane else 0)
                if seq >= index.lanes[lane].start:
                    top = max(top, self.round_at(lane, seq))
            if top != NO_ROUND:
                tops.append(top)
        if len(tops) < self.quorum:
            return 0
        tops.sort(reverse=True)
        return tops[self.quorum - 1] + 1

    def _prior_round(self, node_id: bytes) -> int:
        """The highest round among the writer's own nodes in node's strict past."""
        index = self._index
        own = index.lane_of(node_id)
        best = NO_ROUND
        for lane in index.lanes_of(index.lanes[own].writer):
            seq = index.latest(node_id, lane) - (1 if lane == own else 0)
            if seq >= index.lanes[lane].start:
                best = max(best, self.round_at(lane, seq))
        return best

    def leader(self, round_: int) -> bytes | None:
        if not self._by_key:
            return None
        return self._by_key[(round_ // ANCHOR_SPACING) % len(self._by_key)]

    def candidates(self, round_: int) -> tuple[bytes, ...]:
        """The leader's nodes that may anchor `round_`: one for an honest leader.

        A candidate is a leader node of this round whose past shows no fork
        of the leader and no earlier leader node of this round. A forked
        leader can have one per branch; nothing here depends on which
        branches this replica happens to hold beyond listing them.
        """
        if round_ in self._anchors:
            return self._anchors[round_]
        leader = self.leader(round_)
        lanes = self._index.lanes_of(leader) if leader is not None else []
        found: list[bytes] = []
        reached = True
        for lane in lanes:
            chain = self._index.lanes[lane]
            seq = self._index.first_where(lane, chain.start, chain.end,
                                          lambda s, lane=lane: self.round_at(lane, s) >= round_)
            if seq is None:
                reached = False  # this branch has not reached the round (yet)
                continue
            node = self._index.node_at(lane, seq)
            if (self.round_of(node) == round_ and self._prior_round(node) < round_
                    and not self._index.sees_fork(node, leader, seq)):
                found.append(node)
        result = tuple(sorted(found))
        if lanes and reached:
            # Settled: every branch has passed the round; a new branch clears it (`add`).
            self._anchors[round_] = result
        return result

    def _votes_for(self, indexer: bytes, anchor: bytes, round_: int,
                   within: bytes | None = None) -> bool:
        """Has `indexer` voted for `anchor` (in `within`'s past, if given)?

        A vote is the indexer's first node on a branch that has seen the
        anchor, if the indexer had not yet passed round r there and that node
        sees no fork of the anchor's writer up to the anchor's seq: a fact of
        the voting node's past, so every replica holding it counts it alike.
        An honest indexer votes for at most one candidate of a round: a node
        that sees two sees the leader's fork.
        """
        index = self._index
        leader_lane = index.lanes[index.lane_of(anchor)]
        forked = len(index.lanes_of(leader_lane.writer)) > 1
        anchor_lane, anchor_seq = index.where(anchor)
        for lane in index.lanes_of(indexer):
            chain = index.lanes[lane]
            stop = chain.end if within is None else min(chain.end, index.latest(within, lane) + 1)
            seq = index.first_where(
                lane, chain.start, stop,
                lambda s, lane=lane: index.latest_at(lane, s, anchor_lane) >= anchor_seq)
            if seq is None:
                continue
            node = index.node_at(lane, seq)
            if self._prior_round(node) > round_:
                continue  # it had moved on: its later nodes of round r+1 may not see it
            if forked and index.sees_fork(node, leader_lane.writer, anchor_seq):
                continue
            return True
        return False

    def is_committed(self, anchor: bytes, round_: int) -> bool:
        # Votes are never withdrawn; forgotten with the round once it is committed.
        voters = self._voters.setdefault(round_, {}).setdefault(anchor, set())
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
            for anchor in self.candidates(round_):  # two commit only beyond the fork bound
                if self.is_committed(anchor, round_):
                    chain = self._walk_down(round_, anchor)
                    if chain is not None:
                        return chain
                    break  # a forked round below it is undecided: try a lower anchor
        return []

    def _walk_down(self, top: int, anchor: bytes) -> list[tuple[int, bytes]] | None:
        """The anchors to order up to `anchor`, oldest first; None while a forked
        leader's round below it cannot be decided from `anchor`'s past."""
        chain = [(top, anchor)]
        for round_ in range(top - ANCHOR_SPACING, self.committed_round, -ANCHOR_SPACING):
            current = chain[-1][1]
            seen = [a for a in self.candidates(round_) if self._index.sees(current, a)]
            if len(seen) > 1:
                decided = self._resolve(round_, seen, anchor)
                if decided is UNDECIDED:
                    return None
                seen = [decided] if decided is not None else []
            if seen:
                chain.append((round_, seen[0]))
        chain.reverse()
        return chain

    def _resolve(self, round_: int, seen: list[bytes], top: bytes) -> bytes | None | object:
        """A forked leader's round, judged from `top`'s past: the candidate that has
        a quorum of votes, None if none can ever get one, else UNDECIDED.

        Both answers are facts about the whole DAG (with at most
        `tolerated_forks` equivocating indexers), so every walk that decides
        decides alike, whatever anchor it started from.
        """
        votes = {a: self._voters_seen(a, round_, top) for a in seen}
        winners = sorted(a for a in seen if len(votes[a]) >= self.quorum)
        if winners:
            return winners[0]  # one only, within the fork bound
        index = self._index
        forked = sum(1 for k in self._by_key if index.sees_fork(top, k, NO_FORK_LIMIT))
        spare = max(0, self.tolerated_forks - forked)  # unseen equivocators that may vote late
        # An indexer with a round r+1 node in top's past and no vote has had its say.
        still_open = {k for k in self._by_key if self._max_round_seen(k, top) <= round_}
        for a in seen:
            if len(votes[a]) + len(still_open - votes[a]) + spare >= self.quorum:
                return UNDECIDED
        return None

    def _voters_seen(self, anchor: bytes, round_: int, within: bytes) -> set[bytes]:
        return {k for k in self._by_key if self._votes_for(k, anchor, round_, within)}

    def _max_round_seen(self, indexer: bytes, within: bytes) -> int:
        index = self._index
        best = NO_ROUND
        for lane in index.lanes_of(indexer):
            seq = index.latest(within, lane)
            if seq >= index.lanes[lane].start:
                best = max(best, self.round_at(lane, seq))
        return best


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
