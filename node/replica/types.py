"""The replica's vocabulary: its configuration, a topic's fixed parameters, what
receiving one event did, and the errors its operations raise.

Values only, shared by the modules of `node.replica` (`replica`, `authoring`,
`state_ops`) and re-exported by `node.replica.replica`, where callers import
them; kept apart so that each of those modules reads as one concept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from node.core.outcomes import AddStatus
from node.core.event import Event
from node.core.fastinit import fast_init
from node.core.graph import GraphLimits
from node.core.monitor import MAX_FUTURE_SKEW_MS
from node.core.order import OrderUpdate
from node.core.parents import DEFAULT_D_MAX, MAX_D_MAX, MIN_D_MAX, DepletionPolicy, ParentPolicy
from node.replica.cache_budget import CacheSizes
from node.replica.ordering import OrderConfig
from node.state.store import MAX_DELTA_CHAIN


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
    # Soft fail on receipt (node.state.soft_fail). False: every event valid in its own
    # past is forwarded, built on and delivered (the seeded world's "before" figure).
    soft_fail: bool = True
    # Sizes of the biggest caches: a node shares one budget among its topics
    # (node.replica.cache_budget; later changes: `Replica.resize_caches`).
    caches: CacheSizes = CacheSizes()


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
    # Applied, authorized events soft-failed here (node.state.soft_fail): kept in the
    # graph, never forwarded, built on or delivered by this node. (id, reason).
    soft_failed: tuple[tuple[bytes, str], ...] = ()

