"""Benchmarks "model vs urn Monte-Carlo" and "model vs the real core": the MEG width.

What: for k in {10, 100, 1000} and d in {2, 3, 5, 10}, run the urn from
u0 = 100 k past the expected convergence time, then average the width over a
window and compare with `fixed_point_width`. Results go to
bench-results/model.json; `make bench` runs it, CI does not.

Why: the paper's Figures 4 and 5 use the mean-value iteration
``E(U_{n+1}) = E(U_n) + k - E(R(E(U_n)))``, which swaps an expectation and a
non-linear function. Because ``E(R)`` is concave in ``u``, the chain's long-run
mean sits slightly above the iteration's fixed point; this bench measures that
gap and sets it beside a second-order (delta-method) prediction, so we know
how far the paper's figures can be trusted as statements about the real
process. The chain's exact stationary mean, from its transition matrix on a
truncated state space (rows from `removed_distribution`), is the referee for
both.

The second benchmark (`test_core_width_vs_model`, bench-results/model_core.json)
measures the same quantity on the real thing: a MEG built by our own core
(`tests.analytics.core_width`: node.core's Graph and parent selection, k writers per
synchronous round, depletion off), beside the urn run over the same rounds.
Its tolerance is the exact chain's asymptotic standard error of a window mean;
`removed_z` also tests every round's removals against Theorem 4. Beside it,
the topics a node really creates (authorized, with a total order: the
author's chain is pinned among the parents) are measured with k = 10 whole
replicas: they do not follow the model, and the bench says by how much.
"""

from __future__ import annotations

import functools
import json
import math
import platform
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.analytics.core_width import (
    StationaryWidth,
    core_width_path,
    removed_z,
    replica_width_path,
    stationary_width,
)
from analytics.model import (
    DEFAULT_START_FACTOR,
    fixed_point_width,
    rounds_to_convergence,
    simulate_urn,
    variance_removed,
)

KS = (10, 100, 1000)
DS = (2, 3, 5, 10)
SEED = 20240601
BURN_IN_MARGIN = 20
"""Rounds past the mean-value convergence time before we start averaging."""
WINDOW = {10: (20, 1000), 100: (20, 200), 1000: (10, 40)}
"""k -> (batches, rounds per batch). A round costs ~k*d draws, so large k gets
a shorter window; batches must stay long against the chain's correlation time,
which is a few rounds at most here."""
SIGMAS = 5.0
JENSEN_ALLOWANCE = 0.01
"""Same bound as the unit test: the gap is second order, well under 1%."""
TAIL_MASS_LIMIT = 1e-9
"""Stationary mass the exact chain's truncation may fold away (see core_width)."""
RESULTS = Path(__file__).resolve().parents[2] / "bench-results" / "model.json"

CORE_RESULTS = RESULTS.with_name("model_core.json")
CORE_WINDOW = {10: (10, 300), 100: (10, 60), 1000: (10, 8)}
"""k -> (batches, rounds per batch) of the real-core run. A round adds k events
at ~65 us each unloaded, ~170 us on a loaded 2-core machine (parent draw,
graph.add, group commit on the memory store), and the whole run is ~0.85 M
events: about a minute unloaded, under three loaded. The exact se still
resolves 0.2% of u* at k = 1000 (80 rounds)."""
CORE_SIGMAS = 4.0
"""Allowed |core mean - exact stationary mean| in exact standard errors
(sqrt(asymptotic variance / window)). Two-sided P(|Z| > 4) = 6e-5 per case, so
under 1e-3 for the 12 cases together if the core follows the model."""
MAX_STAR_WIDTH = 10_000
"""Largest start width built as a star. Above it (k = 1000: 100 k = 100,000)
every event's parent draw sorts the whole extremity list (select_parents):
2-8 ms per event at width 100,000 depending on load, so the d = 2 descent alone
would take minutes. Those cases start from the create event (width 1) and rise
to u* instead; the stationary mean does not depend on the start."""
REACH_SDS = 3.0
"""The path has reached stationarity once it is within 3 sd (+1) of the mean."""
AUTHORIZED_K = 10
AUTHORIZED_ROUNDS = 60
"""The node's own (authorized) topics, k whole replicas: k (k - 1) signature and
auth-rule checks a round, so only k = 10 (~2 s per d)."""


