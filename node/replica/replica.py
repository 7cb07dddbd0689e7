"""A replica of one topic: Reference Monitor + graph + local authoring, sans-IO.

This is the object the simulator and the trio runtime both drive. It takes
bytes and the current time in, and returns what happened; it never awaits,
sleeps, reads a clock or draws from global randomness, so one seed
reproduces any run.

    replica = Replica.create_topic(store, identity, now_ms=..., name="kitchen")
    outcome = other.receive(raw, now_ms=...)      # from the network
    event = replica.publish(b"21.5C", now_ms=..., rng=rng)
    replica.commit()                              # durable: group commit

Writes become durable only at `commit()` (or when the node's committer,
the only writer in a running node, commits the graph's `take_writes()`);
callers acknowledge published or received events to others only after it
returns.

Topic state and authorization
-----------------------------
A topic created with `authorization=True` is a Matrix-style room: every
applied event gets a state before and after it and is checked against the
auth rules (`node.state.tracker`). An event that fails stays a vertex of the
graph (its children are not blocked, and it is still gossiped), but it is
*rejected*: listed in `Received.unauthorized`, counted as
`counters["rejected.<reason>"]`, never in state, and skipped by
`deliveries()`. Whether a topic is authorized is fixed by its create event
(`TopicParams.authorization`; absent means authorized, as in Matrix), so every
replica of a topic agrees; `ReplicaConfig.authorization=False` turns state
tracking off in one replica (pure MEG, as before: the simulator's setting).

    replica = Replica.create_topic(store, me, now_ms, authorization=True)
    replica.add_writer(bob_key, now_ms, rng)       # invite + writing level
    bob_replica.join(now_ms, rng)                  # on bob's node
    replica.state(); replica.role_of(bob_key); replica.indexers()

The creator bootstraps the topic in `create_topic`: create, its own join
(allowed only straight after the create event), the initial power levels
(`node.state.actions.initial_power_levels`) and the join rule, so the creator
can write at once. Local operations are checked before signing and raise
`NotAuthorizedError` naming the missing power.

Total order (node.replica.ordering)
---------------------------
An authorizing replica also keeps the topic's consistent total order
(`ReplicaConfig.ordering`; `TopicOrder`, built on first use): every batch of
applied events is fed to it, and `Received.order` reports what changed.

    replica.ordered("confirmed" | "tentative" | "causal", since=0)
    replica.order_status()             # confirmed/tentative length, indexers
    replica.maybe_ack(now_ms, rng)     # the dissemination tick calls it
    replica.sign_relayed(payload, now_ms, rng)   # a relayed device's writes

Local events keep the author's chain (the extremity above its own latest
event is always a parent) and reference pending relayed events first when
the width exceeds `d_max` (`TopicOrder.parents_to_keep`).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from node.core.event import (
    EVENT_VERSION,
    KIND_CREATE,
    KIND_DUMMY,
    KIND_MESSAGE,
    Event,
    pack_payload,
)
from node.core.fastinit import fast_init
from node.core.graph import AddResult, Graph, GraphLimits
from node.core.identity import Identity, sign_event
from node.core.monitor import MAX_FUTURE_SKEW_MS, ReferenceMonitor, Rejected
from node.core.order import OrderUpdate
from node.core.outcomes import AddStatus
from node.core.parents import (
    DEFAULT_D_MAX,
    MAX_D_MAX,
    MIN_D_MAX,
    DepletionPolicy,
    ParentPolicy,
    select_parents,
)
from node.replica.ordering import (
    KIND_ACK,
    ORDER_CAUSAL,
    ORDER_CONFIRMED,
    ORDER_TENTATIVE,
    OrderConfig,
    OrderStatus,
    TopicOrder,
)
from node.state import actions
from node.state.actions import EventSpec, NotAuthorizedError, RoleError
from node.state.auth_rules import EventFields, select_auth_refs
from node.state.roles import Role
from node.state.roles import indexers as indexers_in
from node.state.roles import role_of as role_in
from node.state.store import MAX_DELTA_CHAIN, StateGroups
from node.state.tracker import REASON_UNRESOLVABLE, StateResolutionError, StateTracker
from node.state.types import (
    BAN,
    INVITE,
    JOIN,
    RULE_INVITE,
    TYPE_JOIN_RULES,
    TYPE_MEMBER,
    TYPE_POWER_LEVELS,
    StateKey,
)
from node.state.view import StateView
from node.core.store import TABLE_STATE, Store

__all__ = [
    "NotAuthorizedError", "NotReadyError", "OrderingDisabledError", "PublishError", "Received",
    "Replica", "ReplicaConfig", "RoleError", "StateDisabledError", "TopicParams",
]


class NotReadyError(Exception):
    """The replica cannot author events yet: it does not hold the topic's create event."""


