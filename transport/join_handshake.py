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
  (`node.replica.joining.sign_join`), submits it to that peer, and from then
  on treats that peer (its *sponsor*) as a reader until its own join is in
  its own state: before that, its partial copy of the state may not show the
  sponsor as a member yet.
* The member checks the submitted event is the asking peer's own join of
  this topic (a join replayed from another node or for another key is
  refused and logged), then takes it in through the normal intake
  (`_ingest`: Reference Monitor, auth rules; in a node inside the committer
  step that handles the frame). If the asker may now read, the member pushes
  the join to a fan-out of readers and opens an exchange with the asker.

`JoinHandshake` is a mixin of `Disseminator`; it reads the engine's state
listed in its class body.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from node.core.event import Event, EventFormatError, decode_event
from node.logschema import SYNC
from node.replica.joining import JoinTerms, is_join_of, sign_join
from node.replica.replica import Replica
from node.state.actions import NotAuthorizedError
from node.replica.types import NotReadyError, StateDisabledError
from transport.dissemination_config import MAX_JOIN_ASKS, DisseminationConfig
from transport.effects import Effect, Log, PeerId, Send
from transport.messages import JoinAsk, JoinRefused, JoinSubmit, JoinTemplate, Message


@dataclass(frozen=True, slots=True)
class JoinProgress:
    """How a `request_join` is going: peers asked, peers that refused, a join submitted."""

    asked: int = 0
    refused: int = 0  # answered not_found, or went away before answering
    submitted: bool = False


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

    if TYPE_CHECKING:  # the engine's methods this part calls
        def _send(self, peer: PeerId, message: Message, data: bytes | None = None) -> Send | None: ...
        def _ingest(self, peer: PeerId, replica: Replica, raws: Sequence[bytes], channel: str,
                    now_ms: int, out: list[Effect]) -> list[bytes]: ...
        def _push(self, topic: bytes, raws: list[bytes], exclude: Sequence[PeerId],
                  fanout: int) -> list[Effect]: ...
        def sync_with(self, peer: PeerId, topic: bytes, now_ms: int) -> list[Effect]: ...
        def _log(self, record_type: str, now_ms: int, topic: bytes | None, *,
                 event: Event | None = None, event_id: bytes | None = None,
                 **fields: Any) -> Log | None: ...

    def _init_join_handshake(self) -> None:
        self._attempts: dict[bytes, _Attempt] = {}

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

    def _forget_join_topic(self, topic: bytes) -> None:
        self._attempts.pop(topic, None)

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
        return [] if sent is None else [sent]

    def _on_join_refused(self, peer: PeerId, replica: Replica, message: JoinRefused,
                         now_ms: int) -> list[Effect]:
        attempt = self._attempts.get(replica.topic_id)
        if attempt is not None and peer in attempt.asked:
            attempt.refused.add(peer)
            self.stats["join_refusals"] += 1
        return []

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
        fresh = self._ingest(peer, replica, [message.raw], SYNC, now_ms, out)
        if not replica.may_read(key):
            self.stats["join_submits_not_applied"] += 1
            return out
        self.stats["joins_accepted"] += 1
        if fresh:
            out += self._push(topic, fresh, exclude=(peer,), fanout=self.config.push_fanout)
        out += self.sync_with(peer, topic, now_ms)
        return out