@dataclass(frozen=True)
class BenchRow:
    k: int
    d: int
    fixed_point: float
    expected_rounds: int
    burn_in: int
    window_rounds: int
    sim_mean: float
    sim_sd: float
    sim_se: float
    """Batch-means standard error of sim_mean."""
    gap: float
    """sim_mean - fixed_point."""
    relative_gap: float
    exact_mean: float
    """Stationary mean width of the (truncated) Markov chain, computed exactly."""
    exact_sd: float
    exact_gap: float
    """exact_mean - fixed_point: the Jensen gap itself."""
    predicted_gap: float
    """Delta-method estimate of the Jensen gap (second order)."""
    tail_mass: float
    """Stationary mass on the top truncated states; must be negligible."""
    seconds: float


def predicted_jensen_gap(d: int, k: int, fixed: float) -> float:
    """Second-order estimate of (stationary mean width) - (mean-value fixed point).

    Balance at stationarity is E[m(U)] = k with m(u) = E(R_{d,k}(u)). Expanding
    m around its root u*: m'(u*) (E U - u*) + m''(u*) Var(U) / 2 ~ 0. The width
    near u* is an AR(1)-like chain with slope g = 1 - m'(u*), so
    Var(U) ~ V(R(u*)) / (1 - g^2).
    """
    if k <= d:
        return 0.0  # the chain is absorbed at exactly k
    p = 1.0 - d / fixed
    slope = p ** (k - 1) * (p + k * (1.0 - p))  # g = d E(U_{n+1}) / d u_n at u*
    m1 = 1.0 - slope
    m2 = -k * (k - 1) * p ** (k - 2) * (1.0 - p) * d / fixed**2
    var_u = variance_removed(d, k, round(fixed)) / (1.0 - slope**2)
    return -0.5 * m2 * var_u / m1


def exact_stationary(d: int, k: int, fixed: float) -> tuple[float, float, float]:
    """Mean, sd and top-tail mass of the chain's stationary law on [k, hi].

    Widths below k are transient (a round never removes more than it finds,
    so U_{n+1} >= k), and hi sits far above the fixed point; the rare jumps
    past hi are folded onto hi, which the returned tail mass bounds. The
    computation lives in `tests.analytics.core_width.stationary_width` (cached here:
    both benchmarks of this file need it for the same 12 cases).
    """
    law = _stationary(d, k, fixed)
    return law.mean, law.sd, law.tail_mass


@functools.lru_cache(maxsize=len(KS) * len(DS))
def _stationary(d: int, k: int, fixed: float) -> StationaryWidth:
    return stationary_width(d, k, fixed)


def run_one(d: int, k: int, rng: random.Random) -> BenchRow:
    started = time.perf_counter()
    fixed = fixed_point_width(d, k)
    expected_rounds = rounds_to_convergence(d, k)
    burn_in = expected_rounds + BURN_IN_MARGIN
    batches, batch_len = WINDOW[k]
    path = simulate_urn(d, k, 100 * k, burn_in + batches * batch_len, rng)
    tail = path[burn_in + 1:]
    means = [statistics.fmean(tail[i * batch_len:(i + 1) * batch_len]) for i in range(batches)]
    mean = statistics.fmean(tail)
    exact_mean, exact_sd, tail_mass = exact_stationary(d, k, fixed)
    return BenchRow(
        k=k, d=d, fixed_point=fixed, expected_rounds=expected_rounds, burn_in=burn_in,
        window_rounds=len(tail), sim_mean=mean, sim_sd=statistics.pstdev(tail),
        sim_se=statistics.stdev(means) / math.sqrt(batches), gap=mean - fixed,
        relative_gap=(mean - fixed) / fixed, exact_mean=exact_mean, exact_sd=exact_sd,
        exact_gap=exact_mean - fixed, predicted_gap=predicted_jensen_gap(d, k, fixed),
        tail_mass=tail_mass,
        seconds=time.perf_counter() - started,
    )


