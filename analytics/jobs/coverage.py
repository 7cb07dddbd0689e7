"""Coverage over time: what fraction of a topic's members hold an event t ms after
its creation.

For one event e of topic T with members M(T):
    coverage_e(t) = |{n in M(T) : n had e by created_ms(e) + t}| / |M(T)|
where the author has it at t = 0 (definitions in `jobs.events`). The aggregate
curve is the mean over all created events, each event weighing the same:
    coverage(t) = (1/|E|) * sum_e coverage_e(t)
It is a step function; `coverage_curve` returns its value at every step
(offsets rounded up to `resolution_ms`, so the value at a returned t is exact).
An event some member never delivers keeps the curve below 1 forever.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from analytics.jobs import events

REACH_PERCENTS: Final = (50, 90, 100)  # per-event "time to reach" columns


def _member_holdings(b: events.Basis) -> tuple[DataFrame, DataFrame]:
    """(holdings of members only, member count per topic)."""
    held = events.holdings(b).join(b.members, ["topic", "node"])
    sizes = b.members.groupBy("topic").agg(F.count("*").alias("members"))
    return held, sizes


def coverage_curve(
    data: events.Records, members: DataFrame | None = None, *, resolution_ms: int = 1
) -> DataFrame:
    """Columns: t_ms, coverage — the aggregate curve at each of its steps, ascending."""
    if resolution_ms < 1:
        raise ValueError("resolution_ms must be >= 1")
    b = events.as_basis(data, members)
    held, sizes = _member_holdings(b)
    event_count = b.origins.count()
    if event_count == 0:
        return held.sparkSession.createDataFrame([], "t_ms long, coverage double")
    step = F.ceil(F.col("offset_ms") / resolution_ms) * resolution_ms
    weights = (
        held.join(sizes, "topic")
        .select(step.cast("long").alias("t_ms"), (1.0 / (F.col("members") * event_count)).alias("w"))
        .groupBy("t_ms")
        .agg(F.sum("w").alias("w"))
    )
    # One partition is fine here: one row per distinct offset, not per record.
    running = Window.orderBy("t_ms").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return weights.select("t_ms", F.sum("w").over(running).alias("coverage")).orderBy("t_ms")


def event_coverage(data: events.Records, members: DataFrame | None = None) -> DataFrame:
    """Per created event: members, holders, final coverage, and time to reach 50/90/100 %.

    Columns: topic, event, members, holders, coverage, t50_ms, t90_ms, t100_ms —
    t<p>_ms is the smallest offset by which at least ceil(p% of members) members
    held the event, null if that never happened.
    """
    held, sizes = _member_holdings(events.as_basis(data, members))
    rank = F.row_number().over(Window.partitionBy("topic", "event").orderBy("offset_ms", "node"))
    ranked = held.select("topic", "event", "offset_ms", rank.alias("rank")).join(sizes, "topic")
    reach = [
        # ceil(members * percent / 100) in integers: floats would make 0.9 * 10 a coin toss.
        F.min(F.when(F.col("rank") >= F.expr(f"(members * {percent} + 99) div 100"), F.col("offset_ms")))
        .alias(f"t{percent}_ms")
        for percent in REACH_PERCENTS
    ]
    return (
        ranked.groupBy("topic", "event", "members")
        .agg(F.count("*").alias("holders"), *reach)
        .withColumn("coverage", F.col("holders") / F.col("members"))
        .select("topic", "event", "members", "holders", "coverage", *[f"t{p}_ms" for p in REACH_PERCENTS])
        .orderBy("topic", "event")
    )
