"""Building blocks every dissemination analysis shares: who is in a topic, where
each event started, and when each node first had it.

Definitions (the analyses rely on them):
- Members of a topic: the nodes that logged any record for it, unless the
  caller passes the membership explicitly (DataFrame `topic, node`). Membership
  is not time-bounded: a node that joins late backfills the whole history.
- Origin of an event: its `created` record (the earliest, if a log holds
  several). `created_ms` is the author's clock at creation.
- A node's delivery of an event: its earliest `delivered` record; its channel
  is that record's channel. The author's `created` record counts as the
  author's own delivery at offset 0; a `delivered` record the author may log
  for its own event is ignored.
- An event exists for these analyses once some node created or delivered it;
  events that were only received, buffered or rejected are not counted.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analytics import logschema as ls


def topic_members(records: DataFrame) -> DataFrame:
    """Columns: topic, node — every node that logged something for the topic."""
    return records.where(F.col("topic").isNotNull()).select("topic", "node").distinct()


def members_or_default(records: DataFrame, members: DataFrame | None) -> DataFrame:
    return topic_members(records) if members is None else members.select("topic", "node").distinct()


def event_origins(records: DataFrame) -> DataFrame:
    """Columns: topic, event, origin_node, created_ms (one row per created event)."""
    first = F.min(F.struct("ts_ms", "node"))  # earliest; ties broken by node id, deterministically
    return (
        records.where(F.col("type") == ls.CREATED)
        .groupBy("topic", "event")
        .agg(first.alias("_first"))
        .select("topic", "event", F.col("_first.node").alias("origin_node"), F.col("_first.ts_ms").alias("created_ms"))
    )


def first_deliveries(records: DataFrame) -> DataFrame:
    """Columns: topic, event, node, delivered_ms, channel — each node's earliest delivery."""
    first = F.min(F.struct("ts_ms", "channel"))
    return (
        records.where(F.col("type") == ls.DELIVERED)
        .groupBy("topic", "event", "node")
        .agg(first.alias("_first"))
        .select(
            "topic", "event", "node",
            F.col("_first.ts_ms").alias("delivered_ms"), F.col("_first.channel").alias("channel"),
        )
    )


def remote_deliveries(records: DataFrame) -> DataFrame:
    """First deliveries at nodes other than the event's origin, with the origin joined in.

    Columns: topic, event, origin_node, created_ms, node, channel, delivered_ms,
    latency_ms. Events without a `created` record have no latency and are left out.
    """
    return (
        event_origins(records)
        .join(first_deliveries(records), ["topic", "event"])
        .where(F.col("node") != F.col("origin_node"))
        .select(
            "topic", "event", "origin_node", "created_ms", "node", "channel", "delivered_ms",
            (F.col("delivered_ms") - F.col("created_ms")).alias("latency_ms"),
        )
    )


def holdings(records: DataFrame) -> DataFrame:
    """When each node had each created event, as an offset from creation.

    Columns: topic, event, node, offset_ms (0 for the origin). Clocks of
    different nodes are assumed synchronised (the virtual clock in simulation);
    skew shows up as negative offsets, which are kept, not hidden.
    """
    origins = event_origins(records)
    at_origin = origins.select(
        "topic", "event", F.col("origin_node").alias("node"), F.lit(0).cast("long").alias("offset_ms")
    )
    elsewhere = remote_deliveries(records).select("topic", "event", "node", F.col("latency_ms").alias("offset_ms"))
    return at_origin.unionByName(elsewhere)


def known_events(records: DataFrame) -> DataFrame:
    """Columns: topic, event, origin_node (null when no created record was logged)."""
    delivered = records.where(F.col("type") == ls.DELIVERED).select("topic", "event").distinct()
    origins = event_origins(records).select("topic", "event", "origin_node")
    return origins.join(delivered, ["topic", "event"], "full_outer")
