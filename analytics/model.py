"""The MEG width model of the paper's section VIII: an urn process, as code.

What: each round, every one of ``k`` replicas picks ``d`` parents uniformly at
random, without replacement, from the ``u`` current forward extremities (red
balls in an urn). Picked balls turn black, so overlapping picks remove nothing
more. ``R_{d,k}(u)`` is the number of red balls removed in one round, and the
width evolves as ``U_{n+1} = U_n + k - R_{d,k}(U_n)`` because each replica's new
vertex is itself a forward extremity. This module gives Theorem 4 (mean,
variance, distribution of ``R``), the mean-value iteration behind Figures 4 and
5, and a Monte-Carlo urn to check both against.

Why: megnode caps the number of parents per event (the Reference Monitor's
cost grows with every parent), and we need to know what width the graph
settles at, and how fast, for a given cap ``d`` and replica count ``k``.

Definitions this module fixes, where the paper leaves them open:

* ``u < d``: a replica cannot draw ``d`` parents from fewer extremities, so it
  takes all ``u`` (what an implementation does; Synapse likewise uses every
  extremity when it has at most its cap). The first replica then removes every
  red ball, so ``R = u`` exactly, with variance 0. The closed form agrees at the
  seam ``u = d`` (``p = 0`` gives ``E(R) = d``) and is continuous there.
* ``u = 0`` is not a state: a MEG always has at least one forward extremity.
* ``d = 1`` never shrinks the width (each event removes at most the one
  extremity it replaces), so the convergence functions demand ``d >= 2``.

Two corrections to the printed paper, both checked by the tests:

* The appendix's variance recursion prints ``v`` as the factor of
  ``V(R_{d,k-1})``; the derivation gives ``(1 - d/u)^2 - v = w``, and the
  stated closed form (b) indeed solves ``V_k = w V_{k-1} + v (u E_{k-1} -
  E_{k-1}^2)``. We implement the closed form.
* Section VIII-B says the speed far from the fixed point is ``k (1 - d)`` and
  the rounds scale with ``1 / (1 - d)``; the signs are flipped: each round
  removes up to ``k d`` and adds ``k``, so the width falls by about
  ``k (d - 1)``.
"""

from __future__ import annotations

import math
import random
from numbers import Integral, Real

import numpy as np

# Argument limits. They bound run time and memory, and keep the closed forms
# inside the range where float rounding stays far below anything we report.
MAX_WIDTH = 10**9
"""Largest urn content ``u`` the closed forms accept (variance loses ~u*1e-16 relative)."""
MAX_REPLICAS = 10**6
"""Largest number of replicas ``k`` per round."""
MAX_PARENTS = 10**4
"""Largest number of parents ``d`` per event."""

MAX_DISTRIBUTION_WIDTH = 100_000
"""Largest ``u`` for `removed_distribution` (its vectors have up to ``u + 1`` entries)."""
MAX_DISTRIBUTION_WORK = 300_000_000
"""Cap on ``k * (min(d, u) + 1) * support`` multiply-adds in the distribution recursion."""
MAX_TRANSITION_CELLS = 10_000_000
"""Cap on the cached hypergeometric table, ``(min(d, u) + 1) * support`` floats (80 MB)."""

MAX_ROUNDS = 100_000
"""Default cap on rounds of the mean-value iteration in `rounds_to_convergence`."""
CONVERGENCE_STEP = 1.0
"""The paper's criterion: converged once the expected width moves by less than one."""
DEFAULT_START_FACTOR = 100
"""Figure 5 starts at ``u_0 = 100 * k``."""
MIN_CONVERGENT_PARENTS = 2
"""With one parent per event the width can only grow (section VIII)."""

FIXED_POINT_REL_TOLERANCE = 1e-12
"""Bisection stops when the bracket is this small relative to the fixed point."""
MAX_BISECTION_STEPS = 200

MAX_SIMULATION_DRAWS = 50_000_000
"""Cap on ``rounds * k * d`` (or ``trials * k * d``) balls drawn by one Monte-Carlo call."""


# --------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------

def _require_int(name: str, value: object, low: int, high: int) -> int:
    # bool is an Integral in Python, but True parents is always a caller bug.
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return int(value)


