"""The dissemination engine of one node: gossip push + anti-entropy, sans-IO.

Theory of operation
-------------------
`Disseminator` drives every topic replica of one node. It never does IO: the
runtime (trio + libp2p) or the simulator hands it bytes, peer events and the
time, and carries out the `Effect`s it returns (`transport.effects`: `Send`,
`Log`, `Disconnect`, `Announce`). Randomness comes from a seeded
`random.Random` passed in, so one seed reproduces a whole simulated network.

Durability first: nothing is ever relayed or acknowledged that a crash
could lose. Who commits depends on the driver:

* standalone (`commits=True`, the simulator and tests): the engine commits
  (`replica.commit()`) every batch of received events, every local publish
  (`on_publish`) and every dummy before returning an effect that forwards,
  answers or logs it; `on_batch` widens the batch to many frames and local
  publishes and commits each touched topic once, after all of them;
* driven (`commits=False`, the node): the engine never commits. The node's
  committer (`node/committer.py`), the only writer of a running node, calls
  it inside its step (frames, `announce` of local events, `tick`), commits
  every topic's writes in one transaction, and only then carries out the
  effects. So an ack or a state event can never be durable before the
  events it cites: they are written in the order they were made.

Three mechanisms move events (`docs/anti-entropy.md` has the full argument
and the measurements):

1. **Push (gossip fast path), here.** A published event is pushed to
   `push_fanout` random peers; an event first received by push is forwarded
   once, to `forward_fanout` random peers other than the one it came from
   and its author (infect-and-die gossip: each node relays an event at most once, so an
   event costs at most push_fanout + (n-1)·forward_fanout pushes, about
   forward_fanout receipts per replica, whatever n). Push alone reaches most
   replicas; anti-entropy delivers the rest. Duplicates are recognised by id
   before the signature is checked, so they cost one hash (`_ingest` in
   `transport.intake`, the hot path every received event takes).
   With `config.tree` the fast path is the eager/lazy tree instead
   (`transport.eager_lazy`, Plumtree with one tree per topic, which keeps
   causal order): an event new here, whatever brought it, goes in full on
   the eager links and by id (`IHave`) on a few lazy ones; the eager links
   are the nodes' parent links, which each node tells its peers (`Graft`:
   "you are my parent", `Prune`: "I am not your child"); ids not received in
   time are fetched (from a new parent by a graft where the tree broke), and
   exchanges hold back young events (`_held_back`). About one copy per node
   instead of ~`forward_fanout`.
2. **Anti-entropy (the guarantee)** and 3. **the want backstop**: the
   exchanges live in `transport.anti_entropy` (a mixin of this class), the
   reconciliation they run in `transport.reconcile`. An exchange that moved
   events triggers one more with another peer on the next tick (rumor
   mongering with feedback, Demers et al. 1987), so a repair spreads
   exponentially instead of one hop per interval.

`tick` also depletes a wide topic with dummy events, behind a randomized,
exponentially growing backoff (`transport.depletion`) so that n replicas do
not all emit one at once.

Bad input never raises out of the engine: an undecodable message, an
event failing a hard Reference Monitor check, a peer's own event failing the
auth rules, an impossible offer, and stray traffic (unknown topics, a
private topic's messages from a non-reader) beyond a free allowance are
logged with their reason and counted against the peer with a weight each
(`peer_misbehaviour`; `transport.intake` counts, `transport.misbehaviour`
says which faults are a peer's and how much each weighs); at
`misbehaviour_threshold` a `Disconnect` effect asks the runtime to drop it.
Anti-entropy answers to a peer not yet trusted are bounded by the bytes it
sent (`transport.peer_budget`), and offers by a rate per peer and topic.

Read access (issue 15). A private topic (authorizing, join rule not public)
is read only by the keys joined in the replica's current state
(`node.replica.read_access`). The engine enforces it in one place each way:

* every message about a topic that carries its events or ids (Push, Offer,
  Reply, Want, Events) leaves through `_send`, which withholds it from a peer
  that may not read the topic (`not_member_withheld`), and peer selection
  (push fan-out, sync partner, want target) picks among readers only, so
  fan-out is not wasted on peers the filter would refuse;
* such a message *from* a peer that may not read the topic is dropped as if
  the topic were unknown (no answer, nothing ingested; `not_member_dropped`,
  logged with reason `not_member`), unless this replica is not joined itself
  (an invitee catching up, or a member that left: it takes what comes but
  still sends only to readers).

A peer's key is `peer_key(peer)`: the simulator's convention by default
(the peer id is the key in hex); the runtime passes the key a libp2p peer id
embeds. A private topic is never announced (no `Announce`: GossipSub would
hand it to any subscriber). The join handshake (`transport.join_handshake`)
is how an invitee gets in.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from node.core.event import KIND_DUMMY, Event, event_id_of, is_withheld_form
from node.logschema import GOSSIP, SCHEMA_VERSION
from node.core.graph import Graph
from node.replica.ordering import KIND_ACK
from node.replica.replica import Replica
from node.state.types import TYPE_MEMBER, Membership, content_of, user_id
from transport.anti_entropy import AntiEntropy
from transport.depletion import DepletionMode, DepletionTimer
from transport.eager_lazy import (FRESH_LINK_MS, MAX_YOUNG_EVENTS, ORDER_EVENT_EXTRA_LINKS,
                                  TREE_WANT_AFTER_MS, TopicTree)
from transport.dissemination_config import (MAX_REMOVAL_PAST_WALK, MAX_WITNESSED_IDS,
                                            DisseminationConfig)
from transport.effects import Announce, Effect, Log, PeerId, Send
from transport.join_handshake import JoinHandshake
from transport.misbehaviour import Fault, Scores
from transport.intake_budget import IntakeBudget
from transport.peer_budget import AnswerBudget, RateBucket
from transport.messages import (
    EVENT_FRAMING_BYTES,
    Events,
    Graft,
    IHave,
    JoinAsk,
    JoinMissing,
    JoinRefused,
    JoinSubmit,
    JoinTemplate,
    Message,
    MAX_HEADS,
    MAX_WANT_IDS,
    MessageError,
    Offer,
    Prune,
    Push,
    Reply,
    Want,
    decode,
    encode,
    event_bytes,
)
from transport.intake import Intake

# A push of this many events or more is a repair passed on along the tree (what an
# exchange brought, `_ingest`), not the tree's own flow: its copies do not feed
# the tree's lateness measure (`_tree_received`). The flow comes a few events per push
# (the 10-node bench: 1.1-1.2 events per push message at 200 events/s).
BULK_PUSH_EVENTS: Final = 16

_STAT_KEYS = {kind: (f"messages_sent_{kind.__name__.lower()}", f"bytes_sent_{kind.__name__.lower()}")
              for kind in (Push, Offer, Reply, Want, Events, JoinAsk, JoinTemplate, JoinRefused,
                           JoinSubmit, JoinMissing, IHave, Graft, Prune)}
# Messages that carry a topic's events or event ids: the read filter applies to them.
_GUARDED = frozenset({Push, Offer, Reply, Want, Events, IHave, Graft})
_CARRIES_EVENTS = frozenset({Push, Reply, Events})
# A joiner whose join's past we fetch (transport.join_handshake): its answers, and its
# own asks, taken though it is no reader yet.
_FROM_JOINER: dict[type, Callable[..., list[Effect | None]]] = {
    Events: JoinHandshake._on_join_past, Want: JoinHandshake._on_joiner_want}
_REMOVALS = frozenset({Membership.BAN, Membership.LEAVE})  # set by another: a ban or a kick  # what history_access may thin out
NOT_MEMBER = "not_member"  # the log reason of a message dropped by the read filter


def _without_withheld(raws: Sequence[bytes]) -> tuple[bytes, ...] | None:
    """`raws` less any withheld form, or None if there is none (the common case)."""
    if not any(map(is_withheld_form, raws)):
        return None
    return tuple(raw for raw in raws if not is_withheld_form(raw))


def key_of_hex_peer(peer: PeerId) -> bytes | None:
    """The simulator's convention: a peer id is its author key in hex (None if it is not)."""
    try:
        return bytes.fromhex(peer)
    except ValueError:
        return None


