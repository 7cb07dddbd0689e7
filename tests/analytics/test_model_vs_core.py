"""CI guard: the width of a MEG our core builds follows the paper's model (k = 10, d = 3).

The benchmark tests/bench/test_model_bench.py::test_core_width_vs_model covers
k in {10, 100, 1000} x d in {2, 3, 5, 10}; this keeps one small case in every
run, so a change to parent selection or to the graph's extremity bookkeeping
that moves the width away from the model fails CI. The tolerance comes from
the model itself: the exact chain's asymptotic variance gives the scatter of a
window mean (`tests.analytics.core_width.stationary_width`), and we allow
`SIGMAS` of it. Seeds are fixed, so the runs are deterministic.

Two more small runs: k whole replicas (signed events, the Reference Monitor)
hold identical extremities after every round, which is why the fast driver's
one shared graph is faithful; and the topics a node really creates
(authorized, author's chain pinned among the parents) are not the model:
their width stays at exactly k in synchronous rounds.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest

from tests.analytics.core_width import (
    core_width_path,
    removed_z,
    replica_width_path,
    stationary_width,
)
from analytics.model import (
    DEFAULT_START_FACTOR,
    expected_next_width,
    fixed_point_width,
    rounds_to_convergence,
    variance_removed,
)

K = 10
D = 3
SEED = 7
SIGMAS = 4.0
"""Two-sided P(|Z| > 4) = 6e-5 if the core follows the model."""
BURN_IN_MARGIN = 20
"""Rounds past the mean-value convergence time before averaging (as the bench)."""
CORE_WINDOW = 500
"""Rounds averaged on the shared graph (~0.4 s): exact se ~0.03 widths."""
REPLICA_ROUNDS = 30
"""Rounds of k whole replicas (~0.5 s: k (k - 1) signature checks a round)."""
REPLICA_BURN_IN = 5
"""From the create event the width is k after one round and near u* at once."""
AUTHORIZED_ROUNDS = 12
"""Rounds of k replicas on an authorized topic (~0.5 s: auth rules and order per event)."""


@pytest.fixture(scope="module")
def law():
    return stationary_width(D, K, fixed_point_width(D, K))


def within(mean: float, expected: float, asymptotic_variance: float, rounds: int) -> float:
    """How many exact standard errors (sqrt(asymptotic variance / rounds)) `mean` is off."""
    return abs(mean - expected) / math.sqrt(asymptotic_variance / rounds)


def test_core_width_matches_the_model_fixed_point(law):
    start = DEFAULT_START_FACTOR * K
    burn_in = rounds_to_convergence(D, K, u0=start) + BURN_IN_MARGIN
    path = core_width_path(D, K, burn_in + CORE_WINDOW, random.Random(SEED), start_width=start)

    assert path[0] == start  # the star start state is as wide as asked
    # The first round of the descent is the model's: u0 + k - R, with R
    # within SIGMAS sd of E(R) (Theorem 4).
    spread = SIGMAS * math.sqrt(variance_removed(D, K, start)) + 1.0
    assert abs(path[1] - expected_next_width(D, K, start)) <= spread
    # And so is every round: what each removes, against Theorem 4's mean and variance.
    assert abs(removed_z(path, D, K)) <= SIGMAS
    window = path[burn_in + 1:]
    mean = statistics.fmean(window)
    sigmas = within(mean, law.mean, law.asymptotic_variance, len(window))
    assert sigmas <= SIGMAS, (mean, law)
    # The stationary mean sits at or just above the fixed point (Jensen), so
    # the measured mean is the model's prediction within the same tolerance.
    tolerance = SIGMAS * math.sqrt(law.asymptotic_variance / len(window))
    assert law.mean - fixed_point_width(D, K) <= tolerance
    assert abs(mean - fixed_point_width(D, K)) <= 2 * tolerance
    # The check has teeth: the tolerance is a small fraction of the width's own spread.
    assert tolerance < law.sd / 4


def test_whole_replicas_build_the_same_process(law):
    # replica_width_path raises if the replicas' extremities ever differ at a
    # round's end: that is what makes the shared graph above faithful.
    path = replica_width_path(D, K, REPLICA_ROUNDS, random.Random(SEED))

    assert path[:2] == [1, K]  # every writer of round one names the create event alone
    assert abs(removed_z(path, D, K)) <= SIGMAS
    window = path[REPLICA_BURN_IN + 1:]
    mean = statistics.fmean(window)
    assert within(mean, law.mean, law.asymptotic_variance, len(window)) <= SIGMAS, (mean, law)


def test_authorized_topics_pin_the_chain_and_stay_at_width_k(law):
    # Not the model: the topics a node creates (authorized, with a total
    # order) name the author's own latest event among the parents whenever
    # the width exceeds d_max. In synchronous rounds that event is always an
    # extremity at the round start, so each of the k events of a round is
    # removed by its own author's next one: the width is k after every round,
    # below the model's u*. The bench records it for all d.
    path = replica_width_path(D, K, AUTHORIZED_ROUNDS, random.Random(SEED), authorized=True)

    assert path[1:] == [K] * AUTHORIZED_ROUNDS
    assert law.mean > fixed_point_width(D, K) > K  # where the model puts the pure MEG
