"""Width of the MEG as the nodes saw it: the forward-extremity samples over time,
their distribution, and the dummy events issued to deplete extremities.

Width samples are the `width` records each node logs periodically (`width` =
number of forward extremities, `buffered` = events waiting for parents). A
sample describes the node's own replica, so nodes of one topic may disagree
while events are in flight.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from node import logschema as ls
from analytics.jobs import events, stats


def width_samples(data: events.Records) -> DataFrame:
    """Columns: topic, node, ts_ms, width, buffered (unordered: for further aggregation)."""
    widths = events.records_of(data).where(F.col("type") == ls.WIDTH)
    return widths.select("topic", "node", "ts_ms", "width", "buffered")


def width_series(data: events.Records) -> DataFrame:
    """The samples ordered by topic, node, time: one series per node and topic."""
    return width_samples(data).orderBy("topic", "node", "ts_ms")


def width_summary(data: events.Records, by: tuple[str, ...] = ("topic",)) -> DataFrame:
    """Columns: *by, samples, mean, p50, p90, p99, max of the width samples."""
    return stats.summarize(width_samples(data), "width", by, count_name="samples")


def width_histogram(data: events.Records, by: tuple[str, ...] = ("topic",)) -> DataFrame:
    """Columns: *by, width, samples — how many samples saw each width."""
    return (
        width_samples(data)
        .groupBy(*by, "width")
        .agg(F.count("*").alias("samples"))
        .orderBy(*by, "width")
    )


def dummy_counts(data: events.Records, members: DataFrame | None = None) -> DataFrame:
    """Columns: topic, node, dummies — every member, zero when it issued none."""
    b = events.as_basis(data, members)
    dummies = b.records.where(F.col("type") == ls.DUMMY)
    issued = dummies.groupBy("topic", "node").agg(F.count("*").alias("dummies"))
    return (
        b.members
        .join(issued, ["topic", "node"], "left")
        .fillna(0, ["dummies"])
        .orderBy("topic", "node")
    )
