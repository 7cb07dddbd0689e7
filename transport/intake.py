"""What the engine takes in: received events into the replicas, faults against peers.

Every event a peer hands over — by push, in an anti-entropy reply, in
answer to a want — goes through `_ingest`: a known id is a duplicate and
costs one hash (content-addressed: the same id is the same bytes, so the
signature is not checked again; each node hears each event about
`forward_fanout` times, so this is the hot path), anything else goes to
`Replica.receive` and its outcome becomes log records, want sources for
missing parents, and the raws new here (which push forwards). In
standalone mode the batch is committed before anything is forwarded or
answered (`transport.dissemination` explains who commits when).

Faults are counted here too (`_blame`, weighed by `transport.misbehaviour`):
a frame that does not decode, an event failing a Reference Monitor check a
correct peer never fails, or the peer's own event failing the auth rules on
its own past counts against the peer that handed it over, and at
`misbehaviour_threshold` a `Disconnect` effect asks the driver to drop it; a
frame only attributed to a peer (`accountable=False`) is never held against
it. An event that is applied, authorized and new here is useful traffic: it
makes its sender trusted (`_trust`), which lifts the anti-entropy answer
budget (`transport.peer_budget`).

Gossip is judged before it is forwarded (`check_gossip`, the GossipSub
topic validator's question): the events of a message are prechecked
against the replica without a write (`node.replica.precheck`), and a
message holding one the replica would refuse is neither forwarded nor
taken in; the peer that handed it over is blamed as for a frame of its
own: a hard fault for what every relay checks (decoding, signature), the
author's own unauthorized event as `UNAUTHORIZED`, someone else's as
`INVALID_RELAYED` beyond the stray allowance.

`Intake` is a mixin of `Disseminator`, like `transport.anti_entropy`: it
reads the engine's state listed in its class body.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from node.core.event import Event, event_id_of, trusted_event
from node.core.outcomes import AddStatus
from node.logschema import SYNC
from node.replica.precheck import Verdict, precheck
from node.replica.replica import Received, Replica
from transport.dissemination_config import DisseminationConfig
from transport.effects import Disconnect, Effect, Log, PeerId
from transport.intake_budget import IntakeBudget
from transport.messages import MessageError, Push, decode
from transport.peer_budget import AnswerBudget
from transport.misbehaviour import (
    AUTH_BLAMED_REASONS,
    FAULT_WEIGHTS,
    MISBEHAVIOUR_REASONS,
    Fault,
    Scores,
)

# The statuses `_ingest` compares, bound once: on Python 3.11 every enum member
# lookup (`AddStatus.REJECTED`) goes through EnumType.__getattr__ and costs
# ~0.1 µs, which would be paid for every received event.
_REJECTED = AddStatus.REJECTED
_DUPLICATE = AddStatus.DUPLICATE
_BUFFERED = AddStatus.BUFFERED


MAX_REJECTIONS_KEPT = 1_024  # newest refusals by the auth rules kept for diagnostics
# Events received by push while their past was missing, remembered so that they are
# pushed on once the past arrives and the cascade applies them (`_ingest`). The
# bound of the buffer itself (node.core.buffer.MAX_BUFFERED_TOTAL): a forgotten
# one is only not relayed by this node (anti-entropy still spreads it).
MAX_AWAITING_FORWARD = 16_384


@dataclass(frozen=True, slots=True)
class Refusal:
    """One event the auth rules refused here, for diagnostics (never its payload)."""

    topic: bytes
    event_id: bytes
    reason: str
    peer: PeerId  # who handed it over


class Intake:
    """Received events and peer faults; a mixin of `Disseminator` (module docstring)."""

    @property
    def refusals(self) -> deque[Refusal]:
        """The newest MAX_REJECTIONS_KEPT events the auth rules refused here (id, reason,
        peer). The event itself is not kept: it never entered the graph."""
        kept = self.__dict__.get("_refusals")
        if kept is None:
            kept = self.__dict__["_refusals"] = deque(maxlen=MAX_REJECTIONS_KEPT)
        return kept

    @property
    def _awaiting_forward(self) -> OrderedDict[tuple[bytes, bytes], PeerId]:
        """(topic, id) of events pushed to us and buffered, and who pushed each
        (oldest first, at most MAX_AWAITING_FORWARD)."""
        kept = self.__dict__.get("_awaiting")
        if kept is None:
            kept = self.__dict__["_awaiting"] = OrderedDict()
        return kept

    # Set by each `_ingest`: the events it released (pushed to us earlier, buffered,
    # applied now) -> the peer that pushed each. That peer holds it; the peer whose
    # frame released it may not (it brought the past, not the event).
    released_by: dict[bytes, PeerId]

    # The engine's state this part reads (set by `Disseminator.__init__`).
    config: DisseminationConfig
    stats: Counter[str]
    peer_misbehaviour: Scores
    _commits: bool  # standalone: the engine commits
    _deferring: bool  # inside on_batch: commits wait for the end of the batch
    _accountable: bool  # the frame being handled came from its sender

    if TYPE_CHECKING:  # the engine's methods this part calls
        def _log(self, record_type: str, now_ms: int, topic: bytes | None, *,
                 event: Event | None = None, event_id: bytes | None = None,
                 **fields: Any) -> Log | None: ...
        def _note_want_source(self, topic: bytes, parent: bytes, peer: PeerId) -> None: ...
        def _note_news(self, topic: bytes, peer: PeerId) -> None: ...
        def _key(self, peer: PeerId) -> bytes | None: ...
        def _trust(self, peer: PeerId) -> None: ...
        def _stray_fault(self, peer: PeerId, now_ms: int, fault: Fault) -> list[Effect]: ...
        def _over_budget(self, peer: PeerId, now_ms: int, what: str) -> list[Effect]: ...
        def _holders(self, replica: Replica, sender: PeerId,
                     raws: Sequence[bytes]) -> tuple[PeerId, ...]: ...
        def _push(self, topic: bytes, raws: list[bytes], exclude: Sequence[PeerId],
                  fanout: int) -> list[Effect]: ...
        _replicas: dict[bytes, Replica]
        _trees: dict[bytes, Any]
        _answers: AnswerBudget
        intake_budget: IntakeBudget

    def check_gossip(self, peer: PeerId, data: bytes, now_ms: int) -> tuple[bool, list[Effect]]:
        """May this GossipSub message, handed over by `peer`, be taken in and forwarded?

        Pure for the replicas (nothing is inserted or written; the committer
        ingests the message later if it is accepted); only the misbehaviour
        scores, the stray buckets and the stats change. Returns the verdict
        and the effects of blaming `peer` (a `Disconnect` at the threshold).
        """
        self.stats["gossip_checked"] += 1
        if not self.intake_budget.take_bytes(peer, len(data), now_ms):  # as its own frame's
            return False, self._gossip_over_budget(peer, now_ms, "bytes")
        try:
            message = decode(data)
        except MessageError as error:
            return False, self._gossip_refused(peer, now_ms, None, f"bad_message:{error.reason}",
                                               Fault.HARD)
        if type(message) is not Push:  # the fast path carries pushes alone
            return False, self._gossip_refused(peer, now_ms, message.topic, "gossip_not_push",
                                               Fault.HARD)
        replica = self._replicas.get(message.topic)
        if replica is None:
            self.stats["gossip_refused_unknown_topic"] += 1
            return False, self._stray_fault(peer, now_ms, Fault.UNKNOWN_TOPIC)
        if not self.intake_budget.take_events(peer, len(message.events), now_ms):
            return False, self._gossip_over_budget(peer, now_ms, "events")
        earlier: set[bytes] = set()
        for raw in message.events:
            check = precheck(replica, raw, now_ms, earlier)
            verdict = check.verdict
            if verdict is Verdict.REFUSED:
                fault = Fault.HARD if check.reason in MISBEHAVIOUR_REASONS else None
                return False, self._gossip_refused(peer, now_ms, replica.topic_id,
                                                   check.reason, fault)
            if verdict is Verdict.UNAUTHORIZED or verdict is Verdict.REFUSED_BEFORE:
                event_id = event_id_of(raw)
                if verdict is Verdict.UNAUTHORIZED:
                    self.refusals.append(Refusal(replica.topic_id, event_id, check.reason, peer))
                own = (check.reason in AUTH_BLAMED_REASONS
                       and trusted_event(raw).author == self._key(peer))
                return False, self._gossip_refused(
                    peer, now_ms, replica.topic_id, f"unauthorized:{check.reason}",
                    Fault.UNAUTHORIZED if own else Fault.INVALID_RELAYED)
            earlier.add(check.event.id if check.event is not None else event_id_of(raw))
        return True, []

    def _gossip_over_budget(self, peer: PeerId, now_ms: int, what: str) -> list[Effect]:
        self.stats["gossip_refused"] += 1
        return self._over_budget(peer, now_ms, what)

    def _gossip_refused(self, peer: PeerId, now_ms: int, topic: bytes | None, reason: str,
                        fault: Fault | None) -> list[Effect]:
        """Count a refused gossip message; blame `peer` for `fault` (None: no one's fault)."""
        self.stats["gossip_refused"] += 1
        self.stats[f"gossip_refused:{reason}"] += 1
        if fault is None:
            return []
        if fault is Fault.INVALID_RELAYED:  # honest relays pass on what they cannot judge yet
            return self._stray_fault(peer, now_ms, fault)
        return self._blame(peer, now_ms, topic, f"gossip:{reason}", log=False, fault=fault)

    def _ingest(self, peer: PeerId, replica: Replica, raws: Sequence[bytes], channel: str,
                now_ms: int, out: list[Effect]) -> list[bytes]:
        """Receive a batch, commit it once, log it; return the raws applied here.

        The returned raws are what `_on_push` may pass on: the events this batch
        applied that were new here and passed the auth rules and soft fail,
        including buffered descendants that a received parent released (the
        cascade), in the order they were applied. An event only *buffered*
        (parents unknown here, so not judged yet) is never returned: a node
        relays only what it has judged, so a flood on made-up parents stops at
        the first honest node and its budget (`transport.intake_budget`) blames
        the true source. Such an event, when it came by push, is remembered
        (`_awaiting_forward`) and, if the past that releases it arrives on the
        SYNC channel (a want's answer, an exchange), pushed on here as push
        would have done; on the push channel it is simply in the returned raws.
        On SYNC, an exchange that applied something is news (`_note_news`);
        one that only buffered is not: nothing of it can be offered yet.
        """
        graph = replica.graph
        topic = replica.topic_id
        logging = self.config.log
        fresh: list[bytes] = []
        awaiting = self._awaiting_forward
        self.released_by = {}
        released: list[bytes] = []  # pushed earlier, buffered, applied now on SYNC
        pushers: set[PeerId] = set()
        for raw in raws:
            event_id = event_id_of(raw)
            # Content-addressed: a known id is these very bytes, so skip the signature
            # check. The hot path: each node hears each event about forward_fanout times.
            if graph.has(event_id) or graph.is_buffered(event_id):
                self.stats["duplicates"] += 1
                if logging:
                    out.append(self._log("duplicate", now_ms, topic, event_id=event_id,
                                         channel=channel, peer=peer))
                continue
            if graph.rejected_count and graph.rejected_reason(event_id) is not None:
                self.stats["rejected_again"] += 1  # refused before: no signature check again
                continue
            outcome = replica.receive(raw, now_ms)
            if outcome.status is _REJECTED:
                unauthorized = dict(outcome.unauthorized)
                if event_id in unauthorized:  # refused by the auth rules: kept out of the graph
                    out += self._unauthorized(peer, raw, event_id, unauthorized[event_id],
                                              topic, now_ms)
                    self._log_cascade(outcome, event_id, topic, now_ms, out)
                    continue
                reason = outcome.reason or "rejected"
                out.append(self._log("rejected", now_ms, topic, event_id=event_id, reason=reason))
                if reason in MISBEHAVIOUR_REASONS:
                    out += self._blame(peer, now_ms, topic, reason, log=False)
                continue
            if outcome.status is _DUPLICATE:
                self.stats["duplicates"] += 1
                continue
            soft_failed = dict(outcome.soft_failed) if outcome.soft_failed else {}
            self.stats[f"received_{channel}"] += 1
            out.append(self._log("received", now_ms, topic, event_id=event_id, channel=channel))
            if outcome.status is _BUFFERED:
                out.append(self._log("buffered", now_ms, topic, event_id=event_id))
                for parent in outcome.missing:
                    self._note_want_source(topic, parent, peer)
                if channel != SYNC:
                    awaiting[(topic, event_id)] = peer
                    if len(awaiting) > MAX_AWAITING_FORWARD:
                        awaiting.popitem(last=False)
                if self._accountable and (channel != SYNC or not self._answers.is_trusted(peer)) \
                        and not self.intake_budget.take_buffered(peer, now_ms):
                    # A flood of events on made-up parents (transport.intake_budget): the
                    # rest of this frame is dropped unread. Pushes always count; answers
                    # only from a peer not trusted, since a catch-up from a trusted one
                    # may buffer many (a Bloom false positive hides a parent of them all).
                    out += self._over_budget(peer, now_ms, "buffered")
                    break
            # Events failing the topic's auth rules never become vertices here (the
            # replica's gate): nothing of them is forwarded, offered or delivered.
            unauthorized = dict(outcome.unauthorized)
            for event in outcome.applied:
                if event.id in unauthorized:  # judged after the fact (a store without the gate)
                    out.append(self._log("rejected", now_ms, topic, event=event,
                                         reason=unauthorized[event.id]))
                elif event.id in soft_failed:  # node.state.soft_fail: kept, not delivered
                    self.stats["soft_failed"] += 1
                    out.append(self._log("rejected", now_ms, topic, event=event,
                                         reason=f"soft_failed:{soft_failed[event.id]}"))
                else:
                    if event.id == event_id:
                        self._trust(peer)  # useful traffic: an authorized event new here
                    # Judged and applied here: the only kind passed on (a buffered event
                    # joins `fresh` when its past arrives and the cascade applies it).
                    fresh.append(event.raw)
                    if awaiting and event.id != event_id:
                        pusher = awaiting.pop((topic, event.id), None)
                        if pusher is not None:
                            self.released_by[event.id] = pusher
                            if channel == SYNC:
                                released.append(event.raw)
                                pushers.add(pusher)
                    out.append(self._log("delivered", now_ms, topic, event=event,
                                         channel=channel, depth=graph.depth(event.id)))
            self._log_cascade(outcome, event_id, topic, now_ms, out)
        if graph.pending_ops and self._commits and not self._deferring:
            # Durable before anything is forwarded or answered (in a batch,
            # on_batch commits once at its end, before returning any effect;
            # a driven engine's driver commits before carrying any out).
            replica.commit()
        if fresh and channel == SYNC:
            self._note_news(topic, peer)
        if released and self.config.forward_pushed and topic not in self._trees:
            # After the commit above: durable before it is relayed. (On the tree fast
            # path the engine's `_ingest` sends everything a sync applied along the
            # tree, these included.)
            self.stats["forwarded_when_released"] += len(released)
            exclude = set(self._holders(replica, peer, released)) | pushers
            out += self._push(topic, released, exclude=tuple(exclude),
                              fanout=self.config.forward_fanout)
        return fresh

    def _log_cascade(self, outcome: Received, event_id: bytes, topic: bytes, now_ms: int,
                     out: list[Effect]) -> None:
        """Log the events of a cascade refused besides the one received (buffered descendants)."""
        for rejected_id, reason in outcome.rejected_ids:
            if rejected_id != event_id:
                self.stats["rejected_in_cascade"] += 1
                out.append(self._log("rejected", now_ms, topic, event_id=rejected_id,
                                     reason=reason))

    def _unauthorized(self, peer: PeerId, raw: bytes, event_id: bytes, reason: str,
                      topic: bytes, now_ms: int) -> list[Effect]:
        """Log an event the auth rules refused; blame `peer` if it is the author.

        Only the author is accountable for its own event, and only for a verdict on
        its own past (transport.misbehaviour says why): a relay is never blamed.
        """
        self.stats["unauthorized"] += 1
        self.refusals.append(Refusal(topic, event_id, reason, peer))
        out: list[Effect] = []
        log = self._log("rejected", now_ms, topic, event_id=event_id, reason=reason)
        if log is not None:
            out.append(log)
        if reason in AUTH_BLAMED_REASONS and trusted_event(raw).author == self._key(peer):
            out += self._blame(peer, now_ms, topic, f"unauthorized:{reason}",
                               log=False, fault=Fault.UNAUTHORIZED)
        return out

    def _blame(self, peer: PeerId, now_ms: int, topic: bytes | None, reason: str,
               log: bool = True, fault: Fault = Fault.HARD) -> list[Effect]:
        """Count a fault of `fault`'s weight against `peer`; at the threshold, ask to drop it.

        `Scores` keeps the decaying scores (restarted after a disconnect,
        bounded by MAX_BLAMED_PEERS). A fault in a frame not handed over by
        `peer` itself (`on_message(accountable=False)`) is only counted in stats.
        """
        out: list[Effect] = []
        if log:
            out.append(self._log("rejected", now_ms, topic, reason=reason, peer=peer))
        if not self._accountable:
            self.stats["unattributed_faults"] += 1
            return out
        self.stats["misbehaviour"] += 1
        self.stats[f"misbehaviour_{fault}"] += 1
        if self.peer_misbehaviour.add(peer, FAULT_WEIGHTS[fault],
                                      self.config.misbehaviour_threshold, now_ms):
            self.stats["disconnects"] += 1
            out.append(Disconnect(peer, reason))
        return out
