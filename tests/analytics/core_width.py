"""The MEG width measured on our own core in synchronous rounds, and its referee.

What: `core_width_path` grows a real `node.core.graph.Graph` (memory store)
round by round the way section VIII of the paper models it: in each round
``k`` writers each add one event whose parents the real parent selection
(`node.core.parents.select_parents`, the topic's policy and ``d_max``) draws
from the forward extremities every writer saw at the start of the round; then
the round's events are delivered to everyone. The path of widths (number of
forward extremities) is what the model's urn predicts. `replica_width_path` is
the same process with ``k`` whole `Replica` objects (signed `publish`, the
Reference Monitor on `receive`), which costs far more and serves to show the
shared graph is the faithful equivalent. `stationary_width` computes what the
model says the long-run mean is, exactly, together with how much a sample
mean over ``n`` rounds may scatter (its asymptotic variance), so a test can
set its tolerance from the statistics rather than by hope; `removed_z` tests
each round's removals against Theorem 4 directly.

Why: the paper's figures, and `analytics.model`, describe an abstract urn.
Whether the width of the graph our code builds follows it depends on details
the model leaves out (how parents are drawn, what ``u <= d`` does, whether
application checks ever refuse a parent set). Measuring the real thing is the
only way to know that the model's fixed point is a statement about megnode.

Why one shared Graph is faithful: after every round all writers hold the same
set of events, and a graph's state (vertices, edges, extremities) is a
function of its set of applied events alone (the CRDT property the graph
tests check). So the ``k`` replicas of the model hold ``k`` identical graphs
at each round start, and drawing every writer's parents from one graph's
extremities before adding any of the round's events is the same process.
`replica_width_path` checks that the replicas do agree.

What the shared-graph driver skips, and why that cannot change the width:
events are not signed (a zero signature; the graph never looks at it, the
Reference Monitor does) and do not pass the Monitor (stateless checks of each
event alone), and no dummy events or acks are made (they are not part of the
modelled process: depletion is off). Everything that decides the width runs
for real: parent selection, the graph's application checks (antichain,
depth), extremity bookkeeping, and group commit.

Where the node is not the model: the topics a node creates are authorized
rooms with a total order, and there `Replica._choose_parents` pins the
author's own latest event (or the extremity above it) among the parents once
the width exceeds ``d_max``. In synchronous rounds that event is always an
extremity at the round start, so every round's ``k`` events are merged by
their own authors' next ones and the width stays at exactly ``k``, below the
model's fixed point. `replica_width_path(..., authorized=True)` measures it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analytics.model import (
    MIN_CONVERGENT_PARENTS,
    expected_removed,
    removed_distribution,
    variance_removed,
)
from node.core.event import (
    EVENT_VERSION,
    ID_BYTES,
    KEY_BYTES,
    KIND_MESSAGE,
    SIGNATURE_BYTES,
    Event,
    pack,
    signed_encoding,
    trusted_event,
)
from node.core.graph import Graph
from node.core.identity import Identity
from node.core.outcomes import AddStatus
from node.core.parents import DepletionPolicy, ParentPolicy, select_parents
from node.replica.replica import Replica, ReplicaConfig
from node.state.types import RULE_PUBLIC
from storage.memory import MemoryStore

MAX_WRITERS = 10_000
"""Largest ``k`` the drivers accept (a round builds ``k`` events in memory)."""
MAX_START_WIDTH = 1_000_000
"""Largest start width: the star is built event by event in memory."""
MAX_CORE_EVENTS = 5_000_000
"""Cap on events one driver call adds (each stays in the in-memory store)."""
MAX_REPLICA_EVENTS = 200_000
"""Cap on ``k * k * rounds`` deliveries of `replica_width_path` (each verifies a signature)."""

TIMESTAMP_MS = 0
"""All events carry one timestamp: time plays no part in the modelled process."""
UNSIGNED = bytes(SIGNATURE_BYTES)
"""Signature of the shared-graph driver's events (never checked: see module doc)."""

