"""The relay side of the relay protocol: serve templates, accept relayed writers' events.

A relay is a node that replicates a topic and is a writer or indexer there.
Devices with the relayed role (a key, no replica) ask it for a template,
sign, and submit (`transport.relay` documents the messages). This module is
the decision logic, sans-IO like the core: it takes the requester's key, the
request bytes and the time, and returns the response bytes plus the events
it applied; the runtime (`node.runtime`) commits those, disseminates them
and only then sends the response, so "accepted" always means durable.

What the relay checks, in order, for a submit:

1. the request decodes and is within bounds (`transport.relay.decode`);
2. the request is within the rates of its source and of its key
   (`RateLimiter`, token buckets per source address and per key). Keys are
   free - a Sybil client takes a fresh one every burst (issue 16: 112 keys in
   20 s were never limited) - so the source (the address the connection
   comes from; `node.relay_intake`) has a bucket of its own;
3. the relay replicates the topic and holds its create event, and the peer
   may ask about it (`requester_access`): for a topic whose join rule is not
   public, the peer's key is joined in the current resolved state, or it is
   invited and the request is about its own member event (its join). Anyone
   else gets `UNKNOWN_TOPIC` with one fixed detail: the answer for a topic
   this relay never heard of, so a refusal does not reveal that the topic
   exists, that the relay replicates it, or who is in it (docs/access.md);
4. the relay can reference relayed events (it is a writer or indexer: its
   acks do that);
5. per event: the bytes decode as one canonical event, of this topic,
   signed by the requesting peer's own key (a relay hands on what a device
   signed, not what it forwards for others), and the author holds the
   relayed role in the current state - except the author's own member event
   (its join with `"relayed": true` is how a device declares the role), which
   only a key that holds the writing level (granted by an admin: the role
   needs it) and is not banned may send. All of this is read from the
   resolved state before any signature is verified: an unauthorised key
   costs the relay no verification, whatever it submits;
6. the node-wide verification budget (`VERIFY_PER_S`, a token bucket over
   all keys and sources) has room for the event: however many authorised
   keys or sources there are, the relay verifies at most that many events a
   second; over it, the event is rejected RATE_LIMITED (retry later);
7. then the event takes the path of any remote event, `Replica.receive`:
   Reference Monitor (signature, size, future timestamps...), graph,
   auth rules. Its verdict is the event's outcome.

The requester's key is the key its libp2p peer id embeds (the Noise
handshake proved the peer holds it; `node.relay_intake` derives it): requests
are not signed, and a submitted event counts only if signed by that same key.
Every answer that carries a topic's ids (a Template's parents and auth
references, a SubmitResult's outcomes) passes step 3 first.

Events are handled in the order given, so a batch may carry a device's join
followed by its first messages. After a submit, the relay's ack duty
(`TopicOrder.ack_due`: pending relayed extremities) makes its next ack
reference them; the runtime asks for that ack at once.
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from node.core.event import KIND_MESSAGE, Event, EventFormatError, decode_event
from node.core.outcomes import AddStatus
from node.replica.replica import NotReadyError, PublishError, Replica
from node.state.actions import NotAuthorizedError
from node.state.roles import Role
from node.state.types import TYPE_MEMBER, Membership, user_id
from node.state.view import StateView
from transport.relay import (
    Outcome,
    Refused,
    RelayMessageError,
    RelayReason,
    SubmitRequest,
    SubmitResult,
    SubmitStatus,
    Template,
    TemplateRequest,
    decode,
    encode,
)

# A device publishing a line a second is far below this; a burst covers a
# reconnect's backlog (one template + one submit per MAX_SUBMIT_EVENTS).
REQUESTS_PER_S = 20.0
REQUEST_BURST = 40
MAX_TRACKED_PEERS = 4_096  # rate-limiter entries; the least recently seen go first
# Per source address, all its keys together: a few devices behind one NAT fit,
# a client cycling keys does not get a fresh allowance with each key.
SOURCE_REQUESTS_PER_S = 40.0
SOURCE_REQUEST_BURST = 80
MAX_TRACKED_SOURCES = 1_024
# Events the relay verifies per second, node-wide (~0.1 ms each: ~5% of a core),
# with a burst of a few full submits for reconnecting devices.
VERIFY_PER_S = 500.0
VERIFY_BURST = 2_048
# The one answer for "no such topic here", "not ready yet" and "you may not read it":
# the same reason and the same words, so a refusal tells a non-member nothing.
NOT_FOUND_DETAIL = ("this relay serves no such topic to this key (unknown here, not received "
                    "yet, or the key is not a member)")


class RelayRefusal(Exception):
    """The whole request is refused, for `reason`; `detail` is one line for the device."""

    def __init__(self, reason: RelayReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class RelayLimits:
    requests_per_s: float = REQUESTS_PER_S  # per key
    burst: int = REQUEST_BURST
    max_tracked_peers: int = MAX_TRACKED_PEERS
    source_requests_per_s: float = SOURCE_REQUESTS_PER_S  # per source address
    source_burst: int = SOURCE_REQUEST_BURST
    max_tracked_sources: int = MAX_TRACKED_SOURCES
    verify_per_s: float = VERIFY_PER_S  # events verified, node-wide
    verify_burst: int = VERIFY_BURST


@dataclass(frozen=True, slots=True)
class Handled:
    """A handled request: the response to send once `applied` is committed and sent on."""

    response: bytes
    topic: bytes | None = None
    applied: tuple[Event, ...] = ()  # authorized events newly applied (cascades included)
    wrote: bool = False  # the replica has uncommitted writes (commit before responding)


class TokenBucket:
    """One bucket: `burst` tokens at once, `rate` per second after."""

    def __init__(self, rate_per_s: float, burst: int) -> None:
        self._rate_per_ms = rate_per_s / 1_000
        self._burst = float(burst)
        self._tokens = float(burst)
        self._at_ms: int | None = None

    def take(self, now_ms: int) -> bool:
        """Take one token if there is one."""
        if self._at_ms is not None:
            self._tokens = min(self._burst,
                               self._tokens + max(0, now_ms - self._at_ms) * self._rate_per_ms)
        self._at_ms = now_ms
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class RateLimiter:
    """A token bucket per key (a peer key or a source): `burst` at once, `rate` per second after."""

    def __init__(self, rate_per_s: float, burst: int, max_peers: int) -> None:
        self._rate_per_ms = rate_per_s / 1_000
        self._burst = float(burst)
        self._max_peers = max_peers
        self._buckets: OrderedDict[bytes | str, tuple[float, int]] = OrderedDict()  # tokens, at ms

    def allow(self, peer: bytes | str, now_ms: int) -> bool:
        tokens, at = self._buckets.pop(peer, (self._burst, now_ms))
        tokens = min(self._burst, tokens + max(0, now_ms - at) * self._rate_per_ms)
        allowed = tokens >= 1.0
        self._buckets[peer] = (tokens - 1.0 if allowed else tokens, now_ms)
        while len(self._buckets) > self._max_peers:
            self._buckets.popitem(last=False)  # forgetting a peer only refills its bucket
        return allowed


@dataclass
class RelayServer:
    """Answers relay requests for the topics `replica_of` finds (None: not replicated here)."""

    replica_of: Callable[[bytes], Replica | None]
    rng: random.Random
    limits: RelayLimits = field(default_factory=RelayLimits)
    stats: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        limits = self.limits
        self._limiter = RateLimiter(limits.requests_per_s, limits.burst, limits.max_tracked_peers)
        self._sources = RateLimiter(limits.source_requests_per_s, limits.source_burst,
                                    limits.max_tracked_sources)
        self._verify = TokenBucket(limits.verify_per_s, limits.verify_burst)

    def handle(self, author: bytes, request: bytes, now_ms: int,
               source: str | None = None) -> Handled:
        """Answer one request from the peer whose key is `author`. Never raises for bad input.

        `source` names where the request came from (the connection's IP
        address); None counts the key as its own source.
        """
        self.stats["requests"] += 1
        if source is not None:
            self.stats["requests_with_source"] += 1
        try:
            if not self._sources.allow(author if source is None else source, now_ms):
                raise RelayRefusal(
                    RelayReason.RATE_LIMITED,
                    f"more than {self.limits.source_requests_per_s:g} requests/s from this "
                    "address; retry later")
            if not self._limiter.allow(author, now_ms):
                raise RelayRefusal(
                    RelayReason.RATE_LIMITED,
                    f"more than {self.limits.requests_per_s:g} requests/s; retry later")
            try:
                message = decode(request)
            except RelayMessageError as exc:
                raise RelayRefusal(RelayReason.BAD_REQUEST, str(exc)) from None
            if isinstance(message, TemplateRequest):
                return self._template(author, message, now_ms)
            if isinstance(message, SubmitRequest):
                return self._submit(author, message, now_ms)
            raise RelayRefusal(RelayReason.BAD_REQUEST,
                               f"{type(message).__name__} is not a request")
        except RelayRefusal as refusal:
            self.stats[f"refused.{refusal.reason}"] += 1
            return Handled(encode(Refused(refusal.reason, refusal.detail)))

    # ------------------------------------------------------------------ requests

    def _template(self, author: bytes, request: TemplateRequest, now_ms: int) -> Handled:
        joining = _is_own_member_event(author, request.kind, request.state_key)
        replica = self._replica(request.topic, author, joining)
        if not joining:
            self._require_relayed(replica, author)
        try:
            seq, parents, auth = replica.relayed_template(
                author, request.kind, request.state_key, request.payload, now_ms, self.rng)
        except NotAuthorizedError as exc:
            raise RelayRefusal(RelayReason.NOT_AUTHORIZED, f"{exc.reason}: {exc}") from None
        except (NotReadyError, PublishError) as exc:
            raise RelayRefusal(RelayReason.NOT_AUTHORIZED, str(exc)) from None
        self.stats["templates"] += 1
        return Handled(encode(Template(request.topic, seq, parents, auth, replica.params.d_max,
                                       now_ms)))

    def _submit(self, author: bytes, request: SubmitRequest, now_ms: int) -> Handled:
        # An invitee passes with any batch: only its own member event can get past
        # the per-event role check below, and it learns nothing but its own ids.
        replica = self._replica(request.topic, author, joining=True)
        rights = submit_rights(replica, author)  # read once, before any signature is verified
        outcomes: list[Outcome] = []
        applied: list[Event] = []
        for raw in request.events:
            outcome, made = self._submit_one(replica, author, rights, request.topic, raw, now_ms)
            outcomes.append(outcome)
            applied += made
            self.stats[f"submitted.{outcome.status}"] += 1
            if outcome.status is SubmitStatus.REJECTED:
                self.stats[f"rejected.{outcome.reason}"] += 1
        response = encode(SubmitResult(request.topic, tuple(outcomes)))
        # Buffered events and unauthorized ones the graph keeps (as every replica
        # keeps them) are writes too, not only the applied events.
        return Handled(response, request.topic, tuple(applied), replica.graph.pending_ops > 0)

    def _submit_one(self, replica: Replica, author: bytes, rights: Rights, topic: bytes,
                    raw: bytes, now_ms: int) -> tuple[Outcome, list[Event]]:
        try:
            event = decode_event(raw)  # cheap: the signature is the monitor's job below
        except EventFormatError as exc:
            reason = f"{RelayReason.NOT_AN_EVENT}:{exc.reason}"
            return Outcome(None, SubmitStatus.REJECTED, reason), []
        except Exception:  # defence in depth, as in the monitor
            return Outcome(None, SubmitStatus.REJECTED, RelayReason.NOT_AN_EVENT), []
        if event.topic_id() != topic:
            return Outcome(event.id, SubmitStatus.REJECTED, RelayReason.WRONG_TOPIC), []
        if event.author != author:
            return Outcome(event.id, SubmitStatus.REJECTED, RelayReason.AUTHOR_NOT_SENDER), []
        if replica.graph.has(event.id):
            return Outcome(event.id, SubmitStatus.DUPLICATE), []
        own_member = _is_own_member_event(author, event.kind, event.state_key)
        if not (rights is Rights.RELAYED or (rights is Rights.OWN_MEMBER and own_member)):
            self.stats["unauthorised_unverified"] += 1
            return Outcome(event.id, SubmitStatus.REJECTED, RelayReason.NOT_RELAYED_WRITER), []
        if not self._verify.take(now_ms):
            self.stats["verify_budget_spent"] += 1
            return Outcome(event.id, SubmitStatus.REJECTED, RelayReason.RATE_LIMITED), []
        self.stats["verified"] += 1  # handed to the Reference Monitor: a signature check
        received = replica.receive(raw, now_ms)
        unauthorized = dict(received.unauthorized)
        made = [e for e in received.applied if e.id not in unauthorized]
        if received.status is AddStatus.REJECTED:
            return Outcome(event.id, SubmitStatus.REJECTED, received.reason or "rejected"), made
        if event.id in unauthorized:
            return Outcome(event.id, SubmitStatus.REJECTED, unauthorized[event.id]), made
        if received.status is AddStatus.BUFFERED:
            return Outcome(event.id, SubmitStatus.BUFFERED), made
        if received.status is AddStatus.DUPLICATE:
            return Outcome(event.id, SubmitStatus.DUPLICATE), made
        return Outcome(event.id, SubmitStatus.ACCEPTED), made

    # ------------------------------------------------------------------ checks

    def _replica(self, topic: bytes, author: bytes, joining: bool) -> Replica:
        """The topic's replica if `author` may ask about it; RelayRefusal otherwise.

        `joining`: the request may be the author's own member event, which an
        invitee may ask for. "Not here", "not ready" and "not yours to read"
        are one answer (UNKNOWN_TOPIC, NOT_FOUND_DETAIL), checked before any
        answer that depends on the topic's state or this relay's role in it.
        """
        replica = self.replica_of(topic)
        if replica is None or not replica.ready:
            # Not ready: the relay waits for the create event and cannot tell
            # whether the topic is open; "not found" reveals no interest in it.
            raise RelayRefusal(RelayReason.UNKNOWN_TOPIC, NOT_FOUND_DETAIL)
        access = requester_access(replica, author)
        if access is Access.NONE or (access is Access.INVITEE and not joining):
            self.stats["not_member_refused"] += 1
            raise RelayRefusal(RelayReason.UNKNOWN_TOPIC, NOT_FOUND_DETAIL)
        if not replica.authorizing or replica.ordering is None:
            raise RelayRefusal(RelayReason.NOT_AUTHORIZED,
                               "the topic keeps no roles or order, so it has no relayed writers")
        own = replica.role_of(replica.identity.public_key)
        if own not in (Role.INDEXER, Role.WRITER):
            raise RelayRefusal(RelayReason.RELAY_CANNOT_REFERENCE,
                               f"this relay's role in the topic is {own.value}: only a writer or "
                               "indexer can reference relayed events")
        return replica

    @staticmethod
    def _require_relayed(replica: Replica, author: bytes) -> None:
        role = replica.role_of(author)
        if role is not Role.RELAYED:
            raise RelayRefusal(
                RelayReason.NOT_RELAYED_WRITER,
                f"{user_id(author)[:12]}… has role {role.value} in this topic; a relayed writer "
                "needs the writing level (granted by an admin: add-writer) and its own join "
                "with relayed=true (RelayedWriter.join)")


class Rights(StrEnum):
    """What a key may submit to a topic through the relay (`submit_rights`)."""

    RELAYED = "relayed"  # a relayed writer: its events
    OWN_MEMBER = "own_member"  # granted the writing level, not relayed yet: its member events
    NONE = "none"  # nothing: every event is refused before its signature is checked


def submit_rights(replica: Replica, key: bytes) -> Rights:
    """`key`'s submit rights in the current resolved state of an authorizing replica.

    Cheap (the current state map is cached per state group), and read before
    any signature is verified, so a key nobody granted anything costs the
    relay no verification. A key that may declare the relayed role holds
    the writing level - an admin granted it; keys are free, grants are not -
    and is not banned.
    """
    role = replica.role_of(key)
    if role is Role.RELAYED:
        return Rights.RELAYED
    tracker = replica.tracker
    power = StateView(tracker.state(tracker.current_group()), replica.graph).power_levels()
    if power.user_level(user_id(key)) < power.send_level(KIND_MESSAGE, is_state=False):
        return Rights.NONE
    if replica.membership_of(key) is Membership.BAN:
        return Rights.NONE
    return Rights.OWN_MEMBER


class Access(StrEnum):
    """What a requester's key may ask a relay about one topic (`requester_access`)."""

    READER = "reader"  # open topic, or a joined member: anything, then the role decides
    INVITEE = "invitee"  # invited, not joined: its own member event (its join) only
    NONE = "none"  # not found


def requester_access(replica: Replica, key: bytes) -> Access:
    """`key`'s access to a ready replica's topic in the current resolved state.

    The read rule of docs/access.md ("shared" history): a topic that keeps no
    state or whose join rule is public is open; otherwise a key reads iff it
    is joined, and an invited key may only ask for its join. Pure and cheap:
    the current state map is cached per state group by the tracker.
    """
    if replica.may_read(key):  # the engine's read rule (node/replica/read_access.py)
        return Access.READER
    return Access.INVITEE if replica.membership_of(key) is Membership.INVITE else Access.NONE


def _is_own_member_event(author: bytes, kind: str, state_key: str | None) -> bool:
    """The author's own membership event (its relayed join): allowed before it has the role."""
    return kind == TYPE_MEMBER and state_key == user_id(author)
