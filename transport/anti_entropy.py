"""The anti-entropy exchanges and the want backstop of the engine (its repair half).

Push (`transport.dissemination`) reaches most replicas; this is what makes
every replica get every event. Two mechanisms:

* **Anti-entropy exchanges.** Every `sync_interval_ms` (± jitter) each topic
  offers its heads to one random idle peer (`sync_with`), and the two
  reconcile by KH's Algorithm 2 (`transport.reconcile` judges the offer;
  the Offer/Reply/Events exchange is drawn there). This module keeps the
  per-exchange state (`_Session`: one open exchange per peer and topic, its
  depth window, its fruitless rounds) and the per-peer state of Algorithm 2
  (`since`: the heads both sides were last seen to hold, LRU-bounded).
  Having applied a reply, the offerer holds every head of the peer and knows
  exactly what it lacks: one filter per exchange. Answers are cut at the
  message bounds; `more` makes the receiver offer again with its new heads —
  the continuation, stateless on the sender. A Bloom false positive leaves
  heads unknown, so the offerer offers again with a fresh salt, at most
  `max_session_rounds` fruitless times. A long catch-up is one stream of
  pages per topic (`_streaming`), each page asked for as the one before it
  arrives (`prefetch`), of the peers seen holding the range in turn
  (`_page_peer`); docs/anti-entropy.md "Catch-up at ingest speed".
* **The backstop (Algorithm 1's needs-loop).** Buffered events name parents
  nobody sent; every `want_retry_ms` the missing parents are asked for by id
  (`Want`) — from the peer that sent the child if it is still up — and served
  from the graph or the buffer.

What one peer can make this half spend is bounded (`transport.peer_budget`):
offers are answered at most `offers_per_s` per peer and topic, every answer
(Reply, Events to a Reply or a Want) to a peer not yet trusted fits the
bytes it sent times `amplification_factor` plus a free allowance, and an
offer naming heads its own filter does not hold (`_impossible`) is not
answered and counts against the peer (`transport.misbehaviour`).

`AntiEntropy` is a mixin of `Disseminator`, split off so each half reads on
its own; it owns the state `_init_anti_entropy` makes and uses the engine's
(listed in the class body) and its `_send`, `_note_news`, `_take_raws` and
`_clean`, and `_ingest` (`transport.intake`).
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from node.core.event import Event, claimed_parents, event_id_of
from node.core.graph import Graph
from node.logschema import EXCHANGE_TIMEOUT, SYNC
from node.replica.replica import Replica
from node.state.types import Membership
from transport.dissemination_config import (MAX_PEER_STATES, MAX_WANT_SOURCES,
                                            MAX_WITNESSED_IDS, MAX_WITNESSED_STATES, PAGES_AHEAD,
                                            DisseminationConfig)
from transport.effects import Effect, PeerId, Send
from transport.misbehaviour import Fault
from transport.peer_budget import AnswerBudget, RateBucket
from transport.messages import (
    BLOOM_SALT_BYTES,
    EVENT_FRAMING_BYTES,
    MAX_HEADS,
    MAX_WANT_IDS,
    MAX_XID,
    TAG_REPLY,
    WIRE_VERSION,
    MessageError,
    BloomFilter,
    Events,
    Message,
    Offer,
    Reply,
    Want,
    decode,
    encode,
)
from transport.reconcile import (MAX_SINCE_VISITS, filter_capacity, judge_offer, offer_floor,
                                 recent_events, topmost)

# A pause of the node itself (SIGSTOP, suspension; no tick for this long) that
# ends the exchanges open before it rather than waiting on: half the peers'
# write timeout (`transport.libp2p_streams.MESSAGE_WRITE_TIMEOUT_S`, 10 s), after
# which a peer resets its stream to us and the answers queued on it are lost;
# far above the loop stalls of a loaded machine (1-3 s), which keep a stream.
LONG_ABSENCE_MS: Final = 5_000
# An exchange's timeout follows how long the peer has taken to answer (like
# TCP's retransmission timeout): at least `session_timeout_ms`, else this many
# times its smoothed answer time, at most `MAX_SESSION_TIMEOUT_MS`. On a loaded
# machine a page of 1,024 events takes its peer seconds to prepare and us
# seconds to reach; a fixed 2 s timed such exchanges out (and, no longer
# counted as streaming, let duplicate answers in) though the peer was answering.
ANSWER_TIMEOUT_FACTOR: Final = 4
ANSWER_SMOOTHING: Final = 0.125  # weight of the newest answer time (TCP's 1/8)
MAX_SESSION_TIMEOUT_MS: Final = 20_000  # a silent peer's exchange times out by then at the latest
# Just back from an absence, the backlog our peers queued for us while we were
# away (their pushes) fills the connections, and the answers to the exchanges we
# open on resuming wait behind it: a peer whose frames keep reaching us is busy,
# not silent. For this long after an absence an exchange does not time out while
# the peer was heard within the last `session_timeout_ms` (the catch-up bench's
# 10k resume: 3 opening exchanges timed out that way, their answers on the way).
# Bounded: a peer that keeps sending but never answers is timed out by then.
RESUME_PATIENCE_MS: Final = 20_000
# Peers one catch-up asks its pages of, in turn (`prefetch`): the peer that
# streams and up to two more seen holding what we lack (they offered heads we
# lack, or answered with `more`). Each page is asked of one peer only, so
# every event still crosses once; the serving work is spread, and a peer lost
# mid-stream costs only its one page in flight (the next exchange resumes).
MAX_STREAM_PEERS: Final = 3
# How long a peer seen ahead of us stays a candidate to serve pages.
AHEAD_FRESH_MS: Final = 30_000


@dataclass
class _Session:
    """One anti-entropy exchange we opened with a peer on a topic."""

    peer: PeerId
    topic: bytes
    xid: int
    active_ms: int  # when we last offered (or the offer left): the timeout counts from here
    window: int
    rounds: int = 0  # offers that brought nothing new
    streaming: bool = False  # the last reply said `more`: a catch-up runs on this exchange
    waiting: bool = True  # an offer of ours waits for its answer (else: pages queued, or idle)
    # Pipelining (`prefetch`): the offer we last sent (its filter is reused for the
    # next page's offer) and the xids of pages received but not applied yet.
    offer: Offer | None = None
    queued: set[int] = field(default_factory=set)


class AntiEntropy:
    """Anti-entropy exchanges and wants; a mixin of `Disseminator` (module docstring)."""

    # The engine's state this half reads (set by `Disseminator.__init__`).
    config: DisseminationConfig
    stats: Counter[str]
    _rng: random.Random
    _peers: list[PeerId]
    _replicas: dict[bytes, Replica]
    _answers: AnswerBudget
    _offer_rate: RateBucket

    if TYPE_CHECKING:  # the engine's (and its intake's) methods this half calls
        def _send(self, peer: PeerId, message: Message, data: bytes | None = None) -> Send | None: ...
        def _may_serve(self, peer: PeerId, replica: Replica) -> bool: ...
        def _serving(self, replica: Replica, peers: Sequence[PeerId]) -> list[PeerId]: ...
        def _ingest(self, peer: PeerId, replica: Replica, raws: Sequence[bytes], channel: str,
                    now_ms: int, out: list[Effect]) -> list[bytes]: ...
        def _note_news(self, topic: bytes, peer: PeerId) -> None: ...
        def _take_raws(self, raws: Sequence[bytes]) -> tuple[list[bytes], bool]: ...
        def _clean(self, effects: Sequence[Effect | None]) -> list[Effect]: ...
        def _key(self, peer: PeerId) -> bytes | None: ...
        def _join_unheard(self, peer: PeerId, topic: bytes, now_ms: int) -> list[Effect]: ...
        def _blame(self, peer: PeerId, now_ms: int, topic: bytes | None, reason: str,
                   log: bool = True, fault: Fault = Fault.HARD) -> list[Effect]: ...
        def _log(self, record_type: str, now_ms: int, topic: bytes | None, *,
                 event: Event | None = None, event_id: bytes | None = None,
                 **fields: Any) -> Effect | None: ...

    def _init_anti_entropy(self) -> None:
        self._sessions: dict[tuple[PeerId, bytes], _Session] = {}
        self._since: OrderedDict[tuple[PeerId, bytes], tuple[bytes, ...]] = OrderedDict()
        # (peer, topic) -> ids the peer last pushed, announced or offered (`_witness`).
        self._witnessed: OrderedDict[tuple[PeerId, bytes], deque[bytes]] = OrderedDict()
        self._want_source: OrderedDict[tuple[bytes, bytes], PeerId] = OrderedDict()
        self._next_xid = 1
        self._offered: list[_Session] = []  # offers of the current step (`offers_sent_at`)
        self._last_due_ms: int | None = None  # the driver's last tick (`_discount_absence`)
        self._resumed_ms: int | None = None  # when the last absence ended (`_expecting`)
        self._resumed_long = False  # it lasted LONG_ABSENCE_MS or more
        # When a frame of each peer last reached the driver (`prefetch` sees them
        # all): tells a timed-out exchange's lost answer from a silent peer.
        self._heard_ms: dict[PeerId, int] = {}
        self._answer_ms: dict[PeerId, float] = {}  # smoothed answer time per peer (`_timeout`)
        # topic -> (peer, when): we answered that peer's offer naming heads we lack, so
        # its Events with our missing pages are on their way (`_on_offer`): no second
        # peer is asked for the same pages meanwhile (`_streaming`).
        self._expecting: dict[bytes, tuple[PeerId, int]] = {}
        # topic -> peers seen holding what we lack (peer -> when): who may serve pages.
        self._ahead: dict[bytes, OrderedDict[PeerId, int]] = {}
        # topic -> the heads we will hold once every page received is applied.
        self._frontier: dict[bytes, tuple[bytes, ...]] = {}
        self._turn = 0  # round robin over a catch-up's peers (`_page_peer`)

    def _forget_topic(self, topic: bytes) -> None:
        for key in [k for k in self._sessions if k[1] == topic]:
            del self._sessions[key]
        for key in [k for k in self._since if k[1] == topic]:
            del self._since[key]
        for key in [k for k in self._witnessed if k[1] == topic]:
            del self._witnessed[key]
        for key in [k for k in self._want_source if k[0] == topic]:
            del self._want_source[key]
        self._expecting.pop(topic, None)
        self._ahead.pop(topic, None)
        self._frontier.pop(topic, None)

    def _forget_peer(self, peer: PeerId) -> None:
        for key in [k for k in self._sessions if k[0] == peer]:
            del self._sessions[key]
        self._heard_ms.pop(peer, None)
        self._answer_ms.pop(peer, None)
        for topic in [t for t, (p, _) in self._expecting.items() if p == peer]:
            del self._expecting[topic]
        for ahead in self._ahead.values():
            ahead.pop(peer, None)

    def _relink(self, peer: PeerId, now_ms: int) -> list[Effect]:
        """A connection to `peer` closed while another remains: offer again now what waits.

        Our offer (or the peer's answer) may have gone with the closed
        connection; waiting for it would only time the exchange out. The
        exchange starts again on the connection that remains: a streaming
        one stays the topic's stream (`sync_with(streaming=...)`).
        """
        out: list[Effect] = []
        for (other, topic), session in list(self._sessions.items()):
            if other != peer or not session.waiting:
                continue
            del self._sessions[(other, topic)]
            self.stats["sessions_relinked"] += 1
            out += self.sync_with(peer, topic, now_ms, streaming=session.streaming)
            again = self._sessions.get((peer, topic))
            if again is not None:
                again.queued = session.queued  # pages received, not applied yet: still ours
        return out

    def _expire_sessions(self, now_ms: int) -> list[Effect | None]:
        """Drop the exchanges whose peer has been silent for `session_timeout_ms` at `now_ms`.

        The timeout is about the peer's silence, not about our own backlog: a
        driver whose steps queue behind a long catch-up passes the time the
        tick was *due* (`tick(due_ms=...)`), so an answer that reached us
        before then but still waits in our queue does not count as lost.
        Counted by kind: `sessions_timed_out:opening|streaming`, with
        `:heard` when other frames of the peer reached us after our offer
        (its answer was lost, or is queued behind them at the peer), and
        logged (`exchange_timeout`, that kind as its reason).
        """
        out: list[Effect | None] = []
        for key in [k for k, s in self._sessions.items() if not self._alive(s, now_ms)]:
            session = self._sessions.pop(key)
            if not session.waiting:
                continue  # a catch-up's peer whose turn passed: nothing was asked of it
            self.stats["sessions_timed_out"] += 1
            # Which exchange waited (diagnosis: the catch-up bench reports these).
            kind = "streaming" if session.streaming else "opening"
            heard = self._heard_ms.get(session.peer, -1) > session.active_ms
            reason = f"{kind}{':heard' if heard else ''}"
            self.stats[f"sessions_timed_out:{reason}"] += 1
            out.append(self._log(EXCHANGE_TIMEOUT, now_ms, session.topic, peer=session.peer,
                                 reason=reason))
            if not heard and not session.streaming:
                # Not a word from it since our offer: maybe it does not know us at all
                # (transport.join_handshake, "A sponsor that also invited").
                out += self._join_unheard(session.peer, session.topic, now_ms)
        return out

    def _alive(self, session: _Session, now_ms: int) -> bool:
        """Is `session`'s peer still answering, as of `now_ms`? (`_expire_sessions`)"""
        # (A session with pages waiting in our own queue is not waiting on its peer.)
        if now_ms - session.active_ms <= self._timeout(session.peer) or session.queued:
            return True
        # Just resumed: a peer still delivering its backlog to us is busy, not silent.
        resumed = self._resumed_ms
        return (resumed is not None and now_ms - resumed <= RESUME_PATIENCE_MS
                and self._heard_ms.get(session.peer, -1) >= now_ms - self.config.session_timeout_ms
                and self._heard_ms[session.peer] > session.active_ms)

    def _timeout(self, peer: PeerId) -> int:
        """How long `peer` may stay silent on an exchange (`ANSWER_TIMEOUT_FACTOR`)."""
        base = self.config.session_timeout_ms
        smoothed = self._answer_ms.get(peer)
        if smoothed is None:
            return base
        return int(min(max(base, ANSWER_TIMEOUT_FACTOR * smoothed),
                       max(base, MAX_SESSION_TIMEOUT_MS)))

    def _note_answer_time(self, peer: PeerId, took_ms: int) -> None:
        smoothed = self._answer_ms.get(peer)
        self._answer_ms[peer] = float(took_ms) if smoothed is None else (
            smoothed + ANSWER_SMOOTHING * (took_ms - smoothed))

    def note_due(self, due_ms: int) -> None:
        """The driver queued a tick at `due_ms`; told before the step's frames are handled.

        So an absence is known (`_discount_absence`) before the offers that
        waited in our sockets during it are answered (`_expecting`). The tick
        itself tells it again, which changes nothing.
        """
        self._discount_absence(due_ms)

    def _discount_absence(self, due_ms: int) -> None:
        """Time we could not listen does not count as the peers' silence.

        A driver that queues a tick every few tens of ms (`tick(due_ms=...)`)
        and queues none for half a timeout was not running: SIGSTOPped,
        suspended, or its loop blocked. Answers sent meanwhile wait in our
        sockets; without this the first tick after the pause would time out
        every exchange open before it, answers unread.

        After an absence of `LONG_ABSENCE_MS` or more the exchanges open
        before it are ended instead (`sessions_interrupted`, not timed out:
        the peer did nothing wrong). Their answers may be lost: a peer whose
        writes to us stalled that long resets the stream, and the frames
        queued on it go with it (`transport.libp2p_messages`). An answer
        that did survive is still applied when it comes (a stale reply) and
        carries a catch-up on; the next exchanges offer the heads held now.
        """
        last, self._last_due_ms = self._last_due_ms, max(due_ms, self._last_due_ms or due_ms)
        if last is None or due_ms <= last:
            return
        away = due_ms - last
        if away > self.config.session_timeout_ms // 2:
            self._resumed_ms = due_ms
            self._resumed_long = away >= LONG_ABSENCE_MS
        if away >= LONG_ABSENCE_MS:
            self.stats["absences"] += 1
            self.stats["sessions_interrupted"] += len(self._sessions)
            self._sessions.clear()
            self._expecting.clear()
            self._frontier.clear()
        elif away > self.config.session_timeout_ms // 2:
            self.stats["absences"] += 1
            for session in self._sessions.values():
                session.active_ms += away

    def offers_sent_at(self, now_ms: int) -> None:
        """The driver carried out this step's effects at `now_ms`: its offers left then.

        A step that verifies a large answer takes a while; an offer made in it
        leaves only when the step ends, so its exchange's timeout counts from
        then (`node.committer` calls this after each step; the simulator, whose
        steps take no time, need not).
        """
        for session in self._offered:
            session.active_ms = max(session.active_ms, now_ms)
        self._offered.clear()

    def _solicited(self, peer: PeerId, message: Message) -> bool:
        """Is `message` the answer to the exchange we have open with `peer`, and `peer` trusted?

        Such a Reply is not charged to the peer's intake event budget
        (`transport.intake_budget`): we asked for it, one answer per offer, at
        most `reply_max_events`, and a catch-up continues only while answers
        apply events here (`_on_reply`), so what a peer can make us take in this
        way is bounded by our own offers. The peer must be trusted (it handed
        over an applied, authorized event, or is a member): a trusted peer's
        catch-up runs at ingest speed instead of `PEER_EVENTS_PER_S` once the
        burst is spent, while a stranger's answers stay budgeted.
        """
        if type(message) is not Reply:
            return False
        session = self._sessions.get((peer, message.topic))
        xid = message.xid  # type: ignore[attr-defined]
        if session is None or not (session.xid == xid or xid in session.queued):
            return False
        replica = self._replicas.get(message.topic)
        return replica is not None and self._trusted(peer, replica)

    def prefetch(self, peer: PeerId, data: bytes, now_ms: int) -> list[Effect]:
        """Ask for the next page of a catch-up as soon as a page *arrives* (pipelining).

        Called by the driver when a frame reaches it, before it is queued for
        its step (`node.committer`): verifying and storing a page of 1,024
        events is most of a catch-up's time, and without this the peer stays
        idle meanwhile (it computes and sends the next page only once our offer
        with the applied page's heads arrives). The next offer names the heads
        we will hold once the page is applied — computed from the page's
        parent lists, no signature checked — and reuses the last offer's
        filter (the page's events are the peer's own, known to it: heads it
        holds are certain, never judged by the filter). The page is marked
        `queued`, so its step applies it without offering again.

        Only while a catch-up streams (the previous answer said `more` and
        applied events), from a trusted peer (`_trusted`: it handed us a new
        event, or is a joined member — a member asked for its first page is no
        less trusted than one that sent a push: asking only the first, 4 to 6 of
        a 50k catch-up's ~50 pages waited a round trip, ~40 ms each on the
        bench machine), at most `PAGES_AHEAD` pages
        received and not yet applied: what is asked for ahead stays what the
        node verifies and stores in a few hundred ms. Anything else: [] and
        the step does what it always did. Never raises for bad input.
        """
        self._heard_ms[peer] = max(now_ms, self._heard_ms.get(peer, now_ms))
        if not self.config.pipeline or not _may_be_reply(data):
            return []
        try:
            message = decode(data)
        except MessageError:
            return []  # the step blames it
        if type(message) is not Reply:
            return []
        session = self._sessions.get((peer, message.topic))
        if session is None or not (session.xid == message.xid or message.xid in session.queued):
            return []
        # The peer answered: whatever our queue makes this page wait, it is not silent.
        if session.xid == message.xid and session.waiting:
            self._note_answer_time(peer, now_ms - session.active_ms)
        session.active_ms = max(session.active_ms, now_ms)
        if session.xid != message.xid or not message.more or message.truncated \
                or not message.events or not session.streaming or session.offer is None \
                or len(session.queued) >= PAGES_AHEAD:
            return []
        replica = self._replicas.get(message.topic)
        topic = message.topic
        if replica is None or sum(len(s.queued) for s in self._sessions.values()
                                  if s.topic == topic) >= PAGES_AHEAD \
                or not self._trusted(peer, replica):
            return []
        frontier = _advance(self._frontier.get(topic) or tuple(replica.graph.extremities()),
                            message.events)
        if frontier is None:
            return []  # undecodable events: the step judges them, nothing is asked ahead
        last = session.offer
        session.queued.add(message.xid)
        session.waiting = False
        self._frontier[topic] = frontier
        self._note_ahead(topic, peer, now_ms)
        target = self._page_peer(replica, peer, now_ms)
        if target == peer:
            ask = session
        else:
            ask = self._sessions.get((target, topic)) or _Session(
                target, topic, xid=0, active_ms=now_ms, window=self.config.initial_window_depth)
            self._sessions[(target, topic)] = ask
            ask.streaming = True
            self.stats["pages_asked_of_others"] += 1
        ask.xid = self._new_xid()
        ask.waiting = True
        ask.active_ms = now_ms
        # To another peer the offer names heads we do not hold yet, which its filter
        # cannot include: `final`, so it judges them instead of calling the offer
        # impossible (`_impossible`); one that holds them answers exactly.
        ask.offer = Offer(topic, ask.xid, frontier[:MAX_HEADS], last.since, last.floor,
                          last.final or target != peer, last.bloom)
        self.stats["offers_sent"] += 1
        self.stats["offers_ahead"] += 1
        return self._clean([self._send(target, ask.offer)])

    def _note_ahead(self, topic: bytes, peer: PeerId, now_ms: int) -> None:
        """`peer` holds events we lack on `topic` (it streams them, or offered heads we lack)."""
        ahead = self._ahead.setdefault(topic, OrderedDict())
        ahead[peer] = now_ms
        ahead.move_to_end(peer)
        while len(ahead) > MAX_STREAM_PEERS:
            ahead.popitem(last=False)

    def _page_peer(self, replica: Replica, streamer: PeerId, now_ms: int) -> PeerId:
        """Who to ask for a catch-up's next page: the peers seen ahead of us, in turn.

        Only trusted peers (they handed us an event new here, or are joined
        members) we may serve (what we send is an offer), seen ahead within
        `AHEAD_FRESH_MS`, with no exchange of their own waiting for an answer
        (their turn would wait behind it); `streamer` (who sent the page that
        just arrived) is always one. (Trusted by a new event only, a member
        whose copies all came second stayed out: one 50k catch-up in ten asked
        every page of its streamer.)
        """
        topic = replica.topic_id
        candidates = [streamer]
        for peer, seen_ms in self._ahead.get(topic, {}).items():
            if peer == streamer or now_ms - seen_ms > AHEAD_FRESH_MS or peer not in self._peers \
                    or not self._may_serve(peer, replica) or not self._trusted(peer, replica):
                continue
            current = self._sessions.get((peer, topic))
            if current is not None and current.waiting and self._alive(current, now_ms):
                continue
            candidates.append(peer)
        self._turn += 1
        return sorted(candidates)[self._turn % len(candidates)]

    def _streaming(self, topic: bytes, now_ms: int, exclude: PeerId | None = None) -> bool:
        """Does a catch-up run on `topic` with a peer other than `exclude`?

        An exchange whose last answer said `more` (or opened to continue one),
        or a peer whose offer we answered naming heads we lack (its pages are
        on their way, `_expecting`).
        """
        expecting = self._expecting.get(topic)
        if expecting is not None and expecting[0] != exclude \
                and now_ms - expecting[1] <= self.config.session_timeout_ms:
            return True
        return any(s.streaming and s.topic == topic and s.peer != exclude
                   and (s.waiting or s.queued) and self._alive(s, now_ms)
                   for s in self._sessions.values())

    def sync_with(self, peer: PeerId, topic: bytes, now_ms: int,
                  streaming: bool = False) -> list[Effect]:
        """Open an anti-entropy exchange with `peer` on `topic` now (tick does this on a timer).

        `streaming`: it continues a catch-up that peer's answer cut (`more`), so
        it counts as the topic's stream from the start (`_streaming`): a second
        peer's cut answer arriving meanwhile does not open another.
        """
        current = self._sessions.get((peer, topic))
        if current is not None and self._alive(current, now_ms):
            return []  # one exchange at a time per peer and topic
        if not streaming and self._streaming(topic, now_ms, exclude=peer):
            # A catch-up streams from another peer (e.g. this one just reconnected):
            # our offer would draw the same pages from this one. Later, not now.
            self.stats["syncs_deferred"] += 1
            return []
        if not self._may_serve(peer, self._replicas[topic]):
            return []  # a private topic: our heads are not for this peer
        session = _Session(peer, topic, xid=0, active_ms=now_ms,
                           window=self.config.initial_window_depth, streaming=streaming)
        self._sessions[(peer, topic)] = session
        self.stats["sessions"] += 1
        return self._clean([self._offer(session, now_ms)])

    def _on_offer(self, peer: PeerId, replica: Replica, offer: Offer,
                  now_ms: int) -> list[Effect | None]:
        if not self._offer_rate.take((peer, replica.topic_id), now_ms):
            self.stats["offers_throttled"] += 1  # its exchange times out; it offers again later
            return []
        graph = replica.graph
        if self._impossible(graph, offer):
            self.stats["offers_impossible"] += 1
            return list(self._blame(peer, now_ms, replica.topic_id, Fault.IMPOSSIBLE_OFFER,
                                    fault=Fault.IMPOSSIBLE_OFFER))
        self._witness(peer, replica.topic_id, offer.heads)  # the offerer holds its heads
        known_since = [s for s in offer.since if graph.has(s)]
        limit = self.config.reply_max_events
        holds_all = all(graph.has(h) for h in offer.heads)
        just_back = self._resumed_ms is not None \
            and now_ms - self._resumed_ms <= self.config.session_timeout_ms
        if not holds_all and (just_back and self._resumed_long
                              or self._streaming(replica.topic_id, now_ms, exclude=peer)):
            # We lag the offerer and a catch-up already streams to us from another
            # peer: our reply would make the offerer send us the very pages that
            # stream brings (measured: 1.4-1.8 duplicates per caught-up event). It
            # offers again later, to us or another peer; a peer behind us is served.
            # So too for the offers that waited in our sockets through a long
            # absence: most of their exchanges have timed out at the offerers (our
            # reply brings nothing), the rest would each send us the first pages
            # (5 of them in one 50k catch-up), and our own exchange, opened at the
            # first tick, asks for those pages once.
            self.stats["offers_deferred"] += 1
            self._note_ahead(replica.topic_id, peer, now_ms)  # it may serve the stream's pages
            return []
        if holds_all:
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
        ids = self._held_back(graph, ids, now_ms, peer)
        events, more = self._take(graph, ids[:limit])
        heads = self._reply_heads(graph, now_ms)
        more = more or len(ids) > limit
        events, cut = self._within_budget(peer, replica, now_ms, events, Reply(
            replica.topic_id, offer.xid, heads, truncated, True, ()))
        if events is None:
            return []  # not even the first event fits: no answer (answers_throttled)
        reply = Reply(replica.topic_id, offer.xid, heads, truncated, more or cut, tuple(events))
        if events:
            self._note_news(replica.topic_id, peer)  # the offerer lacked something
        if not holds_all and just_back:  # (and the absence was short: above)
            # Just back from an absence, answering the offers that waited in our
            # sockets: each offerer holds what we missed and, once it has our
            # heads, sends it (`_send_missing`), the same pages from each. Until
            # the first one's come no other peer is asked for them. (Not in
            # steady state: there offers naming a few heads we lack are the norm
            # and the answers overlap little; deferring them slowed convergence
            # of a lossy 50-node anti-entropy world 3x. Nor after a long absence:
            # those offerers' exchanges have timed out, so our reply is stale to
            # them and brings nothing, while the expectation held our own
            # exchanges back for `session_timeout_ms` (a 50k catch-up idled 2.3 s).)
            self._expecting[replica.topic_id] = (peer, now_ms)
            self._note_ahead(replica.topic_id, peer, now_ms)
        return [self._spent(peer, self._send(peer, reply), now_ms)]

    @staticmethod
    def _impossible(graph: Graph, offer: Offer) -> bool:
        """Does the offer name heads its own filter cannot leave out? (only a forger's can)

        A correct offer's filter holds every event of the offerer above
        `floor` that is not below `since` (`transport.reconcile.recent_events`),
        so: it is never empty while a head is new to us (its top depth level
        is in it), and with `floor` 0 every head not in `since` is in it
        (a head is an extremity: never below a `since` id). A `final` offer
        (the filter hit its size bound) is not judged. Costs one pass over
        the filter's bytes and, at floor 0, a Bloom lookup per unknown head.
        """
        if offer.final:
            return False
        since = set(offer.since)
        unknown = [h for h in offer.heads if h not in since and not graph.has(h)]
        if not unknown:
            return False
        if not any(offer.bloom.bits):
            return True
        return offer.floor == 0 and any(h not in offer.bloom for h in unknown)

    def _within_budget(self, peer: PeerId, replica: Replica, now_ms: int, raws: list[bytes],
                       empty: Message) -> tuple[list[bytes] | None, bool]:
        """The prefix of `raws` an answer (`empty` without events) to `peer` may carry.

        Trusted peers get it all (`transport.peer_budget`); the others what fits
        their budget. (None, True) if nothing fits although there was something
        to send, or the bare answer does not fit: then nothing is sent.
        """
        if self._answers.is_trusted(peer):
            return raws, False
        space = self._answers.room(peer, now_ms) - len(encode(empty))
        wanted = sum(len(raw) + EVENT_FRAMING_BYTES for raw in raws)
        if wanted <= space or self._is_member(peer, replica):
            return raws, False
        fitting: list[bytes] = []
        for raw in raws:
            space -= len(raw) + EVENT_FRAMING_BYTES
            if space < 0:
                break
            fitting.append(raw)
        if space < 0 and not fitting:
            self.stats["answers_throttled"] += 1
            return None, True
        self.stats["answers_cut"] += 1
        return fitting, True

    def _trusted(self, peer: PeerId, replica: Replica) -> bool:
        """Did `peer` hand us an event new here, or is it a joined member of the topic?
        (The membership, a state lookup on an open topic, only if the first says no.)"""
        return self._answers.is_trusted(peer) or self._is_member(peer, replica)

    def _is_member(self, peer: PeerId, replica: Replica) -> bool:
        """Is `peer` a joined member of the topic in our state? (then it is trusted here)

        A private topic's readers are its joined members (a cached set); an
        open topic's membership costs a state lookup, so it is asked only
        when trust by a new event (`_trusted`) or a budget (`_within_budget`)
        would otherwise turn the peer down.
        """
        key = self._key(peer)
        if key is None:
            return False
        readers = replica.readers()
        if readers is not None:
            return key in readers
        return replica.membership_of(key) is Membership.JOIN

    def _spent(self, peer: PeerId, sent: Send | None, now_ms: int) -> Send | None:
        """Charge an answer's bytes to `peer`'s budget (a trusted peer's too: harmless)."""
        if sent is not None:
            self._answers.spend(peer, len(sent.data), now_ms)
        return sent

    def _fruitless(self, key: tuple[PeerId, bytes], session: _Session) -> bool:
        """A round of `session` applied nothing; True if that was the last the bound
        allows (`max_session_rounds`): the exchange is abandoned."""
        session.rounds += 1
        if session.rounds < self.config.max_session_rounds:
            return False
        del self._sessions[key]
        self.stats["sessions_abandoned"] += 1
        return True

    def _on_reply(self, peer: PeerId, replica: Replica, reply: Reply,
                  now_ms: int) -> list[Effect | None]:
        out: list[Effect | None] = []
        graph = replica.graph
        applied_before = graph.delivered_count
        duplicates_before = self.stats["duplicates"]
        self._ingest(peer, replica, reply.events, SYNC, now_ms, out)
        # Progress is what was applied here: events buffered on parents nobody
        # sent (a peer answering with made-up parents) do not keep an exchange going.
        progressed = graph.delivered_count > applied_before
        key = (peer, replica.topic_id)
        session = self._sessions.get(key)
        self._count_duplicates(duplicates_before, "stale" if session is None or (
            session.xid != reply.xid and reply.xid not in session.queued) else "page")
        if session is not None and reply.xid in session.queued:
            # A page received while the one before it was verified: the next page
            # was asked for when it arrived (`prefetch`).
            session.queued.discard(reply.xid)
            if progressed:
                self._advance_since(peer, replica, reply)
            else:
                self._fruitless(key, session)
            return out
        if session is None or session.xid != reply.xid:
            self.stats["stale_replies"] += 1  # the events were still worth keeping
            if progressed and (reply.more or not all(graph.has(h) for h in reply.heads)):
                # A late answer of a catch-up: carry on from here rather than wait
                # for the next periodic exchange (no-op while another is open).
                out += self.sync_with(peer, replica.topic_id, now_ms, streaming=reply.more)
            return out
        if all(graph.has(h) for h in reply.heads):
            # We now hold all of the peer's graph, so we know exactly what it lacks.
            del self._sessions[key]
            if reply.heads:
                self._remember_since(peer, replica.topic_id, reply.heads)
            out += self._send_missing(peer, replica, reply.heads, reply.xid, now_ms)
            return out
        # Only rounds that brought nothing new count against the bound: a long
        # catch-up (`more`, one message per round trip) is progress, not a loop.
        if not progressed and self._fruitless(key, session):
            return out
        if progressed:
            self._advance_since(peer, replica, reply)
        if reply.more:
            self._note_ahead(replica.topic_id, peer, now_ms)
        if reply.more and not session.streaming \
                and self._streaming(replica.topic_id, now_ms, exclude=peer):
            # Another peer's catch-up stream already brings these pages (several
            # start at once when a node resumes and answers the offers waiting in
            # its sockets, or a peer reconnects): keep one, end this exchange,
            # whether this page was new or the other stream's copy. (An exchange
            # that streams already is one of the stream's own peers, `_page_peer`.)
            del self._sessions[key]
            self.stats["continuations_deferred"] += 1
            return out
        session.streaming = reply.more and (progressed or session.streaming)
        if reply.truncated:
            session.window *= self.config.window_growth
        # more: continuation; neither flag: a Bloom false positive hid something (fresh salt).
        out.append(self._offer(session, now_ms))
        return out

    def _on_events(self, peer: PeerId, replica: Replica, message: Events, now_ms: int) -> list[Effect]:
        out: list[Effect] = []
        duplicates_before = self.stats["duplicates"]
        self._ingest(peer, replica, message.events, SYNC, now_ms, out)
        topic = replica.topic_id
        self._count_duplicates(duplicates_before, "events" if message.xid else "want")
        if self._expecting.get(topic, (None,))[0] == peer:
            del self._expecting[topic]  # the pages we were waiting for came
        if message.more:
            # The sender had more than one message's worth: continue by offering our new
            # heads, unless a catch-up already runs with another peer: it brings the same
            # pages (every peer answers our heads with the same `not_below`), so a second
            # stream would only send each event twice.
            if self._streaming(replica.topic_id, now_ms, exclude=peer):
                self.stats["continuations_deferred"] += 1
            else:
                out += self.sync_with(peer, topic, now_ms, streaming=True)
        return out

    def _count_duplicates(self, before: int, cause: str) -> None:
        """Count the copies an answer brought that we held already, by what answer it was.

        Causes: "page" (an answer to our open exchange), "stale" (to one
        that timed out or was replaced), "events" (a peer's Events after our
        reply), "want" (an answer to a want). Pushes are not counted here.
        """
        extra = self.stats["duplicates"] - before
        if extra:
            self.stats[f"duplicates:{cause}"] += extra

    def _on_want(self, peer: PeerId, replica: Replica, want: Want,
                 now_ms: int) -> list[Effect | None]:
        graph = replica.graph
        found: list[Event] = []
        for event_id in want.ids:
            event = graph.get(event_id) or graph.buffered_event(event_id)
            if event is not None:
                found.append(event)
        if not found:
            return []
        raws, _ = self._take_raws([e.raw for e in found])  # the rest: asked again later
        fitting, _ = self._within_budget(peer, replica, now_ms, raws,
                                         Events(replica.topic_id, 0, False, ()))
        if not fitting:
            return []
        self.stats["wants_served"] += len(fitting)
        return [self._spent(peer, self._send(peer, Events(replica.topic_id, 0, False,
                                                           tuple(fitting))), now_ms)]

    def _sync_random(self, topic: bytes, now_ms: int, rng: random.Random,
                     exclude: PeerId | None) -> list[Effect]:
        if self._streaming(topic, now_ms):
            return []  # a catch-up is under way: another exchange would fetch the same pages
        idle = self._serving(self._replicas[topic], [
            p for p in self._peers if p != exclude and self._idle(p, topic, now_ms)])
        return self.sync_with(rng.choice(idle), topic, now_ms) if idle else []

    def _idle(self, peer: PeerId, topic: bytes, now_ms: int) -> bool:
        session = self._sessions.get((peer, topic))
        return session is None or not self._alive(session, now_ms)

    def _wants(self, topic: bytes, replica: Replica, now_ms: int,
               rng: random.Random) -> list[Effect | None]:
        if not self._peers or not replica.graph.buffered_count:
            return []
        if self._streaming(topic, now_ms):
            # A catch-up streams the events not below our heads, parents first: the
            # buffered events' parents come with it. Asked by id they come newest
            # first, each answer buffered on parents of its own (measured: a 50k
            # catch-up buffered 11,000 events so, evicting and fetching again).
            self.stats["wants_while_streaming"] += 1
            return []
        sources = self._serving(replica, self._peers)  # a want names ids: readers only
        if not sources:
            return []
        by_peer: dict[PeerId, list[bytes]] = {}
        graph = replica.graph
        for parent in graph.missing_parents(MAX_WANT_IDS):
            if graph.rejected_reason(parent) is not None:
                # We rejected it when it came (e.g. parents not an antichain); asking
                # again would only fetch it to reject it again, every retry, forever.
                continue
            source = self._want_source.get((topic, parent))
            if source not in sources:
                source = rng.choice(sources)
            asked = by_peer.setdefault(source, [])
            if len(asked) >= self.config.wants_in_flight_per_peer:
                # transport.intake_budget: the rest waits for the next round, so a
                # buffer flood of made-up parents draws a bounded number of wants.
                self.stats["wants_deferred"] += 1
                continue
            asked.append(parent)
        self.stats["wants_sent"] += sum(len(v) for v in by_peer.values())
        if not by_peer:
            return []
        return [self._send(peer, Want(topic, tuple(ids))) for peer, ids in sorted(by_peer.items())]

    def _heads(self, graph: Graph) -> tuple[bytes, ...]:
        # A wider graph offers a subset: the peer then sends a little more than needed.
        return tuple(graph.extremities()[:MAX_HEADS])

    def _advance_since(self, peer: PeerId, replica: Replica, reply: Reply) -> None:
        """After applying a page of `peer`'s: our heads it holds become the common heads.

        Without this the next offer's filter covers every event applied since
        the exchange before (the `since` heads stay those of before the lag),
        so each page of a catch-up rebuilt a filter of everything caught up so
        far: O(lag) per page, O(lag²) in all (half of a 50k catch-up's CPU). The
        peer holds the events it sent, its heads and the old common heads, so
        those of our heads among them are common heads too (KH's `StoreHeads`,
        as soon as known); the filter then covers only what the peer may lack.
        """
        key = (peer, replica.topic_id)
        held = set(self._since.get(key, ())) | set(reply.heads)
        held.update(event_id_of(raw) for raw in reply.events)
        common = [h for h in replica.graph.extremities() if h in held]
        if common:
            self._remember_since(peer, replica.topic_id, common)

    def _remember_since(self, peer: PeerId, topic: bytes, heads: Sequence[bytes]) -> None:
        if not self.config.use_peer_state:
            return
        key = (peer, topic)
        self._since[key] = tuple(heads[:MAX_HEADS])
        self._since.move_to_end(key)
        while len(self._since) > MAX_PEER_STATES:
            self._since.popitem(last=False)

    def _witness(self, peer: PeerId, topic: bytes, ids: Sequence[bytes]) -> None:
        """`peer` holds `ids`: it pushed, announced or offered them.

        So it holds everything below them too, and the next offer to it names
        those we hold in `since` (`_offer_since`). Without this an offer's
        filter covered every event since the last exchange with that peer,
        although the fast path had shown the peer holding nearly all of them:
        at 200 events/s a filter of about 1,300 ids, built and judged about
        every 2 s per peer (docs/anti-entropy.md, "An offer covers what the
        fast path has not shown"). A peer that names ids it does not hold gains
        nothing: `since` only narrows our filter (the responder judges its own
        events against it, and sends us those below a `since` id it lacks),
        and what the peer lacks is sent from its reply's heads (`_send_missing`).
        """
        if not ids or not self.config.since_from_fast_path:
            return
        key = (peer, topic)
        seen = self._witnessed.get(key)
        if seen is None:
            seen = self._witnessed[key] = deque(maxlen=MAX_WITNESSED_IDS)
            while len(self._witnessed) > MAX_WITNESSED_STATES:
                self._witnessed.popitem(last=False)
        else:
            self._witnessed.move_to_end(key)
        seen.extend(ids[-MAX_WITNESSED_IDS:])

    def _offer_since(self, graph: Graph, peer: PeerId, topic: bytes) -> tuple[bytes, ...]:
        """The common heads of the last exchange, with the ids we hold that `peer` was
        seen holding since (`_witness`) first, deepest first.

        Ids below another one are left out (`reconcile.topmost`), but only among
        those at least as deep as the shallowest witnessed id: a common head
        from long ago stays as it is, since proving it redundant would walk
        every event between it and the witnessed ids, at every offer, to save
        32 bytes.
        """
        since = self._since.get((peer, topic), ())
        seen = self._witnessed.get((peer, topic))
        if not seen:
            return since
        known = set(since)
        held = {i for i in seen if i not in known and graph.has(i)}
        if not held:
            return since
        ordered = sorted(held, key=lambda i: (-(graph.depth(i) or 0), i))
        low = graph.depth(ordered[-1]) or 0
        near: list[bytes] = []
        far: list[bytes] = []
        for head in since:
            (near if (graph.depth(head) or 0) >= low else far).append(head)
        return tuple((topmost(graph, ordered + near, MAX_SINCE_VISITS) + far)[:MAX_HEADS])

    def _offer(self, session: _Session, now_ms: int) -> Send | None:
        graph = self._replicas[session.topic].graph
        since = self._offer_since(graph, session.peer, session.topic)
        floor = offer_floor(graph, since, session.window)
        cap = filter_capacity(self.config.max_bloom_items, self.config.bloom_bits_per_item)
        ids, covered = recent_events(graph, since, floor, cap)
        bloom = BloomFilter.build(ids, self._rng.randbytes(BLOOM_SALT_BYTES),
                                  self.config.bloom_bits_per_item, self.config.bloom_hashes)
        session.xid = self._new_xid()
        session.active_ms = now_ms
        self._offered.append(session)
        self.stats["offers_sent"] += 1
        session.waiting = True
        if not any(s.queued for s in self._sessions.values() if s.topic == session.topic):
            self._frontier.pop(session.topic, None)  # from the graph again: all pages applied
        session.offer = Offer(session.topic, session.xid, self._heads(graph), since, covered,
                              covered > floor, bloom)
        return self._send(session.peer, session.offer)

    def _new_xid(self) -> int:
        xid = self._next_xid
        self._next_xid = 1 if xid >= MAX_XID else xid + 1
        return xid

    def _send_missing(self, peer: PeerId, replica: Replica, heads: Sequence[bytes],
                      xid: int, now_ms: int) -> list[Effect | None]:
        graph = replica.graph
        limit = self.config.reply_max_events
        ids = self._held_back(graph, graph.not_below(heads, limit=limit + 1), now_ms, peer)
        if not ids:
            return []
        events, more = self._take(graph, ids[:limit])
        fitting, cut = self._within_budget(peer, replica, now_ms, events,
                                           Events(graph.topic_id, xid, True, ()))
        if not fitting:
            return []
        self._note_news(graph.topic_id, peer)  # the peer lacked something
        return [self._spent(peer, self._send(peer, Events(
            graph.topic_id, xid, more or cut or len(ids) > limit, tuple(fitting))), now_ms)]

    # Hooks of the fast path (transport.dissemination): what an exchange holds back.
    def _held_back(self, graph: Graph, ids: list[bytes], now_ms: int,
                   peer: PeerId) -> list[bytes]:
        """The ids of `ids` an exchange with `peer` sends now (all of them, unless the fast
        path says)."""
        return ids

    def _reply_heads(self, graph: Graph, now_ms: int) -> tuple[bytes, ...]:
        """The heads a reply names (ours, unless the fast path holds events back)."""
        return self._heads(graph)

    def _take(self, graph: Graph, ids: Sequence[bytes]) -> tuple[list[bytes], bool]:
        raws = []
        for event_id in ids:
            event = graph.get(event_id)
            if event is not None:
                raws.append(event.raw)
        return self._take_raws(raws)

    def _note_want_source(self, topic: bytes, parent: bytes, peer: PeerId) -> None:
        self._want_source[(topic, parent)] = peer
        self._want_source.move_to_end((topic, parent))
        while len(self._want_source) > MAX_WANT_SOURCES:
            self._want_source.popitem(last=False)



def _may_be_reply(data: bytes) -> bool:
    """Could `data` be a Reply frame? (`[version, tag, ...]`: a fixarray, then two fixints)

    `prefetch` sees every frame before its step; peeking at two bytes spares
    decoding pushes twice. A false "yes" only costs the full decode.
    """
    return len(data) > 3 and data[0] & 0xF0 == 0x90 and data[1] == WIRE_VERSION \
        and data[2] == TAG_REPLY


def _advance(heads: Sequence[bytes], raws: Sequence[bytes]) -> tuple[bytes, ...] | None:
    """The heads of `heads` plus a page of events, parents first; None if one is no event.

    A page answers `not_below(heads)`: closed under parents over what lies
    below `heads`, so the new heads are the old ones and the page's events,
    minus every id a page event names as a parent. Nothing is checked here
    (`claimed_parents`): the heads only shape our next offer, and the step
    verifies the page.
    """
    cited: set[bytes] = set()
    ids: list[bytes] = []
    for raw in raws:
        parents = claimed_parents(raw)
        if parents is None:
            return None
        cited.update(parents)
        ids.append(event_id_of(raw))  # memoised: the step's intake asks for it again
    return tuple(h for h in dict.fromkeys([*heads, *ids]) if h not in cited)