TRUNCATION_SDS = 30
"""`stationary_width` keeps widths up to u* + 30 sd of R (+10); `tail_mass` shows
the dropped tail is negligible."""
TRUNCATION_SLACK = 10
TAIL_STATES = 5

# A pure MEG as the model sees it: no topic state or order (so no acks, and
# the author's chain is not pinned among the parents), no dummy events, and
# the uniform parent draw of the paper.
MODEL_CONFIG = ReplicaConfig(
    parent_policy=ParentPolicy.RANDOM,
    depletion=DepletionPolicy(enabled=False),
    authorization=False,
)
# What a node's own topics run (authorization and the total order on, as in
# ReplicaConfig's defaults), with depletion off to compare like with like.
AUTHORIZED_CONFIG = ReplicaConfig(
    parent_policy=ParentPolicy.RANDOM,
    depletion=DepletionPolicy(enabled=False),
)


class CoreWidthError(RuntimeError):
    """The real core did not behave as the modelled process needs (names the event and why)."""


@dataclass(frozen=True)
class StationaryWidth:
    """The model chain's stationary law of the width, computed exactly."""

    mean: float
    sd: float
    asymptotic_variance: float
    """``lim n Var(mean of n consecutive widths)``: the sample mean's scatter is
    ``sqrt(asymptotic_variance / n)`` for a long stationary window."""
    tail_mass: float
    """Stationary mass on the top `TAIL_STATES` kept states; must be negligible."""


def _check_dk(d: int, k: int) -> None:
    if not 1 <= d <= MAX_WRITERS or not 1 <= k <= MAX_WRITERS:
        raise ValueError(f"d and k must be in [1, {MAX_WRITERS}], got d={d}, k={k}")


def stationary_width(d: int, k: int, fixed_point: float) -> StationaryWidth:
    """Mean, sd and asymptotic variance of the model's width chain at stationarity.

    The chain lives on ``[k, hi]``: a round never removes more extremities
    than there are, so ``U_{n+1} >= k``, and ``hi`` sits far above the fixed
    point; the rare jumps past ``hi`` are folded onto it, and `tail_mass`
    bounds what that costs. Rows come from `removed_distribution`.

    The asymptotic variance of the sample mean comes from the Poisson
    equation ``(I - P) g = f_c`` (``f(u) = u``, ``f_c = f - pi f``, ``pi g = 0``):
    it is ``pi (f_c (2 g - f_c))``, the variance plus twice every autocovariance.
    Needs ``d >= 2``: with one parent the width never settles.
    """
    _check_dk(d, k)
    if d < MIN_CONVERGENT_PARENTS:
        raise ValueError(f"d must be >= {MIN_CONVERGENT_PARENTS} for a stationary width, got {d}")
    spread = math.sqrt(variance_removed(d, k, max(1, round(fixed_point))))
    low, high = k, math.ceil(fixed_point + TRUNCATION_SDS * max(spread, 1.0) + TRUNCATION_SLACK)
    size = high - low + 1
    transition = np.zeros((size, size))
    for u in range(low, high + 1):
        for removed, prob in enumerate(removed_distribution(d, k, u)):
            if prob > 0.0:
                transition[u - low, min(u + k - removed, high) - low] += prob
    # pi (P - I) = 0 with sum(pi) = 1: replace one balance equation by the norm.
    system = transition.T - np.eye(size)
    system[-1, :] = 1.0
    rhs = np.zeros(size)
    rhs[-1] = 1.0
    pi = np.linalg.solve(system, rhs)
    widths = np.arange(low, high + 1, dtype=np.float64)
    mean = float(pi @ widths)
    centred = widths - mean
    # (I - P + 1 pi) is invertible for an ergodic chain; its solution g has pi g = 0.
    g = np.linalg.solve(np.eye(size) - transition + np.outer(np.ones(size), pi), centred)
    return StationaryWidth(
        mean=mean,
        sd=float(math.sqrt(max(0.0, pi @ centred**2))),
        asymptotic_variance=float(max(0.0, pi @ (centred * (2.0 * g - centred)))),
        tail_mass=float(abs(pi[-TAIL_STATES:]).sum()),
    )


