"""Dissemination: how fast events reach nodes, which never arrive, and how many
copies arrive in vain.

Latency of an event at a node = its first `delivered` time there minus its
`created` time at the author (see `jobs.events` for the exact definitions);
the author itself is not a sample. Summaries are overall, per node and per
channel (gossip = the fast path, sync = anti-entropy / backfill, relay).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from node import logschema as ls
from analytics.jobs import events, stats

LATENCY_GROUPINGS = {"overall": (), "node": ("node",), "channel": ("channel",)}


def latencies(data: events.Records) -> DataFrame:
    """One row per (event, node other than the author) that delivered it.

    Columns: topic, event, origin_node, created_ms, node, channel, delivered_ms, latency_ms.
    """
    return events.remote_deliveries(data)


def latency_summary(latency_rows: DataFrame, by: tuple[str, ...] = ()) -> DataFrame:
    """Columns: *by, deliveries, mean_ms, p50_ms, p90_ms, p99_ms, max_ms."""
    return stats.summarize(latency_rows, "latency_ms", by, count_name="deliveries", unit="_ms")


def overall_latency(latency_rows: DataFrame) -> stats.Summary:
    return stats.summary_of(latency_rows, "latency_ms")


def never_delivered(data: events.Records, members: DataFrame | None = None) -> DataFrame:
    """(event, member) pairs where the member never delivered the event.

    Columns: topic, event, origin_node, node. The author is never listed for its
    own event. `members` (topic, node) defaults to every node that logged for the topic.
    """
    b = events.as_basis(data, members)
    expected = events.known_events(b).join(b.members, "topic")
    delivered = b.deliveries.select("topic", "event", "node")
    return (
        expected.join(delivered, ["topic", "event", "node"], "left_anti")
        .where(F.col("origin_node").isNull() | (F.col("node") != F.col("origin_node")))
        .select("topic", "event", "origin_node", "node")
        .orderBy("topic", "event", "node")
    )


def duplicates_per_event(data: events.Records) -> DataFrame:
    """Columns: topic, event, deliveries, duplicates, duplicates_per_delivery.

    deliveries = nodes other than the author that delivered the event;
    duplicates = `duplicate` records for it at any node (copies that arrived
    after delivery). duplicates_per_delivery is null when nothing was delivered.
    """
    b = events.as_basis(data)
    known = events.known_events(b)
    delivered = events.remote_first_deliveries(b).groupBy("topic", "event").agg(F.count("*").alias("deliveries"))
    copies = (
        b.records.where(F.col("type") == ls.DUPLICATE)
        .groupBy("topic", "event")
        .agg(F.count("*").alias("duplicates"))
    )
    per_event = (
        known.select("topic", "event")
        .join(delivered, ["topic", "event"], "left")
        .join(copies, ["topic", "event"], "left")
        .fillna(0, ["deliveries", "duplicates"])
    )
    ratio = F.when(F.col("deliveries") > 0, F.col("duplicates") / F.col("deliveries"))
    return per_event.withColumn("duplicates_per_delivery", ratio).orderBy("topic", "event")


@dataclass(frozen=True)
class DuplicateTotals:
    events: int
    deliveries: int
    duplicates: int
    duplicates_per_delivery: float | None
    max_per_event: int


def duplicate_totals(per_event: DataFrame) -> DuplicateTotals:
    row = per_event.agg(
        F.count("*").alias("events"),
        F.sum("deliveries").alias("deliveries"),
        F.sum("duplicates").alias("duplicates"),
        F.max("duplicates").alias("max_per_event"),
    ).collect()[0]
    deliveries, duplicates = row["deliveries"] or 0, row["duplicates"] or 0
    return DuplicateTotals(
        events=row["events"],
        deliveries=deliveries,
        duplicates=duplicates,
        duplicates_per_delivery=duplicates / deliveries if deliveries else None,
        max_per_event=row["max_per_event"] or 0,
    )


def duplicates_by_channel(data: events.Records) -> DataFrame:
    """Columns: channel, duplicates — where the useless copies came from."""
    return (
        events.records_of(data)
        .where(F.col("type") == ls.DUPLICATE)
        .groupBy("channel")
        .agg(F.count("*").alias("duplicates"))
        .orderBy("channel")
    )