@dataclass
class _TopicTimers:
    next_sync_ms: int | None = None
    next_want_ms: int = 0
    next_width_ms: int = 0
    news_from: PeerId | None = None  # set when sync brought events: spread them on the next tick
    depletion: DepletionTimer = field(default_factory=DepletionTimer)


def _is_removal(event: Event) -> bool:
    """Is `event` a ban or a kick: a member event that removes another key than its
    author's?"""
    return (event.kind == TYPE_MEMBER and bool(event.state_key)
            and event.state_key != user_id(event.author)
            and content_of(event).get("membership") in _REMOVALS)


def _held_here(graph: Graph) -> Callable[[bytes], bool]:
    """Is an id one the tree need not fetch: applied, buffered, or refused here before?"""
    return lambda event_id: (graph.has(event_id) or graph.is_buffered(event_id)
                             or graph.rejected_reason(event_id) is not None)


def _author_and_dummy(event: Event | None) -> tuple[bytes, bool] | None:
    """What coordinated depletion needs of an extremity (transport.depletion)."""
    return None if event is None else (event.author, event.kind == KIND_DUMMY)


class Disseminator(Intake, AntiEntropy, JoinHandshake):
    """Gossip push + anti-entropy for all topic replicas of one node."""

    def __init__(self, node_id: str, rng: random.Random,
                 config: DisseminationConfig = DisseminationConfig(), *,
                 commits: bool = True,
                 peer_key: Callable[[PeerId], bytes | None] = key_of_hex_peer) -> None:
        """`commits=False`: the driver commits (module docstring), the engine never does.

        `peer_key`: the author key a peer id is bound to (None if unknown); the
        read filter of private topics asks it (module docstring).
        """
        self.node_id = node_id  # lowercase hex (it names the node in logs)
        self.config = config
        self._commits = commits
        self._rng = rng
        self._peer_key = peer_key
        self._keys: dict[PeerId, bytes | None] = {}  # peer_key of each connected peer
        self._connected_at: dict[PeerId, int] = {}  # when each connected peer's link opened
        self._replicas: dict[bytes, Replica] = {}
        self._timers: dict[bytes, _TopicTimers] = {}
        self._trees: dict[bytes, TopicTree] = {}  # the tree fast path's links (config.tree)
        # Per tree topic: (ms, delivered_count) samples over the tree's last hold
        # (what an exchange holds back: `_young_cutoff`).
        self._delivered_at: dict[bytes, deque[tuple[int, int]]] = {}
        self._held: set[bytes] = set()  # the ids the exchange being answered holds back
        self.released_by: dict[bytes, PeerId] = {}  # set by each `_ingest` (transport.intake)
        self._peers: list[PeerId] = []  # sorted: random choices must not depend on hash order
        self._init_anti_entropy()
        self._init_join_handshake()
        self.peer_misbehaviour = Scores()
        # Per-peer budgets (transport.peer_budget): answer bytes for peers not
        # trusted, offers per (peer, topic), free stray messages per peer.
        self._answers = AnswerBudget(config.amplification_factor, config.answer_allowance_bytes,
                                     config.answer_refill_bytes_per_s)
        self._offer_rate = RateBucket(config.offers_per_s, config.offer_burst)
        self._stray = RateBucket(config.stray_allowance_per_s, config.stray_allowance_burst)
        # What one peer may make us take in (transport.intake_budget).
        self.intake_budget = IntakeBudget(config.peer_bytes_per_s, config.peer_bytes_burst,
                                          config.peer_events_per_s, config.peer_events_burst)
        self.stats: Counter[str] = Counter()
        self._deferring = False  # inside on_batch: commits wait for the end of the batch
        self._accountable = True  # the frame being handled came from its sender (on_message)

    # ------------------------------------------------------------- topology

    def add_topic(self, replica: Replica) -> None:
        self._replicas[replica.topic_id] = replica
        self._timers[replica.topic_id] = _TopicTimers()
        if self.config.push and self.config.tree:
            self._trees[replica.topic_id] = TopicTree(
                self.config.graft_timeout_ms, self.config.prune_after, self._own_key(),
                sync_hold_floor_ms=self.config.sync_hold_ms,
                adaptive=self.config.adaptive_timers,
                flush_every_ms=self.config.announce_every_ms)

    def _own_key(self) -> bytes | None:
        """This node's author key (its id is the key in hex), if the id is one."""
        try:
            key = bytes.fromhex(self.node_id)
        except ValueError:
            return None
        return key if len(key) == 32 else None

    def remove_topic(self, topic: bytes) -> None:
        """Stop replicating `topic` here (the runtime's `leave`); unknown topics are ignored."""
        self._replicas.pop(topic, None)
        self._timers.pop(topic, None)
        self._trees.pop(topic, None)
        self._delivered_at.pop(topic, None)
        self._forget_topic(topic)
        self._forget_join_topic(topic)

    def replica(self, topic: bytes) -> Replica:
        return self._replicas[topic]

    def tree_of(self, topic: bytes) -> TopicTree | None:
        """The topic's tree (None: not on the tree fast path, or not a topic here)."""
        return self._trees.get(topic)

    @property
    def commits(self) -> bool:
        """Whether the engine commits itself (standalone) or its driver does (module docstring)."""
        return self._commits

    @property
    def topics(self) -> tuple[bytes, ...]:
        return tuple(sorted(self._replicas))

    @property
    def peers(self) -> tuple[PeerId, ...]:
        return tuple(self._peers)

    def on_peer_up(self, peer: PeerId, now_ms: int) -> list[Effect]:
        """A connection opened: remember the peer and (by default) reconcile every topic with it."""
        if peer in self._peers:
            return []
        self._peers.append(peer)
        self._peers.sort()
        self._keys[peer] = self._peer_key(peer)
        self._connected_at[peer] = now_ms
        out: list[Effect] = [self._log("peer_up", now_ms, None, peer=peer)]
        if self.config.sync_on_connect:
            for topic in sorted(self._replicas):
                out += self.sync_with(peer, topic, now_ms)
        return self._clean(out)

    def on_link_lost(self, peer: PeerId, now_ms: int) -> list[Effect]:
        """One of `peer`'s connections closed and another remains: frames in flight on the
        closed one may be lost (the peer aborted it while we were stopped, and redialled).

        An exchange waiting on the peer is offered again at once rather than timing
        out (`AntiEntropy._relink`), and the link counts as fresh (`FRESH_LINK_MS`):
        what we hold back would cross by no tree of ours until the peer's tree is
        repaired. What the fast path lost on it is repaired as any loss is.
        """
        if peer not in self._peers:
            return []
        self._connected_at[peer] = now_ms
        self.stats["links_lost"] += 1
        return self._clean(self._relink(peer, now_ms))

    def on_peer_down(self, peer: PeerId, now_ms: int) -> list[Effect]:
        if peer not in self._peers:
            return []
        self._peers.remove(peer)
        self._keys.pop(peer, None)
        self._connected_at.pop(peer, None)
        for tree in self._trees.values():
            tree.forget_peer(peer)
            self.stats["tree_peers_forgotten"] += 1
        self._forget_peer(peer)
        self._forget_join_peer(peer)
        return self._clean([self._log("peer_down", now_ms, None, peer=peer)])

    # ------------------------------------------------------------- local events

    def on_publish(self, topic: bytes, event: Event, now_ms: int) -> list[Effect]:
        """A local author added `event` (replica.publish): make it durable, then push it.

        Standalone only: a driven engine does not commit, so its driver
        commits first and then calls `announce`.
        """
        if not self._commits:
            raise RuntimeError("a driven engine never commits: commit, then call announce")
        self._replicas[topic].commit()  # durable before anyone hears of it
        return self.announce(topic, [event], now_ms)

    def announce(self, topic: bytes, events: Sequence[Event], now_ms: int) -> list[Effect]:
        """Effects for events a local author added: `created` records, then the push.

        Commits nothing: the caller carries the effects out only once the
        events are durable.
        """
        replica = self._replicas[topic]
        out: list[Effect | None] = [
            self._log("created", now_ms, topic, event=event, depth=replica.graph.depth(event.id))
            for event in events]
        out += self._spread_local(topic, [e.raw for e in events], now_ms)
        return self._clean(out)

    def on_batch(self, frames: Sequence[tuple[PeerId, bytes] | tuple[PeerId, bytes, bool]],
                 now_ms: int,
                 published: Sequence[tuple[bytes, Sequence[Event]]] = ()) -> list[Effect]:
        """Handle many frames and local publishes with one commit per touched topic.

        `published` are (topic, events) a local author just added (replica.publish,
        not yet committed). A frame is (peer, data) or (peer, data, accountable)
        (see `on_message`). Every frame is handled as by `on_message`, but the
        commits `on_message` would make after each frame are deferred: each
        topic with pending writes is committed once, after all of them, and
        only then are the effects returned — so, as for single messages, no
        effect forwards, answers or logs an event a crash could lose. If a
        commit fails the exception propagates and no effect is returned; the
        caller must `discard_pending()` on the topics still holding writes.
        A driven engine (`commits=False`) commits nothing here: its driver does.
        """
        out: list[Effect | None] = []
        self._deferring = True
        self.defer_orders()
        try:
            for topic, events in published:
                out += self.announce(topic, events, now_ms)
            for frame in frames:
                out += self.on_message(frame[0], frame[1], now_ms,
                                       accountable=frame[2] if len(frame) > 2 else True)
        finally:
            self._deferring = False
            self.flush_orders()
        for topic in sorted(self._replicas) if self._commits else ():
            replica = self._replicas[topic]
            if replica.graph.pending_ops:
                replica.commit()
                self.stats["batch_commits"] += 1
        self.stats["batches"] += 1
        return self._clean(out)

    def defer_orders(self) -> None:
        """Every topic feeds its total order once, at `flush_orders`, instead of once
        per frame (`Replica.defer_order`): for a driver's step of many frames."""
        for replica in self._replicas.values():
            replica.defer_order()

    def flush_orders(self, feed: bool = True) -> None:
        """Feed each topic's order what its step applied, and stop deferring; before the
        step's commit (the order writes its records with the events). `feed=False`
        after a failed step: what waits was discarded with it."""
        for topic in sorted(self._replicas):
            self._replicas[topic].flush_order(feed)

    def tick(self, now_ms: int, rng: random.Random | None = None,
             due_ms: int | None = None) -> list[Effect]:
        """Periodic work: expire exchanges, deplete width, offer heads, retry wants, sample width.

        `rng` overrides the engine's random stream for this call. `due_ms`: when
        the driver queued this tick, if it waited behind other work; exchanges
        expire by the peers' silence until then (`AntiEntropy._expire_sessions`).
        """
        rng = rng or self._rng
        out: list[Effect] = []
        if due_ms is not None:
            self._discount_absence(due_ms)
        out += self._expire_sessions(now_ms if due_ms is None else min(now_ms, due_ms))
        self._expire_join_fetches(now_ms)
        for topic in sorted(self._replicas):
            out += self._tick_topic(topic, now_ms, rng)
        return self._clean(out)

    # ------------------------------------------------------------- network input

    def on_message(self, peer: PeerId, data: bytes, now_ms: int,
                   accountable: bool = True) -> list[Effect]:
        """Handle one frame from `peer`. Never raises for bad input.

        `accountable=False`: `peer` is only who the frame claims it comes
        from, not who handed it to us (a GossipSub message's unsigned origin,
        relayed by others). Its faults are logged and counted
        (`unattributed_faults`) but never held against `peer`: otherwise
        anyone could get an honest peer disconnected by naming it.
        """
        self.stats["bytes_received"] += len(data)
        self._accountable = accountable
        if accountable:  # bytes a peer sent itself earn it answer bytes (transport.peer_budget)
            if not self.intake_budget.take_bytes(peer, len(data), now_ms):
                return self._clean(self._over_budget(peer, now_ms, "bytes"))
            self._answers.received(peer, len(data), now_ms)
        try:
            try:
                message = decode(data)
            except MessageError as error:
                return self._clean(self._blame(peer, now_ms, None,
                                               f"bad_message:{error.reason}"))
            replica = self._replicas.get(message.topic)
            kind = type(message)
            if kind is JoinAsk:  # answered whether or not we know the topic: one refusal for all
                return self._clean(self._on_join_ask(peer, replica, message, now_ms))
            if replica is None:
                # The peer may serve topics we do not: a fault only beyond its allowance.
                self.stats["unknown_topic"] += 1
                return self._clean(self._stray_fault(peer, now_ms, Fault.UNKNOWN_TOPIC))
            # The answers (and asks) of a joiner whose join's past we fetch
            # (transport.join_handshake).
            joining = kind in _FROM_JOINER and self._fetching_join_past(replica, peer,
                                                                         kind is Want)
            if kind in _GUARDED and not joining and not self._accepts(peer, replica):
                served = self._on_removed(peer, replica, message, now_ms)
                if served is not None:  # a removed member fetching its removal's past
                    return self._clean(served)
                # A private topic's message from a peer that may not read it: as if
                # the topic were unknown here (no answer, nothing ingested). A member
                # whose join we have not seen yet sends these too: the same allowance,
                # and if our state counts it as invited, word that we lack its join.
                self.stats["not_member_dropped"] += 1
                return self._clean([self._log("rejected", now_ms, replica.topic_id,
                                              reason=NOT_MEMBER, peer=peer)]
                                   + self._stray_fault(peer, now_ms, Fault.NOT_MEMBER)
                                   + self._nudge_joiner(peer, replica, now_ms))
            if kind in _GUARDED and message.topic not in self._served_by_others \
                    and not joining:
                # Its sender sends these to readers only: it holds our join.
                self._served_by(message.topic, peer)
            if accountable and kind in _CARRIES_EVENTS and not self._solicited(peer, message) \
                    and not self.intake_budget.take_events(
                        peer, len(message.events), now_ms):  # type: ignore[union-attr]
                return self._clean(self._over_budget(peer, now_ms, "events"))
            handler = _FROM_JOINER[kind] if joining else self._HANDLERS[kind]
            return self._clean(handler(self, peer, replica, message, now_ms))
        finally:
            self._accountable = True

    def _on_push(self, peer: PeerId, replica: Replica, message: Push, now_ms: int) -> list[Effect]:
        out: list[Effect] = []
        tree = self._trees.get(replica.topic_id)
        graph = replica.graph
        # Copies that brought nothing new (what prunes a tree link): known before this
        # push. Not "absent from fresh": an event only buffered is new, yet not passed on.
        ids = [] if tree is None else [event_id_of(raw) for raw in message.events]
        known = {event_id for event_id in ids if graph.knows(event_id)}
        if self.config.since_from_fast_path:
            # The sender holds what it pushes (`_witness`); off the tree, where the ids
            # are not needed otherwise, the newest one is enough.
            self._witness(peer, replica.topic_id, ids[-MAX_WITNESSED_IDS:] if tree is not None
                          else [event_id_of(raw) for raw in message.events[-1:]])
        fresh = self._ingest(peer, replica, message.events, GOSSIP, now_ms, out)
        if tree is not None:
            out += self._tree_received(tree, peer, replica, ids, fresh, known,
                                       now_ms, message.repair)
        elif fresh and self.config.forward_pushed:
            # Only events new here (each node relays an event at most once), never
            # to a peer sure to hold them (the sender, their author), to a bounded
            # number of others.
            holders = self._holders(replica, peer, fresh)
            out += self._push(replica.topic_id, fresh, exclude=holders,
                              fanout=self.config.forward_fanout)
        if fresh:
            out += self._tell_removed(replica, fresh)
        return out

    def _tell_removed(self, replica: Replica, raws: Sequence[bytes]) -> list[Effect]:
        """Hand a member that was just banned or kicked its own removal, if connected.

        The read filter sends a removed member nothing more, its removal included, so
        its node could never tell it was removed (`subscribe` would wait forever).
        The removal is the one event it may still read: it was joined in the state
        before it (Matrix sends the ban to the banned user too). It arrives as a push;
        if the member lacks some of its parents it stays buffered there.
        """
        if not replica.is_private():
            return []  # an open topic's removed members still read it all
        out: list[Effect] = []
        for raw in raws:
            event = replica.graph.get(event_id_of(raw))
            if event is None or not _is_removal(event):
                continue
            peer = self._peer_of_key(event.state_key)
            if peer is not None:
                self.stats["removals_told"] += 1
                out.append(self._emit(peer, Push(replica.topic_id, (event.raw,))))
        return out

    def _removal_of(self, replica: Replica, peer: PeerId) -> Event | None:
        """The ban or kick of `peer` in our state of a private topic, if it was removed
        while joined."""
        key = self._key(peer)
        if key is None or not replica.is_private():
            return None
        event = replica.membership_event(key)
        if event is None or not _is_removal(event) or not replica.joined_before(key, event):
            return None  # (an invitee refused, say, never read the topic: a stranger still)
        return event

    def _on_removed(self, peer: PeerId, replica: Replica, message: Message,
                    now_ms: int) -> list[Effect | None] | None:
        """A frame the read filter refused: if it is an ask or an offer of a member we
        count as banned or kicked, its answer (`_REMOVED_HANDLERS`); else None. Each
        answer walks the removal's past: at most `offers_per_s` a peer, as for a
        reader's offers; beyond, its frames are dropped as before."""
        handler = self._REMOVED_HANDLERS.get(type(message))
        if handler is None:
            return None
        removal = self._removal_of(replica, peer)
        if removal is None or not self._offer_rate.take((peer, replica.topic_id), now_ms):
            return None
        return handler(self, peer, replica, message, removal, now_ms)

    def _on_removed_want(self, peer: PeerId, replica: Replica, message: Want, removal: Event,
                         now_ms: int) -> list[Effect | None] | None:
        """A member we count as banned or kicked asks for events: those in the past of its
        removal are answered, nothing else.

        We hand it its removal (`_tell_removed`), and if it lacks some of the removal's
        parents the removal stays buffered there: nobody served it more, so its node
        never applied it and its app's `subscribe` never ended. It was joined in the
        state before its removal, so it may read that past (Matrix serves a banned user
        the room up to its ban). Its asks name ids; any other id is dropped unanswered,
        as from a stranger, and history it may not read goes in its withheld form, as to
        any reader (`_send`). None if it asked nothing of that past: the read filter
        drops the ask then.
        """
        past = replica.graph.in_past_of(removal.id, message.ids, MAX_REMOVAL_PAST_WALK)
        asked = tuple(i for i in message.ids if i in past)
        if not asked:
            return None
        with self._granted(replica.topic_id, peer):
            out = self._on_want(peer, replica, Want(message.topic, asked), now_ms)
        self.stats["removed_wants_served"] += 1
        return out

    def _on_removed_offer(self, peer: PeerId, replica: Replica, message: Offer,
                          removal: Event, now_ms: int) -> list[Effect | None] | None:
        """A member we count as banned or kicked offers its heads: what it lacks of its
        removal's past goes to it in one push, parents first (a page at most, within its
        answer budget), not a parent per round trip as its wants would fetch it (a member
        away for long would take hours). The rest of the exchange is refused, as before:
        None (the read filter drops the offer; `_nudge_joiner` hands it its removal)."""
        graph = replica.graph
        limit = self.config.reply_max_events
        lacking = graph.not_below(message.heads, limit=MAX_REMOVAL_PAST_WALK)
        past = graph.in_past_of(removal.id, lacking, MAX_REMOVAL_PAST_WALK)
        ids = [i for i in lacking if i in past][:limit]
        if not ids:
            return None
        raws, _ = self._take(graph, ids)
        fitting, _ = self._within_budget(peer, replica, now_ms, raws, Push(replica.topic_id, ()))
        if not fitting:
            return None
        self.stats["removed_offers_served"] += 1
        with self._granted(replica.topic_id, peer):
            sent = self._send(peer, Push(replica.topic_id, tuple(fitting)))
        return [self._spent(peer, sent, now_ms)] + self._nudge_joiner(peer, replica, now_ms)

    def _peer_of_key(self, user: str) -> PeerId | None:
        """The connected peer whose key is the user id `user` (hex), if any."""
        for peer in self._peers:
            key = self._key(peer)
            if key is not None and key.hex() == user:
                return peer
        return None

    def _over_budget(self, peer: PeerId, now_ms: int, what: str) -> list[Effect]:
        """A frame beyond `peer`'s intake budget (transport.intake_budget): dropped unread."""
        self.stats["intake_throttled"] += 1
        self.stats[f"intake_throttled_{what}"] += 1
        return self._blame(peer, now_ms, None, f"over_budget:{what}", log=False,
                           fault=Fault.OVER_BUDGET)

    def _stray_fault(self, peer: PeerId, now_ms: int, fault: Fault) -> list[Effect]:
        """A stray message (unknown topic, non-member): free within the peer's allowance."""
        if not self._accountable or self._stray.take(peer, now_ms):
            return []
        return self._blame(peer, now_ms, None, str(fault), log=False, fault=fault)

    def _trust(self, peer: PeerId) -> None:
        """`peer` handed over useful traffic: its answers are no longer bounded."""
        if self._accountable:
            self._answers.trust(peer)

    # ------------------------------------------------------------- read access

    def _key(self, peer: PeerId) -> bytes | None:
        key = self._keys.get(peer)
        return key if key is not None or peer in self._keys else self._peer_key(peer)

    def _may_serve(self, peer: PeerId, replica: Replica) -> bool:
        """May `peer` be sent this topic's events and ids? (one set lookup for a private topic)"""
        readers = replica.readers()
        if readers is None:
            # An open topic (or a pure MEG): anyone. An invitee that holds nothing
            # of its topic yet (not ready) but maybe buffered pushes: its asks name
            # event ids, so they go to the member that took its join in, to no one else.
            return replica.ready or self._invitee_serves(replica.topic_id, peer)
        if self._key(peer) in readers:
            return True
        if self._granting == (replica.topic_id, peer):
            return True  # our join's past, to a peer fetching it (transport.join_handshake)
        # Catching up after a join: our copy of the state may not show the member
        # that took our join in as a member yet (transport.join_handshake).
        return (replica.identity.public_key not in readers
                and self._is_sponsor(replica.topic_id, peer))

    def _accepts(self, peer: PeerId, replica: Replica) -> bool:
        """Do we take this topic's messages from `peer`? Readers' only, once we are joined."""
        readers = replica.readers()
        return (readers is None or self._key(peer) in readers
                or replica.identity.public_key not in readers)

    def _serving(self, replica: Replica, peers: Sequence[PeerId]) -> list[PeerId]:
        """The peers of `peers` that may read the topic (all of them for an open topic)."""
        if replica.readers() is None and replica.ready:
            return list(peers)  # an open topic: one test, not one per peer
        return [p for p in peers if self._may_serve(p, replica)]

    # ------------------------------------------------------------- internals: topics

    def _tick_topic(self, topic: bytes, now_ms: int, rng: random.Random) -> list[Effect]:
        replica = self._replicas[topic]
        timers = self._timers[topic]
        out: list[Effect] = []
        # The width as each tick sees it: its maximum and a tick-weighted mean (the
        # bound depletion keeps, docs/anti-entropy.md "Coordinated depletion").
        width = replica.graph.width
        self.stats["width_ticks"] += 1
        self.stats["width_tick_sum"] += width
        if width > self.stats["width_max"]:
            self.stats["width_max"] = width
        if self.config.depletion:
            out += self._deplete(topic, replica, timers, now_ms, rng)
        out += self._nudge_invited(replica, now_ms)
        if timers.next_sync_ms is None:  # first tick: a random phase, so nodes do not sync in step
            timers.next_sync_ms = now_ms + rng.randrange(self.config.sync_interval_ms)
        news_from, timers.news_from = timers.news_from, None
        if now_ms >= timers.next_sync_ms:
            jitter = self.config.sync_jitter_ms
            timers.next_sync_ms = (now_ms + self.config.sync_interval_ms
                                   + rng.randint(-jitter, jitter))
            out += self._sync_random(topic, now_ms, rng, exclude=None)
        elif news_from is not None and self.config.sync_on_news:
            # Rumor mongering with feedback (Demers et al. 1987): an exchange that
            # moved events suggests other peers lack them too, so exchange with one
            # more peer now instead of at the next interval. Both sides do, so news
            # spreads exponentially; it stops by itself once exchanges move nothing.
            # (On the tree path too: after a partition heals the cut links are lazy,
            # and the events one side wrote cross by exchanges. With it only where the
            # tree above was broken, the 100-node world converged 6.0 s after the heal
            # (mean of seeds 1-6) against 4.6 s with it everywhere, together with the
            # root's first link (`TopicTree.first_copies`); bytes 2.5-2.7x against
            # 3.0-3.2x in the short scenario, the steady state about the same.)
            self.stats["news_syncs"] += 1
            out += self._sync_random(topic, now_ms, rng, exclude=news_from)
        if now_ms >= timers.next_want_ms:
            timers.next_want_ms = now_ms + self.config.want_retry_ms
            out += self._wants(topic, replica, now_ms, rng)
        tree = self._trees.get(topic)
        if tree is not None:
            self._sample_delivered(topic, tree, replica, now_ms)
            out += self._tree_tick(tree, replica, now_ms)
        if self.config.log and now_ms >= timers.next_width_ms:
            timers.next_width_ms = now_ms + self.config.width_sample_ms
            out.append(self._log("width", now_ms, topic, width=replica.graph.width,
                                 buffered=replica.graph.buffered_count))
        return out

    def _deplete(self, topic: bytes, replica: Replica, timers: _TopicTimers, now_ms: int,
                 rng: random.Random) -> list[Effect]:
        """A dummy if the width stayed over the threshold and it is our turn.

        Who and when: transport.depletion.
        """
        graph, policy = replica.graph, replica.config.depletion
        width = graph.width
        timer = timers.depletion
        merge = policy.dummy_parents(replica.params.d_max)
        if self.config.depletion_mode is DepletionMode.BACKOFF:  # the old timers, for comparison
            if not timer.due_backoff(replica.ready, width, policy.threshold, now_ms, rng,
                                     self.config.depletion_backoff_ms):
                return []
        elif not policy.over(width) and timer.over_since_ms is None:
            return []  # the common case: narrow, nothing armed (no extremity list built)
        elif not timer.due(ready=replica.ready and policy.enabled,
                           extremities=graph.extremities(), threshold=policy.threshold,
                           merge=merge, me=replica.identity.public_key, now_ms=now_ms, rng=rng,
                           describe=lambda i: _author_and_dummy(graph.get(i))):
            return []
        # (The old timers rank nobody: their dummies take the parent policy's pick.)
        made = replica.maybe_deplete(now_ms, rng, timer.share(width, policy.threshold, merge))
        if made is None:
            return []
        event, _ = made
        if self._commits:
            replica.commit()  # durable before it is pushed (driven: the driver commits first)
        self.stats["dummies"] += 1
        out: list[Effect] = [
            self._log("dummy", now_ms, topic, event=event, width=width),
            self._log("created", now_ms, topic, event=event, depth=replica.graph.depth(event.id)),
        ]
        return out + self._spread_local(topic, [event.raw], now_ms)

    def _note_news(self, topic: bytes, peer: PeerId) -> None:
        """An exchange moved events (either way): others may lack them too."""
        self._timers[topic].news_from = peer

    # ------------------------------------------------------------- internals: push

    def _take_raws(self, raws: Sequence[bytes]) -> tuple[list[bytes], bool]:
        """The longest prefix of `raws` within the per-message bounds; True if cut."""
        total = 0
        for count, raw in enumerate(raws):
            total += len(raw) + EVENT_FRAMING_BYTES
            if count >= self.config.reply_max_events or total > self.config.reply_max_bytes:
                return list(raws[:count]), True
        return list(raws), False

    def _holders(self, replica: Replica, sender: PeerId,
                 raws: Sequence[bytes]) -> tuple[PeerId, ...]:
        """Peers certain to hold all of `raws`: the sender, and their author if they share one
        (a node's id is its key in hex, the key that signed its events)."""
        authors = set()
        for raw in raws:
            event = replica.graph.get(event_id_of(raw)) or replica.graph.buffered_event(
                event_id_of(raw))
            authors.add(None if event is None else event.author)
        if len(authors) == 1 and None not in authors:
            return (sender, next(iter(authors)).hex())
        return (sender,)

    def _spread_local(self, topic: bytes, raws: list[bytes], now_ms: int) -> list[Effect]:
        """The fast path for events authored here: push them, and announce them if asked."""
        tree = self._trees.get(topic)
        if tree is not None:
            out = self._tree_local(tree, topic, raws, now_ms)
        else:
            out = self._push(topic, raws, exclude=(), fanout=self.config.push_fanout)
        out += self._tell_removed(self._replicas[topic], raws)
        if self.config.announce and raws and not self._replicas[topic].is_private():
            out.append(Announce(topic, tuple(raws)))  # never for a private topic
        return out

    def _push(self, topic: bytes, raws: list[bytes], exclude: Sequence[PeerId],
              fanout: int) -> list[Effect]:
        if not self.config.push or fanout <= 0:
            return []
        candidates = self._serving(self._replicas[topic],
                                   [p for p in self._peers if p not in exclude])
        if not candidates:
            return []
        return self._push_to(topic, raws, self._rng.sample(candidates,
                                                           min(fanout, len(candidates))))

    def _push_to(self, topic: bytes, raws: list[bytes], chosen: Sequence[PeerId],
                 repair: bool = False) -> list[Effect]:
        """Push `raws` to each of `chosen`, in messages within the per-message bounds
        (`repair`: marked as a repair passed on along the tree, `Push.repair`)."""
        # One encoding for every peer, unless what each may read differs (history).
        shared = not self._replicas[topic].limits_history()
        out: list[Effect] = []
        while raws:
            batch, _ = self._take_raws(raws)
            batch = batch or raws[:1]
            raws = raws[len(batch):]
            data = None
            for peer in sorted(chosen):
                sent = self._send(peer, Push(topic, tuple(batch), repair), data)
                if sent is not None:
                    data = sent.data if shared else None
                    out.append(sent)
                    if repair:
                        self.stats["tree_repair_pushes"] += 1
        return out

    # ------------------------------------------------------------- internals: the tree

    def _ingest(self, peer: PeerId, replica: Replica, raws: Sequence[bytes], channel: str,
                now_ms: int, out: list[Effect]) -> list[bytes]:
        """`Intake._ingest`; on the tree path, events a sync brought go on along the tree.

        Plumtree's tree carries every event new at a node, whatever brought it:
        after a partition heals, one exchange across it repairs each side by push
        instead of one exchange per node. (Pushed events are forwarded by `_on_push`.)
        An exchange no longer races the tree (it holds back young events,
        `_held_back`), so what it brings is what the tree lost. (Sent by id only
        instead, as tried, a healed partition's events crossed one graft timeout
        per hop: the 100-node world converged in 7.8 s against push's 3.1 s.)
        A tree copy of an event a sync brought prunes nothing (`TopicTree.synced`).
        """
        fresh = Intake._ingest(self, peer, replica, raws, channel, now_ms, out)
        tree = self._trees.get(replica.topic_id)
        if fresh and tree is not None and channel != GOSSIP:
            fresh_ids = [event_id_of(raw) for raw in fresh]
            tree.received(fresh_ids)
            brought = {event_id_of(raw) for raw in raws}
            tree.synced(i for i in fresh_ids if i in brought)
            if self.config.forward_pushed:
                self.stats["tree_forwarded_sync"] += len(fresh)
                out += self._tree_spread(tree, replica.topic_id, fresh, (peer,), now_ms,
                                         repair=True)
        return fresh

    def _tree_local(self, tree: TopicTree, topic: bytes, raws: list[bytes],
                    now_ms: int) -> list[Effect]:
        """Events authored here: on the tree, as any other event new here.

        Not on every link (GossipSub's flood publishing, the previous design): a
        child sent on a link its parents did not take could overtake them, and
        be held back there (measured in the seeded world: a root flooding its
        own events made a third of the copies wait for a parent). Except the
        order's own events, acks and dummies: they go on ORDER_EVENT_EXTRA_LINKS
        links off the tree too (`_tree_spread`).
        """
        return self._tree_spread(tree, topic, raws, (), now_ms, own=True)  # (notes our source)

    def _tree_spread(self, tree: TopicTree, topic: bytes, raws: list[bytes],
                     exclude: Sequence[PeerId], now_ms: int, *,
                     own: bool = False, repair: bool = False,
                     repaired: bool = False) -> list[Effect]:
        """Events new here: in full on the eager links, ids on a few lazy ones.

        While the root is not settled (`TopicTree.settled`: a join storm, the
        topic's first events) the links nobody declared are eager at both ends;
        the events go in full on the tree's links and, as push does, on enough
        of the others to make `forward_fanout` (`push_fanout` for our `own`
        events), and by id on a few of the rest. (On every undeclared link, the
        200-node join storm cost 6 copies of each join per node, against push's
        1.6.) Events an exchange or a want brought (`repair`) go on the tree's
        links alone then, as push forwards none of them: with no tree yet to
        repair, each exchange's events went on `forward_fanout` links more, a
        second flood of the join storm beside the first. The issue's 100-node
        world (10 % loss, a partition; seeds 1-10): 3.95 -> 3.56x the event's
        bytes per node (push 3.28x), 2.22 -> 1.88 duplicates per node and
        event (push 1.69), converged 4.35 -> 3.37 s after the heal (push 3.41).

        Our own acks and dummies also go in full on ORDER_EVENT_EXTRA_LINKS
        random links off the tree. Convergence after a heal waits for one
        confirmed order everywhere, so for the acks to reach every indexer and
        every node; over the tree, under loss, a lost copy waits for an
        announcement and a timeout, and the acks kept acknowledging each other
        meanwhile. Entering the tree at a few more places, an ack reaches every
        node sooner at a few copies per event in all, not per node: in the
        100-node world with 10 % loss and a partition (seeds 1-12) the tree
        converged in 3.7 s at the mean against 5.1 s, and push's 3.8 s; the
        steady state's bytes did not move.
        """
        if not raws:
            return []
        replica = self._replicas[topic]
        peers = self._serving(replica, [p for p in self._peers if p not in exclude])
        lazy = tree.lazy_of(peers)
        eager = tree.eager_of(peers)
        if not tree.settled(now_ms):
            placed = [p for p in eager if tree.is_parent(p) or tree.is_child(p)]
            others = [p for p in eager if p not in placed]
            room = 0 if repair else max(
                0, (self.config.push_fanout if own else self.config.forward_fanout) - len(placed))
            if len(others) > room:
                picked = self._rng.sample(others, room)
                lazy = lazy + [p for p in others if p not in picked]
                eager = placed + picked
        fanout = self.config.lazy_fanout
        announce: dict[PeerId, list[bytes]] = {}
        order_events: list[bytes] = []  # our own acks and dummies (below)
        for raw in raws:
            event_id = event_id_of(raw)
            event = self._held_event(replica, event_id)
            if event is not None:
                if event.kind != KIND_ACK:
                    # Acks are no source of the tree: an indexer acks at a steady
                    # cadence, so it could be the root, and then every change of that
                    # cadence moved the root and its parents. With the leader's turn
                    # (`OrderDuties._leader_due`) always on, the fixed-writers world's
                    # p99 was 544, 752 and 495 ms (seeds 1, 7, 12); 406, 416 and 409
                    # with acks no source (docs/anti-entropy.md, s27).
                    tree.saw(event.author, now_ms)
                if own and event.kind in (KIND_ACK, KIND_DUMMY):
                    order_events.append(raw)
            chosen = self._rng.sample(lazy, fanout) if len(lazy) > fanout else lazy
            for peer in chosen:  # announcements repair the tree; a few per event suffice
                announce.setdefault(peer, []).append(event_id)
        # A repair goes on marked (`Push.repair`): what an exchange or a want brought
        # here (`repair`), and what came marked (`repaired`).
        out = self._push_to(topic, raws, eager, repair or repaired) if eager else []
        if order_events:
            on_tree = set(eager)
            off_tree = [p for p in peers if p not in on_tree]
            if off_tree:
                out += self._push_to(topic, order_events, self._rng.sample(
                    off_tree, min(len(off_tree), ORDER_EVENT_EXTRA_LINKS)))
        for peer, ids in sorted(announce.items()):
            out += self._ihaves(topic, tree.announce([peer], ids))
        return out

    @staticmethod
    def _held_event(replica: Replica, event_id: bytes) -> Event | None:
        """The event, applied or buffered here (None: not held)."""
        return replica.graph.get(event_id) or replica.graph.buffered_event(event_id)

    def _tree_received(self, tree: TopicTree, peer: PeerId, replica: Replica, ids: list[bytes],
                       fresh: list[bytes], known: set[bytes], now_ms: int,
                       repaired: bool = False) -> list[Effect]:
        """A push of events `ids` arrived (`known`: those held here before): note whose
        first copies it brought, and forward what it applied along the tree
        (`repaired`: the push was a repair passed on along the tree, `Push.repair`)."""
        topic = replica.topic_id
        fresh_ids = {event_id_of(raw) for raw in fresh}  # (with the buffered ones it released)
        stats = self.stats
        held_back = len(ids) - len(known) - len(fresh)
        if held_back > 0:  # buffered: a parent is missing here (or refused)
            stats["tree_held_back"] += held_back
            # The sender relays only what it applied, so it holds the missing past: ask
            # it soon (its copy of that past was lost or is a little late) rather than
            # at the next want round.
            timers = self._timers[topic]
            timers.next_want_ms = min(timers.next_want_ms, now_ms + TREE_WANT_AFTER_MS)
        if known:
            stats["tree_duplicates_grafted"] += tree.grafted_lately(known)
        if fresh_ids:
            stats["tree_fresh_grafted"] += tree.grafted_lately(fresh_ids)
        out: list[Effect] = []
        # The root's first copies say which link is our parent (transport.eager_lazy),
        # judged on their own: under load a push often carries several sources' events.
        root = tree.root(now_ms)
        events = [self._held_event(replica, event_id) for event_id in ids]
        sources = [None if event is None else event.author for event in events]
        if tree.adaptive and not repaired and len(ids) < BULK_PUSH_EVENTS:
            # How late the tree's first copies come (transport.tree_lateness). Not a
            # repair going on along the tree (what an exchange or a want brought, across
            # a healed partition say), whose copies are as old as what they repair:
            # marked so by whoever took them in by the exchange (`Push.repair`); and
            # not a bulk push, the same unmarked (a busy spell's too: measured so).
            # Unmarked, the copies pushed on after a heal stretched the timers to their
            # cap: the 100-node world with a partition converged 0.65 s later
            # (docs/anti-entropy.md, s27).
            lateness = tree.lateness
            for event in events:
                if event is not None and event.id in fresh_ids:
                    lateness.arrived(event.author, now_ms - event.timestamp_ms)
        root_ids = [i for i, source in zip(ids, sources) if source is not None and source == root]
        all_known = bool(ids) and all(i in known for i in ids)
        if len(known) < len(ids):  # news by this link, of any source (`TopicTree.broken`)
            tree.news_from(peer, now_ms)
        tree.first_copies(peer, {source for i, source in zip(ids, sources)
                                 if source is not None and i not in known})
        root_news = [i for i in root_ids if i not in known]
        if root_news:
            if tree.is_lazy(peer):
                stats["tree_root_news_over_lazy"] += 1
            tree.first_copy_from(peer, [root], now_ms,  # type: ignore[list-item]
                                 authored=self._key(peer) == root)
        if all_known and tree.synced_lately(ids):
            stats["tree_sync_races"] += 1  # anti-entropy was first: no cycle
        elif all_known:
            stats["tree_duplicate_pushes"] += 1
            stats["tree_duplicate_pushes_" + (
                "lazy" if tree.is_lazy(peer) else "parent" if tree.is_parent(peer)
                else "child" if tree.is_child(peer) else "other")] += 1
            if tree.duplicate_from(peer, now_ms):
                stats["tree_retold"] += 1  # the peer missed our prune: `_tell` repeats it
        out += self._tell(tree, replica, now_ms)
        if not fresh:
            return out
        tree.received(fresh_ids)
        if not self.config.forward_pushed:
            return out
        # The events this push brought go on to everyone but their holders; those it
        # released (buffered here, pushed earlier by another peer) go to the sender
        # too: it brought their past, not them. (Excluding it, as before, kept a
        # child's events from going up the tree whenever its parent's push released
        # them: in the seeded world they reached the rest of the tree by an exchange,
        # ~0.7 s late.)
        released_by = self.released_by
        if not released_by:  # the common case: one id lookup less per event
            return out + self._tree_spread(tree, topic, fresh,
                                           self._holders(replica, peer, fresh), now_ms,
                                           repaired=repaired)
        brought: list[bytes] = []
        by_pusher: dict[PeerId, list[bytes]] = {}
        for raw in fresh:
            pusher = released_by.get(event_id_of(raw))
            if pusher is None:
                brought.append(raw)
            else:
                by_pusher.setdefault(pusher, []).append(raw)
        if brought:
            out += self._tree_spread(tree, topic, brought,
                                     self._holders(replica, peer, brought), now_ms,
                                     repaired=repaired)
        for pusher, raws in sorted(by_pusher.items()):
            out += self._tree_spread(tree, topic, raws, (pusher,), now_ms, repaired=repaired)
        return out

    def _tree_tick(self, tree: TopicTree, replica: Replica, now_ms: int) -> list[Effect]:
        """Flush the announcements, and graft for the announced ids overdue here."""
        topic = replica.topic_id
        tree.quiet_tick(now_ms)
        out = self._ihaves(topic, tree.flush(now_ms))
        # A gauge, not a counter: the measure the timers stretch to (of the topic ticked last).
        self.stats["tree_lateness_ms"] = tree.lateness.ms
        graph = replica.graph
        if self._streaming(topic, now_ms):
            # A catch-up streams what we lack, parents first. The ids our peers
            # announced meanwhile are its newest events: fetched by id they come
            # ahead of their parents and wait in the buffer (a 50k catch-up
            # buffered 11,000 so); awaited on, they arrive with the stream.
            self.stats["tree_fetches_deferred"] += 1
            asks: dict[PeerId, list[bytes]] = {}
        else:
            asks = tree.due(now_ms, _held_here(graph))
        # Late, not lost, while the parent link is live (`TopicTree.broken`): fetched,
        # no link changes. Broken above us: the announcer with the most of them is our
        # parent from now on (a graft tells it), the others are asked by a want.
        repairer = None
        if asks and tree.broken(now_ms):
            live = [(len(ids), peer) for peer, ids in asks.items() if peer in self._peers]
            repairer = min(live, key=lambda c: (-c[0], c[1]))[1] if live else None
        for peer, ids in sorted(asks.items()):
            if peer not in self._peers:
                continue
            asked = tuple(ids[:MAX_WANT_IDS])
            if peer != repairer:
                self.stats["tree_fetches_sent"] += 1
                self.stats["tree_fetch_ids_sent"] += len(asked)
                sent = self._send(peer, Want(topic, asked))
            else:
                tree.adopt_parent(peer, now_ms)
                self.stats["grafts_sent"] += 1
                self.stats["graft_ids_sent"] += len(asked)
                sent = self._send(peer, Graft(topic, asked))
            if sent is not None:
                out.append(sent)
        return out + self._tell(tree, replica, now_ms)

    def _tell(self, tree: TopicTree, replica: Replica, now_ms: int) -> list[Effect]:
        """Tell the peers what changed about our place in the tree (`TopicTree.declarations`):
        a `Graft` to a new parent, a `Prune` to every other peer once."""
        out: list[Effect] = []
        topic = replica.topic_id
        for peer, child in tree.declarations(self._serving(replica, self._peers), now_ms):
            if child:
                self.stats["grafts_sent"] += 1
                sent = self._send(peer, Graft(topic, ()))
            else:
                self.stats["prunes_sent"] += 1
                sent = self._send(peer, Prune(topic, tree.root(now_ms) or tree.me or bytes(32)))
            if sent is not None:
                out.append(sent)
        return out

    # ------------------------------------------------------------- internals: young events

    def _sample_delivered(self, topic: bytes, tree: TopicTree, replica: Replica,
                          now_ms: int) -> None:
        """Remember how many events were applied by now (one sample per tick). Before
        the tree formed here only the latest sample is kept: what was applied by then
        is never held back (`_young_cutoff`)."""
        samples = self._delivered_at.setdefault(topic, deque())
        if not tree.formed:
            samples.clear()
        samples.append((now_ms, replica.graph.delivered_count))
        hold_from = now_ms - tree.sync_hold()
        while len(samples) > 1 and samples[1][0] <= hold_from:
            samples.popleft()  # the first sample left is the last one at or before hold_from

    def _young_cutoff(self, graph: Graph, now_ms: int) -> int | None:
        """The delivery position from which events are young (applied within the tree's
        hold, `TopicTree.sync_hold`), or None if none is held back.

        On the tree path an exchange holds back events applied here within
        `sync_hold_ms` (`transport.eager_lazy`, SYNC_HOLD_MS; stretched to the
        tree's measured lateness when that is more): they are mostly on
        their way to the peer by the tree, and sent by the exchange they arrive
        out of the tree's causal order, so that the peer's children of them
        overtake their other parents elsewhere (measured in the seeded world: with
        exchanges, a third of the copies were held back waiting for a parent; with
        none, none). Not when more than MAX_YOUNG_EVENTS are young (a catch-up
        stream: nothing races it), and not at all while this node has not
        declared its place in the tree (`TopicTree.formed`): until then no tree
        carries them. In a join storm the joins go on `forward_fanout` undeclared
        links each, as by push, and the holes that leaves were repaired only by
        announcements and timeouts (200 nodes, a partition from 1 s: every member
        held every join at 4.3 s, after the heal, against 0.63 s by push). Once
        formed, what was applied by the last tick before is still never held
        back (`_sample_delivered`). (Holding back only what came after that last
        tick while unformed, 41,153 events were held back by 200 ms in that
        storm, and every join was everywhere at 0.76 s; holding back none, 0.51 s
        on links that keep order: docs/anti-entropy.md, "FIFO links".)
        """
        samples = self._delivered_at.get(graph.topic_id)
        if not samples or self.config.sync_hold_ms <= 0:
            return None
        tree = self._trees.get(graph.topic_id)
        if tree is None or not tree.formed:
            return None
        cutoff, delivered = samples[0][1], graph.delivered_count
        if cutoff >= delivered or delivered - cutoff > MAX_YOUNG_EVENTS:
            return None
        return cutoff

    def _held_back(self, graph: Graph, ids: list[bytes], now_ms: int,
                   peer: PeerId) -> list[bytes]:
        """`_young_cutoff`, except with a peer whose link opened within FRESH_LINK_MS:
        no tree of ours carries anything to it yet (the other side of a partition that
        a new connection healed, or a newcomer), so what we held back would wait for
        the next exchange."""
        self._held = set()
        opened_ms = self._connected_at.get(peer)
        if opened_ms is not None and now_ms - opened_ms < FRESH_LINK_MS:
            return ids
        cutoff = self._young_cutoff(graph, now_ms)
        if cutoff is None:
            return ids
        kept = [i for i in ids if (graph.position(i) or 0) < cutoff]
        if len(kept) < len(ids):
            self._held = set(ids) - set(kept)
            self.stats["sync_held_back"] += len(self._held)
        return kept

    def _reply_heads(self, graph: Graph, now_ms: int) -> tuple[bytes, ...]:
        """Our heads, less the events the reply holds back (`_held_back`): the peer then
        sees that it holds all we have but those, sends us what we lack exactly (no more:
        old heads made it send back what the peer had and we held back, 0.3 duplicates
        per node and event in bursts) and ends the exchange instead of asking again."""
        held = self._held
        if not held:
            return self._heads(graph)
        heads = [h for h in graph.extremities() if h not in held]
        seen = set(heads)
        for event_id in held:
            for parent in graph.parents_of(event_id) or ():
                if parent not in seen and parent not in held \
                        and all(c in held for c in graph.children(parent)):
                    seen.add(parent)
                    heads.append(parent)
        return tuple(heads[:MAX_HEADS])

    def _ihaves(self, topic: bytes, batches: list[tuple[PeerId, list[bytes]]]) -> list[Effect]:
        out: list[Effect] = []
        for peer, ids in batches:
            if ids and peer in self._peers:
                self.stats["ihave_ids_sent"] += len(ids)
                sent = self._send(peer, IHave(topic, tuple(ids)))
                if sent is not None:
                    out.append(sent)
        return out

    def _on_ihave(self, peer: PeerId, replica: Replica, message: IHave,
                  now_ms: int) -> list[Effect]:
        tree = self._trees.get(replica.topic_id)
        if tree is None:  # not on the tree path here: anti-entropy brings what we lack
            return []
        graph = replica.graph
        self._witness(peer, replica.topic_id, message.ids)
        if tree.announced(peer, message.ids, now_ms, _held_here(graph)):
            # It holds events we lack: a catch-up may ask it for pages (`_page_peer`).
            # On the tree a resumed node hears this from its lazy links, which offer
            # to it no more often than any peer (a 50k catch-up asked one peer only).
            self._note_ahead(replica.topic_id, peer, now_ms)
        return []

    def _on_graft(self, peer: PeerId, replica: Replica, message: Graft,
                  now_ms: int) -> list[Effect]:
        """`peer` named us its parent (the link is eager here from now on); push it the ids
        it asked for (bounded as a want's answer)."""
        tree = self._trees.get(replica.topic_id)
        if tree is not None and tree.child_joined(peer):
            self.stats["grafted"] += 1
        graph = replica.graph
        found = [e for e in (graph.get(i) for i in message.ids) if e is not None]
        if not found:
            return []
        raws = [e.raw for e in found]
        raws, _ = self._take_raws(raws)
        fitting, _ = self._within_budget(peer, replica, now_ms, raws, Push(replica.topic_id, ()))
        if not fitting:
            return []
        self.stats["graft_events_served"] += len(fitting)
        sent = self._spent(peer, self._send(peer, Push(replica.topic_id, tuple(fitting))), now_ms)
        return [sent] if sent is not None else []

    def _on_prune(self, peer: PeerId, replica: Replica, message: Prune,
                  now_ms: int) -> list[Effect]:
        """`peer` is not our child: the link is lazy here unless `peer` is our parent."""
        tree = self._trees.get(replica.topic_id)
        if tree is not None and tree.child_left(peer):
            self.stats["pruned"] += 1
        return []

    _HANDLERS = {Push: _on_push, Offer: AntiEntropy._on_offer, Reply: AntiEntropy._on_reply,
                 Want: AntiEntropy._on_want, Events: AntiEntropy._on_events,
                 IHave: _on_ihave, Graft: _on_graft, Prune: _on_prune,
                 JoinTemplate: JoinHandshake._on_join_template,
                 JoinRefused: JoinHandshake._on_join_refused,
                 JoinSubmit: JoinHandshake._on_join_submit,
                 JoinMissing: JoinHandshake._on_join_missing}
    # What a member we count as banned or kicked still has answered: its removal's past.
    _REMOVED_HANDLERS = {Want: _on_removed_want, Offer: _on_removed_offer}

    # ------------------------------------------------------------- internals: output

    def _send(self, peer: PeerId, message: Message, data: bytes | None = None) -> Send | None:
        """The one way out: a Send of `message`, or None if the read filter withholds it.

        `data`, if given, is `encode(message)` (a caller sending one message to many
        peers encodes it once); for a topic whose history is limited it must be None.
        """
        if type(message) in _GUARDED:
            replica = self._replicas.get(message.topic)
            if replica is not None:
                if not self._may_serve(peer, replica):
                    self.stats["not_member_withheld"] += 1
                    return None
                if type(message) in _CARRIES_EVENTS:
                    # History this reader may not read goes in its withheld form
                    # (node.replica.history_access); one check per event. A node that
                    # cannot judge (no history in its state yet) passes no withheld form
                    # on: the peer might be one who may read the payload.
                    if replica.limits_history():
                        served = replica.served_to(self._key(peer), message.events)
                    else:
                        served = _without_withheld(message.events)
                    if served is not None:
                        self.stats["history_withheld"] += 1
                        if not served and type(message) is Push:
                            return None
                        message = replace(message, events=served)
                        data = None
        return self._emit(peer, message, data)

    def _emit(self, peer: PeerId, message: Message, data: bytes | None = None) -> Send:
        """A Send of `message`, counted, past the read filter: `_send` after its checks,
        or a caller that knows the peer may have it (`_tell_removed`, the join handshake)."""
        data = data if data is not None else encode(message)
        stats = self.stats
        messages_key, bytes_key = _STAT_KEYS[type(message)]
        stats["messages_sent"] += 1
        stats[messages_key] += 1
        stats["bytes_sent"] += len(data)
        stats[bytes_key] += len(data)
        stats["event_bytes_sent"] += event_bytes(message)
        if type(message) in _CARRIES_EVENTS:  # their mean encoded size: event_bytes / events
            stats["events_sent"] += len(message.events)  # type: ignore[union-attr]
        return Send(peer, data)

    def _log(self, record_type: str, now_ms: int, topic: bytes | None, *,
             event: Event | None = None, event_id: bytes | None = None, **fields: Any) -> Log | None:
        if not self.config.log:
            return None
        record: dict[str, Any] = {"v": SCHEMA_VERSION, "ts_ms": now_ms, "node": self.node_id,
                                  "type": record_type}
        if topic is not None:
            record["topic"] = topic.hex()
        if event is not None:
            record["event"] = event.id.hex()
            record["author"] = event.author.hex()
            record["kind"] = event.kind
        elif event_id is not None:
            record["event"] = event_id.hex()
        record.update((k, v) for k, v in fields.items() if v is not None)
        return Log(record)

    @staticmethod
    def _clean(effects: list[Effect | None]) -> list[Effect]:
        if None not in effects:  # the common case when logging is off: no copy
            return effects  # type: ignore[return-value]
        return [e for e in effects if e is not None]
