"""Figures 4 and 5 of the MEG paper (section VIII), recomputed from `analytics.model`.

What: the data behind both figures as rows of frozen dataclasses, a plain-text
table for the terminal, and PNG plots. ``python -m analytics.figures OUTDIR``
writes ``figure4.png`` and ``figure5.png`` and prints both tables.

* Figure 4 plots ``E(U_{n+1})`` against realisations of ``U_n`` (not the
  change), for ``d = 5`` and several ``k``, with the diagonal
  ``U_{n+1} = U_n`` dashed; crossings are the fixed points. The band is the
  standard deviation of ``U_{n+1}`` given ``U_n`` (that is, of ``R``) magnified
  five times, as in the paper. Rows also carry the expected change.
* Figure 5 plots the rounds of the mean-value iteration until the expected
  width moves by less than one, from ``u_0 = 100 k``, against ``d``.
* A Monte-Carlo check of Figure 4: at a few sampled points the urn itself is
  drawn (`analytics.model.monte_carlo_removed`, seeded) and the mean next
  width set beside the closed form, with its standard error, so the table
  shows the curve is what the urn does, not only what the formula says.

Why: to check our model against the paper's curves, and to pick megnode's
parent cap ``d`` for an expected replica count ``k``.

Plots draw on an explicit Agg canvas rather than pyplot, so importing this
module never changes the process-wide matplotlib backend.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass, fields, is_dataclass
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analytics.model import (
    expected_next_width,
    fixed_point_width,
    monte_carlo_removed,
    rounds_to_convergence,
    variance_removed,
)

FIGURE4_DS = (5,)
FIGURE4_KS = (10, 20, 50, 100)
FIGURE4_US = tuple(range(1, 601))
"""Dense grid for the plot: wide enough to show the linear regime for k = 100."""
FIGURE4_TABLE_US = (1, 5, 10, 20, 50, 100, 200, 300, 400, 500, 600)
"""The printed table samples the plot's grid; a 2400-row table helps no one."""
FIGURE4_MC_US = (100, 300, 600)
"""Widths where Figure 4 is checked by simulating the urn, near and far above the
fixed points of the plotted k. Not below ~k: there the urn is almost surely
emptied each round, so a few hundred rounds all look alike and say nothing."""
FIGURE4_MC_TRIALS = 200
"""Rounds drawn per point: ~0.3 s for all of them; the standard error is in the table."""
FIGURE4_MC_SEED = 4
FIGURE5_KS = (10, 100, 1000)
FIGURE5_DS = tuple(range(2, 11))

STD_MAGNIFICATION = 5
"""The paper magnifies the plotted standard deviation by 5 for visibility."""
FLOAT_DIGITS = 6
"""Significant digits of floats in `format_table`."""
DPI = 120


@dataclass(frozen=True)
class Figure4Row:
    """Expected next width at one realised width ``U_n = u``."""

    d: int
    k: int
    u: int
    expected_next: float
    """E(U_{n+1} | U_n = u)."""
    std_next: float
    """Standard deviation of U_{n+1} given U_n = u, i.e. sqrt(V(R_{d,k}(u)))."""
    expected_change: float
    """E(U_{n+1}) - u: negative means the width is expected to shrink."""


@dataclass(frozen=True)
class Figure4MonteCarloRow:
    """Closed form and simulated urn side by side at one Figure 4 point."""

    d: int
    k: int
    u: int
    expected_next: float
    """E(U_{n+1} | U_n = u), the closed form (Theorem 4a)."""
    mc_next: float
    """Mean of u + k - R over `trials` simulated rounds of the urn."""
    mc_se: float
    """Standard error of `mc_next`: sample standard deviation / sqrt(trials)."""
    trials: int


@dataclass(frozen=True)
class Figure5Row:
    """Rounds to convergence of the mean-value iteration for one (d, k)."""

    d: int
    k: int
    u0: int
    rounds: int
    fixed_point: float
    """Where the expected change is zero (`fixed_point_width`)."""
    fixed_point_over_k: float


def figure4_rows(
    ks: Iterable[int] = FIGURE4_KS, ds: Iterable[int] = FIGURE4_DS, us: Iterable[int] = FIGURE4_US
) -> list[Figure4Row]:
    """Figure 4's curves: one row per (d, k, u), ordered by d, then k, then u."""
    us = tuple(us)
    rows = []
    for d in ds:
        for k in ks:
            for u in us:
                expected = expected_next_width(d, k, u)
                rows.append(Figure4Row(
                    d=d, k=k, u=u, expected_next=expected,
                    std_next=math.sqrt(variance_removed(d, k, u)),
                    expected_change=expected - u,
                ))
    return rows


def figure4_monte_carlo_rows(
    ks: Iterable[int] = FIGURE4_KS,
    ds: Iterable[int] = FIGURE4_DS,
    us: Iterable[int] = FIGURE4_MC_US,
    trials: int = FIGURE4_MC_TRIALS,
    seed: int = FIGURE4_MC_SEED,
) -> list[Figure4MonteCarloRow]:
    """The urn simulated at sampled Figure 4 points, one row per (d, k, u), one seeded rng."""
    rng = random.Random(seed)
    us = tuple(us)
    rows = []
    for d in ds:
        for k in ks:
            for u in us:
                mean_removed, var_removed = monte_carlo_removed(d, k, u, trials, rng)
                rows.append(Figure4MonteCarloRow(
                    d=d, k=k, u=u, expected_next=expected_next_width(d, k, u),
                    mc_next=u + k - mean_removed, mc_se=math.sqrt(var_removed / trials), trials=trials,
                ))
    return rows


