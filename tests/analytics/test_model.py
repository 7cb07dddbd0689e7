"""The urn model of the MEG width (paper section VIII) and its figures.

Three independent routes to R_{d,k}(u) must agree: the closed forms of
Theorem 4, the distribution recursion, and the urn itself (enumerated exactly
for tiny urns, sampled for larger ones). Then the paper's qualitative claims:
convergence near k, diminishing returns in d.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analytics.figures import (
    FIGURE4_MC_TRIALS,
    Figure4Row,
    Figure5Row,
    figure4_monte_carlo_rows,
    figure4_rows,
    figure5_rows,
    format_table,
    main,
    plot_figure4,
    plot_figure5,
)
from analytics.model import (
    MAX_DISTRIBUTION_WIDTH,
    expected_next_width,
    expected_removed,
    fixed_point_width,
    monte_carlo_removed,
    removed_distribution,
    rounds_to_convergence,
    simulate_urn,
    variance_removed,
)

# Monte-Carlo checks allow this many standard errors; a correct model fails one
# such check with probability ~6e-7, and the seeds are fixed anyway.
SIGMAS = 5.0
JENSEN_ALLOWANCE = 0.01
"""The chain's mean width exceeds the mean-value fixed point by a second-order
(Jensen) term, because E(R) is concave in u. The exact stationary law (see
tests/bench/test_model_bench.py) puts it under 0.08 widths, at most 0.6% of the
fixed point for the parameters used here, so 1% bounds it."""


def moments(dist: list[float]) -> tuple[float, float, float]:
    """Mean, variance and fourth central moment of a pmf on 0..len-1."""
    mean = math.fsum(j * p for j, p in enumerate(dist))
    var = math.fsum((j - mean) ** 2 * p for j, p in enumerate(dist))
    fourth = math.fsum((j - mean) ** 4 * p for j, p in enumerate(dist))
    return mean, var, fourth


def enumerate_urn(d: int, k: int, u: int) -> list[Fraction]:
    """Exact pmf of R by listing every combination of every replica's draw."""
    draws = list(itertools.combinations(range(u), min(d, u)))
    counts = [0] * (min(u, d * k) + 1)
    for picks in itertools.product(draws, repeat=k):
        counts[len(set().union(*picks))] += 1
    total = len(draws) ** k
    return [Fraction(c, total) for c in counts]


def variance_by_recursion(d: int, k: int, u: int) -> Fraction:
    """The appendix recursion, exactly, with the factor of V_{k-1} corrected to w.

    The paper prints v there; p^2 - v = w is what the derivation gives.
    """
    p = Fraction(u - d, u)
    v = Fraction(d * (u - d), u * u * (u - 1))
    w = Fraction((u - d) * (u - d - 1), u * (u - 1))
    assert p * p - v == w
    mean, var = Fraction(d), Fraction(0)
    for _ in range(k - 1):
        var = w * var + v * (u * mean - mean * mean)
        mean = d + p * mean
    return var


# --------------------------------------------------------------------------
# Theorem 4: three routes agree
# --------------------------------------------------------------------------

@pytest.mark.parametrize("d,k,u", [(2, 3, 5), (3, 3, 6), (2, 4, 4), (3, 2, 7), (1, 3, 4), (4, 2, 3)])
def test_distribution_recursion_equals_exhaustive_enumeration(d, k, u):
    exact = enumerate_urn(d, k, u)
    assert removed_distribution(d, k, u) == pytest.approx([float(x) for x in exact], abs=1e-14)


@pytest.mark.parametrize("d,k,u", [(2, 5, 9), (3, 10, 40), (5, 7, 12), (10, 3, 11)])
def test_variance_closed_form_solves_the_corrected_appendix_recursion(d, k, u):
    assert variance_removed(d, k, u) == pytest.approx(float(variance_by_recursion(d, k, u)), rel=1e-12)


