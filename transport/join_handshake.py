"""The join handshake of a private topic, in the engine (sans-IO: node and simulator share it).

Members send a private topic's events only to members (`transport.dissemination`,
the read filter), so an invitee holding nothing of the topic cannot learn it
by anti-entropy. It asks instead:

    invitee ── JoinAsk(topic) ──────────────────────────▶ member
            ◀── JoinTemplate(topic, parents, auth, seq) ─  (the state lets its key join now)
            ◀── JoinRefused(topic, not_found) ──────────   (unknown topic, not a member
                                                            myself, or not invited: one reason)
            ── JoinSubmit(topic, signed join) ──────────▶  received like any event;
            ◀── Push(join) to others, Offer(heads) ──────   once applied the invitee is a
                                                            reader: the exchange brings it all

* `request_join(topic, now_ms)`: the topic's replica is added (empty); ask
  every connected peer, at most `MAX_JOIN_ASKS`. `join_progress(topic)` says
  how many were asked, how many refused (or went away before answering) and
  whether a join was submitted; the runtime waits for the replica's
  `membership_of(own key) == JOIN` and gives up when all refused or its timeout
  passes.
* The member answers from its current state (`Replica.join_terms`); it
  answers only if it is joined itself.
* The asker signs its join from the first template of a peer it asked
  (`node.replica.joining.sign_join`), submits it to that peer, opens its own
  exchange with it behind the join (one lost offer of the member's would
  otherwise cost a sync interval: the 30-node private world, seeds 40-119,
  converged 1.61 s after its faults at the mean against 1.89 s, with 10 runs
  of 3 s or more against 17), and from then on treats that peer (its
  *sponsor*) as a reader until its own join is in its own state: before that,
  its partial copy of the state may not show the sponsor as a member yet.
* The member checks the submitted event is the asking peer's own join of
  this topic (a join replayed from another node or for another key is
  refused and logged), then takes it in through the normal intake
  (`_ingest`: Reference Monitor, auth rules; in a node inside the committer
  step that handles the frame). If the asker may now read, the member pushes
  the join to a fan-out of readers and opens an exchange with the asker.

A join its sponsor never passed on (the sponsor was banned, or went for good,
before it did): no other member holds it, so to them the joiner is only
invited, and they refuse its frames. Two steps repair it:

    member ── JoinMissing(topic) ───────────────────────▶ joiner   (refused a frame of a
                                                                    peer it counts as invited)
           ◀── JoinSubmit(topic, the same signed join) ──           (from its own state)
           ── Want(the join's missing past) ────────────▶           (only ids the joiner sent)
           ◀── Events(...) ─────────────────────────────            wave after wave, until
                                                                    the join applies

* The member tells a peer whose frames it refused, and whose membership in
  its state is `invite`, that it lacks its join, at most once per
  `JOIN_NUDGE_MS`. No one else hears anything: to a stranger the topic stays
  unknown, as before.
* The joiner answers a reader of its own state, or a peer its state counts as
  invited (below), at most once per `JOIN_NUDGE_MS`, with its member event
  from its state: the very join it signed, never a new one (a second join of
  the same seq would be an equivocation).
* If the member lacks part of the join's past (the sponsor's last events,
  which only the sponsor and its joiners may hold), it asks the joiner for the
  missing parents of that past, and takes the answers from it though it is
  no reader yet. It names only ids the joiner's own events named, so it tells
  the joiner nothing. At most `MAX_JOIN_FETCHES` joiners at once, each for
  `JOIN_FETCH_MS` without progress and `MAX_JOIN_FETCH_WAVES` waves.
* Once the join applies, the member serves the joiner as any reader: it
  pushes the join on and opens an exchange, which brings the rest both ways,
  the joins the joiner itself took in included.

Two joins each side lacks: two members, each joined in a view without the
other's join, each count the other as invited only, so neither sends the
other anything and no refusal starts the repair above. So:

* a joined member tells each connected peer its state counts as invited only
  that it lacks its join, unasked (`_nudge_invited`): with no reader of its
  view connected, once per `JOIN_NUDGE_MS`; else after `JOIN_NUDGE_MS`, then
  twice as long each time, up to `MAX_JOIN_NUDGE_INTERVAL_MS` (a member taken
  in by a member later banned counts that one a reader, connected, and it
  passes nothing on: seed 57 of the 40-node private banned world);
* a member told so by a peer it counts as invited hands it its join too;
* each side then fetches the other's join's past from the other, as above,
  and answers the other's `Want`s while it does (`_on_joiner_want`): it holds
  that peer's signed join, so no peer reads anything of the topic without a
  join of record. Its own first `Want`, dropped if it came before its join
  reached the other side, goes again once.

An invited peer learns from this no more than from a join template: that we
hold the topic, and the ids our join names.

A sponsor that also invited: if the member that invited the joiner also took
its join in, and went before passing either on, to the others the joiner is a
stranger, whose frames they drop without a word. So:

* an exchange the joiner opened with a reader of its view that times out with
  not a word from that peer (`_join_unheard`) makes it hand that peer its join
  and the invite its join names (`JoinSubmit.invite`), at most once per
  `JOIN_NUDGE_MS`;
* a member that does not know the joiner answers only if that invite is of the
  joiner's own key, signed, by a joined member of its state
  (`_vouching_invite`); then it fetches the past of both from the joiner, and
  takes its answers, but answers none of its asks until the join applies.

`JoinHandshake` is a mixin of `Disseminator`; it reads the engine's state
listed in its class body.
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from node.core.event import Event, EventFormatError, decode_event
from node.logschema import SYNC
from node.core.identity import verify_signature
from node.replica.joining import (JoinTerms, invite_cited_by, is_invite_of, is_join_of,
                                 sign_join)
from node.replica.replica import Replica
from node.state.actions import NotAuthorizedError
from node.replica.types import NotReadyError, StateDisabledError
from node.state.types import Membership
from node.core.graph import Graph
from transport.dissemination_config import (JOIN_FETCH_MS, JOIN_NUDGE_MS, MAX_JOIN_ASKS,
                                            MAX_JOIN_FETCH_WAVES, MAX_JOIN_FETCHES,
                                            INVITED_SCAN_MS, MAX_JOIN_NUDGE_INTERVAL_MS,
                                            MAX_JOIN_NUDGES, MAX_JOIN_PAST_WALK,
                                            DisseminationConfig)
from transport.effects import Effect, Log, PeerId, Send
from transport.messages import (MAX_WANT_IDS, Events, JoinAsk, JoinMissing, JoinRefused,
                                JoinSubmit, JoinTemplate, Message, Push, Want)


@dataclass(frozen=True, slots=True)
class JoinProgress:
    """How a `request_join` is going: peers asked, peers that refused, a join submitted."""

    asked: int = 0
    refused: int = 0  # answered not_found, or went away before answering
    submitted: bool = False


@dataclass
class _JoinFetch:
    """A resubmitted join whose past the member is fetching from its joiner."""

    join_id: bytes
    key: bytes
    deadline_ms: int
    invite_id: bytes | None = None  # an invite the joiner handed us (we did not know it)
    waves: int = 0
    answered: bool = False
    asked_again: bool = False  # after a Want of the joiner's (`_on_joiner_want`)


@dataclass
class _Attempt:
    asked: set[PeerId] = field(default_factory=set)
    refused: set[PeerId] = field(default_factory=set)
    sponsor: PeerId | None = None  # the peer we submitted our join to


class JoinHandshake:
    """Both sides of the join handshake; a mixin of `Disseminator` (module docstring)."""

    # The engine's state this part reads (set by `Disseminator.__init__`).
    config: DisseminationConfig
    stats: Counter[str]
    _rng: random.Random
    _peers: list[PeerId]
    _replicas: dict[bytes, Replica]
    _peer_key: Callable[[PeerId], bytes | None]
    _accountable: bool  # the frame being handled came from `peer` itself (`on_message`)

    if TYPE_CHECKING:  # the engine's methods this part calls
        def _send(self, peer: PeerId, message: Message, data: bytes | None = None) -> Send | None: ...
        def _emit(self, peer: PeerId, message: Message, data: bytes | None = None) -> Send: ...
        def _key(self, peer: PeerId) -> bytes | None: ...
        def _removal_of(self, replica: Replica, peer: PeerId) -> Event | None: ...
        def _ingest(self, peer: PeerId, replica: Replica, raws: Sequence[bytes], channel: str,
                    now_ms: int, out: list[Effect]) -> list[bytes]: ...
        def _push(self, topic: bytes, raws: list[bytes], exclude: Sequence[PeerId],
                  fanout: int) -> list[Effect]: ...
        def sync_with(self, peer: PeerId, topic: bytes, now_ms: int) -> list[Effect]: ...
        def _on_want(self, peer: PeerId, replica: Replica, want: Want,
                     now_ms: int) -> list[Effect | None]: ...
        def _log(self, record_type: str, now_ms: int, topic: bytes | None, *,
                 event: Event | None = None, event_id: bytes | None = None,
                 **fields: Any) -> Log | None: ...

    def _init_join_handshake(self) -> None:
        self._attempts: dict[bytes, _Attempt] = {}
        # (topic, peer) -> when we last told it / resubmitted to it (JOIN_NUDGE_MS).
        self._nudged: OrderedDict[tuple[bytes, PeerId], int] = OrderedDict()
        self._resubmitted: OrderedDict[tuple[bytes, PeerId], int] = OrderedDict()
        # Apart from `_resubmitted`: a join handed round on a silence (maybe lost across a
        # partition) must not hold back the answer to a JoinMissing that follows.
        self._handed_unheard: OrderedDict[tuple[bytes, PeerId], int] = OrderedDict()
        # (topic, invited peer) -> (when next, interval) of our unasked JoinMissing, and
        # per topic when we next look for such peers (`_nudge_invited`).
        self._unasked: OrderedDict[tuple[bytes, PeerId], tuple[int, int]] = OrderedDict()
        # (topic, removed peer) -> (when its removal may be handed it again, the interval).
        self._removals_retold: OrderedDict[tuple[bytes, PeerId], tuple[int, int]] = \
            OrderedDict()
        self._next_invited_scan: dict[bytes, int] = {}
        self._join_fetches: OrderedDict[tuple[bytes, PeerId], _JoinFetch] = OrderedDict()
        # The (topic, peer) whose Want is being answered as a reader's (`_granted`).
        self._granting: tuple[bytes, PeerId] | None = None
        # Topics of which a reader other than our sponsor sent us a frame (so it holds
        # our join, and passes it on): no need to hand our join round (`_join_unheard`).
        self._served_by_others: set[bytes] = set()

    # ------------------------------------------------------------- the asker

    def request_join(self, topic: bytes, now_ms: int) -> list[Effect]:
        """Ask connected peers (at most MAX_JOIN_ASKS) for the terms of our join of `topic`.

        The topic's replica must be added already (empty). A new request
        replaces an earlier one: its answers are then ignored.
        """
        if topic not in self._replicas:
            raise KeyError("add the topic's (empty) replica before requesting a join")
        peers = list(self._peers)
        if len(peers) > MAX_JOIN_ASKS:
            peers = sorted(self._rng.sample(peers, MAX_JOIN_ASKS))
        self._attempts[topic] = _Attempt(asked=set(peers))
        self.stats["join_asks_sent"] += len(peers)
        out: list[Effect] = []
        for peer in peers:
            sent = self._send(peer, JoinAsk(topic))
            if sent is not None:
                out.append(sent)
        return out

    def join_progress(self, topic: bytes) -> JoinProgress:
        """How the last `request_join` of `topic` is going (all zero if none)."""
        attempt = self._attempts.get(topic)
        if attempt is None:
            return JoinProgress()
        return JoinProgress(len(attempt.asked), len(attempt.refused & attempt.asked),
                            attempt.sponsor is not None)

    def _is_sponsor(self, topic: bytes, peer: PeerId) -> bool:
        attempt = self._attempts.get(topic)
        return attempt is not None and attempt.sponsor == peer

    def _invitee_serves(self, topic: bytes, peer: PeerId) -> bool:
        """Whom a replica that is not ready may send asks to: anyone, unless it is an
        invitee (a join requested), then only its sponsor."""
        attempt = self._attempts.get(topic)
        return attempt is None or attempt.sponsor == peer

    def _forget_join_peer(self, peer: PeerId) -> None:
        """`peer` went away: an asked peer that had not answered never will."""
        for attempt in self._attempts.values():
            if peer in attempt.asked and attempt.sponsor is None:
                attempt.refused.add(peer)
        for key in [k for k in self._join_fetches if k[1] == peer]:
            del self._join_fetches[key]

    def _sponsor_connected(self, topic: bytes) -> bool:
        """Is the member that took our join in (this run) still connected? Then it is
        there to pass our join on, and a silence is no sign it never did."""
        attempt = self._attempts.get(topic)
        return attempt is not None and attempt.sponsor in self._peers

    def _served_by(self, topic: bytes, peer: PeerId) -> None:
        """A frame of `topic` that only a reader is sent came from `peer` (first one only)."""
        if not self._is_sponsor(topic, peer):
            self._served_by_others.add(topic)

    def _forget_join_topic(self, topic: bytes) -> None:
        self._attempts.pop(topic, None)
        self._served_by_others.discard(topic)
        self._next_invited_scan.pop(topic, None)
        for key in [k for k in self._unasked if k[0] == topic]:
            del self._unasked[key]
        for key in [k for k in self._join_fetches if k[0] == topic]:
            del self._join_fetches[key]

    def _on_join_template(self, peer: PeerId, replica: Replica, message: JoinTemplate,
                          now_ms: int) -> list[Effect]:
        attempt = self._attempts.get(replica.topic_id)
        if attempt is None or peer not in attempt.asked or attempt.sponsor is not None:
            self.stats["join_templates_ignored"] += 1  # unasked, or we already submitted
            return []
        event = sign_join(replica.identity, replica.topic_id,
                          JoinTerms(message.seq, message.parents, message.auth), now_ms)
        attempt.sponsor = peer
        self.stats["joins_submitted"] += 1
        sent = self._send(peer, JoinSubmit(replica.topic_id, event.raw))
        if sent is None:
            return []
        # Our own exchange too, behind the join on the same link: the member opens one
        # once the join applies, but one lost offer would leave us waiting a sync interval.
        return [sent] + self.sync_with(peer, replica.topic_id, now_ms)

    def _on_join_refused(self, peer: PeerId, replica: Replica, message: JoinRefused,
                         now_ms: int) -> list[Effect]:
        attempt = self._attempts.get(replica.topic_id)
        if attempt is not None and peer in attempt.asked:
            attempt.refused.add(peer)
            self.stats["join_refusals"] += 1
        return []

    def _on_join_missing(self, peer: PeerId, replica: Replica, message: JoinMissing,
                         now_ms: int) -> list[Effect]:
        """A member lacks our join: hand it the one in our state (module docstring)."""
        topic = replica.topic_id
        own = replica.identity.public_key
        key = self._key(peer)
        membership = None if key is None else replica.membership_of(key)
        if membership not in _MAY_HAVE_OUR_JOIN or not replica.authorizing \
                or replica.membership_of(own) is not Membership.JOIN:
            # A stranger or a removed member to us (our join is not theirs to read), or
            # we are not joined ourselves: nothing to resubmit.
            self.stats["join_missing_ignored"] += 1
            return []
        if not _due(self._resubmitted, (topic, peer), now_ms):
            self.stats["join_missing_ignored"] += 1
            return []
        join = replica.membership_event(own)
        if join is None:
            return []
        self.stats["joins_resubmitted"] += 1
        # To an invited peer too (joined, maybe, in a view without our join, as we are in
        # one without its): our join is a state event, its parents ids a template names.
        return [self._emit(peer, JoinSubmit(topic, join.raw))]

    def _join_unheard(self, peer: PeerId, topic: bytes, now_ms: int) -> list[Effect]:
        """An exchange we opened with `peer` timed out with not a word from it. If it is a
        reader of our view of a private topic we joined by an invite, our sponsor is
        gone, and no other reader has sent us anything of the topic yet, it may not know
        us at all: the member that invited us also took our join in, and went before
        passing either on, so to the others we are a stranger, whose frames they drop
        without a word. Hand it our join and that invite (at most once per
        JOIN_NUDGE_MS); a member that knows us takes it as a resubmission."""
        replica = self._replicas.get(topic)
        if replica is None or not replica.authorizing or topic in self._served_by_others \
                or self._sponsor_connected(topic):
            return []
        readers = replica.readers()
        own = replica.identity.public_key
        if readers is None or own not in readers or self._key(peer) not in readers:
            return []
        join = replica.membership_event(own)
        invite = None if join is None else invite_cited_by(join, replica.graph)
        if join is None or invite is None \
                or not _due(self._handed_unheard, (topic, peer), now_ms):
            return []
        self.stats["joins_handed_unheard"] += 1
        return [self._emit(peer, JoinSubmit(topic, join.raw, invite.raw))]

    def _nudge_invited(self, replica: Replica, now_ms: int) -> list[Effect]:
        """Joined: tell each connected peer our state counts as invited only that we lack
        its join, unasked. With no reader of our view connected, at once and then once
        per JOIN_NUDGE_MS; otherwise once it has stayed invited JOIN_NUDGE_MS, then after
        twice as long each time, up to MAX_JOIN_NUDGE_INTERVAL_MS. (Looked at once per
        INVITED_SCAN_MS per topic.)

        It may be joined in a view without our join, as we are in one without its;
        then neither sends the other anything, so no refusal says so
        (`_nudge_joiner`). With no reader connected we are surely apart, so we keep
        telling; with one we may still be (a reader of our view that the others
        banned passes nothing on), so we keep telling, less and less often. Its
        answer (`_on_join_missing`) starts the repair; an invitee not joined yet
        ignores it. An invitee may learn that we hold the topic: it may ask any
        member for the terms of its join (`_on_join_ask`) and learn as much.
        """
        topic = replica.topic_id
        if now_ms < self._next_invited_scan.get(topic, 0):
            return []
        self._next_invited_scan[topic] = now_ms + INVITED_SCAN_MS
        readers = replica.readers()
        if readers is None or not self._peers or replica.identity.public_key not in readers:
            return []
        keyed = [(peer, self._key(peer)) for peer in self._peers]
        apart = not any(key in readers for _, key in keyed)
        out: list[Effect] = []
        for peer, key in keyed:
            if key is None or key in readers \
                    or replica.membership_of(key) is not Membership.INVITE:
                continue
            if apart:
                told = _due(self._nudged, (topic, peer), now_ms)
            else:
                told = self._unasked_due(topic, peer, now_ms)
            if told:
                self.stats["joins_missing_told_unasked"] += 1
                out.append(self._emit(peer, JoinMissing(topic)))
        return out

    def _unasked_due(self, topic: bytes, peer: PeerId, now_ms: int) -> bool:
        """The backoff of `_nudge_invited` with a reader connected (noted if due)."""
        return _backed_off(self._unasked, (topic, peer), now_ms, at_once=False)

    # ------------------------------------------------------------- the member

    def _refuse(self, peer: PeerId, topic: bytes) -> list[Effect]:
        self.stats["join_asks_refused"] += 1
        sent = self._send(peer, JoinRefused(topic))
        return [] if sent is None else [sent]

    def _on_join_ask(self, peer: PeerId, replica: Replica | None, message: JoinAsk,
                     now_ms: int) -> list[Effect]:
        """Answer with the terms of the asker's join, or not_found (whatever the cause)."""
        key = self._peer_key(peer)
        if replica is None or key is None or not replica.authorizing:
            return self._refuse(peer, message.topic)
        if not replica.may_read(replica.identity.public_key):
            return self._refuse(peer, message.topic)  # not a member myself
        try:
            terms = replica.join_terms(key, now_ms, self._rng)
        except (NotAuthorizedError, NotReadyError, StateDisabledError):
            return self._refuse(peer, message.topic)
        self.stats["join_templates_sent"] += 1
        sent = self._send(peer, JoinTemplate(replica.topic_id, terms.parents, terms.auth,
                                             terms.seq))
        return [] if sent is None else [sent]

    def _on_join_submit(self, peer: PeerId, replica: Replica, message: JoinSubmit,
                        now_ms: int) -> list[Effect]:
        """Take the asker's own join in like a received event; then serve it the topic."""
        topic = replica.topic_id
        key = self._peer_key(peer)
        out: list[Effect] = []
        try:
            event = decode_event(message.raw)
        except EventFormatError:
            event = None
        if key is None or event is None or not is_join_of(event, topic, key):
            # Someone else's join (replayed), a forged one, or not a join at all.
            self.stats["join_submits_refused"] += 1
            out.append(self._log("rejected", now_ms, topic, reason="join_not_own", peer=peer))
            return out
        if not replica.authorizing or not replica.may_read(replica.identity.public_key):
            self.stats["join_submits_refused"] += 1
            return out  # we are not a member: we never offered terms
        raws = [message.raw]
        invite: Event | None = None
        if message.invite and replica.membership_of(key) is None:
            # We do not know the joiner at all: only a member's invite of its key, in its
            # hand, makes it more than a stranger (who hears nothing from us).
            invite = _vouching_invite(replica, message.invite, key)
            if invite is None:
                self.stats["join_submits_refused"] += 1
                out.append(self._log("rejected", now_ms, topic, reason="invite_not_valid",
                                     peer=peer))
                return out
            raws.insert(0, message.invite)
        fresh = self._ingest(peer, replica, raws, SYNC, now_ms, out)
        if not replica.may_read(key):
            if replica.graph.is_buffered(event.id) and (
                    invite is not None or replica.membership_of(key) is Membership.INVITE):
                # Its past has not reached us (its sponsor's last events): the joiner has it.
                out += self._fetch_join_past(peer, replica, event.id, key, now_ms,
                                             None if invite is None else invite.id)
            else:
                self.stats["join_submits_not_applied"] += 1
            return out
        return out + self._serve_joiner(peer, replica, fresh, now_ms)

    def _serve_joiner(self, peer: PeerId, replica: Replica, fresh: list[bytes],
                      now_ms: int) -> list[Effect]:
        """The joiner's join applied here: pass it on, and bring the joiner the rest."""
        self.stats["joins_accepted"] += 1
        out: list[Effect] = []
        if fresh:
            out += self._push(replica.topic_id, fresh, exclude=(peer,),
                              fanout=self.config.push_fanout)
        out += self.sync_with(peer, replica.topic_id, now_ms)
        return out

    def _nudge_joiner(self, peer: PeerId, replica: Replica, now_ms: int) -> list[Effect]:
        """We refused a frame of `peer` (`Disseminator._accepts`: so we are a reader and
        it is not), at most one word per JOIN_NUDGE_MS: if our state counts it as invited
        only, that we lack its join (its sponsor never passed it on); if as banned or
        kicked, its removal, as `Disseminator._tell_removed` hands it (it was away then:
        its node still counts itself a member, and keeps asking)."""
        topic = replica.topic_id
        if not self._accountable:
            return []  # a relayed frame names its origin unsigned: no word to it on that
        # Noted before the state is read: a stranger's frames then cost a table lookup per
        # interval, not a read of the state each.
        if (topic, peer) in self._join_fetches or not _due(self._nudged, (topic, peer), now_ms):
            return []
        key = self._key(peer)
        if key is None:
            return []
        if replica.membership_of(key) is Membership.INVITE:
            self.stats["joins_missing_told"] += 1
            return [self._emit(peer, JoinMissing(topic))]
        removal = self._removal_of(replica, peer)
        if removal is None:
            return []  # a stranger: the topic stays unknown to it
        # It may hold its removal already and still send (its node keeps syncing): told
        # again after 5, 10, 20 ... up to 60 s, not every JOIN_NUDGE_MS.
        if not _backed_off(self._removals_retold, (topic, peer), now_ms, at_once=True):
            return []
        self.stats["removals_retold"] += 1
        return [self._emit(peer, Push(topic, (removal.raw,)))]

    def _fetch_join_past(self, peer: PeerId, replica: Replica, join_id: bytes, key: bytes,
                         now_ms: int, invite_id: bytes | None = None) -> list[Effect]:
        """Ask the joiner for the parents its buffered join's past waits for (one wave);
        and the past of the invite it handed us (`invite_id`), if any."""
        topic = replica.topic_id
        fetch = self._join_fetches.get((topic, peer))
        if fetch is None:
            if len(self._join_fetches) >= MAX_JOIN_FETCHES:
                self._join_fetches.popitem(last=False)
            fetch = self._join_fetches[(topic, peer)] = _JoinFetch(join_id, key, 0, invite_id)
            self.stats["join_fetches"] += 1
        missing = _missing_past(replica.graph, (join_id,) if fetch.invite_id is None
                                else (join_id, fetch.invite_id))
        if not missing or fetch.waves >= MAX_JOIN_FETCH_WAVES:
            del self._join_fetches[(topic, peer)]
            self.stats["join_fetches_abandoned"] += 1
            return []
        fetch.waves += 1
        fetch.deadline_ms = now_ms + JOIN_FETCH_MS
        self.stats["join_fetch_wants"] += len(missing)
        # Past the read filter: the ids are parents named by the joiner's own events.
        return [self._emit(peer, Want(topic, tuple(missing)))]

    def _fetching_join_past(self, replica: Replica, peer: PeerId, asks: bool) -> bool:
        """Do we fetch `peer`'s join's past, and is it still invited only here? (banned
        or kicked meanwhile: the fetch ends, and its frames are a non-member's again)

        `asks`: the frame is the joiner's own ask (a `Want`), answered only if its
        invite is of record here; on an invite of its own hand we take its answers,
        and it reads nothing until its join applies.
        """
        key = (replica.topic_id, peer)
        if not self._join_fetches or key not in self._join_fetches:
            return False
        fetch = self._join_fetches[key]
        membership = replica.membership_of(fetch.key)
        if membership is Membership.INVITE:
            return True
        if membership is None and fetch.invite_id is not None:
            return not asks
        del self._join_fetches[key]
        if membership is not Membership.JOIN:  # else its join came by another path
            self.stats["join_fetches_abandoned"] += 1
        return False

    def _on_joiner_want(self, peer: PeerId, replica: Replica, message: Want,
                        now_ms: int) -> list[Effect | None]:
        """A joiner whose join's past we fetch asks for events in turn: answered as a
        reader's Want, since we hold its signed join (the two of us joined in views
        without the other's join, each fetching the other's past). Our own ask of it,
        dropped if it came before our join reached it, goes again once."""
        topic = replica.topic_id
        fetch = self._join_fetches[(topic, peer)]
        with self._granted(topic, peer):
            out = self._on_want(peer, replica, message, now_ms)
        self.stats["joiner_wants_served"] += 1
        if not fetch.answered and not fetch.asked_again:
            fetch.asked_again = True
            out += self._fetch_join_past(peer, replica, fetch.join_id, fetch.key, now_ms)
        return out

    @contextmanager
    def _granted(self, topic: bytes, peer: PeerId) -> Iterator[None]:
        """While inside, `peer` is served `topic` as a reader (`Disseminator._may_serve`):
        a joiner whose join's past we fetch, or a removed member asking for its
        removal's past."""
        self._granting = (topic, peer)
        try:
            yield
        finally:
            self._granting = None

    def _on_join_past(self, peer: PeerId, replica: Replica, message: Events,
                      now_ms: int) -> list[Effect]:
        """An answer of a joiner whose join's past we fetch: take it in, then ask on."""
        topic = replica.topic_id
        fetch = self._join_fetches[(topic, peer)]
        fetch.answered = True
        out: list[Effect] = []
        fresh = self._ingest(peer, replica, message.events, SYNC, now_ms, out)
        if replica.may_read(fetch.key):
            del self._join_fetches[(topic, peer)]
            return out + self._serve_joiner(peer, replica, fresh, now_ms)
        if not replica.graph.is_buffered(fetch.join_id):
            del self._join_fetches[(topic, peer)]  # refused, or evicted from the buffer
            self.stats["join_fetches_abandoned"] += 1
            return out
        return out + self._fetch_join_past(peer, replica, fetch.join_id, fetch.key, now_ms)

    def _expire_join_fetches(self, now_ms: int) -> None:
        for key in [k for k, f in self._join_fetches.items() if f.deadline_ms <= now_ms]:
            del self._join_fetches[key]
            self.stats["join_fetches_abandoned"] += 1


