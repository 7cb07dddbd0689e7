"""What a topic's total order asks of a local author: which parents to keep, and when
to acknowledge.

`TopicOrder` (node.replica.ordering) mixes this in; the authoring side of
the replica (node.replica.authoring) asks it. Kept apart from feeding the
linearizer because it is policy, not bookkeeping: it reads the order's
state and decides, and changes nothing but the ack rate limit.

*Relayed writers.* Their events stay aside until a non-relayed event
references them; `parents_to_keep` makes every local event reference the
pending relayed events that are forward extremities first, and `ack_due`
makes a writer that holds some emit an acknowledgement, so "the relay
references them promptly" holds for whoever has them.

*Acknowledgements* (kind `ack`, empty payload; the auth rules ask the
writing level, `events_default`, as for any non-state kind). `ack_due` says
yes, at most once per `OrderConfig.ack_interval_ms`, when

* pending relayed events are extremities and the local identity is a
  writer or indexer in the current state (the relay duty), or
* the local identity is in the linearizer's indexer set, some non-ack event
  is unconfirmed, and either its latest event has not seen every
  unconfirmed event (it has something new to vote on) or it is the only
  indexer (a lone indexer's rounds advance on its own nodes; after a write
  it acks once or twice until the write is confirmed).

And, whatever the interval, when the next even round is the local
identity's to lead and some non-ack event is unconfirmed (`_leader_due`): a
leader whose timer makes it jump its own round leaves the round without an
anchor, and leaders that all do stall the order.

Acks of acks are never needed: when only acks are unconfirmed, nobody acks,
so a quiet topic falls silent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from node.core.graph import Graph
from node.core.order import Linearizer, OrderNode
from node.state.roles import Role

MAX_TIP_WALK = 4_096  # children followed from the own latest event up to an extremity


def own_tip(graph: Graph, author: bytes) -> bytes | None:
    """A forward extremity at or above `author`'s latest event, None if it has none.

    Referencing it keeps the author's events a chain (each has the previous
    one in its past), which the linearizer's writer numbering assumes. The
    latest event itself when it is an extremity; else the walk follows the
    smallest child until an extremity (bounded by MAX_TIP_WALK).
    """
    seq = graph.author_latest_seq(author)
    if seq is None:
        return None
    candidates = graph.events_by(author, seq)
    if not candidates:
        return None
    current = max(candidates)
    extremities = set(graph.extremities())
    for _ in range(MAX_TIP_WALK):
        if current in extremities:
            return current
        children = graph.children(current)
        if not children:
            return None
        current = min(children)
    return None


class AckPacing(Protocol):
    """What the duties read of the order's config (`node.replica.ordering.OrderConfig`)."""

    @property
    def ack_interval_ms(self) -> int: ...