@pytest.mark.parametrize(
    "d,k,u", [(2, 10, 12), (3, 10, 100), (5, 100, 300), (10, 50, 1000), (2, 1000, 5000)]
)
def test_closed_forms_equal_moments_of_the_distribution(d, k, u):
    dist = removed_distribution(d, k, u)
    mean, var, _ = moments(dist)
    assert math.fsum(dist) == pytest.approx(1.0, abs=1e-12)
    assert min(dist) >= 0.0
    assert expected_removed(d, k, u) == pytest.approx(mean, rel=1e-12)
    assert variance_removed(d, k, u) == pytest.approx(var, rel=1e-9)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(d=st.integers(1, 5), k=st.integers(1, 8), u=st.integers(1, 30))
def test_property_distribution_moments_match_closed_forms(d, k, u):
    dist = removed_distribution(d, k, u)
    assert len(dist) == min(u, d * k) + 1
    assert math.fsum(dist) == pytest.approx(1.0, abs=1e-12)
    # The first replica alone removes min(d, u); nothing can remove more than u.
    assert all(p == 0.0 for p in dist[: min(d, u)])
    mean, var, _ = moments(dist)
    assert expected_removed(d, k, u) == pytest.approx(mean, rel=1e-12, abs=1e-12)
    assert variance_removed(d, k, u) == pytest.approx(var, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("d,k,u,trials", [(3, 10, 20, 4000), (5, 20, 100, 3000), (2, 50, 60, 2000)])
def test_monte_carlo_urn_agrees_with_closed_forms(d, k, u, trials):
    mean, var, fourth = moments(removed_distribution(d, k, u))
    sample_mean, sample_var = monte_carlo_removed(d, k, u, trials, random.Random(20240601))
    # Standard errors of the sample mean and of the unbiased sample variance
    # (the latter needs the fourth central moment, which the exact pmf gives).
    se_mean = math.sqrt(var / trials)
    se_var = math.sqrt(fourth / trials - var**2 * (trials - 3) / (trials * (trials - 1)))
    assert abs(sample_mean - expected_removed(d, k, u)) <= SIGMAS * se_mean
    assert abs(sample_var - variance_removed(d, k, u)) <= SIGMAS * se_var


# --------------------------------------------------------------------------
# edge cases and limits
# --------------------------------------------------------------------------

@pytest.mark.parametrize("d,k,u", [(5, 10, 3), (5, 10, 5), (2, 1, 2), (10, 100, 1)])
def test_urn_no_larger_than_d_is_emptied_by_the_first_replica(d, k, u):
    assert expected_removed(d, k, u) == u
    assert variance_removed(d, k, u) == 0.0
    dist = removed_distribution(d, k, u)
    assert dist[u] == 1.0 and math.fsum(dist) == 1.0
    assert expected_next_width(d, k, u) == k


@pytest.mark.parametrize("d,u", [(2, 10), (5, 5), (5, 3), (10, 1000)])
def test_single_replica_removes_exactly_min_d_u(d, u):
    assert expected_removed(d, 1, u) == min(d, u)
    assert variance_removed(d, 1, u) == 0.0
    dist = removed_distribution(d, 1, u)
    assert dist[min(d, u)] == 1.0


def exact_mean_removed(d: int, k: int, u: int) -> Fraction:
    """Theorem 4a as printed, d (1 - p^k) / (1 - p) with p = 1 - d/u, in exact arithmetic
    (u <= d: the first replica takes the whole urn)."""
    if u <= d:
        return Fraction(u)
    p = Fraction(u - d, u)
    return d * (1 - p**k) / (1 - p)


def test_closed_form_is_continuous_across_u_equals_d():
    d, k = 5, 20
    # At u = d the first replica empties the urn: E(U_{n+1}) = d + k - d = k exactly.
    # Both sides must approach that value, not merely each other.
    for u in (d - 1e-9, float(d), d + 1e-9):
        assert expected_next_width(d, k, u) == pytest.approx(k, abs=1e-6)
    # One ball more: E(R) = 6 (1 - (1/6)^20), from the exact urn (2 replicas: enumeration).
    assert expected_next_width(d, k, d + 1) == pytest.approx(float(d + 1 + k - exact_mean_removed(d, k, d + 1)))
    assert expected_removed(2, 2, 3) == float(sum(j * p for j, p in enumerate(enumerate_urn(2, 2, 3))))


@pytest.mark.parametrize("d,u", [(2, 50), (5, 200)])
def test_expected_removed_grows_with_k_towards_u(d, u):
    # Theorem 4a: in the long run every red ball shows up, E(R) -> u.
    values = [expected_removed(d, k, u) for k in (1, 2, 5, 10, 100, 1000, 100_000)]
    assert values == sorted(values)
    assert all(v <= min(u, d * k) for v, k in zip(values, (1, 2, 5, 10, 100, 1000, 100_000)))
    assert values[-1] == pytest.approx(u, rel=1e-9)


def test_expected_removed_grows_with_u_towards_dk():
    d, k = 3, 10
    values = [expected_removed(d, k, u) for u in (1, 3, 10, 30, 100, 10**4, 10**8)]
    assert values == sorted(values)
    assert values[-1] == pytest.approx(d * k, rel=1e-6)  # overlap-free picks


def test_real_width_interpolation_is_exact_at_integers():
    # Reference: the paper's form of Theorem 4a in exact fractions, and for the
    # small urn the mean of the exact distribution (a third route, the recursion).
    for u in (1, 3, 7, 30, 301):
        exact = u + 10 - exact_mean_removed(3, 10, u)
        assert expected_next_width(3, 10, float(u)) == pytest.approx(float(exact), rel=1e-13)
    mean, _, _ = moments(removed_distribution(3, 10, 7))
    assert expected_next_width(3, 10, 7.0) == pytest.approx(7 + 10 - mean, rel=1e-12)


@pytest.mark.parametrize(
    "call",
    [
        lambda: expected_removed(0, 3, 10),
        lambda: expected_removed(2, 0, 10),
        lambda: expected_removed(2, 3, 0),  # a MEG has at least one extremity
        lambda: variance_removed(2, 3, -1),
        lambda: removed_distribution(2, 3, MAX_DISTRIBUTION_WIDTH + 1),
        lambda: removed_distribution(10, 10**6, MAX_DISTRIBUTION_WIDTH),
        lambda: expected_next_width(2, 3, 0.5),
        lambda: expected_next_width(2, 3, math.nan),
        lambda: rounds_to_convergence(1, 10),  # d = 1 never shrinks the width
        lambda: fixed_point_width(1, 10),
        lambda: simulate_urn(2, 10, 0, 5, random.Random(1)),
        lambda: monte_carlo_removed(2, 10, 20, 1, random.Random(1)),
    ],
)
def test_out_of_range_arguments_raise_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_wrong_types_raise_type_error():
    with pytest.raises(TypeError):
        expected_removed(2, 3, 10.0)
    with pytest.raises(TypeError):
        simulate_urn(2, 3, 10, 5, rng=1)


def test_rounds_to_convergence_reports_exhausted_budget():
    with pytest.raises(RuntimeError):
        rounds_to_convergence(2, 10, max_rounds=5)


# --------------------------------------------------------------------------
# section VIII-B: convergence near k, diminishing returns in d
# --------------------------------------------------------------------------

@pytest.mark.parametrize("k", [10, 100])
def test_rounds_fall_with_d_with_diminishing_returns(k):
    rounds = {d: rounds_to_convergence(d, k) for d in range(2, 11)}
    assert all(rounds[d] > rounds[d + 1] for d in range(2, 10))
    # "the highest gain ... is between d = 2 and d = 3, while there is much
    # less difference between d = 6 and d = 10"
    assert rounds[2] - rounds[3] > rounds[6] - rounds[10]
    for d, n in rounds.items():
        # Far from the fixed point a round removes at most k d and adds k, so
        # covering ~99 k of width takes at least ~99 / (d - 1) rounds; the paper
        # calls the count nearly proportional to 1 / (d - 1).
        assert 95 <= n * (d - 1) <= 150


def test_rounds_count_is_zero_at_the_fixed_point_and_counts_growth_from_below():
    d, k = 3, 100
    fixed = round(fixed_point_width(d, k))
    assert rounds_to_convergence(d, k, fixed) == 0
    assert rounds_to_convergence(d, k, 1) > 0  # 1 -> ~k: the width grows


@pytest.mark.parametrize("k", [10, 100, 1000])
@pytest.mark.parametrize("d", [2, 3, 5, 10])
def test_fixed_point_is_near_but_above_k(d, k):
    fixed = fixed_point_width(d, k)
    assert expected_next_width(d, k, fixed) == pytest.approx(fixed, rel=1e-9)
    if k <= d:
        assert fixed == k  # one replica takes the whole urn every round
        return
    # "the fixed point is near the number of replicas k"; for large k, u*/k
    # tends to the root a of a (1 - exp(-d/a)) = 1, which is 1.255 for d = 2.
    assert k < fixed < 1.26 * k
    assert expected_next_width(d, k, 0.9 * fixed) > 0.9 * fixed  # grows below
    assert expected_next_width(d, k, 1.1 * fixed) < 1.1 * fixed  # shrinks above


# u* where E(R_{d,k}(u*)) = k, from the mean-value iteration run to convergence in
# 40-digit decimal arithmetic (independent of fixed_point_width's bisection).
INDEPENDENT_FIXED_POINTS = {
    (2, 5): 5.625420134694711,
    (2, 10): 11.88052840141130,
    (3, 10): 10.33514973413634,
    (3, 20): 20.95291707162026,
    (5, 100): 100.6151728543840,
    (2, 1000): 1254.316540499172,
}


def fixed_point_by_iteration(d: int, k: int) -> float:
    """E(U_{n+1}) = U_n + k - E(R_{d,k}(U_n)) iterated from 100 k, written out here."""
    u = 100.0 * k
    for _ in range(10_000):
        following = u + k - u * (1.0 - (1.0 - d / u) ** k)
        if abs(following - u) <= 1e-13 * u:
            return following
        u = following
    raise AssertionError(f"no convergence for d={d}, k={k}")


@pytest.mark.parametrize("d,k", sorted(INDEPENDENT_FIXED_POINTS))
def test_fixed_point_equals_the_independently_iterated_one(d, k):
    reference = INDEPENDENT_FIXED_POINTS[(d, k)]
    assert fixed_point_by_iteration(d, k) == pytest.approx(reference, rel=1e-11)
    assert fixed_point_width(d, k) == pytest.approx(reference, rel=1e-10)


def test_fixed_point_moves_towards_k_as_d_grows():
    ratios = [fixed_point_width(d, 100) / 100 for d in range(2, 11)]
    assert ratios == sorted(ratios, reverse=True)


def test_mean_value_iteration_converges_to_the_fixed_point():
    d, k = 3, 100
    u = float(100 * k)
    for _ in range(500):
        u = expected_next_width(d, k, u)
    assert u == pytest.approx(fixed_point_width(d, k), rel=1e-9)


def test_simulate_urn_is_reproducible_and_steps_stay_in_range():
    d, k, u0 = 3, 10, 200
    path = simulate_urn(d, k, u0, 60, random.Random(7))
    assert path == simulate_urn(d, k, u0, 60, random.Random(7))
    assert len(path) == 61 and path[0] == u0
    for before, after in zip(path, path[1:]):
        # Section VIII-C: one round changes the width by k - R, R in [min(d,u), min(u, k d)].
        assert k - min(before, k * d) <= after - before <= k - min(d, before)
        assert after >= 1


@pytest.mark.parametrize("d,k", [(3, 10), (5, 100), (2, 20)])
def test_simulated_width_settles_near_the_fixed_point(d, k):
    burn_in = rounds_to_convergence(d, k) + 10
    batches, batch_len = 10, 40
    path = simulate_urn(d, k, 100 * k, burn_in + batches * batch_len, random.Random(1000 + d * k))
    tail = path[burn_in + 1:]
    # Successive widths are correlated; batch means give an honest standard error.
    means = [statistics.fmean(tail[i * batch_len:(i + 1) * batch_len]) for i in range(batches)]
    se = statistics.stdev(means) / math.sqrt(batches)
    fixed = fixed_point_width(d, k)
    assert abs(statistics.fmean(tail) - fixed) <= SIGMAS * se + JENSEN_ALLOWANCE * fixed


# --------------------------------------------------------------------------
# figures
# --------------------------------------------------------------------------

def test_figure_rows_tables_and_plots(tmp_path):
    rows4 = figure4_rows(ks=(10, 50), ds=(5,), us=range(1, 201, 20))
    assert all(isinstance(row, Figure4Row) for row in rows4) and len(rows4) == 20
    for row in rows4:
        assert row.expected_change == pytest.approx(row.expected_next - row.u)
        assert row.std_next == pytest.approx(math.sqrt(variance_removed(row.d, row.k, row.u)))
    rows5 = figure5_rows(ks=(10,), ds=(2, 5))
    assert rows5 == [
        Figure5Row(d, 10, 1000, rounds_to_convergence(d, 10), fixed_point_width(d, 10),
                   fixed_point_width(d, 10) / 10)
        for d in (2, 5)
    ]
    table = format_table(rows5).splitlines()
    assert table[0].split() == ["d", "k", "u0", "rounds", "fixed_point", "fixed_point_over_k"]
    assert len(table) == 2 + len(rows5)
    for plot, rows, name in ((plot_figure4, rows4, "f4.png"), (plot_figure5, rows5, "f5.png")):
        written = plot(rows, tmp_path / name)
        assert written.read_bytes().startswith(b"\x89PNG")


def test_figure4_closed_form_agrees_with_the_simulated_urn():
    rows = figure4_monte_carlo_rows()
    assert len(rows) >= 12 and all(row.trials == FIGURE4_MC_TRIALS for row in rows)
    assert rows == figure4_monte_carlo_rows()  # seeded: the table is reproducible
    for row in rows:
        assert row.expected_next == expected_next_width(row.d, row.k, row.u)  # the plotted value
        # Every sampled point is a random one (else a zero standard error proves nothing).
        assert row.mc_se > 0
        assert abs(row.mc_next - row.expected_next) <= SIGMAS * row.mc_se, row
    # The standard error itself is honest: near the exact sqrt(V(R) / trials).
    for row in rows:
        exact_se = math.sqrt(variance_removed(row.d, row.k, row.u) / row.trials)
        assert row.mc_se == pytest.approx(exact_se, rel=0.35), row


def test_figure4_monte_carlo_would_catch_a_wrong_curve():
    # The check has teeth: an E(R) off by 2% (one paper misprint's worth) lies
    # outside the tolerance at most sampled points.
    rows = figure4_monte_carlo_rows()
    off = [row for row in rows
           if abs(row.mc_next - (row.u + row.k - 1.02 * (row.u + row.k - row.expected_next))) > SIGMAS * row.mc_se]
    assert len(off) >= len(rows) // 2


def test_cli_writes_both_pngs_and_prints_both_tables(tmp_path, capsys):
    assert main([str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "figure4.png").stat().st_size > 0
    assert (tmp_path / "out" / "figure5.png").stat().st_size > 0
    captured = capsys.readouterr()
    assert "Figure 4" in captured.out and "Figure 5" in captured.out
    assert "Figure 4 check: the urn simulated" in captured.out and "mc_next" in captured.out
    assert "wrote" in captured.err and "wrote" not in captured.out
