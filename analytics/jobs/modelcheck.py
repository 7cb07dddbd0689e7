"""Hold the measured width against the paper's model (section VIII).

The model (`analytics.model`) predicts that k replicas, each adding one event
with d random parents per round, keep the width near `fixed_point_width(d, k)`.
Here the measured width of a run is compared with that number: the mean over
all samples, and the mean over each series' steady window (the last
`STEADY_FRACTION` of its time span, as in `jobs.convergence`), which leaves the
warm-up and disturbances out. The model is a worst case (every replica writes
every round, concurrently), and a node samples its width between rounds too,
so a ratio near 1 is agreement, not a coincidence to demand exactly.

k is the run's number of writing replicas; when not given it is inferred per
topic by `writer_counts`: the nodes that authored at least one event of a
writing kind (`WRITE_KINDS`). Nodes log a `created` record for everything they
make, and most of it is not writing in the model's sense: the topic's create
event and bootstrap state, joins (`m.room.member`), indexer acks (`ack`),
extremity-depletion dummies (`dummy`), and events a relay node takes in for
a relayed device (logged as `created` by the relay, with the device as
`author`). Counting them would make every member that joined a "writer". d
must be given: the logs do not record parent counts.

It also reproduces the paper's Figures 4 and 5 (tables and PNGs) through
`analytics.figures`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

from node import logschema as ls
from analytics.jobs.convergence import STEADY_FRACTION, steady_samples
from analytics.jobs.events import Records, records_of
from analytics.jobs.width import width_samples

WRITE_KINDS = ("message",)
"""Event kinds that count as writing (node.core.event.KIND_MESSAGE, the kind
`Topic.publish` uses by default); applications that publish other kinds can
pass theirs to `writer_counts`."""


class ModelUnavailable(RuntimeError):
    """analytics.model / analytics.figures cannot be imported (not built yet, or broken)."""


def _import(name: str) -> Any:
    try:
        return __import__(f"analytics.{name}", fromlist=["_"])
    except ImportError as error:
        raise ModelUnavailable(f"analytics.{name} is not available: {error}") from error


@dataclass(frozen=True)
class ModelCheck:
    """Measured vs predicted width for one topic."""

    topic: str
    k: int
    d: int
    samples: int
    measured_mean: float
    steady_mean: float
    predicted: float  # fixed_point_width(d, k)
    steady_over_predicted: float


def writer_counts(data: Records, write_kinds: tuple[str, ...] = WRITE_KINDS) -> dict[str, int]:
    """Topic -> distinct nodes that authored events of `write_kinds` in it (the run's k).

    A `created` record counts when its `kind` is one of `write_kinds` and its
    `author` is the logging node (or absent): the relay node's record of a
    relayed device's event names the device as author. A record without
    `kind` (the schema keeps it optional) counts unless a `dummy` record names
    the same event, the one non-writing creation the logs then still reveal;
    joins and acks logged without a kind cannot be told from writes.
    """
    records = records_of(data)
    created = records.where(F.col("type") == ls.CREATED).where(
        F.col("author").isNull() | (F.col("author") == F.col("node"))
    )
    writes = created.where(F.col("kind").isin(*write_kinds))
    unknown = created.where(F.col("kind").isNull()).join(
        records.where(F.col("type") == ls.DUMMY).select("topic", "event"), ["topic", "event"], "left_anti"
    )
    rows = (
        writes.select("topic", "node")
        .unionByName(unknown.select("topic", "node"))
        .groupBy("topic")
        .agg(F.countDistinct("node").alias("k"))
        .collect()
    )
    return {row["topic"]: row["k"] for row in rows}


def model_check(
    data: Records, *, d: int, k: int | None = None, steady_fraction: float = STEADY_FRACTION
) -> tuple[ModelCheck, ...]:
    """One comparison per topic that has width samples (and, if k is inferred, writers)."""
    fixed_point_width = _import("model").fixed_point_width
    samples = width_samples(data)
    overall = samples.groupBy("topic").agg(F.count("*").alias("samples"), F.avg("width").alias("mean"))
    steady = steady_samples(samples, steady_fraction).groupBy("topic").agg(F.avg("width").alias("steady"))
    rows = overall.join(steady, "topic").orderBy("topic").collect()
    writers = writer_counts(data) if k is None else {}
    checks = []
    for row in rows:
        run_k = k if k is not None else writers.get(row["topic"], 0)
        if run_k < 1:
            continue  # no writers, nothing to model
        predicted = fixed_point_width(d, run_k)
        checks.append(
            ModelCheck(
                topic=row["topic"], k=run_k, d=d, samples=row["samples"],
                measured_mean=row["mean"], steady_mean=row["steady"], predicted=predicted,
                steady_over_predicted=row["steady"] / predicted,
            )
        )
    return tuple(checks)


@dataclass(frozen=True)
class PaperFigures:
    figure4_table: str
    figure5_table: str
    figure4_png: Path
    figure5_png: Path
    figure4_monte_carlo_table: str = ""  # the urn simulated at a few Figure 4 points


def paper_figures(outdir: str | Path) -> PaperFigures:
    """Figures 4 and 5 of the paper as text tables and PNGs in `outdir`."""
    figures = _import("figures")
    rows4 = figures.figure4_rows()
    rows5 = figures.figure5_rows()
    # The plot's grid is too dense for a table; print the sample the figures module picks.
    table_us = set(getattr(figures, "FIGURE4_TABLE_US", (row.u for row in rows4)))
    monte_carlo = getattr(figures, "figure4_monte_carlo_rows", None)
    return PaperFigures(
        figure4_table=figures.format_table([row for row in rows4 if row.u in table_us]),
        figure5_table=figures.format_table(rows5),
        figure4_png=Path(figures.plot_figure4(rows4, Path(outdir) / "figure4.png")),
        figure5_png=Path(figures.plot_figure5(rows5, Path(outdir) / "figure5.png")),
        figure4_monte_carlo_table=figures.format_table(monte_carlo()) if monte_carlo else "",
    )