def _require_width(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    width = float(value)
    if not math.isfinite(width) or not 1.0 <= width <= MAX_WIDTH:
        raise ValueError(f"{name} must be a finite width in [1, {MAX_WIDTH}], got {value}")
    return width


def _check_dk(d: object, k: object) -> tuple[int, int]:
    return (_require_int("d", d, 1, MAX_PARENTS), _require_int("k", k, 1, MAX_REPLICAS))


def _check_convergent_d(d: int) -> None:
    if d < MIN_CONVERGENT_PARENTS:
        raise ValueError(
            f"d must be >= {MIN_CONVERGENT_PARENTS} for the width to converge "
            f"(with d = 1 no round can shrink it), got {d}"
        )


# --------------------------------------------------------------------------
# Theorem 4: moments and distribution of R_{d,k}(u)
# --------------------------------------------------------------------------

def _mean_removed(d: int, k: int, u: float) -> float:
    """E(R_{d,k}(u)) for a real ``u >= 1``; exact at integers (Theorem 4a).

    ``d (1 - p^k) / (1 - p)`` with ``p = 1 - d/u`` simplifies to
    ``u (1 - p^k)`` because ``d / (1 - p) = u``; expm1/log1p keep it accurate
    when ``p`` is close to 1 (large ``u``), where ``1 - p^k`` would cancel.
    """
    if u <= d:
        return u  # every replica takes the whole urn; the first one empties it
    return -u * math.expm1(k * math.log1p(-d / u))


def expected_removed(d: int, k: int, u: int) -> float:
    """E(R_{d,k}(u)), the expected number of extremities one round removes.

    Closed form of Theorem 4a; for ``u <= d`` it is ``u`` (see module doc).
    """
    d, k = _check_dk(d, k)
    u = _require_int("u", u, 1, MAX_WIDTH)
    return float(_mean_removed(d, k, u))


def _geometric_sum(q: float, n: int) -> float:
    """``sum_{i<n} x^i = (1 - x^n) / (1 - x)`` for ``x = 1 - q``, given ``q`` exactly.

    The callers know ``1 - x`` as an exact ratio, so passing it avoids the
    cancellation of computing ``1 - x`` from a ``x`` near 1.
    """
    if q >= 1.0:
        return 1.0  # x = 0: only the i = 0 term (n >= 1 here)
    return -math.expm1(n * math.log1p(-q)) / q


def variance_removed(d: int, k: int, u: int) -> float:
    """V(R_{d,k}(u)), closed form of Theorem 4b.

    With ``v, w`` of eq. (2), the paper's two bracketed terms have prefactors
    ``v u d / (1 - p) = v d^2 / (1 - p)^2 = v u^2``, so their leading geometric
    sums cancel and

        V = v u^2 ( p^{k-1} S(w/p) - p^{2(k-1)} S(w/p^2) ),  S(x) = sum_{i<k-1} x^i.

    The complements are exact ratios: ``1 - w/p = d/(u-1)`` and
    ``1 - w/p^2 = d/((u-1)(u-d))``. Zero for ``k = 1`` or ``u <= d``, where
    ``R`` is the constant ``min(d, u)``.
    """
    d, k = _check_dk(d, k)
    u = _require_int("u", u, 1, MAX_WIDTH)
    if k == 1 or u <= d:
        return 0.0
    n = k - 1
    v = d * (u - d) / (u * u * (u - 1))  # u >= d + 1 >= 2 here, so u - 1 > 0
    log_p = math.log1p(-d / u)
    first = math.exp(n * log_p) * _geometric_sum(d / (u - 1), n)
    second = math.exp(2 * n * log_p) * _geometric_sum(d / ((u - 1) * (u - d)), n)
    # The bracket is a sum of positive terms; rounding must not make it negative.
    return max(0.0, v * u * u * (first - second))


def _hypergeometric_table(u: int, draw: int, top: int) -> np.ndarray:
    """``T[l, r - draw] = P(Z = l | R = r)`` for ``r`` in ``[draw, top]``.

    Given ``r`` black balls, a replica's ``draw`` picks show ``l`` red ones with
    the Hyp(draw, u - r, r) law (appendix, proof of c). Since ``r >= draw``
    there is always a way to pick only black balls, so we start at
    ``P(Z = 0 | r) = C(r, draw) / C(u, draw)`` and climb with the ratio
    ``P(l+1)/P(l) = (u-r-l)(draw-l) / ((l+1)(r-draw+l+1))``. Working in logs
    avoids underflow of ``C(r, draw)/C(u, draw)`` when ``draw`` is large.
    """
    r = np.arange(draw, top + 1, dtype=np.float64)
    table = np.empty((draw + 1, r.size))
    i = np.arange(draw, dtype=np.float64)[:, None]
    log_prob = np.sum(np.log((r - i) / (u - i)), axis=0)
    table[0] = np.exp(log_prob)
    for ell in range(draw):
        red_left = u - r - ell
        with np.errstate(divide="ignore"):
            # No red ball left: this and every larger l is impossible.
            step = np.where(
                red_left > 0,
                np.log(np.maximum(red_left, 1.0)) + math.log(draw - ell)
                - math.log(ell + 1) - np.log(r - draw + ell + 1),
                -np.inf,
            )
        log_prob = log_prob + step
        table[ell + 1] = np.exp(log_prob)
    return table


def removed_distribution(d: int, k: int, u: int) -> list[float]:
    """``P(R_{d,k}(u) = j)`` for ``j = 0 .. min(u, d*k)``, by Theorem 4c.

    Replica by replica: ``R_i = R_{i-1} + Z_i`` with ``Z_i | R_{i-1} = r`` being
    Hyp(min(d,u), u - r, r). Entries below ``min(d, u)`` are zero (the first
    replica alone removes that many).
    """
    d, k = _check_dk(d, k)
    u = _require_int("u", u, 1, MAX_DISTRIBUTION_WIDTH)
    draw = min(d, u)
    top = min(u, d * k)
    support = top - draw + 1
    if k > 1 and (draw + 1) * support > MAX_TRANSITION_CELLS:
        raise ValueError(
            f"removed_distribution({d}, {k}, {u}) needs a {draw + 1}x{support} table, "
            f"over MAX_TRANSITION_CELLS={MAX_TRANSITION_CELLS}"
        )
    if k * (draw + 1) * support > MAX_DISTRIBUTION_WORK:
        raise ValueError(
            f"removed_distribution({d}, {k}, {u}) needs ~{k * (draw + 1) * support:.3g} "
            f"operations, over MAX_DISTRIBUTION_WORK={MAX_DISTRIBUTION_WORK}"
        )
    probs = np.zeros(top + 1)
    probs[draw] = 1.0  # R_1 = min(d, u): the first replica only finds red balls
    if k > 1 and support > 1:
        table = _hypergeometric_table(u, draw, top)
        for replica in range(2, k + 1):
            hi = min(top, (replica - 1) * draw)  # R_{replica-1} lies in [draw, hi]
            prev = probs[draw:hi + 1]
            width = hi - draw + 1
            # Padding: r + l can only exceed top where the table entry is zero.
            nxt = np.zeros(top + draw + 1)
            for ell in range(draw + 1):
                nxt[draw + ell:hi + 1 + ell] += prev * table[ell, :width]
            probs = nxt[:top + 1]
    return probs.tolist()


# --------------------------------------------------------------------------
# the mean-value iteration (Figures 4 and 5)
# --------------------------------------------------------------------------

def _next_width(d: int, k: int, u: float) -> float:
    return u + k - _mean_removed(d, k, u)


def expected_next_width(d: int, k: int, u: float) -> float:
    """``E(U_{n+1} | U_n = u) = u + k - E(R_{d,k}(u))``.

    Non-integer ``u`` (the expected widths of the iteration in Figure 5) uses
    the closed form of Theorem 4a evaluated at real ``u``: that is the paper's
    own mean-value step ``E(U_{n+1}) = E(U_n) + k - E(R(E(U_n)))``. The formula
    is exact at every integer and smooth and increasing in between, so it is
    the natural interpolation; rounding ``u`` instead would make the step a
    staircase whose integer-sized jumps distort the "moves by less than one"
    stopping rule.
    """
    d, k = _check_dk(d, k)
    return _next_width(d, k, _require_width("u", u))


def rounds_to_convergence(
    d: int, k: int, u0: int | None = None, max_rounds: int = MAX_ROUNDS
) -> int:
    """Rounds ``n`` of the mean-value iteration until ``|E(U_n) - E(U_{n+1})| < 1``.

    Figure 5's quantity: start from ``E(U_0) = u0`` (default ``100 k``), step
    with `expected_next_width`, return the first ``n`` whose step is shorter
    than `CONVERGENCE_STEP`. The paper writes the one-sided
    ``E(U_n) - E(U_{n+1}) < 1``; from above the fixed point the iteration
    decreases monotonically (the step map is non-decreasing in ``u``), so both
    agree there. The absolute value keeps a start below the fixed point, where
    the width grows, from counting as converged at once.

    Raises RuntimeError if ``max_rounds`` rounds do not suffice.
    """
    d, k = _check_dk(d, k)
    _check_convergent_d(d)
    if u0 is None:
        u0 = DEFAULT_START_FACTOR * k
    start = _require_int("u0", u0, 1, MAX_WIDTH)
    max_rounds = _require_int("max_rounds", max_rounds, 0, 10 * MAX_ROUNDS)
    current = float(start)
    for n in range(max_rounds + 1):
        following = _next_width(d, k, current)
        if abs(current - following) < CONVERGENCE_STEP:
            return n
        current = following
    raise RuntimeError(
        f"expected width for d={d}, k={k}, u0={start} still moves by >= "
        f"{CONVERGENCE_STEP} after {max_rounds} rounds"
    )


def fixed_point_width(d: int, k: int) -> float:
    """The width where the expected change ``E(U_{n+1}) - U_n`` is zero.

    That is the solution of ``E(R_{d,k}(u)) = k``: the crossing with the
    diagonal in Figure 4 and the limit of the mean-value iteration of
    Figure 5 (from any start). It is *not* the stationary mean of the Markov
    chain: ``E(R)`` is concave in ``u``, so by Jensen the chain's long-run mean
    width sits at or slightly above this point (the bench measures the gap).

    For ``k <= d`` it is exactly ``k`` (each round one replica takes the whole
    urn). For ``k > d`` it lies strictly above ``k`` and is found by bisection;
    ``E(R)`` is strictly increasing in ``u`` there, so the root is unique.
    """
    d, k = _check_dk(d, k)
    _check_convergent_d(d)
    if k <= d:
        return float(k)
    low, high = float(k), 2.0 * k  # E(R)(k) < k because replicas overlap
    while _mean_removed(d, k, high) <= k:
        low, high = high, 2.0 * high  # E(R) -> d k > k, so this ends
    for _ in range(MAX_BISECTION_STEPS):
        if high - low <= FIXED_POINT_REL_TOLERANCE * high:
            break
        mid = 0.5 * (low + high)
        if _mean_removed(d, k, mid) < k:
            low = mid
        else:
            high = mid
    return 0.5 * (low + high)


# --------------------------------------------------------------------------
# Monte-Carlo urn
# --------------------------------------------------------------------------

def _removed_in_round(d: int, k: int, u: int, rng: random.Random) -> int:
    """Draw one round of the urn and count the distinct red balls picked."""
    draw = min(d, u)
    population = range(u)  # sample() on a range is O(draw), not O(u)
    picked: set[int] = set()
    for _ in range(k):
        picked.update(rng.sample(population, draw))
        if len(picked) == u:
            break  # urn is all black; later replicas cannot change R
    return len(picked)


def _check_rng(rng: object) -> random.Random:
    if not isinstance(rng, random.Random):
        raise TypeError("rng must be a random.Random (seeded by the caller)")
    return rng


def _check_draw_budget(what: str, repetitions: int, d: int, k: int) -> None:
    if repetitions * k * d > MAX_SIMULATION_DRAWS:
        raise ValueError(
            f"{what}: {repetitions} x k={k} x d={d} draws exceed "
            f"MAX_SIMULATION_DRAWS={MAX_SIMULATION_DRAWS}"
        )


def simulate_urn(d: int, k: int, u0: int, rounds: int, rng: random.Random) -> list[int]:
    """One sample path ``[U_0, U_1, ..., U_rounds]`` of the urn process."""
    d, k = _check_dk(d, k)
    width = _require_int("u0", u0, 1, MAX_WIDTH)
    rounds = _require_int("rounds", rounds, 0, MAX_SIMULATION_DRAWS)
    _check_draw_budget("simulate_urn", rounds, d, k)
    rng = _check_rng(rng)
    widths = [width]
    for _ in range(rounds):
        width = width + k - _removed_in_round(d, k, width, rng)
        widths.append(width)
    return widths


def monte_carlo_removed(
    d: int, k: int, u: int, trials: int, rng: random.Random
) -> tuple[float, float]:
    """Sample mean and unbiased sample variance of ``R_{d,k}(u)`` over ``trials`` rounds."""
    d, k = _check_dk(d, k)
    u = _require_int("u", u, 1, MAX_WIDTH)
    trials = _require_int("trials", trials, 2, MAX_SIMULATION_DRAWS)
    _check_draw_budget("monte_carlo_removed", trials, d, k)
    rng = _check_rng(rng)
    samples = np.fromiter(
        (_removed_in_round(d, k, u, rng) for _ in range(trials)), dtype=np.float64, count=trials
    )
    return float(samples.mean()), float(samples.var(ddof=1))