class PublishError(Exception):
    """A local event could not be added (the message says why)."""


class StateDisabledError(Exception):
    """Topic state was asked of a replica that does not track it (see `Replica.authorizing`)."""


class OrderingDisabledError(StateDisabledError):
    """A total order was asked of a replica that keeps none (see `Replica.ordering`)."""


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    parent_policy: ParentPolicy = ParentPolicy.RANDOM
    depletion: DepletionPolicy = field(default_factory=DepletionPolicy)
    limits: GraphLimits = field(default_factory=GraphLimits)
    max_future_skew_ms: int = MAX_FUTURE_SKEW_MS
    # Track topic state and enforce the auth rules on topics whose create event
    # asks for them. False: pure MEG, no state (the simulator, the CRDT tests).
    authorization: bool = True
    state_delta_chain: int = MAX_DELTA_CHAIN  # see node.state.store
    # The total order of authorizing topics (node.replica.ordering): on/off, ack interval.
    ordering: OrderConfig = field(default_factory=OrderConfig)


@dataclass(frozen=True, slots=True)
class TopicParams:
    """Parameters fixed by the create event's content."""

    name: str = ""
    d_max: int = DEFAULT_D_MAX
    authorization: bool = True  # Matrix rooms are always authorized; a topic may opt out

    @classmethod
    def from_create(cls, event: Event) -> "TopicParams":
        try:
            content = event.content()
        except Exception:
            return cls()
        if not isinstance(content, dict):
            return cls()
        name = content.get("name", "")
        d_max = content.get("d_max", DEFAULT_D_MAX)
        if not isinstance(name, str):
            name = ""
        if type(d_max) is not int or not MIN_D_MAX <= d_max <= MAX_D_MAX:
            d_max = DEFAULT_D_MAX
        authorization = content.get("authorization", True)
        if type(authorization) is not bool:
            authorization = True  # a garbled flag never turns authorization off
        return cls(name=name, d_max=d_max, authorization=authorization)


@fast_init  # built for every event received or published: node.core.fastinit
@dataclass(frozen=True, slots=True)
class Received:
    """The outcome of `Replica.receive` for one incoming byte string."""

    status: AddStatus
    event_id: bytes | None
    reason: str | None = None
    applied: tuple[Event, ...] = ()
    missing: tuple[bytes, ...] = ()
    dropped: tuple[bytes, ...] = ()
    equivocations: tuple[Event, ...] = ()
    rejected_ids: tuple[tuple[bytes, str], ...] = ()
    # Applied events (a subset of `applied`) that failed the auth rules: stored
    # as rejected vertices, never delivered, never in state. (id, reason).
    unauthorized: tuple[tuple[bytes, str], ...] = ()
    # What the applied events changed in the total order (None: nothing, or no order).
    order: OrderUpdate | None = None