# Whom we hand our join when told it is missing: a reader of our state, or a peer it
# counts as invited (joined, maybe, in a view without our join; module docstring).
_MAY_HAVE_OUR_JOIN = frozenset({Membership.JOIN, Membership.INVITE})


def _due(last: OrderedDict[tuple[bytes, PeerId], int], key: tuple[bytes, PeerId],
         now_ms: int) -> bool:
    """True (and noted) if `key` was last done JOIN_NUDGE_MS ago or never; bounded table."""
    when = last.get(key)
    if when is not None and now_ms - when < JOIN_NUDGE_MS:
        return False
    _note(last, key, now_ms)
    return True


def _backed_off(table: OrderedDict[tuple[bytes, PeerId], tuple[int, int]],
                key: tuple[bytes, PeerId], now_ms: int, at_once: bool) -> bool:
    """True (and noted) if `key` is due: the first time if `at_once` (else JOIN_NUDGE_MS
    later), then twice as long each time, up to MAX_JOIN_NUDGE_INTERVAL_MS."""
    entry = table.get(key)
    if entry is None:
        _note(table, key, (now_ms + JOIN_NUDGE_MS, JOIN_NUDGE_MS))
        return at_once
    due_ms, interval = entry
    if now_ms < due_ms:
        return False
    interval = min(2 * interval, MAX_JOIN_NUDGE_INTERVAL_MS)
    _note(table, key, (now_ms + interval, interval))
    return True