def test_fixed_point_vs_urn_monte_carlo():
    rng = random.Random(SEED)
    rows = [run_one(d, k, rng) for k in KS for d in DS]

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "model vs urn Monte-Carlo",
        "seed": SEED,
        "python": platform.python_version(),
        "rows": [asdict(row) for row in rows],
    }, indent=2) + "\n")

    print(f"\nmodel vs urn Monte-Carlo -> {RESULTS}")
    print(summary(rows))

    for row in rows:
        assert row.tail_mass < TAIL_MASS_LIMIT, row  # truncation did not matter
        # Jensen: concave E(R) puts the chain's mean at or above u*.
        assert row.exact_gap >= -1e-9, row
        assert abs(row.exact_gap) <= JENSEN_ALLOWANCE * row.fixed_point, row
        # The urn simulation and the exact chain describe the same process.
        assert abs(row.sim_mean - row.exact_mean) <= SIGMAS * row.sim_se + 1e-9, row


def summary(rows: Sequence[BenchRow]) -> str:
    lines = [f"{'k':>5} {'d':>3} {'u*':>10} {'rounds':>6} {'sim mean':>10} {'se':>6} "
             f"{'exact mean':>10} {'exact gap':>9} {'predicted':>9} {'s':>5}"]
    for row in rows:
        lines.append(
            f"{row.k:>5} {row.d:>3} {row.fixed_point:>10.3f} {row.expected_rounds:>6} "
            f"{row.sim_mean:>10.3f} {row.sim_se:>6.3f} {row.exact_mean:>10.3f} "
            f"{row.exact_gap:>9.4f} {row.predicted_gap:>9.4f} {row.seconds:>5.1f}"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class CoreRow:
    k: int
    d: int
    fixed_point: float
    start_width: int
    """100 k (a star), or 1 (the create event alone) above MAX_STAR_WIDTH."""
    burn_in: int
    """rounds_to_convergence from start_width, plus BURN_IN_MARGIN."""
    reached_round: int
    """First round within REACH_SDS sd (+1) of the exact mean, on the core's path."""
    window_rounds: int
    core_mean: float
    core_sd: float
    core_se_batch: float
    """Batch-means standard error of core_mean (measured)."""
    exact_mean: float
    exact_sd: float
    exact_se: float
    """sqrt(asymptotic variance / window_rounds): the window mean's scatter under the model."""
    deviation_sigmas: float
    """(core_mean - exact_mean) / exact_se; 0 where the model allows no scatter."""
    core_gap: float
    """core_mean - fixed_point: the measured Jensen gap (exact: exact_mean - fixed_point)."""
    removed_z: float
    """Every round's removals against Theorem 4 (`removed_z`), descent included; ~N(0, 1)."""
    urn_mean: float
    """The urn's window mean over the same start, burn-in and window."""
    core_seconds: float
    core_us_per_event: float


def run_core(d: int, k: int, rng: random.Random) -> CoreRow:
    fixed = fixed_point_width(d, k)
    law = _stationary(d, k, fixed)
    start = DEFAULT_START_FACTOR * k
    if start > MAX_STAR_WIDTH:
        start = 1
    burn_in = rounds_to_convergence(d, k, u0=start) + BURN_IN_MARGIN
    batches, batch_len = CORE_WINDOW[k]
    rounds = burn_in + batches * batch_len
    started = time.perf_counter()
    path = core_width_path(d, k, rounds, rng, start_width=start)
    seconds = time.perf_counter() - started
    urn = simulate_urn(d, k, start, rounds, rng)
    tail = path[burn_in + 1:]
    means = [statistics.fmean(tail[i * batch_len:(i + 1) * batch_len]) for i in range(batches)]
    mean = statistics.fmean(tail)
    exact_se = math.sqrt(law.asymptotic_variance / len(tail))
    near = REACH_SDS * law.sd + 1.0
    reached = next(n for n, width in enumerate(path) if abs(width - law.mean) <= near)
    return CoreRow(
        k=k, d=d, fixed_point=fixed, start_width=start, burn_in=burn_in, reached_round=reached,
        window_rounds=len(tail), core_mean=mean, core_sd=statistics.pstdev(tail),
        core_se_batch=statistics.stdev(means) / math.sqrt(batches),
        exact_mean=law.mean, exact_sd=law.sd, exact_se=exact_se,
        deviation_sigmas=(mean - law.mean) / exact_se if exact_se > 0 else 0.0,
        core_gap=mean - fixed, removed_z=removed_z(path, d, k),
        urn_mean=statistics.fmean(urn[burn_in + 1:]),
        core_seconds=seconds,
        core_us_per_event=seconds / ((start if start > 1 else 0) + rounds * k) * 1e6,
    )


@dataclass(frozen=True)
class AuthorizedRow:
    k: int
    d: int
    rounds: int
    mean: float
    """Mean width over rounds 1..rounds (round 0 is the state after the joins)."""
    min_width: int
    max_width: int
    model_mean: float
    """The model's exact stationary mean, for comparison (it does not apply here)."""
    seconds: float


def run_authorized(d: int, k: int, rng: random.Random) -> AuthorizedRow:
    started = time.perf_counter()
    path = replica_width_path(d, k, AUTHORIZED_ROUNDS, rng, authorized=True)[1:]
    seconds = time.perf_counter() - started
    return AuthorizedRow(
        k=k, d=d, rounds=len(path), mean=statistics.fmean(path), min_width=min(path),
        max_width=max(path), model_mean=_stationary(d, k, fixed_point_width(d, k)).mean,
        seconds=seconds,
    )


def test_core_width_vs_model():
    rng = random.Random(SEED)
    rows = [run_core(d, k, rng) for k in KS for d in DS]
    authorized = [run_authorized(d, AUTHORIZED_K, rng) for d in DS]

    CORE_RESULTS.parent.mkdir(parents=True, exist_ok=True)
    CORE_RESULTS.write_text(json.dumps({
        "benchmark": "model vs the real core (synchronous rounds)",
        "seed": SEED,
        "python": platform.python_version(),
        "rows": [asdict(row) for row in rows],
        "authorized_rows": [asdict(row) for row in authorized],
    }, indent=2) + "\n")

    print(f"\nmodel vs real core -> {CORE_RESULTS}")
    print(core_summary(rows))
    print("\nauthorized topics (author's chain pinned among the parents; not the model):")
    print(authorized_summary(authorized))

    for row in rows:
        # The burn-in was long enough: the window starts after the path arrived.
        assert row.reached_round <= row.burn_in, row
        # Each round of the real graph removes what the urn's round would.
        assert abs(row.removed_z) <= CORE_SIGMAS, row
        if row.exact_se == 0.0:  # k <= d: the model's width is exactly k every round
            assert row.core_mean == row.k and abs(row.exact_mean - row.k) < 1e-9, row
        else:
            assert abs(row.core_mean - row.exact_mean) <= CORE_SIGMAS * row.exact_se, row
        # The urn over the same rounds agrees as well: a failure above is the core's.
        assert abs(row.urn_mean - row.exact_mean) <= CORE_SIGMAS * row.exact_se + 1e-9, row
    for auth in authorized:
        # Each writer's previous event is an extremity at every round start and
        # is always among its parents, so every round's events are all merged.
        assert auth.min_width == auth.max_width == auth.k, auth


def core_summary(rows: Sequence[CoreRow]) -> str:
    lines = [f"{'k':>5} {'d':>3} {'u*':>10} {'start':>6} {'burn':>4} {'reach':>5} "
             f"{'core mean':>10} {'exact mean':>10} {'exact se':>8} {'batch se':>8} "
             f"{'dev/se':>6} {'R z':>5} {'urn mean':>10} {'us/ev':>6} {'s':>5}"]
    for row in rows:
        lines.append(
            f"{row.k:>5} {row.d:>3} {row.fixed_point:>10.3f} {row.start_width:>6} "
            f"{row.burn_in:>4} {row.reached_round:>5} {row.core_mean:>10.3f} "
            f"{row.exact_mean:>10.3f} {row.exact_se:>8.4f} {row.core_se_batch:>8.4f} "
            f"{row.deviation_sigmas:>6.2f} {row.removed_z:>5.2f} {row.urn_mean:>10.3f} "
            f"{row.core_us_per_event:>6.1f} {row.core_seconds:>5.1f}"
        )
    return "\n".join(lines)


def authorized_summary(rows: Sequence[AuthorizedRow]) -> str:
    lines = [f"{'k':>5} {'d':>3} {'rounds':>6} {'mean':>8} {'min':>4} {'max':>4} "
             f"{'model':>8} {'s':>5}"]
    for row in rows:
        lines.append(f"{row.k:>5} {row.d:>3} {row.rounds:>6} {row.mean:>8.3f} "
                     f"{row.min_width:>4} {row.max_width:>4} {row.model_mean:>8.3f} "
                     f"{row.seconds:>5.1f}")
    return "\n".join(lines)