def removed_z(path: Sequence[int], d: int, k: int) -> float:
    """How far a width path's removals are from Theorem 4, in standard errors.

    Round ``n`` removes ``R_n = U_n + k - U_{n+1}`` extremities; under the
    model ``R_n - E(R_{d,k}(U_n))`` has mean 0 and variance ``V(R_{d,k}(U_n))``
    given the past, so the sum of residuals over the sum of variances is
    ~N(0, 1) (martingale CLT). It tests the round's law itself, at every width
    the path visits (the descent too), and is far sharper than comparing means
    because the width's own slow scatter cancels. 0 when no round is random.
    """
    residual = variance = 0.0
    for width, following in zip(path, path[1:]):
        residual += width + k - following - expected_removed(d, k, width)
        variance += variance_removed(d, k, width)
    if variance == 0.0:
        if abs(residual) > 1e-9:
            raise CoreWidthError(f"the path removed {residual:+g} more than the model "
                                 "in rounds the model says are certain")
        return 0.0
    return residual / math.sqrt(variance)


def _writer_keys(count: int) -> list[bytes]:
    # Distinct fixed author keys: the graph only needs (author, seq) to be unique.
    return [index.to_bytes(KEY_BYTES, "big") for index in range(1, count + 1)]


def unsigned_event(topic: bytes, author: bytes, seq: int, parents: Sequence[bytes]) -> Event:
    """A message event in its canonical encoding, with a zero signature.

    Built with the event module's own encoding helpers, so its id and bytes
    are exactly what a signed event with this signature would have.
    """
    body = pack([EVENT_VERSION, topic, author, seq, sorted(parents), [topic], TIMESTAMP_MS,
                 KIND_MESSAGE, None, b""])
    return trusted_event(signed_encoding(body, UNSIGNED))


def _new_topic(d: int, rng: random.Random) -> Replica:
    creator = Identity.from_seed(rng.randbytes(ID_BYTES))
    return Replica.create_topic(MemoryStore(), creator, TIMESTAMP_MS, d_max=d, config=MODEL_CONFIG)


def _add_all(graph: Graph, events: Sequence[Event]) -> None:
    for event in events:
        result = graph.add(event)
        if result.status is not AddStatus.APPLIED:
            raise CoreWidthError(f"{event!r} not applied: {result.status} {result.reason}")


def core_width_path(
    d: int, k: int, rounds: int, rng: random.Random, start_width: int = 1
) -> list[int]:
    """Widths ``[U_0, ..., U_rounds]`` of a real graph grown in synchronous rounds.

    ``start_width = 1`` starts from the create event alone (a single chain);
    a larger value first hangs that many events straight off the create event
    (a star), so the graph starts exactly that wide, as the paper's Figure 5
    does with ``100 k``. Raises CoreWidthError if the graph refuses an event.
    """
    _check_dk(d, k)
    if not 1 <= start_width <= MAX_START_WIDTH:
        raise ValueError(f"start_width must be in [1, {MAX_START_WIDTH}], got {start_width}")
    if rounds < 0 or start_width + rounds * k > MAX_CORE_EVENTS:
        raise ValueError(f"{rounds} rounds of k={k} from width {start_width} exceed "
                         f"MAX_CORE_EVENTS={MAX_CORE_EVENTS}")
    replica = _new_topic(d, rng)
    graph, topic = replica.graph, replica.topic_id
    d_max, policy = replica.params.d_max, replica.config.parent_policy
    star_author, *writers = _writer_keys(k + 1)
    if start_width > 1:
        _add_all(graph, [unsigned_event(topic, star_author, seq, (topic,))
                         for seq in range(start_width)])
        graph.commit()
    def depth_of(event_id: bytes) -> int:  # as Replica passes it (RANDOM never asks)
        return graph.depth(event_id) or 0

    widths = [graph.width]
    for seq in range(rounds):
        seen = graph.extremities()  # what every writer holds at the round start
        round_events = [
            unsigned_event(topic, writer, seq, select_parents(seen, d_max, policy, rng, depth_of))
            for writer in writers
        ]
        _add_all(graph, round_events)  # the round is delivered to everyone
        graph.commit()
        widths.append(graph.width)
    return widths


