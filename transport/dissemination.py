"""The dissemination protocol engine of one node: gossip push + anti-entropy, sans-IO.

Theory of operation
-------------------
`Disseminator` drives every topic replica of one node. It never does IO: the
runtime (trio + libp2p) or the simulator hands it bytes, peer events and the
time, and carries out the `Effect`s it returns (`Send`, `Log`, `Disconnect`).
Randomness comes from a seeded `random.Random` passed in, so one seed
reproduces a whole simulated network.

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

1. **Push (gossip fast path).** A published event is pushed to
   `push_fanout` random peers; an event first received by push is forwarded
   once, to `forward_fanout` random peers other than the one it came from
   and its author (infect-and-die gossip: each node relays an event at most once, so an
   event costs at most push_fanout + (n-1)·forward_fanout pushes, about
   forward_fanout receipts per replica, whatever n). Push alone reaches most
   replicas; anti-entropy delivers the rest. Duplicates are recognised by id
   before the signature is checked, so they cost one hash.
2. **Anti-entropy (the guarantee).** Every `sync_interval_ms` (± jitter) each
   topic offers its heads to one random peer; the exchange is Kleppmann &
   Howard's Algorithm 2 made asymmetric, with a depth window for peers we
   hold no state about:

   A → B  Offer(heads_A, since, floor, Bloom of A's events above `floor` not below `since`)
   B → A  Reply(heads_B, events A lacks — parents first, bounded — truncated?, more?)
   A → B  Events(what B lacks), once A holds every head of B

   * B holds every head of A → A lacks exactly `B.not_below(heads_A)`: sent
     at once, no filter needed (a lagging peer catches up in 1 RTT).
   * otherwise `judge_offer`: B walks its events down by depth; in the
     window an event is judged by the filter itself (not in it = missing,
     sent with all its descendants: KH's `neg ∪ succ*(neg)`); an event in
     the filter vouches for its ancestors. An event below the window that
     nothing vouches for cannot be judged: the reply is `truncated` and A
     offers again with a window `window_growth` times deeper.
   * `since`, the per-peer state of Algorithm 2, holds the heads both sides
     were last seen to hold: with it the filter covers exactly A's events
     since then, and two partitions of m events reconcile in 1.5 RTT.
   * Having applied the reply, A holds every head of B and knows exactly
     what B lacks (`A.not_below(heads_B)`): one filter per exchange.
   * Answers are cut at the message bounds; `more` makes the receiver offer
     again with its new heads — the continuation, stateless on the sender.
   * A Bloom false positive only leaves heads of B unknown to A, which then
     offers again with a fresh salt (`max_session_rounds` fruitless offers).
   * An exchange that moved events triggers one more with another peer on
     the next tick (rumor mongering with feedback, Demers et al. 1987), so a
     repair spreads exponentially instead of one hop per interval.
3. **Backstop (Algorithm 1's needs-loop).** Buffered events name parents
   nobody sent; every `want_retry_ms` the missing parents
   (`graph.missing_parents()`) are asked for by id — from the peer that sent
   the child if it is still up — and served from the graph or the buffer.

`tick` also depletes a wide topic with dummy events, behind a randomized,
exponentially growing backoff (see DEFAULT_DEPLETION_BACKOFF_MS) so that n
replicas do not all emit one at once.

Bad input never raises out of the engine: an undecodable message or an
event failing a hard Reference Monitor check is logged with its reason and
counted against the peer (`peer_misbehaviour`); at
`misbehaviour_threshold` a `Disconnect` effect asks the runtime to drop it.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Union

from node.core.event import Event, event_id_of
from node.core.graph import Graph
from node.core.outcomes import AddStatus
from node.replica.replica import Replica
from node.logschema import GOSSIP, SCHEMA_VERSION, SYNC
from transport.defaults import (
    DEFAULT_SYNC_INTERVAL_MS,
    DEFAULT_SYNC_JITTER_MS,
    MISBEHAVIOUR_THRESHOLD,
)
from transport.messages import (
    BLOOM_SALT_BYTES,
    EVENT_FRAMING_BYTES,
    FRAME_HEADROOM_BYTES,
    MAX_BLOOM_BYTES,
    MAX_BLOOM_HASHES,
    MAX_EVENTS_PER_MESSAGE,
    MAX_FRAME_BYTES,
    MAX_HEADS,
    MAX_WANT_IDS,
    MAX_XID,
    BloomFilter,
    Events,
    Message,
    MessageError,
    Offer,
    Push,
    Reply,
    Want,
    decode,
    encode,
    event_bytes,
)

PeerId = str

# ----------------------------------------------------------------- named limits and defaults

DEFAULT_PUSH_FANOUT = 6  # GossipSub's D: copies of each new event its author sends
# Copies a relay sends of an event it accepted first by push (once per event).
# Infect-and-die with fanout k reaches the fraction z = 1 - exp(-k z) of a
# large mesh by push alone (k=3: ~94%, plus the author's wider first hop);
# each replica then receives about k copies of each event, so duplicates per
# event grow as n·(k-1) instead of n·(push_fanout-1). docs/anti-entropy.md
# has the simulator's figures for 5..50 replicas.
DEFAULT_FORWARD_FANOUT = 3
DEFAULT_WANT_RETRY_MS = 500  # > a few one-way latencies: gives push a chance first
# An exchange with no answer for this long counts as lost and the peer may be
# offered to again (a late answer's events are still used). Far above a
# round trip, but short enough that lost replies do not idle a node's peers.
DEFAULT_SESSION_TIMEOUT_MS = 2_000
DEFAULT_MAX_SESSION_ROUNDS = 16  # fruitless offers in one exchange (window growth, FP retries)
DEFAULT_WIDTH_SAMPLE_MS = 1_000
# A replica whose width stays over the depletion threshold waits a random time
# in [0, this) before emitting a dummy, and stands down if the width drops
# meanwhile (someone else's dummy arrived): the randomized suppression timers of
# SRM. Without it every node of a wide topic emits dummies at once, and n
# concurrent dummies are n new extremities — a dummy storm that never settles.
# When a dummy did not bring the width down, the next wait doubles (Ethernet's
# binary exponential backoff), so even a slow network (anti-entropy only,
# where a dummy needs seconds to reach everyone) ends up with fewer concurrent
# dummies than one dummy removes extremities. The wait resets only once the
# width is at most half the threshold (hysteresis): a width hovering around the
# threshold must not keep re-arming short timers.
DEFAULT_DEPLETION_BACKOFF_MS = 5_000
MAX_DEPLETION_BACKOFF_MS = 300_000  # Synapse sends its dummy events every 5 minutes at most
INITIAL_WINDOW_DEPTH = 32  # depth levels a first-contact filter covers
WINDOW_GROWTH = 8  # each truncated reply makes the window this many times deeper
BLOOM_BITS_PER_ITEM = 10  # with 7 hashes: ~0.8% false positives (KH use the same)
BLOOM_HASHES = 7
MAX_BLOOM_ITEMS = MAX_BLOOM_BYTES * 8 // BLOOM_BITS_PER_ITEM
MAX_JUDGE_VISITS = 200_000  # events a responder walks to judge one offer
REPLY_MAX_BYTES = MAX_FRAME_BYTES - FRAME_HEADROOM_BYTES  # event bytes in one answer
MAX_WANT_SOURCES = 65_536  # remembered "who sent the child of this missing parent"
MAX_PEER_STATES = 65_536  # remembered (peer, topic) -> last common heads
MAX_BLAMED_PEERS = 4_096  # peers whose fault counts are remembered (the least suspect go first)

# Reference Monitor reasons a correct peer never causes: it validated the
# event before relaying it. Others (a future timestamp by our clock, a full
# buffer, an antichain verdict on an event it only buffered) are not its fault.
MISBEHAVIOUR_REASONS = frozenset({
    "not_bytes", "too_large", "not_msgpack", "bad_shape", "bad_field", "unknown_version",
    "not_canonical", "too_many_parents", "duplicate_parents", "no_parents",
    "too_many_auth_refs", "duplicate_auth_refs", "state_key_too_long", "bad_signature",
    "id_mismatch", "wrong_topic",
})



# ----------------------------------------------------------------- effects


@dataclass(frozen=True, slots=True)
class Send:
    peer: PeerId
    data: bytes


@dataclass(frozen=True, slots=True)
class Log:
    """One dissemination log record (node.logschema v1 keys; absent fields omitted)."""

    record: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Disconnect:
    peer: PeerId
    reason: str


@dataclass(frozen=True, slots=True)
class Announce:
    """Events authored here, durable, for a fast path outside the engine (GossipSub).

    Emitted for every local event (publishes, acks, joins, state changes,
    dummies, relayed submits) when `DisseminationConfig.announce` is on, so
    an external fast path carries all of them, not only what one API call
    made. Effects of one call keep their order: the runtime may batch the
    announcements of one call into one gossip message.
    """

    topic: bytes
    raws: tuple[bytes, ...]


Effect = Union[Send, Log, Disconnect, Announce]


@dataclass(frozen=True, slots=True)
class DisseminationConfig:
    push: bool = True
    announce: bool = False  # emit `Announce` for local events (an external fast path)
    push_fanout: int = DEFAULT_PUSH_FANOUT
    forward_pushed: bool = True  # relay events first received by push
    forward_fanout: int = DEFAULT_FORWARD_FANOUT  # peers a relay forwards such an event to
    sync_interval_ms: int = DEFAULT_SYNC_INTERVAL_MS
    sync_jitter_ms: int = DEFAULT_SYNC_JITTER_MS
    sync_on_connect: bool = True
    sync_on_news: bool = True  # an exchange that brought events triggers one more (rumor mongering)
    want_retry_ms: int = DEFAULT_WANT_RETRY_MS
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS
    max_session_rounds: int = DEFAULT_MAX_SESSION_ROUNDS
    initial_window_depth: int = INITIAL_WINDOW_DEPTH
    window_growth: int = WINDOW_GROWTH
    use_peer_state: bool = True  # KH Algorithm 2's per-peer common heads
    bloom_bits_per_item: int = BLOOM_BITS_PER_ITEM
    bloom_hashes: int = BLOOM_HASHES
    max_bloom_items: int = MAX_BLOOM_ITEMS
    reply_max_events: int = MAX_EVENTS_PER_MESSAGE
    reply_max_bytes: int = REPLY_MAX_BYTES
    depletion: bool = True  # emit dummy events when the width is over the replica's threshold
    depletion_backoff_ms: int = DEFAULT_DEPLETION_BACKOFF_MS
    width_sample_ms: int = DEFAULT_WIDTH_SAMPLE_MS
    misbehaviour_threshold: int = MISBEHAVIOUR_THRESHOLD
    log: bool = True  # build Log effects (the simulator turns this off when nobody reads them)

    def __post_init__(self) -> None:
        if not 1 <= self.reply_max_events <= MAX_EVENTS_PER_MESSAGE:
            raise ValueError("reply_max_events must be in [1, MAX_EVENTS_PER_MESSAGE]")
        if not 0 < self.reply_max_bytes <= REPLY_MAX_BYTES:
            raise ValueError("reply_max_bytes must be in (0, REPLY_MAX_BYTES]")
        if not 1 <= self.bloom_hashes <= MAX_BLOOM_HASHES or self.bloom_bits_per_item < 1:
            raise ValueError("Bloom filter needs >= 1 bit per item and 1..MAX_BLOOM_HASHES hashes")
        if self.max_bloom_items < 1:
            raise ValueError("max_bloom_items must be >= 1")
        if self.window_growth < 2 or self.initial_window_depth < 1:
            raise ValueError("the depth window must start >= 1 and grow by >= 2")
        if self.sync_jitter_ms < 0 or self.sync_jitter_ms >= self.sync_interval_ms:
            raise ValueError("sync_jitter_ms must be in [0, sync_interval_ms)")
        if self.depletion_backoff_ms < 1:
            raise ValueError("depletion_backoff_ms must be >= 1")
        if self.push_fanout < 0 or self.forward_fanout < 0:
            raise ValueError("push_fanout and forward_fanout must be >= 0")


# ----------------------------------------------------------------- reconciliation walks


def recent_events(graph: Graph, since: Iterable[bytes], floor: int, cap: int) -> tuple[list[bytes], int]:
    """Ids of events here that are not below `since` and have depth >= `floor`.

    `Graph.recent` (the walk lives with the graph's other walks); kept under
    this name for callers of the engine's API. If more than `cap` qualify,
    the deepest whole depth levels that fit are kept and the floor is raised
    to match; returns `(ids, floor actually covered)`.
    """
    return graph.recent(since, floor, cap)


_NONE, _LIKELY, _CERTAIN = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Judgement:
    send: list[bytes]  # what the offerer lacks, parents first
    truncated: bool  # candidates below the filter's floor could not be judged


def judge_offer(graph: Graph, known: set[bytes], floor: int, bloom: BloomFilter, final: bool,
                max_visits: int = MAX_JUDGE_VISITS) -> Judgement:
    """Which of our events does the offerer lack, given its filter (KH Algorithm 2)?

    `known` are ids the offerer certainly holds (its heads and `since` ids we
    know). Walking down by depth, each event is CERTAIN (below a known id),
    LIKELY (below an event the filter claims) or unmarked. Events at depth
    >= `floor` are judged by the filter itself — not in it means missing, no
    false negatives — so a false positive never hides a negative below it.
    An unmarked event below the floor is unjudgeable: the answer is
    truncated, unless the offer is `final`, when it is sent as missing.
    The walk stops once every queued event is marked, so it visits the
    candidates plus a frontier.
    """
    mark: dict[bytes, int] = dict.fromkeys(known, _CERTAIN)
    heap: list[tuple[int, bytes]] = []
    queued: set[bytes] = set()
    uncertain = 0  # queued, not popped, mark < CERTAIN
    unmarked = 0  # queued, not popped, mark == NONE

    def push(event_id: bytes) -> None:
        nonlocal uncertain, unmarked
        if event_id in queued:
            return
        queued.add(event_id)
        level = mark.get(event_id, _NONE)
        uncertain += level < _CERTAIN
        unmarked += level == _NONE
        heapq.heappush(heap, (-(graph.depth(event_id) or 0), event_id))

    def raise_mark(event_id: bytes, level: int) -> None:
        nonlocal uncertain, unmarked
        old = mark.get(event_id, _NONE)
        if level <= old:
            return
        mark[event_id] = level
        # A parent is shallower than the child being popped, so if queued it is still queued.
        if event_id in queued:
            uncertain -= old < _CERTAIN <= level
            unmarked -= old == _NONE

    for event_id in sorted(set(graph.extremities()) | {k for k in known if graph.has(k)}):
        push(event_id)
    judged: list[tuple[int, bytes]] = []  # uncertain events popped, with their depth
    missing: set[bytes] = set()
    visits = 0
    while heap and uncertain > 0:
        if -heap[0][0] < floor and unmarked == 0:
            break  # below the window and everything left is covered
        negative_depth, event_id = heapq.heappop(heap)
        depth = -negative_depth
        level = mark.get(event_id, _NONE)
        uncertain -= level < _CERTAIN
        unmarked -= level == _NONE
        visits += 1
        if visits > max_visits:
            return Judgement([], True)
        if level == _CERTAIN:
            passed = _CERTAIN
        elif depth >= floor:
            judged.append((depth, event_id))
            if event_id in bloom:
                passed = _LIKELY
            else:
                missing.add(event_id)
                passed = _NONE
        elif level == _LIKELY:
            passed = _LIKELY
        elif final:
            judged.append((depth, event_id))
            missing.add(event_id)
            passed = _NONE
        else:
            return Judgement([], True)
        for parent in graph.parents_of(event_id) or ():
            if passed:
                raise_mark(parent, passed)
            push(parent)
    # neg ∪ succ*(neg): in (depth, id) order parents come first, so one pass suffices.
    send: list[bytes] = []
    sending: set[bytes] = set()
    for _, event_id in sorted(judged):
        if event_id in missing or any(p in sending for p in graph.parents_of(event_id) or ()):
            sending.add(event_id)
            send.append(event_id)
    return Judgement(send, False)


# ----------------------------------------------------------------- the engine

_STAT_KEYS = {kind: (f"messages_sent_{kind.__name__.lower()}", f"bytes_sent_{kind.__name__.lower()}")
              for kind in (Push, Offer, Reply, Want, Events)}


@dataclass
class _Session:
    """One anti-entropy exchange we opened with a peer on a topic."""

    peer: PeerId
    topic: bytes
    xid: int
    active_ms: int  # when we last offered: the timeout counts from here
    window: int
    rounds: int = 0  # offers that brought nothing new


@dataclass
class _TopicTimers:
    next_sync_ms: int | None = None
    next_want_ms: int = 0
    next_width_ms: int = 0
    deplete_at_ms: int | None = None
    news_from: PeerId | None = None  # set when sync brought events: spread them on the next tick
    depletion_backoff_ms: int = 0  # current backoff; 0 = the configured base


class Disseminator:
    """Gossip push + anti-entropy for all topic replicas of one node."""

    def __init__(self, node_id: str, rng: random.Random,
                 config: DisseminationConfig = DisseminationConfig(), *,
                 commits: bool = True) -> None:
        """`commits=False`: the driver commits (module docstring), the engine never does."""
        self.node_id = node_id  # lowercase hex (it names the node in logs)
        self.config = config
        self._commits = commits
        self._rng = rng
        self._replicas: dict[bytes, Replica] = {}
        self._timers: dict[bytes, _TopicTimers] = {}
        self._peers: list[PeerId] = []  # sorted: random choices must not depend on hash order
        self._sessions: dict[tuple[PeerId, bytes], _Session] = {}
        self._since: OrderedDict[tuple[PeerId, bytes], tuple[bytes, ...]] = OrderedDict()
        self._want_source: OrderedDict[tuple[bytes, bytes], PeerId] = OrderedDict()
        self._next_xid = 1
        self.peer_misbehaviour: Counter[PeerId] = Counter()
        self.stats: Counter[str] = Counter()
        self._deferring = False  # inside on_batch: commits wait for the end of the batch
        self._accountable = True  # the frame being handled came from its sender (on_message)

    # ------------------------------------------------------------- topology

    def add_topic(self, replica: Replica) -> None:
        self._replicas[replica.topic_id] = replica
        self._timers[replica.topic_id] = _TopicTimers()

    def remove_topic(self, topic: bytes) -> None:
        """Stop replicating `topic` here (the runtime's `leave`); unknown topics are ignored."""
        self._replicas.pop(topic, None)
        self._timers.pop(topic, None)
        for key in [k for k in self._sessions if k[1] == topic]:
            del self._sessions[key]
        for key in [k for k in self._since if k[1] == topic]:
            del self._since[key]
        for key in [k for k in self._want_source if k[0] == topic]:
            del self._want_source[key]

    def replica(self, topic: bytes) -> Replica:
        return self._replicas[topic]

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
        out: list[Effect] = [self._log("peer_up", now_ms, None, peer=peer)]
        if self.config.sync_on_connect:
            for topic in sorted(self._replicas):
                out += self.sync_with(peer, topic, now_ms)
        return self._clean(out)

    def on_peer_down(self, peer: PeerId, now_ms: int) -> list[Effect]:
        if peer not in self._peers:
            return []
        self._peers.remove(peer)
        for key in [k for k in self._sessions if k[0] == peer]:
            del self._sessions[key]
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
        out += self._spread_local(topic, [e.raw for e in events])
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
        try:
            for topic, events in published:
                out += self.announce(topic, events, now_ms)
            for frame in frames:
                out += self.on_message(frame[0], frame[1], now_ms,
                                       accountable=frame[2] if len(frame) > 2 else True)
        finally:
            self._deferring = False
        for topic in sorted(self._replicas) if self._commits else ():
            replica = self._replicas[topic]
            if replica.graph.pending_ops:
                replica.commit()
                self.stats["batch_commits"] += 1
        self.stats["batches"] += 1
        return self._clean(out)

    def tick(self, now_ms: int, rng: random.Random | None = None) -> list[Effect]:
        """Periodic work: expire exchanges, deplete width, offer heads, retry wants, sample width.

        `rng` overrides the engine's random stream for this call.
        """
        rng = rng or self._rng
        out: list[Effect] = []
        timeout = self.config.session_timeout_ms
        for key in [k for k, s in self._sessions.items() if now_ms - s.active_ms > timeout]:
            del self._sessions[key]
            self.stats["sessions_timed_out"] += 1
        for topic in sorted(self._replicas):
            out += self._tick_topic(topic, now_ms, rng)
        return self._clean(out)

    def sync_with(self, peer: PeerId, topic: bytes, now_ms: int) -> list[Effect]:
        """Open an anti-entropy exchange with `peer` on `topic` now (tick does this on a timer)."""
        current = self._sessions.get((peer, topic))
        if current is not None and now_ms - current.active_ms <= self.config.session_timeout_ms:
            return []  # one exchange at a time per peer and topic
        session = _Session(peer, topic, xid=0, active_ms=now_ms,
                           window=self.config.initial_window_depth)
        self._sessions[(peer, topic)] = session
        self.stats["sessions"] += 1
        return self._clean([self._offer(session, now_ms)])

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
        try:
            try:
                message = decode(data)
            except MessageError as error:
                return self._clean(self._blame(peer, now_ms, None,
                                               f"bad_message:{error.reason}"))
            replica = self._replicas.get(message.topic)
            if replica is None:
                self.stats["unknown_topic"] += 1  # not a fault: the peer may serve topics we do not
                return []
            handler = self._HANDLERS[type(message)]
            return self._clean(handler(self, peer, replica, message, now_ms))
        finally:
            self._accountable = True

    def _on_push(self, peer: PeerId, replica: Replica, message: Push, now_ms: int) -> list[Effect]:
        out: list[Effect] = []
        fresh = self._ingest(peer, replica, message.events, GOSSIP, now_ms, out)
        if fresh and self.config.forward_pushed:
            # Only events new here (each node relays an event at most once), never
            # to a peer sure to hold them (the sender, their author), to a bounded
            # number of others.
            holders = self._holders(replica, peer, fresh)
            out += self._push(replica.topic_id, fresh, exclude=holders,
                              fanout=self.config.forward_fanout)
        return out

    def _on_offer(self, peer: PeerId, replica: Replica, offer: Offer, now_ms: int) -> list[Effect]:
        graph = replica.graph
        known_since = [s for s in offer.since if graph.has(s)]
        limit = self.config.reply_max_events
        if all(graph.has(h) for h in offer.heads):
            # We hold all of the offerer's graph: what it lacks is exact, no filter needed.
            ids = graph.not_below(list(offer.heads) + known_since, limit=limit + 1)
            truncated = False
            if offer.heads:
                self._remember_since(peer, replica.topic_id, offer.heads)
            self.stats["offers_exact"] += 1
        else:
            known = {h for h in offer.heads if graph.has(h)} | set(known_since)
            judgement = judge_offer(graph, known, offer.floor, offer.bloom, offer.final)
            ids, truncated = judgement.send, judgement.truncated
            self.stats["offers_judged"] += 1
            self.stats["offers_truncated"] += truncated
        events, more = self._take(graph, ids[:limit])
        reply = Reply(replica.topic_id, offer.xid, self._heads(graph), truncated,
                      more or len(ids) > limit, tuple(events))
        if events:
            self._note_news(replica.topic_id, peer)  # the offerer lacked something
        return [self._send(peer, reply)]

    def _on_reply(self, peer: PeerId, replica: Replica, reply: Reply, now_ms: int) -> list[Effect]:
        out: list[Effect] = []
        fresh = self._ingest(peer, replica, reply.events, SYNC, now_ms, out)
        session = self._sessions.get((peer, replica.topic_id))
        if session is None or session.xid != reply.xid:
            self.stats["stale_replies"] += 1  # the events were still worth keeping
            return out
        graph = replica.graph
        if all(graph.has(h) for h in reply.heads):
            # We now hold all of the peer's graph, so we know exactly what it lacks.
            del self._sessions[(peer, replica.topic_id)]
            if reply.heads:
                self._remember_since(peer, replica.topic_id, reply.heads)
            out += self._send_missing(peer, graph, reply.heads, reply.xid)
            return out
        # Only rounds that brought nothing new count against the bound: a long
        # catch-up (`more`, one message per round trip) is progress, not a loop.
        if not fresh:
            session.rounds += 1
            if session.rounds >= self.config.max_session_rounds:
                del self._sessions[(peer, replica.topic_id)]
                self.stats["sessions_abandoned"] += 1
                return out
        if reply.truncated:
            session.window *= self.config.window_growth
        # more: continuation; neither flag: a Bloom false positive hid something (fresh salt).
        out.append(self._offer(session, now_ms))
        return out

    def _on_events(self, peer: PeerId, replica: Replica, message: Events, now_ms: int) -> list[Effect]:
        out: list[Effect] = []
        self._ingest(peer, replica, message.events, SYNC, now_ms, out)
        if message.more:
            # The sender had more than one message's worth: continue by offering our new heads.
            out += self.sync_with(peer, replica.topic_id, now_ms)
        return out

    def _on_want(self, peer: PeerId, replica: Replica, want: Want, now_ms: int) -> list[Effect]:
        graph = replica.graph
        found: list[Event] = []
        for event_id in want.ids:
            event = graph.get(event_id) or graph.buffered_event(event_id)
            if event is not None:
                found.append(event)
        if not found:
            return []
        raws, _ = self._take_raws([e.raw for e in found])  # the rest: asked again later
        self.stats["wants_served"] += len(raws)
        return [self._send(peer, Events(replica.topic_id, 0, False, tuple(raws)))]

    _HANDLERS = {Push: _on_push, Offer: _on_offer, Reply: _on_reply, Want: _on_want,
                 Events: _on_events}

    # ------------------------------------------------------------- internals: topics

    def _tick_topic(self, topic: bytes, now_ms: int, rng: random.Random) -> list[Effect]:
        replica = self._replicas[topic]
        timers = self._timers[topic]
        out: list[Effect] = []
        if self.config.depletion:
            out += self._deplete(topic, replica, timers, now_ms, rng)
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
            self.stats["news_syncs"] += 1
            out += self._sync_random(topic, now_ms, rng, exclude=news_from)
        if now_ms >= timers.next_want_ms:
            timers.next_want_ms = now_ms + self.config.want_retry_ms
            out += self._wants(topic, replica, rng)
        if self.config.log and now_ms >= timers.next_width_ms:
            timers.next_width_ms = now_ms + self.config.width_sample_ms
            out.append(self._log("width", now_ms, topic, width=replica.graph.width,
                                 buffered=replica.graph.buffered_count))
        return out

    def _sync_random(self, topic: bytes, now_ms: int, rng: random.Random,
                     exclude: PeerId | None) -> list[Effect]:
        idle = [p for p in self._peers if p != exclude and self._idle(p, topic, now_ms)]
        return self.sync_with(rng.choice(idle), topic, now_ms) if idle else []

    def _idle(self, peer: PeerId, topic: bytes, now_ms: int) -> bool:
        session = self._sessions.get((peer, topic))
        return session is None or now_ms - session.active_ms > self.config.session_timeout_ms

    def _deplete(self, topic: bytes, replica: Replica, timers: _TopicTimers, now_ms: int,
                 rng: random.Random) -> list[Effect]:
        width = replica.graph.width
        threshold = replica.config.depletion.threshold
        if not replica.ready or width <= threshold:
            timers.deplete_at_ms = None  # someone's dummy (or ours) did the job
            if width <= threshold // 2:
                timers.depletion_backoff_ms = 0
            return []
        if timers.deplete_at_ms is None:
            backoff = timers.depletion_backoff_ms or self.config.depletion_backoff_ms
            timers.deplete_at_ms = now_ms + rng.randrange(backoff)
            timers.depletion_backoff_ms = min(2 * backoff, MAX_DEPLETION_BACKOFF_MS)
            return []
        if now_ms < timers.deplete_at_ms:
            return []
        timers.deplete_at_ms = None
        made = replica.maybe_deplete(now_ms, rng)
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
        return out + self._spread_local(topic, [event.raw])

    def _wants(self, topic: bytes, replica: Replica, rng: random.Random) -> list[Effect]:
        if not self._peers or not replica.graph.buffered_count:
            return []
        by_peer: dict[PeerId, list[bytes]] = {}
        graph = replica.graph
        for parent in graph.missing_parents(MAX_WANT_IDS):
            if graph.rejected_reason(parent) is not None:
                # We rejected it when it came (e.g. parents not an antichain); asking
                # again would only fetch it to reject it again, every retry, forever.
                continue
            source = self._want_source.get((topic, parent))
            if source not in self._peers:
                source = rng.choice(self._peers)
            by_peer.setdefault(source, []).append(parent)
        self.stats["wants_sent"] += sum(len(v) for v in by_peer.values())
        if not by_peer:
            return []
        return [self._send(peer, Want(topic, tuple(ids))) for peer, ids in sorted(by_peer.items())]

    def _heads(self, graph: Graph) -> tuple[bytes, ...]:
        # A wider graph offers a subset: the peer then sends a little more than needed.
        return tuple(graph.extremities()[:MAX_HEADS])

    def _remember_since(self, peer: PeerId, topic: bytes, heads: Sequence[bytes]) -> None:
        if not self.config.use_peer_state:
            return
        key = (peer, topic)
        self._since[key] = tuple(heads[:MAX_HEADS])
        self._since.move_to_end(key)
        while len(self._since) > MAX_PEER_STATES:
            self._since.popitem(last=False)

    def _offer(self, session: _Session, now_ms: int) -> Send:
        graph = self._replicas[session.topic].graph
        since = self._since.get((session.peer, session.topic), ())
        if since:
            floor = 0  # KH Algorithm 2: everything since the common heads
        else:
            top = max((graph.depth(h) or 0 for h in graph.extremities()), default=0)
            floor = max(0, top - session.window)
        # The filter must fit MAX_BLOOM_BYTES whatever the bits per item.
        cap = min(self.config.max_bloom_items,
                  MAX_BLOOM_BYTES * 8 // self.config.bloom_bits_per_item)
        ids, covered = recent_events(graph, since, floor, cap)
        bloom = BloomFilter.build(ids, self._rng.randbytes(BLOOM_SALT_BYTES),
                                  self.config.bloom_bits_per_item, self.config.bloom_hashes)
        session.xid = self._new_xid()
        session.active_ms = now_ms
        self.stats["offers_sent"] += 1
        return self._send(session.peer, Offer(
            session.topic, session.xid, self._heads(graph), since, covered,
            covered > floor, bloom))

    def _new_xid(self) -> int:
        xid = self._next_xid
        self._next_xid = 1 if xid >= MAX_XID else xid + 1
        return xid

    def _send_missing(self, peer: PeerId, graph: Graph, heads: Sequence[bytes], xid: int) -> list[Effect]:
        limit = self.config.reply_max_events
        ids = graph.not_below(heads, limit=limit + 1)
        if not ids:
            return []
        events, more = self._take(graph, ids[:limit])
        self._note_news(graph.topic_id, peer)  # the peer lacked something
        return [self._send(peer, Events(graph.topic_id, xid, more or len(ids) > limit,
                                        tuple(events)))]

    def _take(self, graph: Graph, ids: Sequence[bytes]) -> tuple[list[bytes], bool]:
        raws = []
        for event_id in ids:
            event = graph.get(event_id)
            if event is not None:
                raws.append(event.raw)
        return self._take_raws(raws)

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

    def _spread_local(self, topic: bytes, raws: list[bytes]) -> list[Effect]:
        """The fast path for events authored here: push them, and announce them if asked."""
        out = self._push(topic, raws, exclude=(), fanout=self.config.push_fanout)
        if self.config.announce and raws:
            out.append(Announce(topic, tuple(raws)))
        return out

    def _push(self, topic: bytes, raws: list[bytes], exclude: Sequence[PeerId],
              fanout: int) -> list[Effect]:
        if not self.config.push or fanout <= 0:
            return []
        candidates = [p for p in self._peers if p not in exclude]
        if not candidates:
            return []
        chosen = self._rng.sample(candidates, min(fanout, len(candidates)))
        out: list[Effect] = []
        while raws:
            batch, _ = self._take_raws(raws)
            batch = batch or raws[:1]
            raws = raws[len(batch):]
            data = None
            for peer in sorted(chosen):
                sent = self._send(peer, Push(topic, tuple(batch)), data)
                data = sent.data
                out.append(sent)
        return out

    # ------------------------------------------------------------- internals: ingest

    def _ingest(self, peer: PeerId, replica: Replica, raws: Sequence[bytes], channel: str,
                now_ms: int, out: list[Effect]) -> list[bytes]:
        """Receive a batch, commit it once, log it; return the raws that were new here."""
        graph = replica.graph
        topic = replica.topic_id
        logging = self.config.log
        fresh: list[bytes] = []
        for raw in raws:
            event_id = event_id_of(raw)
            # Content-addressed: a known id is these very bytes, so skip the signature
            # check. The hot path: each node hears each event about forward_fanout times.
            if graph.has(event_id) or graph.is_buffered(event_id):
                self.stats["duplicates"] += 1
                if logging:
                    out.append(self._log("duplicate", now_ms, topic, event_id=event_id,
                                         channel=channel))
                continue
            outcome = replica.receive(raw, now_ms)
            if outcome.status is AddStatus.REJECTED:
                reason = outcome.reason or "rejected"
                out.append(self._log("rejected", now_ms, topic, event_id=event_id, reason=reason))
                if reason in MISBEHAVIOUR_REASONS:
                    out += self._blame(peer, now_ms, topic, reason, log=False)
                continue
            if outcome.status is AddStatus.DUPLICATE:
                self.stats["duplicates"] += 1
                continue
            fresh.append(raw)
            self.stats[f"received_{channel}"] += 1
            out.append(self._log("received", now_ms, topic, event_id=event_id, channel=channel))
            if outcome.status is AddStatus.BUFFERED:
                out.append(self._log("buffered", now_ms, topic, event_id=event_id))
                for parent in outcome.missing:
                    self._note_want_source(topic, parent, peer)
            # Events failing the topic's auth rules stay vertices (and are still
            # gossiped) but are never delivered to subscribers: log them as rejected.
            unauthorized = dict(outcome.unauthorized)
            for event in outcome.applied:
                if event.id in unauthorized:
                    out.append(self._log("rejected", now_ms, topic, event=event,
                                         reason=unauthorized[event.id]))
                else:
                    out.append(self._log("delivered", now_ms, topic, event=event,
                                         channel=channel, depth=graph.depth(event.id)))
            for rejected_id, reason in outcome.rejected_ids:
                if rejected_id != event_id:
                    out.append(self._log("rejected", now_ms, topic, event_id=rejected_id,
                                         reason=reason))
        if graph.pending_ops and self._commits and not self._deferring:
            # Durable before anything is forwarded or answered (in a batch,
            # on_batch commits once at its end, before returning any effect;
            # a driven engine's driver commits before carrying any out).
            replica.commit()
        if fresh and channel == SYNC:
            self._note_news(topic, peer)
        return fresh

    def _note_news(self, topic: bytes, peer: PeerId) -> None:
        """An exchange moved events (either way): others may lack them too."""
        self._timers[topic].news_from = peer

    def _note_want_source(self, topic: bytes, parent: bytes, peer: PeerId) -> None:
        self._want_source[(topic, parent)] = peer
        self._want_source.move_to_end((topic, parent))
        while len(self._want_source) > MAX_WANT_SOURCES:
            self._want_source.popitem(last=False)

    def _blame(self, peer: PeerId, now_ms: int, topic: bytes | None, reason: str,
               log: bool = True) -> list[Effect]:
        """Count a hard fault against `peer`; at the threshold, ask to disconnect it.

        The count starts again after a disconnect, so a peer that comes back
        (its ban expired) and misbehaves again is dropped again. Only peers
        with faults are counted, and at most MAX_BLAMED_PEERS of them.
        """
        out: list[Effect] = []
        if log:
            out.append(self._log("rejected", now_ms, topic, reason=reason, peer=peer))
        if not self._accountable:
            self.stats["unattributed_faults"] += 1
            return out
        self.stats["misbehaviour"] += 1
        counts = self.peer_misbehaviour
        counts[peer] += 1
        if counts[peer] >= self.config.misbehaviour_threshold:
            del counts[peer]
            out.append(Disconnect(peer, reason))
        elif len(counts) > MAX_BLAMED_PEERS:
            del counts[min(counts, key=counts.__getitem__)]  # forget the least suspect
        return out

    # ------------------------------------------------------------- internals: output

    def _send(self, peer: PeerId, message: Message, data: bytes | None = None) -> Send:
        data = data if data is not None else encode(message)
        stats = self.stats
        messages_key, bytes_key = _STAT_KEYS[type(message)]
        stats["messages_sent"] += 1
        stats[messages_key] += 1
        stats["bytes_sent"] += len(data)
        stats[bytes_key] += len(data)
        stats["event_bytes_sent"] += event_bytes(message)
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
