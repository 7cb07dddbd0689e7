"""A replica of one topic: Reference Monitor + graph + topic state + total order, sans-IO.

This is the object the simulator and the trio runtime both drive. It takes
bytes and the current time in, and returns what happened; it never awaits,
sleeps, reads a clock or draws from global randomness, so one seed
reproduces any run.

    replica = Replica.create_topic(store, identity, now_ms=..., name="kitchen")
    outcome = other.receive(raw, now_ms=...)      # from the network
    event = replica.publish(b"21.5C", now_ms=..., rng=rng)
    replica.commit()                              # standalone: make it durable

The replica is three modules: this one (receiving, the reads, the hand-over
of writes), `node.replica.authoring` (making local events: publish, dummies,
acks, relayed writers' events) and `node.replica.state_ops` (join, invite,
ban, add_writer, set_role, set_state); its values and errors are in
`node.replica.types` and importable from here.

Durability. Everything a replica does is written to the graph's write-set
(events, state records, the confirmed order) and is durable only once
committed. In a running node the committer (node.committer) is the only
writer: each step it takes every topic's write-set (`Graph.take_writes`)
and commits them in one transaction, and only then are the events
announced or acknowledged; nothing in the node calls `commit()`.
`commit()` is for a replica used standalone: the dissemination engine run
standalone (`Disseminator(commits=True)`: the simulator, tests), tests and
benchmarks. Either way, nobody is told of an event before it is durable.

Topic state and authorization
-----------------------------
A topic created with `authorization=True` is a Matrix-style room: every
applied event gets a state before and after it and is checked against the
auth rules (`node.state.tracker`), before it becomes a vertex (`_gate`). An
event that fails is *rejected* and never enters the graph (nor do events
built on it): listed in `Received.unauthorized`, counted as
`counters["rejected.<reason>"]`, remembered by the graph (bounded). A
rejected vertex from a store older than the gate stays, never in state and
skipped by `deliveries()`. Whether a topic is authorized is fixed by its create event
(`TopicParams.authorization`; absent means authorized, as in Matrix), so every
replica of a topic agrees; `ReplicaConfig.authorization=False` turns state
tracking off in one replica (pure MEG: the dissemination simulator's and the CRDT
tests' setting).

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
-----------------------------------
An authorizing replica also keeps the topic's consistent total order
(`ReplicaConfig.ordering`; `TopicOrder`, built on first use): every batch of
applied events is fed to it, and `Received.order` reports what changed.

    replica.ordered("confirmed" | "tentative" | "causal", since=0)
    replica.order_status()             # confirmed/tentative length, indexers
    replica.maybe_ack(now_ms, rng)     # the node's tick duties call it (node.runtime)
    replica.sign_relayed(payload, now_ms, rng)   # a relayed device's writes

Local events keep the author's chain (the extremity above its own latest
event is always a parent) and reference pending relayed events first when
the width exceeds `d_max` (`TopicOrder.parents_to_keep`).
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict
from collections.abc import Mapping

from node.core.add_result import AddResult
from node.core.outcomes import AddStatus, RejectReason
from node.core.event import KIND_CREATE, Event, pack_payload
from node.core.graph import Graph
from node.core.identity import Identity, sign_event
from node.core.monitor import ReferenceMonitor, Rejected
from node.core.order import OrderUpdate
from node.core.parents import DEFAULT_D_MAX, MAX_D_MAX, MIN_D_MAX
from node.replica.authoring import Authoring
from node.replica.cache_budget import CacheSizes
from node.replica.history_access import HistoryAccess
from node.replica.joining import Joining
from node.replica.order_views import ORDER_CAUSAL, ORDER_CONFIRMED, ORDER_TENTATIVE, OrderStatus
from node.replica.delivery_count import COUNT_READ_BACK_PAGE, DeliveryCount, HandedCount
from node.replica.ordering import KIND_ACK, TopicOrder
from node.replica.read_access import ReadAccess
from node.replica.state_ops import StateOperations
from node.replica.types import (
    NotReadyError,
    OrderingDisabledError,
    PublishError,
    Received,
    ReplicaConfig,
    StateDisabledError,
    TopicParams,
)
from node.state import actions
from node.state.actions import EventSpec, NotAuthorizedError, RoleError
from node.state.roles import Role
from node.state.roles import indexers as indexers_in
from node.state.roles import role_of as role_in
from node.state.soft_fail import SoftFails
from node.state.store import StateGroups
from node.state.tracker import StateTracker
from node.state.types import (
    HISTORY_SETTINGS,
    HISTORY_SHARED,
    RULE_INVITE,
    AuthReason,
    TYPE_HISTORY,
    TYPE_JOIN_RULES,
    TYPE_MEMBER,
    TYPE_POWER_LEVELS,
    Membership,
    StateKey,
)
from node.core.store import TABLE_STATE, Store

_ACCESS_RULE_KINDS = frozenset({TYPE_JOIN_RULES, TYPE_POWER_LEVELS, TYPE_HISTORY})

_AUTH_REASONS = frozenset(str(reason) for reason in AuthReason)

__all__ = [
    "NotAuthorizedError", "NotReadyError", "OrderingDisabledError", "PublishError", "Received",
    "Replica", "ReplicaConfig", "RoleError", "StateDisabledError", "TopicParams",
]


class Replica(StateOperations, Authoring, ReadAccess, HistoryAccess, Joining):
    """One topic's replica on one node (see the module docstring).

    Receiving and reading live here; making local events is `Authoring`
    (node.replica.authoring), topic-state operations `StateOperations`
    (node.replica.state_ops), who may read the topic `ReadAccess`
    (node.replica.read_access), the terms of a join from outside `Joining`
    (node.replica.joining).
    """

    def __init__(
        self, store: Store, topic_id: bytes, identity: Identity, config: ReplicaConfig = ReplicaConfig()
    ) -> None:
        self.topic_id = topic_id
        self.identity = identity
        self.config = config
        self.graph = Graph(store, topic_id, config.limits)
        self._caches = CacheSizes()
        self.monitor = ReferenceMonitor(topic_id, config.max_future_skew_ms)
        self.counters: Counter[str] = Counter()
        self._params: TopicParams | None = None
        self._last_dummy_ms: int | None = None
        self._tracker: StateTracker | None = None
        self._soft_fails: SoftFails | None = None
        self._authorizing: bool | None = None
        self._order: TopicOrder | None = None
        # Inside a driver's step (`defer_order`): the events applied and not yet fed
        # to the order, fed as one batch when the step ends or the order is read.
        self._order_backlog: list[Event] | None = None
        self._readers_cache: tuple[int, int, int, frozenset[bytes] | None] | None = None
        # (join-rules and power-levels events, member events) applied: node.replica.read_access
        self._access_epochs = (0, 0)
        # node.replica.history_access: (rules epoch, history limited) and readers per group
        self._history_epoch: tuple[int, bool] | None = None
        self._history_readers_cache: OrderedDict[int, frozenset[bytes] | None] = OrderedDict()
        # The current state soft fail last judged against, with the access epochs it was
        # resolved at: only member, power-levels and join-rules events change who stands
        # (the same argument as read_access's), so other events reuse it unresolved.
        self._standing_state: tuple[tuple[int, int], int, Mapping[StateKey, bytes]] | None = None
        # Events the gate refused during the current `graph.add` (id, reason): rejected
        # events never become vertices (`_gate`, docs/state.md "Rejected events").
        self._refused: list[tuple[bytes, str]] = []
        self.graph.set_gate(self._gate)
        # How many applied events `deliveries` hands out, stored with them (`handed_count`).
        self._handed = HandedCount(self.graph.table(TABLE_STATE))
        self.graph.on_discard(self._forget_state_caches)
        self.graph.on_discard(self._forget_order)
        self.graph.on_discard(self._handed.forget)
        if config.caches != self._caches:
            self.resize_caches(config.caches)

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
        history: str = HISTORY_SHARED,
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
        `history=HISTORY_JOINED` adds a history event: members read payloads only
        from their join on (node.replica.history_access); `shared` writes none.
        """
        if history not in HISTORY_SETTINGS:
            raise ValueError(f"history must be one of {', '.join(HISTORY_SETTINGS)}")
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
        replica._count_handed(result.applied, False, ())  # the root: handed out
        if authorization:
            replica.tracker.apply(result.applied)
            if config.soft_fail:
                replica.soft_fails.note_applied(create, {})
            # One extremity at each step: the parent choice draws nothing from this rng.
            rng = random.Random(0)
            for spec in (
                actions.membership_spec(identity.public_key, Membership.JOIN),
                EventSpec(TYPE_POWER_LEVELS, "", actions.initial_power_levels(
                    identity.public_key, members_write=members_write)),
                EventSpec(TYPE_JOIN_RULES, "", {"join_rule": join_rule}),
                *([EventSpec(TYPE_HISTORY, "", {"history_visibility": history})]
                  if history != HISTORY_SHARED else []),
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
            self._resize_state_caches()
        return self._tracker

    @property
    def soft_fails(self) -> SoftFails:
        """This node's soft-fail verdicts (node.state.soft_fail); needs `authorizing`."""
        if self._soft_fails is None:
            self.tracker  # raises StateDisabledError as the tracker does
            self._soft_fails = SoftFails(self.graph.table(TABLE_STATE), self.graph)
        return self._soft_fails

    def is_soft_failed(self, event_id: bytes) -> bool:
        """True if the event is here, passed the auth rules, and was soft-failed on arrival."""
        return self.authorizing and self.soft_fails.is_soft_failed(event_id)

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
        """True if the event failed the auth rules here (always False without state).

        Such an event is not in the graph (the gate refused it; remembered, the newest
        `GraphLimits.rejected_remembered`), or, applied before the gate existed, a
        vertex recorded as rejected.
        """
        return self.rejection_reason(event_id) is not None

    def rejection_reason(self, event_id: bytes) -> str | None:
        if not self.authorizing:
            return None
        remembered = self.graph.rejected_reason(event_id)
        if remembered is not None:
            return str(remembered) if str(remembered) in _AUTH_REASONS else None
        record = self.tracker.event_state(event_id)
        return None if record is None else record.reason

    def rejected_events(self, limit: int | None = None) -> list[bytes]:
        """Ids of the events refused by the auth rules: remembered ones (oldest first), then
        vertices stored as rejected (by id); at most `limit`."""
        if not self.authorizing:
            return []
        out = [i for i, reason in self.graph.rejections() if str(reason) in _AUTH_REASONS]
        out += self.tracker.groups.rejected_ids(None if limit is None else max(0, limit - len(out)))
        return out if limit is None else out[:limit]

    def deliveries(self, since: int = 0, limit: int = 1_000,
                   include_rejected: bool = False) -> list[tuple[int, Event]]:
        """What subscribers get: `graph.deliveries` without rejected, soft-failed or
        withheld events (`include_rejected=True`: every applied event).

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
            out += [(p, e) for p, e in page if self._handed_out(e)]
            position = page[-1][0] + 1
        return out[:limit]

    def _handed_out(self, event: Event) -> bool:
        """Does `deliveries` hand this applied event to subscribers? (authorizing only)"""
        return (not event.withheld and not self.tracker.is_rejected(event.id)
                and not self.soft_fails.is_soft_failed(event.id))

    @property
    def handed_count(self) -> DeliveryCount | None:
        """How many applied events `deliveries` hands out (and acks among them), over
        delivery positions [0, end): kept as events are applied and committed with
        them (node.replica.delivery_count). None for a topic stored before the count
        was kept, until `adopt_count`; behind (`end` < `graph.delivered_count`) if a
        build that does not keep it applied events since."""
        kept = self._handed.value
        if kept is not None and kept.end > self.graph.delivered_count:
            return None  # a record no store write leaves (it commits with the events): damaged
        return kept

    @property
    def keeps_count(self) -> bool:
        """Does `handed_count` cover every applied event? (False: read back, adopt.)"""
        kept = self._handed.value
        return kept is not None and kept.end == self.graph.delivered_count

    def count_delivered(self, start: int, end: int,
                        read_back_at_most: int = COUNT_READ_BACK_PAGE) -> DeliveryCount:
        """Read back what `deliveries` hands out at delivery positions [start, stop), for
        some stop <= end with at most `read_back_at_most` (>= 1) positions: how many,
        and how many of them are acknowledgements (7-14 us an event: for a topic
        without `handed_count`)."""
        end = min(end, self.graph.delivered_count)
        if start >= end:
            return DeliveryCount(start, start, 0, 0)
        stop = min(end, start + max(1, read_back_at_most))
        page = self.graph.deliveries(start, stop - start)
        if self.authorizing:
            page = [(p, e) for p, e in page if self._handed_out(e)]
        return DeliveryCount(start, stop, len(page), sum(1 for _, e in page if e.kind == KIND_ACK))

    def adopt_count(self, counted: DeliveryCount) -> DeliveryCount:
        """Store `counted` (positions [0, end) read back) as this topic's `handed_count`,
        with what was applied since counted too; inside a step (the committer's), so
        it commits with the events it counts. A count that is up to date is kept."""
        if not self.keeps_count:
            end = self.graph.delivered_count
            since = self.count_delivered(counted.end, end, end - counted.end)
            self._handed.set(DeliveryCount(0, max(end, counted.end), counted.delivered
                                           + since.delivered, counted.acks + since.acks))
        return self._handed.value  # type: ignore[return-value]

    def _current_state(self) -> Mapping[StateKey, bytes]:
        tracker = self.tracker
        return tracker.state(tracker.current_group())

    def _event(self, event_id: bytes) -> Event:
        event = self.graph.get(event_id)
        assert event is not None, "a state map names an event the graph lacks"
        return event

    def _forget_state_caches(self) -> None:
        self._authorizing = None  # the root itself may have been among the discarded writes
        self._refused = []
        self._readers_cache = None  # group ids are only meaningful with the writes that made them
        self._history_epoch = None
        self._history_readers_cache.clear()
        self._standing_state = None
        if self._tracker is not None:
            self._tracker.clear_caches()
        if self._soft_fails is not None:
            self._soft_fails.clear_caches()

    # ---------------------------------------------------------------- updates

    def receive(self, raw: bytes, now_ms: int, expected_id: bytes | None = None) -> Received:
        """Validate and add one event from outside. Never raises for bad input."""
        # A known id skips the signature check: ids hash the bytes, which were
        # verified when first received (gossip repeats each event many times).
        verdict = self.monitor.check(raw, now_ms, expected_id, known=self.graph.knows)
        if isinstance(verdict, Rejected):
            self.counters[f"rejected.{verdict.reason}"] += 1
            return Received(AddStatus.REJECTED, None, reason=verdict.reason)
        if verdict.withheld and not self.takes_withheld(verdict):
            # Not remembered as rejected: the full event, same id, is welcome.
            self.counters[f"rejected.{RejectReason.WITHHELD_READABLE}"] += 1
            return Received(AddStatus.REJECTED, verdict.id, reason=RejectReason.WITHHELD_READABLE)
        received = self._outcome(self.graph.add(verdict))
        if received.applied and self._authorizing and self.config.soft_fail:
            received = self._soft_fail(received)
        return received

    def _soft_fail(self, received: Received) -> Received:
        """Judge the applied, authorized events of a received batch against the current
        state (node.state.soft_fail); the soft-failed ones are reported and counted."""
        if not self.soft_fails.restricted:
            return received  # nobody can have lost its standing here (the guard)
        unauthorized = {event_id for event_id, _ in received.unauthorized}
        judged = [e for e in received.applied if e.id not in unauthorized]
        if not judged:
            return received
        cached = self._standing_state
        if cached is not None and cached[0] == self._access_epochs:
            _, group, state = cached
        else:  # resolving the heads costs a resolution whenever they changed: only when needed
            tracker = self.tracker
            group = tracker.current_group()
            state = tracker.state(group)
            self._standing_state = (self._access_epochs, group, state)
        failed = self.soft_fails.judge(judged, group, state, self.graph.position)
        if not failed:
            return received
        self.counters["soft_failed"] += len(failed)
        first = self.graph.delivered_count - len(received.applied)
        counted = {event.id: (first + i, event.kind == KIND_ACK)  # withheld: not counted
                   for i, event in enumerate(received.applied) if not event.withheld}
        for event_id, _ in failed:
            if event_id in counted:
                self._handed.hide(*counted[event_id])  # applied, counted, not handed out
        for _, reason in failed:
            self.counters[f"soft_failed.{reason}"] += 1
        return Received(
            received.status, received.event_id, received.reason, received.applied,
            received.missing, received.dropped, received.equivocations, received.rejected_ids,
            received.unauthorized, received.order, tuple((i, str(r)) for i, r in failed))

    def _gate(self, event: Event) -> str | None:
        """The graph's gate: the auth rules against the event's own past, before it becomes
        a vertex. Refused: it stays out of the graph (remembered as rejected, with its
        buffered descendants), so it is never an extremity, a parent, forwarded, offered
        or delivered. The verdict depends on the event's ancestry alone, so every correct
        replica refuses the same events and their graphs still converge."""
        if event.is_create:
            return None  # the root: nothing to judge it against yet
        authorizing = self._authorizing
        if authorizing is None:
            authorizing = self.authorizing
        if not authorizing:
            return None
        reason = self.tracker.admit(event)
        if reason is None:
            return None
        self._refused.append((event.id, str(reason)))
        return str(reason)

    def _outcome(self, result: AddResult) -> Received:
        refused, self._refused = tuple(self._refused), []
        self.counters[result.status] += 1
        for rejection in result.rejected:
            self.counters[f"rejected.{rejection.reason}"] += 1
        if result.equivocations:
            self.counters["equivocations"] += len(result.equivocations)
        for event in result.applied:
            if event.withheld:  # history this member may not read (history_access)
                self.counters["withheld"] += 1
        unauthorized: tuple[tuple[bytes, str], ...] = refused
        if refused:
            self.counters["unauthorized"] += len(refused)  # `rejected.<reason>` counted above
        order: OrderUpdate | None = None
        judged_late: tuple[tuple[bytes, str], ...] = ()
        authorizing = self._authorizing  # the property's cached answer: this runs per event
        if authorizing is None:
            authorizing = self.authorizing
        if result.applied and authorizing:
            # Same write-set as the graph's: state commits with the events.
            judged_late = tuple(self.tracker.apply(result.applied))  # without the gate only
            for event in result.applied:
                kind = event.kind
                if kind in _ACCESS_RULE_KINDS:  # who may read may have changed
                    self._access_epochs = (self._access_epochs[0] + 1, self._access_epochs[1])
                elif kind == TYPE_MEMBER:
                    self._access_epochs = (self._access_epochs[0], self._access_epochs[1] + 1)
            if self.config.soft_fail and self.soft_fails.watching:
                self._note_state_changes(result.applied, judged_late)
            for _, reason in judged_late:
                self.counters[f"rejected.{reason}"] += 1
            self.counters["unauthorized"] += len(judged_late)
            unauthorized = refused + judged_late
            order = self._order_applied(result.applied)
        if result.applied:
            self._count_handed(result.applied, authorizing, judged_late)
        # Positional (in field order): keywords cost a third of building it, once per event.
        return Received(
            result.status, result.event_id, result.reason, result.applied, result.missing,
            result.dropped, result.equivocations,
            tuple((r.event_id, r.reason) for r in result.rejected) if result.rejected else (),
            unauthorized, order,
        )

    def _count_handed(self, applied: tuple[Event, ...], authorizing: bool,
                      judged_late: tuple[tuple[bytes, str], ...]) -> None:
        """Count what `deliveries` will hand out of the events just applied (the last
        len(applied) positions): every one, or with authorization those neither
        withheld nor rejected (a soft fail is taken off by `_soft_fail`)."""
        if authorizing:
            late = {event_id for event_id, _ in judged_late}
            handed = [e for e in applied if not (e.withheld or late and e.id in late)]
        else:
            handed = list(applied)
        self._handed.extend(self.graph.delivered_count - len(applied), len(applied),
                            len(handed), sum(1 for e in handed if e.kind == KIND_ACK))

    def _note_state_changes(self, applied: tuple[Event, ...],
                            unauthorized: tuple[tuple[bytes, str], ...]) -> None:
        """Show soft fail's guard the authorized state events just applied."""
        refused = {event_id for event_id, _ in unauthorized}
        tracker, soft_fails = self.tracker, self.soft_fails
        for event in applied:
            if event.state_key is None or event.id in refused:
                continue
            record = tracker.event_state(event.id)
            if record is not None:
                soft_fails.note_applied(event, tracker.state(record.before))

    def commit(self) -> int:
        """Commit the pending writes (standalone use; a running node's committer commits)."""
        return self.graph.commit()

    # --------------------------------------------------------- total order
    #
    # node.replica.ordering holds the logic; these are the replica's hooks into it.

    @property
    def ordering(self) -> TopicOrder | None:
        """The topic's total order, built on first use (a replay of the delivery order).

        None unless this replica is `authorizing` (roles exist only there) and
        `ReplicaConfig.ordering.enabled`.
        """
        if self._order_backlog:  # read inside a step: what it applied so far counts
            self._feed_backlog()
        if self._order is None and self.authorizing and self.config.ordering.enabled:
            self._order = TopicOrder(self.graph, self.tracker, self.config.ordering,
                                     where_cache=self._caches.where)
            self._order.soft_failed = self.soft_fails.is_soft_failed
            self._order.resize_caches(self._caches.where, self._caches.roles)
        return self._order

    def defer_order(self) -> None:
        """Until `flush_order`, feed the events applied to the order as one batch.

        Every feed of the order costs the unconfirmed tail's length besides its
        events (copies and comparisons of the tail, at C speed:
        tests/bench/test_engine_step_bench.py), so a driver that applies many
        frames in one step (the node's committer, `Disseminator.on_batch`)
        feeds once per step instead of once per frame. Reading the order
        (`ordering`, and through it authoring, acks and the views) feeds what
        waits first, so no reader sees it behind the graph. `Received.order`
        is None meanwhile.
        """
        if self._order_backlog is None:
            self._order_backlog = []

    def flush_order(self, feed: bool = True) -> OrderUpdate | None:
        """Feed what waits (`defer_order`) and stop deferring; what changed.

        `feed=False` drops it instead (its writes were discarded). Nothing is
        lost either way: the order feeds from its own position in the delivery
        order (`TopicOrder.catch_up`), so what the graph still holds is fed on
        the next feed.
        """
        update = self._feed_backlog() if feed and self._order_backlog else None
        self._order_backlog = None
        return update

    def _feed_backlog(self) -> OrderUpdate | None:
        backlog, self._order_backlog = self._order_backlog, []
        return self._feed_order(tuple(backlog or ()))

    def _order_applied(self, applied: tuple[Event, ...]) -> OrderUpdate | None:
        """Feed newly applied (and judged) events to the order; what changed."""
        if not self.config.ordering.enabled:
            return None
        if self._order_backlog is not None:
            self._order_backlog.extend(applied)
            return None
        return self._feed_order(applied)

    def _feed_order(self, applied: tuple[Event, ...]) -> OrderUpdate | None:
        if self._order is None:
            # Replay what came before this batch, so the batch itself is reported.
            self._order = TopicOrder(self.graph, self.tracker, self.config.ordering,
                                     replay_to=self.graph.delivered_count - len(applied),
                                     where_cache=self._caches.where)
            self._order.soft_failed = self.soft_fails.is_soft_failed
            self._order.resize_caches(self._caches.where, self._caches.roles)
        return self._order.catch_up(applied)

    def resize_caches(self, sizes: CacheSizes) -> None:
        """Bound the biggest caches to `sizes` (a node's cache budget, node.replica.cache_budget)."""
        self._caches = sizes
        self.graph.resize_caches(sizes.nodes, sizes.events, sizes.latest_seq)
        if self._tracker is not None:
            self._resize_state_caches()
        if self._order is not None:
            self._order.resize_caches(sizes.where, sizes.roles)

    def _resize_state_caches(self) -> None:
        sizes, tracker = self._caches, self._tracker
        assert tracker is not None
        tracker.groups.resize_caches(sizes.records, sizes.memo)
        tracker.resize_caches(sizes.verdicts)

    def _forget_order(self) -> None:
        self._order = None  # pending writes were discarded: rebuild from what is durable
        if self._order_backlog is not None:
            self._order_backlog = []  # discarded with them

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
