"""A replica of one topic: Reference Monitor + graph + local authoring, sans-IO.

This is the object the simulator and the trio runtime both drive. It takes
bytes and the current time in, and returns what happened; it never awaits,
sleeps, reads a clock or draws from global randomness, so one seed
reproduces any run.

    replica = Replica.create_topic(store, identity, now_ms=..., name="kitchen")
    outcome = other.receive(raw, now_ms=...)      # from the network
    event = replica.publish(b"21.5C", now_ms=..., rng=rng)
    replica.commit()                              # durable: group commit

Writes become durable only at `commit()`; callers acknowledge published or
received events to others only after it returns.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from node.core.event import (
    KIND_CREATE,
    KIND_DUMMY,
    KIND_MESSAGE,
    Event,
    pack_payload,
)
from node.core.graph import AddResult, Graph, GraphLimits
from node.core.identity import Identity, sign_event
from node.core.monitor import MAX_FUTURE_SKEW_MS, ReferenceMonitor, Rejected
from node.core.parents import (
    DEFAULT_D_MAX,
    MAX_D_MAX,
    MIN_D_MAX,
    DepletionPolicy,
    ParentPolicy,
    select_parents,
)
from storage.protocol import Store


class NotReadyError(Exception):
    """The replica cannot author events yet: it does not hold the topic's create event."""


class PublishError(Exception):
    """A local event could not be added (the message says why)."""


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    parent_policy: ParentPolicy = ParentPolicy.RANDOM
    depletion: DepletionPolicy = field(default_factory=DepletionPolicy)
    limits: GraphLimits = field(default_factory=GraphLimits)
    max_future_skew_ms: int = MAX_FUTURE_SKEW_MS


@dataclass(frozen=True, slots=True)
class TopicParams:
    """Parameters fixed by the create event's content."""

    name: str = ""
    d_max: int = DEFAULT_D_MAX

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
        return cls(name=name, d_max=d_max)


@dataclass(frozen=True, slots=True)
class Received:
    """The outcome of `Replica.receive` for one incoming byte string."""

    status: str  # "applied" | "buffered" | "duplicate" | "rejected"
    event_id: bytes | None
    reason: str | None = None
    applied: tuple[Event, ...] = ()
    missing: tuple[bytes, ...] = ()
    dropped: tuple[bytes, ...] = ()
    equivocations: tuple[Event, ...] = ()
    rejected_ids: tuple[tuple[bytes, str], ...] = ()


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

    @classmethod
    def create_topic(
        cls,
        store: Store,
        identity: Identity,
        now_ms: int,
        name: str = "",
        d_max: int = DEFAULT_D_MAX,
        config: ReplicaConfig = ReplicaConfig(),
    ) -> "Replica":
        """Author a new topic's create event and return the replica holding it (committed)."""
        if not MIN_D_MAX <= d_max <= MAX_D_MAX:
            raise ValueError(f"d_max must be in [{MIN_D_MAX}, {MAX_D_MAX}]")
        create = sign_event(
            identity, topic=b"", seq=0, parents=(), timestamp_ms=now_ms, kind=KIND_CREATE,
            state_key="", payload=pack_payload(
                {"name": name, "d_max": d_max, "creator": identity.public_key.hex()}),
        )
        replica = cls(store, create.id, identity, config)
        result = replica.graph.add(create)
        assert result.status == "applied", result
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

    # ---------------------------------------------------------------- updates

    def receive(self, raw: bytes, now_ms: int, expected_id: bytes | None = None) -> Received:
        """Validate and add one event from outside. Never raises for bad input."""
        verdict = self.monitor.check(raw, now_ms, expected_id)
        if isinstance(verdict, Rejected):
            self.counters[f"rejected.{verdict.reason}"] += 1
            return Received("rejected", None, reason=verdict.reason)
        return self._outcome(self.graph.add(verdict))

    def _outcome(self, result: AddResult) -> Received:
        self.counters[result.status] += 1
        for rejection in result.rejected:
            self.counters[f"rejected.{rejection.reason}"] += 1
        if result.equivocations:
            self.counters["equivocations"] += len(result.equivocations)
        return Received(
            status=result.status, event_id=result.event_id, reason=result.reason,
            applied=result.applied, missing=result.missing, dropped=result.dropped,
            equivocations=result.equivocations,
            rejected_ids=tuple((r.event_id, r.reason) for r in result.rejected),
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
        `applied`). Not durable until `commit()`.
        """
        if not self.ready:
            raise NotReadyError("the topic's create event has not arrived yet; wait for sync")
        if kind == KIND_CREATE:
            raise PublishError("a topic has exactly one create event")
        parents = select_parents(
            self.graph.extremities(), self.params.d_max, self.config.parent_policy, rng,
            lambda i: self.graph.depth(i) or 0,
        )
        latest = self.graph.author_latest_seq(self.identity.public_key)
        event = sign_event(
            self.identity, topic=self.topic_id, seq=(latest if latest is not None else -1) + 1,
            parents=parents, timestamp_ms=now_ms, kind=kind, payload=payload,
            state_key=state_key, auth=(self.topic_id,),
        )
        outcome = self._outcome(self.graph.add(event))
        if outcome.status != "applied":
            raise PublishError(f"local event not applied: {outcome.status} {outcome.reason}")
        self.counters["created"] += 1
        return event, outcome

    def maybe_deplete(self, now_ms: int, rng: random.Random) -> tuple[Event, Received] | None:
        """Emit a dummy event if the width is over the depletion threshold (rate-limited)."""
        if not self.ready:
            return None
        if not self.config.depletion.due(self.graph.width, now_ms, self._last_dummy_ms):
            return None
        self._last_dummy_ms = now_ms
        self.counters["dummies"] += 1
        return self.publish(b"", now_ms, rng, kind=KIND_DUMMY)

    def commit(self) -> int:
        return self.graph.commit()
