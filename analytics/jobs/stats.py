"""Summaries of a numeric column: count, mean, exact percentiles, max.

Percentiles are exact, computed by Spark's `percentile` with linear
interpolation between the two closest ranks — the same definition as numpy's
and pandas' default (`(n - 1) * q`), so numbers can be checked by hand and
against a pandas computation. Exact is affordable: latencies and widths are
integers with few distinct values, and `percentile` keeps one counter per
distinct value, not one per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

QUANTILES: Final = (0.5, 0.9, 0.99)
QUANTILE_NAMES: Final = ("p50", "p90", "p99")


@dataclass(frozen=True)
class Summary:
    """Summary of one group; statistics are None when the group is empty."""

    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None


def summarize(
    df: DataFrame, column: str, by: Sequence[str] = (), *, count_name: str = "count", unit: str = ""
) -> DataFrame:
    """One row per group: count_name, mean<unit>, p50<unit>, p90<unit>, p99<unit>, max<unit>."""
    value = F.col(column)
    quantiles = F.percentile(value, list(QUANTILES))
    aggregated = df.groupBy(*by).agg(
        F.count(value).alias(count_name),
        F.avg(value).alias(f"mean{unit}"),
        quantiles.alias("_q"),
        F.max(value).cast("double").alias(f"max{unit}"),
    )
    result = aggregated.select(
        *by,
        count_name,
        f"mean{unit}",
        *[F.col("_q")[i].alias(f"{name}{unit}") for i, name in enumerate(QUANTILE_NAMES)],
        f"max{unit}",
    )
    return result.orderBy(*by) if by else result


def summary_of(df: DataFrame, column: str) -> Summary:
    """The ungrouped summary of `column` as a value."""
    row = summarize(df, column).collect()[0]
    return Summary(
        count=row["count"], mean=row["mean"], p50=row["p50"], p90=row["p90"], p99=row["p99"], max=row["max"]
    )