def figure5_rows(ks: Iterable[int] = FIGURE5_KS, ds: Iterable[int] = FIGURE5_DS) -> list[Figure5Row]:
    """Figure 5's bars: one row per (k, d), starting each iteration at 100 k."""
    ds = tuple(ds)
    rows = []
    for k in ks:
        for d in ds:
            fixed = fixed_point_width(d, k)
            rows.append(Figure5Row(
                d=d, k=k, u0=100 * k, rounds=rounds_to_convergence(d, k, 100 * k),
                fixed_point=fixed, fixed_point_over_k=fixed / k,
            ))
    return rows


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.{FLOAT_DIGITS}g}"
    return str(value)


def format_table(rows: Sequence[object]) -> str:
    """Right-aligned text table of dataclass rows, header from the field names."""
    if not rows:
        return "(no rows)"
    first = rows[0]
    if not is_dataclass(first):
        raise TypeError("format_table expects dataclass rows")
    header = [f.name for f in fields(first)]
    body = [[_cell(value) for value in astuple(row)] for row in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in [header, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _new_figure(ncols: int) -> Figure:
    figure = Figure(figsize=(6.4 * ncols, 4.8), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)  # attaches itself to the figure; no pyplot, no global backend
    return figure


def plot_figure4(rows: Sequence[Figure4Row], path: str | Path) -> Path:
    """E(U_{n+1}) vs U_n, one panel per d, one curve per k, band = ±5 std."""
    ds = sorted({row.d for row in rows})
    if not ds:
        raise ValueError("plot_figure4 needs at least one row")
    figure = _new_figure(len(ds))
    for index, d in enumerate(ds, start=1):
        axes = figure.add_subplot(1, len(ds), index)
        panel = [row for row in rows if row.d == d]
        for k in sorted({row.k for row in panel}):
            curve = sorted((row for row in panel if row.k == k), key=lambda row: row.u)
            us = [row.u for row in curve]
            mean = [row.expected_next for row in curve]
            spread = [STD_MAGNIFICATION * row.std_next for row in curve]
            (line,) = axes.plot(us, mean, label=f"k = {k}")
            axes.fill_between(us, [m - s for m, s in zip(mean, spread)],
                              [m + s for m, s in zip(mean, spread)],
                              color=line.get_color(), alpha=0.25, linewidth=0)
            if d >= 2:
                fixed = fixed_point_width(d, k)
                axes.plot([fixed], [fixed], "o", color=line.get_color(), markersize=4)
        low = min(row.u for row in panel)
        high = max(row.u for row in panel)
        axes.plot([low, high], [low, high], "--", color="black", linewidth=1,
                  label="$U_{n+1} = U_n$")
        axes.set_xlabel("$U_n$ (forward extremities before the round)")
        axes.set_ylabel("$E(U_{n+1})$")
        axes.set_title(f"d = {d}, band = ±{STD_MAGNIFICATION} std")
        axes.legend(loc="upper left")
        axes.grid(alpha=0.3)
    return _save(figure, path)


def plot_figure5(rows: Sequence[Figure5Row], path: str | Path) -> Path:
    """Rounds until convergence vs d, one line per k."""
    if not rows:
        raise ValueError("plot_figure5 needs at least one row")
    figure = _new_figure(1)
    axes = figure.add_subplot(1, 1, 1)
    for k in sorted({row.k for row in rows}):
        series = sorted((row for row in rows if row.k == k), key=lambda row: row.d)
        axes.plot([row.d for row in series], [row.rounds for row in series], "o-",
                  label=f"k = {k}")
    axes.set_xlabel("d (parents per event)")
    axes.set_ylabel("rounds until $|E(U_n) - E(U_{n+1})| < 1$")
    axes.set_title("Expected rounds to convergence from $u_0 = 100k$")
    axes.legend()
    axes.grid(alpha=0.3)
    return _save(figure, path)


def _save(figure: Figure, path: str | Path) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, format="png")
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analytics.figures",
        description="Recompute Figures 4 and 5 of the MEG paper (section VIII).",
    )
    parser.add_argument("outdir", type=Path, help="directory for figure4.png and figure5.png")
    args = parser.parse_args(argv)

    print("computing figure 4 ...", file=sys.stderr)
    rows4 = figure4_rows()
    path4 = plot_figure4(rows4, args.outdir / "figure4.png")
    print(f"wrote {path4}", file=sys.stderr)

    print("computing figure 5 ...", file=sys.stderr)
    rows5 = figure5_rows()
    path5 = plot_figure5(rows5, args.outdir / "figure5.png")
    print(f"wrote {path5}", file=sys.stderr)

    table_us = set(FIGURE4_TABLE_US)
    print("Figure 4: expected next width E(U_{n+1}) for realised U_n = u")
    print(format_table([row for row in rows4 if row.u in table_us]))
    print()
    print(f"Figure 4 check: the urn simulated ({FIGURE4_MC_TRIALS} rounds per point, seed {FIGURE4_MC_SEED})")
    print(format_table(figure4_monte_carlo_rows()))
    print()
    print("Figure 5: rounds until the expected width moves by < 1, from u0 = 100 k")
    print(format_table(rows5))
    return 0


if __name__ == "__main__":
    sys.exit(main())