def replica_width_path(
    d: int, k: int, rounds: int, rng: random.Random, authorized: bool = False
) -> list[int]:
    """Widths of the same process built by ``k`` whole replicas, one store each.

    Each round every replica `publish`es (its own parent choice, signed) on
    the state of the round start, then `receive`s every other replica's event
    through the Reference Monitor. ``authorized=False`` is the modelled pure
    MEG (`MODEL_CONFIG`), starting from the create event alone.
    ``authorized=True`` is the kind of topic a node creates (`node.runtime`):
    an open room with topic state and a total order, whose parent choice pins
    the author's own chain (`Replica._choose_parents`); its path starts after
    the creator's bootstrap and every writer's join. No acks are made (the
    dissemination tick makes those) and depletion is off in both.

    Raises CoreWidthError if a delivery is refused or unauthorized, or the
    replicas' forward extremities ever differ at a round's end (the shared
    graph of `core_width_path` would then not be faithful).
    """
    _check_dk(d, k)
    if rounds < 0 or k * k * rounds > MAX_REPLICA_EVENTS:
        raise ValueError(f"{rounds} rounds of k={k} exceed MAX_REPLICA_EVENTS={MAX_REPLICA_EVENTS}")
    config = AUTHORIZED_CONFIG if authorized else MODEL_CONFIG
    creator = Replica.create_topic(
        MemoryStore(), Identity.from_seed(rng.randbytes(ID_BYTES)), TIMESTAMP_MS, d_max=d,
        config=config, authorization=authorized, join_rule=RULE_PUBLIC, members_write=True)
    replicas = [creator]
    for _ in range(k - 1):
        replica = Replica(MemoryStore(), creator.topic_id,
                          Identity.from_seed(rng.randbytes(ID_BYTES)), config)
        replicas.append(replica)
    bootstrap = [event for _, event in creator.graph.deliveries(0)]
    _deliver(replicas, bootstrap, made_by=[0] * len(bootstrap))
    if authorized:
        joins = [replica.join(TIMESTAMP_MS, rng)[0] for replica in replicas[1:]]
        _deliver(replicas, joins, made_by=range(1, k))
    widths = [_common_width(replicas)]
    for _ in range(rounds):
        made = [replica.publish(b"", TIMESTAMP_MS, rng)[0] for replica in replicas]
        _deliver(replicas, made, made_by=range(k))
        widths.append(_common_width(replicas))
    return widths


def _deliver(replicas: Sequence[Replica], events: Sequence[Event], made_by: Sequence[int]) -> None:
    """Every replica receives every event of `events` except the ones it made itself.

    ``events[j]`` was made (and so already added) by ``replicas[made_by[j]]``.
    """
    for index, replica in enumerate(replicas):
        for event, author_index in zip(events, made_by, strict=True):
            if author_index == index:
                continue
            outcome = replica.receive(event.raw, TIMESTAMP_MS, expected_id=event.id)
            if outcome.status is not AddStatus.APPLIED or outcome.unauthorized:
                raise CoreWidthError(f"{event!r} not applied at replica {index}: "
                                     f"{outcome.status} {outcome.reason} {outcome.unauthorized}")
        replica.commit()


def _common_width(replicas: Sequence[Replica]) -> int:
    reference = replicas[0].graph.extremities()
    if any(replica.graph.extremities() != reference for replica in replicas):
        raise CoreWidthError("replicas hold different extremities after a full round")
    return len(reference)
