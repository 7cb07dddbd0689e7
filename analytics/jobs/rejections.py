"""What the nodes refused: `rejected` records counted by topic and reason.

A rejection either names its topic (the Reference Monitor refused an event of
that topic) or, when the frame could not even be decoded, names only the peer
that sent it; such peer-level rejections have a null topic here and are listed
as their own group rather than dropped. Reasons often carry a detail after a
colon (`bad_message:truncated msgpack`), taken from remote input; grouping on
the text before the first colon keeps the table bounded whatever peers send.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from node import logschema as ls
from analytics.jobs import events

REASON_SEPARATOR = ":"


def rejections(data: events.Records) -> DataFrame:
    """Columns: topic (null = peer-level), reason (before the first ':'), records, nodes, peers.

    `nodes` counts the nodes that refused, `peers` the distinct senders named
    (0 when the records name none). Ordered by topic (nulls first), then reason.
    """
    rejected = events.records_of(data).where(F.col("type") == ls.REJECTED)
    reason = F.substring_index(F.col("reason"), REASON_SEPARATOR, 1)
    return (
        rejected.groupBy("topic", reason.alias("reason"))
        .agg(
            F.count("*").alias("records"),
            F.countDistinct("node").alias("nodes"),
            F.countDistinct("peer").alias("peers"),
        )
        .orderBy(F.asc_nulls_first("topic"), "reason")
    )
