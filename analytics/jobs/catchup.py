"""Catch-up episodes: bursts of anti-entropy deliveries after a node fell behind.

Definition. Take one node's first deliveries (see `jobs.events`) of one topic
whose channel is `sync`, ordered by (delivered_ms, event). Split them into
maximal runs in which each delivery follows the previous one by at most
`gap_ms`. A run of at least `min_events` deliveries is a catch-up episode.
Gossip deliveries in between do not split a run: a node often gets fresh events
by gossip while it backfills old ones.

Each episode reports its start/end, size, how stale the caught-up events were
(lag = delivered_ms - created_ms, max and mean, over events with a known
creation), and `quiet_before_ms`: the time since the node's previous delivery
of any channel on that topic (null if none) — after a partition this is long.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from node import logschema as ls
from analytics.jobs import events

CATCHUP_GAP_MS: Final = 1_000
CATCHUP_MIN_EVENTS: Final = 3


def catchup_episodes(
    data: events.Records, *, gap_ms: int = CATCHUP_GAP_MS, min_events: int = CATCHUP_MIN_EVENTS
) -> DataFrame:
    """Columns: topic, node, start_ms, end_ms, duration_ms, events, max_lag_ms, mean_lag_ms, quiet_before_ms."""
    if gap_ms < 0 or min_events < 1:
        raise ValueError("gap_ms must be >= 0 and min_events >= 1")
    series = Window.partitionBy("topic", "node").orderBy("delivered_ms", "event")
    b = events.as_basis(data)
    deliveries = (
        events.remote_first_deliveries(b)
        .join(b.origins.select("topic", "event", "created_ms"), ["topic", "event"], "left")
        .withColumn("prev_any_ms", F.lag("delivered_ms").over(series))
        .where(F.col("channel") == ls.SYNC)
        .withColumn("prev_sync_ms", F.lag("delivered_ms").over(series))
    )
    starts = F.col("prev_sync_ms").isNull() | (F.col("delivered_ms") - F.col("prev_sync_ms") > gap_ms)
    running = series.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    numbered = deliveries.withColumn("episode", F.sum(F.when(starts, 1).otherwise(0)).over(running))
    lag = F.col("delivered_ms") - F.col("created_ms")
    first = F.min(F.struct("delivered_ms", "event", "prev_any_ms"))
    return (
        numbered.groupBy("topic", "node", "episode")
        .agg(
            F.min("delivered_ms").alias("start_ms"),
            F.max("delivered_ms").alias("end_ms"),
            F.count("*").alias("events"),
            F.max(lag).alias("max_lag_ms"),
            F.avg(lag).alias("mean_lag_ms"),
            first.alias("_first"),
        )
        .where(F.col("events") >= min_events)
        .select(
            "topic", "node", "start_ms", "end_ms",
            (F.col("end_ms") - F.col("start_ms")).alias("duration_ms"),
            "events", "max_lag_ms", "mean_lag_ms",
            (F.col("start_ms") - F.col("_first.prev_any_ms")).alias("quiet_before_ms"),
        )
        .orderBy("topic", "node", "start_ms")
    )
