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

Every job accepts either the records DataFrame or a `Basis`. A Basis made by
`basis(records)` computes origins, first deliveries and members once and
caches them, so a report running a dozen jobs does not redo those shuffles a
dozen times; a bare DataFrame gets an uncached Basis, computed per job.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Union

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from node import logschema as ls


@dataclass(frozen=True)
class Basis:
    """A record set with its shared building blocks (see the module docstring)."""

    records: DataFrame
    origins: DataFrame  # topic, event, origin_node, created_ms
    deliveries: DataFrame  # topic, event, node, delivered_ms, channel: first delivery per node
    members: DataFrame  # topic, node

    def release(self) -> None:
        """Drop the caches `basis()` made (a no-op for an uncached Basis)."""
        for frame in (self.origins, self.deliveries, self.members):
            frame.unpersist()


Records = Union[DataFrame, Basis]


def basis(records: DataFrame, members: DataFrame | None = None) -> Basis:
    """The building blocks of `records`, cached until `release()`."""
    fresh = as_basis(records, members)
    return Basis(records, fresh.origins.cache(), fresh.deliveries.cache(), fresh.members.cache())


def as_basis(data: Records, members: DataFrame | None = None) -> Basis:
    """`data` as a Basis; an explicit `members` replaces the one inferred from the logs."""
    if isinstance(data, Basis):
        return data if members is None else replace(data, members=_normalised(members))
    return Basis(
        data,
        event_origins(data),
        first_deliveries(data),
        topic_members(data) if members is None else _normalised(members),
    )


def records_of(data: Records) -> DataFrame:
    return data.records if isinstance(data, Basis) else data


def _normalised(members: DataFrame) -> DataFrame:
    return members.select("topic", "node").distinct()


def topic_members(records: DataFrame) -> DataFrame:
    """Columns: topic, node — every node that logged something for the topic."""
    return records.where(F.col("topic").isNotNull()).select("topic", "node").distinct()


def event_origins(records: DataFrame) -> DataFrame:
    """Columns: topic, event, origin_node, created_ms (one row per created event)."""
    first = F.min(F.struct("ts_ms", "node"))  # earliest; ties broken by node id, deterministically
    return (
        records.where(F.col("type") == ls.CREATED)
        .groupBy("topic", "event")
        .agg(first.alias("_first"))
        .select(
            "topic", "event", F.col("_first.node").alias("origin_node"), F.col("_first.ts_ms").alias("created_ms")
        )
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


def remote_deliveries(data: Records) -> DataFrame:
    """First deliveries at nodes other than the event's origin, with the origin joined in.

    Columns: topic, event, origin_node, created_ms, node, channel, delivered_ms,
    latency_ms. Events without a `created` record have no latency and are left out.
    """
    b = as_basis(data)
    return (
        b.origins.join(b.deliveries, ["topic", "event"])
        .where(F.col("node") != F.col("origin_node"))
        .select(
            "topic", "event", "origin_node", "created_ms", "node", "channel", "delivered_ms",
            (F.col("delivered_ms") - F.col("created_ms")).alias("latency_ms"),
        )
    )


def holdings(data: Records) -> DataFrame:
    """When each node had each created event, as an offset from creation.

    Columns: topic, event, node, offset_ms (0 for the origin). Clocks of
    different nodes are assumed synchronised (the virtual clock in simulation);
    skew shows up as negative offsets, which are kept, not hidden.
    """
    b = as_basis(data)
    at_origin = b.origins.select(
        "topic", "event", F.col("origin_node").alias("node"), F.lit(0).cast("long").alias("offset_ms")
    )
    elsewhere = remote_deliveries(b).select("topic", "event", "node", F.col("latency_ms").alias("offset_ms"))
    return at_origin.unionByName(elsewhere)


def known_events(data: Records) -> DataFrame:
    """Columns: topic, event, origin_node (null when no created record was logged)."""
    b = as_basis(data)
    delivered = b.deliveries.select("topic", "event").distinct()
    origins = b.origins.select("topic", "event", "origin_node")
    return origins.join(delivered, ["topic", "event"], "full_outer")


def remote_first_deliveries(data: Records) -> DataFrame:
    """First deliveries (columns of `Basis.deliveries`) minus the author's own."""
    b = as_basis(data)
    return (
        b.deliveries.join(b.origins.select("topic", "event", "origin_node"), ["topic", "event"], "left")
        .where(F.col("origin_node").isNull() | (F.col("node") != F.col("origin_node")))
        .drop("origin_node")
    )
