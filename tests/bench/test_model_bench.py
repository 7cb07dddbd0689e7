"""Benchmark "model vs urn Monte-Carlo": mean-value fixed point vs simulated width.

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
"""

from __future__ import annotations

import json
import math
import platform
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from analytics.model import (
    fixed_point_width,
    removed_distribution,
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
TRUNCATION_SDS = 30
"""The exact chain keeps widths up to u* + 30 sd (+10); the tail mass it drops is
checked to be negligible (TAIL_MASS_LIMIT)."""
TAIL_STATES = 5
TAIL_MASS_LIMIT = 1e-9
RESULTS = Path(__file__).resolve().parents[2] / "bench-results" / "model.json"


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
    past hi are folded onto hi, which the returned tail mass bounds.
    """
    sd = math.sqrt(variance_removed(d, k, round(fixed)))
    low, high = k, math.ceil(fixed + TRUNCATION_SDS * max(sd, 1.0) + 10)
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
    widths = np.arange(low, high + 1)
    mean = float(pi @ widths)
    return mean, float(math.sqrt(pi @ (widths - mean) ** 2)), float(abs(pi[-TAIL_STATES:]).sum())


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