def _note(table: OrderedDict[tuple[bytes, PeerId], Any], key: tuple[bytes, PeerId],
          value: Any) -> None:
    """`table[key] = value`, as the newest entry; the oldest dropped past MAX_JOIN_NUDGES."""
    table[key] = value
    table.move_to_end(key)
    while len(table) > MAX_JOIN_NUDGES:
        table.popitem(last=False)


def _vouching_invite(replica: Replica, raw: bytes, key: bytes) -> Event | None:
    """The invite `raw`, if it invites `key` to this topic, is signed, and its author is a
    member in our state: what lets us fetch a stranger's join's past from it."""
    try:
        invite = decode_event(raw)
    except EventFormatError:
        return None
    if not is_invite_of(invite, replica.topic_id, key) or not verify_signature(invite):
        return None
    return invite if replica.membership_of(invite.author) is Membership.JOIN else None


def _missing_past(graph: Graph, roots: Sequence[bytes]) -> list[bytes]:
    """The parents that the buffered `roots`' past waits for: neither here, buffered nor
    refused before (a bounded walk down the buffered events, at most one Want's ids)."""
    missing: list[bytes] = []
    seen = set(roots)
    stack = list(roots)
    visited = 0
    while stack and visited < MAX_JOIN_PAST_WALK and len(missing) < MAX_WANT_IDS:
        event = graph.buffered_event(stack.pop())
        visited += 1
        if event is None:
            continue
        for parent in event.parents:
            if parent in seen:
                continue
            seen.add(parent)
            if graph.has(parent) or graph.rejected_reason(parent) is not None:
                continue
            if graph.is_buffered(parent):
                stack.append(parent)
            else:
                missing.append(parent)
    return missing[:MAX_WANT_IDS]