class Replica:
    """One topic's replica on one node."""

    def __init__(
        self, store: Store, topic_id: bytes, identity: Identity, config: ReplicaConfig = ReplicaConfig()
    ) -> None:
        self.topic_id = topic_id
        self.identity = identity
        self.config = config
        self.graph = Graph(store, topic_id, config.limits)
        self.monitor = ReferenceMonitor(topic_id, config.max_future_skew_ms)
        self.counters: Counter[str] = Counter()
        self._params: TopicParams | None = None
        self._last_dummy_ms: int | None = None
        self._tracker: StateTracker | None = None
        self._authorizing: bool | None = None
        self._order: TopicOrder | None = None
        self.graph.on_discard(self._forget_state_caches)
        self.graph.on_discard(self._forget_order)

    @classmethod
    def create_topic(
        cls,
        store: Store,
        identity: Identity,
        now_ms: int,
        name: str = "",
        d_max: int = DEFAULT_D_MAX,
        config: ReplicaConfig = ReplicaConfig(),
        *,
        authorization: bool = False,
        join_rule: str = RULE_INVITE,
        members_write: bool = False,
        commit: bool = True,
    ) -> "Replica":
        """Author a new topic and return the replica holding it (committed).

        `commit=False` leaves its writes pending for the caller to commit (the
        node's committer takes them with the rest of its step).

        With `authorization`, the topic is a Matrix-style room and the creator
        bootstraps it: its own join, the initial power levels and the join
        rule follow the create event, so the creator can write at once. Without
        it, the topic is a pure MEG (the create event alone, no auth rules).
        `members_write` gives every joined member the writing level (an open
        publish-subscribe topic); otherwise writing is granted per member.
        """
        if not MIN_D_MAX <= d_max <= MAX_D_MAX:
            raise ValueError(f"d_max must be in [{MIN_D_MAX}, {MAX_D_MAX}]")
        if authorization and not config.authorization:
            raise ValueError("an authorized topic needs ReplicaConfig(authorization=True): "
                             "its events need auth refs chosen from the topic state")
        create = sign_event(
            identity, topic=b"", seq=0, parents=(), timestamp_ms=now_ms, kind=KIND_CREATE,
            state_key="", payload=pack_payload(
                {"name": name, "d_max": d_max, "creator": identity.public_key.hex(),
                 "authorization": authorization}),
        )
        replica = cls(store, create.id, identity, config)
        result = replica.graph.add(create)
        assert result.status is AddStatus.APPLIED, result
        if authorization:
            replica.tracker.apply(result.applied)
            # One extremity at each step: the parent choice draws nothing from this rng.
            rng = random.Random(0)
            for spec in (
                actions.membership_spec(identity.public_key, JOIN),
                EventSpec(TYPE_POWER_LEVELS, "", actions.initial_power_levels(
                    identity.public_key, members_write=members_write)),
                EventSpec(TYPE_JOIN_RULES, "", {"join_rule": join_rule}),
            ):
                replica._publish_spec(spec, now_ms, rng)
        if commit:
            replica.commit()
        return replica

    # ---------------------------------------------------------------- queries

    @property
    def params(self) -> TopicParams:
        if self._params is None:
            root = self.graph.get(self.topic_id)
            if root is None:
                return TopicParams()
            self._params = TopicParams.from_create(root)
        return self._params

    @property
    def ready(self) -> bool:
        """True once the create event is here, so this replica can author events."""
        return self.graph.has_root

    @property
    def authorizing(self) -> bool:
        """True when this replica tracks topic state and enforces the auth rules.

        Needs the config switch on and the topic's create event (here) asking
        for authorization.
        """
        if self._authorizing is None:
            if not self.ready:
                return False
            # Fixed from now on: the create event never changes or goes away.
            self._authorizing = self.config.authorization and self.params.authorization
        return self._authorizing

    @property
    def tracker(self) -> StateTracker:
        """The topic's state machine; raises StateDisabledError when not `authorizing`."""
        if self._tracker is None:
            if not self.authorizing:
                raise StateDisabledError(
                    "this replica does not track topic state: "
                    + ("the create event has not arrived" if not self.ready else
                       "the topic is not authorized" if not self.params.authorization else
                       "ReplicaConfig.authorization is off"))
            groups = StateGroups(self.graph.table(TABLE_STATE), self.config.state_delta_chain)
            self._tracker = StateTracker(self.graph, groups)
        return self._tracker

    def state(self) -> dict[StateKey, Event]:
        """The current topic state: the resolved state at the forward extremities."""
        return {key: self._event(eid) for key, eid in self._current_state().items()}

    def role_of(self, key: bytes) -> Role:
        """The writer role of an author key in the current state."""
        return role_in(key, self._current_state(), self.graph)

    def indexers(self) -> frozenset[bytes]:
        """Author keys of the current indexers."""
        return indexers_in(self._current_state(), self.graph)

    def is_rejected(self, event_id: bytes) -> bool:
        """True if the event is here and failed the auth rules (always False without state)."""
        return self.authorizing and self.tracker.is_rejected(event_id)

    def rejection_reason(self, event_id: bytes) -> str | None:
        if not self.authorizing:
            return None
        record = self.tracker.event_state(event_id)
        return None if record is None else record.reason

    def rejected_events(self, limit: int | None = None) -> list[bytes]:
        """Ids of the events stored as rejected (by id), at most `limit`."""
        return self.tracker.groups.rejected_ids(limit) if self.authorizing else []

    def deliveries(self, since: int = 0, limit: int = 1_000,
                   include_rejected: bool = False) -> list[tuple[int, Event]]:
        """What subscribers get: `graph.deliveries` without rejected events.

        Positions are the graph's delivery positions, so a cursor (last
        position + 1) resumes exactly; up to `limit` events are returned.
        """
        if include_rejected or not self.authorizing:
            return self.graph.deliveries(since, limit)
        out: list[tuple[int, Event]] = []
        position = max(since, 0)
        end = self.graph.delivered_count
        while position < end and len(out) < limit:
            page = self.graph.deliveries(position, limit)
            out += [(p, e) for p, e in page if not self.tracker.is_rejected(e.id)]
            position = page[-1][0] + 1
        return out[:limit]

    def _current_state(self) -> Mapping[StateKey, bytes]:
        tracker = self.tracker
        return tracker.state(tracker.current_group())

    def _event(self, event_id: bytes) -> Event:
        event = self.graph.get(event_id)
        assert event is not None, "a state map names an event the graph lacks"
        return event

    def _forget_state_caches(self) -> None:
        self._authorizing = None  # the root itself may have been among the discarded writes
        if self._tracker is not None:
            self._tracker.clear_caches()

    # ---------------------------------------------------------------- updates

    def receive(self, raw: bytes, now_ms: int, expected_id: bytes | None = None) -> Received:
        """Validate and add one event from outside. Never raises for bad input."""
        # A known id skips the signature check: ids hash the bytes, which were
        # verified when first received (gossip repeats each event many times).
        verdict = self.monitor.check(raw, now_ms, expected_id, known=self.graph.knows)
        if isinstance(verdict, Rejected):
            self.counters[f"rejected.{verdict.reason}"] += 1
            return Received(AddStatus.REJECTED, None, reason=verdict.reason)
        return self._outcome(self.graph.add(verdict))

    def _outcome(self, result: AddResult) -> Received:
        self.counters[result.status] += 1
        for rejection in result.rejected:
            self.counters[f"rejected.{rejection.reason}"] += 1
        if result.equivocations:
            self.counters["equivocations"] += len(result.equivocations)
        unauthorized: tuple[tuple[bytes, str], ...] = ()
        order: OrderUpdate | None = None
        authorizing = self._authorizing  # the property's cached answer: this runs per event
        if authorizing is None:
            authorizing = self.authorizing
        if result.applied and authorizing:
            # Same write-set as the graph's: state commits with the events.
            unauthorized = tuple(self.tracker.apply(result.applied))
            for _, reason in unauthorized:
                self.counters[f"rejected.{reason}"] += 1
            self.counters["unauthorized"] += len(unauthorized)
            order = self._order_applied(result.applied)
        # Positional (in field order): keywords cost a third of building it, once per event.
        return Received(
            result.status, result.event_id, result.reason, result.applied, result.missing,
            result.dropped, result.equivocations,
            tuple((r.event_id, r.reason) for r in result.rejected) if result.rejected else (),
            unauthorized, order,
        )

    def publish(
        self,
        payload: bytes,
        now_ms: int,
        rng: random.Random,
        kind: str = KIND_MESSAGE,
        state_key: str | None = None,
    ) -> tuple[Event, Received]:
        """Author, sign and add an event on top of the current extremities.

        Returns the event and the graph outcome (which lists it under
        `applied`). Not durable until `commit()`. On an authorized topic the
        event is checked against the state before it first, and refused with
        NotAuthorizedError (nothing signed) if the auth rules forbid it.
        """
        if not self.ready:
            raise NotReadyError("the topic's create event has not arrived yet; wait for sync")
        if kind == KIND_CREATE:
            raise PublishError("a topic has exactly one create event")
        parents = self._choose_parents(rng, kind)
        latest = self.graph.author_latest_seq(self.identity.public_key)
        seq = (latest if latest is not None else -1) + 1
        auth: tuple[bytes, ...] = (self.topic_id,)
        if self.authorizing:
            draft = self._draft(kind, state_key, payload, parents, seq, now_ms)
            auth = self._checked(draft).auth
        event = sign_event(
            self.identity, topic=self.topic_id, seq=seq, parents=parents, timestamp_ms=now_ms,
            kind=kind, payload=payload, state_key=state_key, auth=auth,
        )
        # fresh: seq is above the author's latest here, so the id cannot be applied yet.
        outcome = self._outcome(self.graph.add(event, fresh=True))
        if outcome.status is not AddStatus.APPLIED:
            raise PublishError(f"local event not applied: {outcome.status} {outcome.reason}")
        if outcome.unauthorized:  # the check above passed: only a bug gets here
            raise PublishError(f"local event rejected: {outcome.unauthorized[0][1]}")
        self.counters["created"] += 1
        return event, outcome

    def _draft(self, kind: str, state_key: str | None, payload: bytes,
               parents: tuple[bytes, ...] | list[bytes], seq: int, now_ms: int) -> Event:
        """The event as it would be signed, unsigned, auth refs not chosen yet."""
        return Event(
            version=EVENT_VERSION, topic=self.topic_id, author=self.identity.public_key, seq=seq,
            parents=tuple(sorted(parents)), auth=(), timestamp_ms=now_ms, kind=kind,
            state_key=state_key, payload=payload, signature=b"", raw=b"", id=b"",
        )

    def _checked(self, draft: Event) -> Event:
        """`draft` with its auth refs, if the auth rules allow it; else NotAuthorizedError."""
        tracker = self.tracker
        try:
            before = tracker.group_before(draft.parents)
        except StateResolutionError as error:
            # Every replica would reject this event as state_unresolvable.
            raise NotAuthorizedError(REASON_UNRESOLVABLE, (
                f"the states of this topic's heads cannot be resolved ({error}); an event "
                "on these parents would be rejected everywhere")) from None
        state = tracker.state(before)
        fields = (EventFields.of(draft) if draft.kind == TYPE_MEMBER
                  else EventFields(draft.kind, draft.author, draft.state_key))
        draft = replace(draft, auth=tuple(select_auth_refs(fields, state)))
        reason = tracker.check(draft, before)
        if reason is not None:
            raise NotAuthorizedError(reason, actions.explain(draft, reason,
                                                             StateView(state, self.graph)))
        return draft

    def maybe_deplete(self, now_ms: int, rng: random.Random) -> tuple[Event, Received] | None:
        """Emit a dummy event if the width is over the depletion threshold (rate-limited).

        On an authorized topic only a joined member may send one; others skip.
        """
        if not self.ready:
            return None
        if not self.config.depletion.due(self.graph.width, now_ms, self._last_dummy_ms):
            return None
        self._last_dummy_ms = now_ms
        try:
            made = self.publish(b"", now_ms, rng, kind=KIND_DUMMY)
        except NotAuthorizedError:
            self.counters["dummies_not_authorized"] += 1
            return None
        self.counters["dummies"] += 1
        return made

    def commit(self) -> int:
        return self.graph.commit()

    # ------------------------------------------------------- topic state API
    #
    # Each call authors state event(s) as the local identity, checked against
    # the auth rules before anything is signed (NotAuthorizedError otherwise).
    # Not durable until `commit()`, like `publish`.

    def set_state(self, kind: str, state_key: str, content: Mapping[str, Any], now_ms: int,
                  rng: random.Random) -> tuple[Event, Received]:
        """Set application (or Matrix) state: `kind`/`state_key` -> `content`."""
        return self._publish_spec(EventSpec(kind, state_key, dict(content)), now_ms, rng)

    def invite(self, user_key: bytes, now_ms: int, rng: random.Random) -> tuple[Event, Received]:
        return self._publish_spec(actions.membership_spec(user_key, INVITE), now_ms, rng)

    def ban(self, user_key: bytes, now_ms: int, rng: random.Random,
            reason: str | None = None) -> tuple[Event, Received]:
        extra = {} if reason is None else {"reason": reason}
        return self._publish_spec(actions.membership_spec(user_key, BAN, **extra), now_ms, rng)

    def join(self, now_ms: int, rng: random.Random,
             relayed: bool = False) -> tuple[Event, Received]:
        """Join as the local identity (after an invite, or under a public join rule).

        `relayed=True` declares this device a relayed writer (see node.state.roles).
        """
        extra = {"relayed": True} if relayed else {}
        spec = actions.membership_spec(self.identity.public_key, JOIN, **extra)
        return self._publish_spec(spec, now_ms, rng)

    def add_writer(self, user_key: bytes, now_ms: int,
                   rng: random.Random) -> tuple[tuple[Event, Received], ...]:
        """Invite `user_key` (unless joined or invited) and give it the writing level.

        Returns every event made, in order (none if it is a writer already).
        """
        specs = actions.writer_specs(self._view(), user_key)
        return self._publish_specs(specs, now_ms, rng)

    def set_role(self, user_key: bytes, role: Role, now_ms: int,
                 rng: random.Random) -> tuple[tuple[Event, Received], ...]:
        """Give `user_key` a writer role (mapping in node.state.actions); events made, in order.

        RoleError if the role cannot be given by this identity at all (the
        relayed flag of another member); NotAuthorizedError if it lacks power.
        """
        specs = actions.role_specs(self._view(), self.identity.public_key, user_key, role)
        return self._publish_specs(specs, now_ms, rng)

    def _view(self) -> StateView:
        return StateView(self._current_state(), self.graph)

    def _publish_spec(self, spec: EventSpec, now_ms: int,
                      rng: random.Random) -> tuple[Event, Received]:
        payload = pack_payload(dict(spec.content))
        return self.publish(payload, now_ms, rng, kind=spec.kind, state_key=spec.state_key)

    def _publish_specs(self, specs: list[EventSpec], now_ms: int,
                       rng: random.Random) -> tuple[tuple[Event, Received], ...]:
        # Check them all against the current state before signing the first,
        # so a refusal never leaves half an operation behind. (The events of
        # one operation touch different keys, so each one's verdict does not
        # depend on the others.)
        parents = tuple(self.graph.extremities())
        for spec in specs:
            payload = pack_payload(dict(spec.content))
            self._checked(self._draft(spec.kind, spec.state_key, payload, parents, 0, now_ms))
        return tuple(self._publish_spec(spec, now_ms, rng) for spec in specs)


    # --------------------------------------------------------- total order
    #
    # node.replica.ordering holds the logic; these are the replica's hooks into it.

    @property
    def ordering(self) -> TopicOrder | None:
        """The topic's total order, built on first use (a replay of the delivery order).

        None unless this replica is `authorizing` (roles exist only there) and
        `ReplicaConfig.ordering.enabled`.
        """
        if self._order is None and self.authorizing and self.config.ordering.enabled:
            self._order = TopicOrder(self.graph, self.tracker, self.config.ordering)
        return self._order

    def _order_applied(self, applied: tuple[Event, ...]) -> OrderUpdate | None:
        """Feed newly applied (and judged) events to the order; what changed."""
        if not self.config.ordering.enabled:
            return None
        if self._order is None:
            # Replay what came before this batch, so the batch itself is reported.
            self._order = TopicOrder(self.graph, self.tracker, self.config.ordering,
                                     replay_to=self.graph.delivered_count - len(applied))
        return self._order.catch_up(applied)

    def _forget_order(self) -> None:
        self._order = None  # pending writes were discarded: rebuild from what is durable

    def _choose_parents(self, rng: random.Random, kind: str = KIND_MESSAGE) -> list[bytes]:
        """Parents of a local event: the policy's choice, keeping the author's chain
        and pending relayed events when the width exceeds d_max."""
        extremities = self.graph.extremities()
        d_max = self.params.d_max
        if kind == KIND_DUMMY:  # a dummy only merges: it may name more (node.core.parents)
            d_max = self.config.depletion.dummy_parents(d_max)
        if len(extremities) <= d_max:
            return extremities  # all of them, sorted: what every policy picks, no rng drawn
        policy, depth = self.config.parent_policy, (lambda i: self.graph.depth(i) or 0)
        order = self.ordering if len(extremities) > d_max else None
        if order is None:
            return select_parents(extremities, d_max, policy, rng, depth)
        me = self.identity.public_key
        keep = order.parents_to_keep(me, self.role_of(me) is Role.RELAYED)[:d_max]
        rest = [e for e in extremities if e not in set(keep)]
        chosen = (select_parents(rest, d_max - len(keep), policy, rng, depth)
                  if len(keep) < d_max else [])
        return sorted(keep + chosen)

    def _require_order(self) -> TopicOrder:
        order = self.ordering
        if order is None:
            raise OrderingDisabledError(
                "this replica keeps no total order: it needs an authorized topic, "
                "ReplicaConfig.authorization and ReplicaConfig.ordering.enabled")
        return order

    def ordered(self, order: str = ORDER_CAUSAL, since: int = 0,
                limit: int = 1_000) -> list[tuple[int, Event]]:
        """(position, event) pairs of one view, from position `since`, at most `limit`.

        "causal": the delivery order (`deliveries`: rejected events left out).
        "confirmed": the confirmed prefix; a position never changes.
        "tentative": the full order, confirmed prefix then tentative tail; after
        an update (`Received.order`) re-read from its `rewind_to`.
        Acks and dummies are events of the order like any other.
        """
        if order == ORDER_CAUSAL:
            return self.deliveries(since, limit)
        if order == ORDER_CONFIRMED:
            ids = self._require_order().confirmed_slice(since, limit)
        elif order == ORDER_TENTATIVE:
            ids = self._require_order().full_slice(since, limit)
        else:
            raise ValueError(f"order must be one of causal, confirmed, tentative; got {order!r}")
        return [(position, self._event(event_id)) for position, event_id in ids]

    def order_status(self) -> OrderStatus | None:
        """Confirmed length, tentative length and indexers (hex); None without an order."""
        order = self.ordering
        return None if order is None else order.status()

    def maybe_ack(self, now_ms: int, rng: random.Random) -> tuple[Event, Received] | None:
        """Append an empty acknowledgement (kind "ack") if the order needs one now.

        An indexer acks while some non-ack event is unconfirmed and it has
        something new to vote on (a lone indexer: until its writes are
        confirmed); any writer acks to reference pending relayed events; at
        most once per `ReplicaConfig.ordering.ack_interval_ms`. Not durable
        until committed, like `publish`: the node's ticker calls it inside a
        committer step (node.committer), which commits, then pushes the event.
        """
        order = self.ordering if self.ready else None
        if order is None:
            return None
        me = self.identity.public_key
        if not order.ack_due(me, now_ms, lambda: self.role_of(me)):
            return None
        order.note_ack(now_ms)
        try:
            made = self.publish(b"", now_ms, rng, kind=KIND_ACK)
        except NotAuthorizedError:
            self.counters["acks_not_authorized"] += 1
            return None
        self.counters["acks"] += 1
        return made

    def sign_relayed(self, payload: bytes, now_ms: int, rng: random.Random,
                     kind: str = KIND_MESSAGE, state_key: str | None = None) -> Event:
        """Author an event as a relayed writer; the caller hands `event.raw` to a relay.

        Only for an identity whose role is RELAYED (RoleError otherwise). The
        event's parents are the current extremities (the previous own event's
        chain kept), and it is added to the local graph, so its sequence
        number is durable (never reused after a restart: that would be an
        equivocation), the next relayed event chains on it and its auth refs
        come from the local state. It is never a head of the order, here or
        anywhere: every replica keeps it aside until a writer references it.
        """
        me = self.identity.public_key
        if self.role_of(me) is not Role.RELAYED:
            raise RoleError("sign_relayed is for relayed writers; this identity is "
                            f"{self.role_of(me).value}: use publish")
        event, _ = self.publish(payload, now_ms, rng, kind=kind, state_key=state_key)
        self.counters["relayed_signed"] += 1
        return event

    def relayed_template(self, author: bytes, kind: str, state_key: str | None,
                         payload: bytes, now_ms: int,
                         rng: random.Random) -> tuple[int, tuple[bytes, ...], tuple[bytes, ...]]:
        """What a relayed device with key `author` needs to sign its next event here.

        Returns (seq, parents, auth refs). Parents keep the device's chain (the
        extremity above its latest event, as `publish` keeps the local
        author's) and the policy fills up to d_max; auth refs come from the
        state before those parents. The draft (`kind`, `state_key`,
        `payload`) is checked against the auth rules first: NotAuthorizedError
        (nothing to sign) if they refuse it. Nothing is added or signed here:
        the relay (node.relay) serves this to the device over the network.
        """
        if not self.ready:
            raise NotReadyError("the topic's create event has not arrived yet; wait for sync")
        if kind == KIND_CREATE:
            raise PublishError("a topic has exactly one create event")
        extremities = self.graph.extremities()
        d_max = self.params.d_max
        order = self.ordering
        keep = order.parents_to_keep(author, True)[:d_max] if order is not None else []
        rest = [e for e in extremities if e not in set(keep)]
        depth = (lambda i: self.graph.depth(i) or 0)
        chosen = (select_parents(rest, d_max - len(keep), self.config.parent_policy, rng, depth)
                  if len(keep) < d_max else [])
        parents = tuple(sorted(keep + chosen))
        latest = self.graph.author_latest_seq(author)
        seq = (latest if latest is not None else -1) + 1
        auth: tuple[bytes, ...] = (self.topic_id,)
        if self.authorizing:
            draft = replace(self._draft(kind, state_key, payload, parents, seq, now_ms),
                            author=author)
            auth = self._checked(draft).auth
        return seq, parents, tuple(sorted(auth))