class OrderDuties:
    """The author-facing policy half of `TopicOrder` (see the module docstring)."""

    if TYPE_CHECKING:
        # The order's state this policy reads (node.replica.ordering.TopicOrder).
        config: AckPacing
        _graph: Graph
        _lin: Linearizer
        _aside: dict[bytes, OrderNode]
        _acks: set[bytes]
        _latest: dict[bytes, tuple[int, bytes]]
        _lin_tail: Sequence[bytes]  # the linearizer's tail, bans not applied: see _vote_due
        soft_failed: Callable[[bytes], bool]  # soft-failed here: never built on, never voted for
        _last_ack_ms: int | None
        # (tail, own latest, answer) of the last `_vote_due`: both change only when the
        # order is fed, so a quiet tail is not walked again at every tick.
        _vote_memo: tuple[Sequence[bytes], tuple[int, bytes] | None, bool] | None

    def ack_due(self, me: bytes, now_ms: int, role: Callable[[], Role]) -> bool:
        """Should `me` append an acknowledgement now? (See the module docstring.)

        `role` gives `me`'s role in the current state; it is asked only when
        pending relayed events make it matter.
        """
        last = self._last_ack_ms
        if last is not None and now_ms - last < self.config.ack_interval_ms:
            return self._leader_due(me)  # the leader's turn does not wait for the interval
        if self._relay_due() and role() in (Role.INDEXER, Role.WRITER):
            return True
        return self._vote_due(me) or self._leader_due(me)

    def note_ack(self, now_ms: int) -> None:
        """An acknowledgement was attempted at `now_ms` (starts the rate-limit interval)."""
        self._last_ack_ms = now_ms

    def _relay_due(self) -> bool:
        if not self._aside:
            return False
        extremities = set(self._graph.extremities())
        return any(node_id in extremities for node_id in self._aside)

    def _leader_due(self, me: bytes) -> bool:
        """Is it our turn to lead? Our next node would be of an even round we lead (one
        past the round a quorum of the indexers' latest nodes reached), we have no
        node of it yet, and some non-ack event is unconfirmed.

        An ack is written on a timer, and a node's round is a fact of its past, so an
        indexer's next node may jump a round. An even round has an anchor only if its
        leader has a node of exactly that round. Three indexers acking on their timers
        fell into a cycle in which every leader jumped exactly the rounds it leads, and
        the order stopped confirming for good (docs/ordering.md, "A leader that skips
        its round"). Acking as soon as the round is ours, whatever the interval, gives
        the round its anchor: at most one ack more per round we lead. (At first only
        once the rounds ran 8 past the last commit: the acks' new cadence moved the
        tree's root, acks being a steady source, until acks stopped counting as
        sources of the tree, `Disseminator._tree_spread`. Always on, the 100-node
        world with a partition converges 0.2-0.4 s sooner: docs/ordering.md.)
        """
        lin = self._lin
        indexers = lin.indexers
        if me not in indexers or len(indexers) < 2:
            return False
        rounds = sorted((lin.round_of(self._latest[k][1]) if k in self._latest else -1
                         for k in indexers), reverse=True)
        quorum = len(indexers) // 2 + 1
        upcoming = rounds[quorum - 1] + 1
        if upcoming % 2 or lin.leader(upcoming) != me:
            return False
        own = self._latest.get(me)
        if own is not None and lin.round_of(own[1]) >= upcoming:
            return False
        return self._votable(self._lin_tail)

    def _votable(self, tail: Sequence[bytes]) -> bool:
        """Is some event of `tail` one an ack votes for (not an ack, not soft-failed)?"""
        acks, soft_failed = self._acks, self.soft_failed
        return any(t not in acks and not soft_failed(t) for t in tail)

    def _vote_due(self, me: bytes) -> bool:
        lin = self._lin
        if me not in lin.indexers:
            return False
        tail, latest = self._lin_tail, self._latest.get(me)
        memo = self._vote_memo
        if memo is not None and memo[0] is tail and memo[1] == latest:
            return memo[2]
        due = self._vote_due_now(tail, latest)
        self._vote_memo = (tail, latest, due)
        return due

    def _vote_due_now(self, tail: Sequence[bytes], latest: tuple[int, bytes] | None) -> bool:
        """`_vote_due` for this tail, walked lazily: it may be long while indexers are
        away, and the checks run every tick until an ack is due."""
        lin, soft_failed = self._lin, self.soft_failed
        # The linearizer's tail, excluded events included: whether an event is
        # excluded is only final at its confirmed position, so it must get there;
        # except soft-failed ones: local events never reference them, so acks
        # would never catch up with them (an ack every interval for ever).
        if not self._votable(tail):
            return False
        if len(lin.indexers) == 1:
            return True
        if latest is None or latest[1] not in lin:
            return True
        # Newest first: what the own latest event has not seen arrived after it.
        return any(not lin.sees(latest[1], t) for t in reversed(tail) if not soft_failed(t))

    def parents_to_keep(self, me: bytes, relayed_self: bool) -> list[bytes]:
        """Extremities a local event of `me` must reference, most important first.

        The extremity above `me`'s own latest event (its chain), then the
        pending relayed events that are extremities (unless `me` is relayed
        itself: its references would be kept aside too).
        """
        keep: list[bytes] = []
        tip = own_tip(self._graph, me)
        if tip is not None:
            keep.append(tip)
        if not relayed_self and self._aside:
            extremities = set(self._graph.extremities())
            keep += sorted(i for i in self._aside if i in extremities and i != tip)
        return keep
