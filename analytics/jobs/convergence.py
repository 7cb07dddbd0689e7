"""Convergence of the width after a disturbance (partition heal, write burst).

Definition, per (topic, node) width series with samples (t_i, w_i):
- steady window: samples with t >= t_last - steady_fraction * (t_last - t_first);
  steady median M = their median (linear interpolation, as `jobs.stats`).
- band: |w - M| <= b with b = max(band_min, band_fraction * M).
- peak: the largest width, earliest if it repeats, at t_peak.
- settle time: if some sample at or after the peak lies outside the band, the
  time of the sample following the last such one (none -> not converged);
  otherwise t_peak itself.
- convergence_ms = settle time - t_peak: how long after the peak the width
  entered the band for good. `disturbed` says whether the peak left the band
  at all (if not, convergence_ms is 0 or reflects only later dips).

To study one disturbance among several, filter the records to a time window
around it first; the definition then applies to that window.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from analytics.jobs.events import Records
from analytics.jobs.width import width_samples

STEADY_FRACTION: Final = 0.25  # the last quarter of a series is taken as its steady state
BAND_FRACTION: Final = 0.25
BAND_MIN: Final = 1.0  # widths are integers: a band narrower than 1 would flag every step

_SERIES: Final = ("topic", "node")


def _series_spans(samples: DataFrame, steady_fraction: float) -> DataFrame:
    """Columns: topic, node, samples, first_ms, last_ms, steady_from_ms."""
    if not 0.0 < steady_fraction <= 1.0:
        raise ValueError("steady_fraction must be in (0, 1]")
    span = samples.groupBy(*_SERIES).agg(
        F.count("*").alias("samples"), F.min("ts_ms").alias("first_ms"), F.max("ts_ms").alias("last_ms")
    )
    return span.withColumn(
        "steady_from_ms", F.col("last_ms") - (F.col("last_ms") - F.col("first_ms")) * steady_fraction
    )


def steady_samples(samples: DataFrame, steady_fraction: float = STEADY_FRACTION) -> DataFrame:
    """The width samples (same columns) that lie in their series' steady window."""
    spans = _series_spans(samples, steady_fraction).select(*_SERIES, "steady_from_ms")
    return (
        samples.join(spans, list(_SERIES))
        .where(F.col("ts_ms") >= F.col("steady_from_ms"))
        .select(*samples.columns)
    )


def steady_state(samples: DataFrame, steady_fraction: float = STEADY_FRACTION) -> DataFrame:
    """Columns: topic, node, samples, first_ms, last_ms, steady_from_ms, steady_median, steady_mean."""
    steady = (
        steady_samples(samples, steady_fraction)
        .groupBy(*_SERIES)
        .agg(F.percentile("width", 0.5).alias("steady_median"), F.avg("width").alias("steady_mean"))
    )
    return _series_spans(samples, steady_fraction).join(steady, list(_SERIES))


def convergence(
    data: Records,
    *,
    band_fraction: float = BAND_FRACTION,
    band_min: float = BAND_MIN,
    steady_fraction: float = STEADY_FRACTION,
) -> DataFrame:
    """One row per (topic, node) width series.

    Columns: topic, node, samples, steady_median, band_low, band_high, peak_ms,
    peak_width, disturbed, settle_ms, convergence_ms, converged.
    """
    samples = width_samples(data)
    half_band = F.greatest(F.lit(float(band_min)), F.col("steady_median") * band_fraction)
    # The largest width, earliest first: the minimum of (-width, ts).
    first_peak = F.min(F.struct((-F.col("width")).alias("neg_width"), F.col("ts_ms")))
    peak = samples.groupBy(*_SERIES).agg(first_peak.alias("_peak"))
    series = (
        steady_state(samples, steady_fraction)
        .join(peak, list(_SERIES))
        .select(
            *_SERIES, "samples", "steady_median",
            half_band.alias("half_band"),
            F.col("_peak.ts_ms").alias("peak_ms"),
            (-F.col("_peak.neg_width")).alias("peak_width"),
        )
    )
    following = F.lead("ts_ms").over(Window.partitionBy(*_SERIES).orderBy("ts_ms"))
    outside = (F.col("ts_ms") >= F.col("peak_ms")) & (
        F.abs(F.col("width") - F.col("steady_median")) > F.col("half_band")
    )
    last_outside = (
        samples.withColumn("next_ms", following)
        .join(series, list(_SERIES))
        .groupBy(*_SERIES)
        .agg(F.max(F.when(outside, F.struct("ts_ms", "next_ms"))).alias("_last_out"))
    )
    settle = F.when(F.col("_last_out").isNull(), F.col("peak_ms")).otherwise(F.col("_last_out.next_ms"))
    return (
        series.join(last_outside, list(_SERIES))
        .select(
            *_SERIES, "samples", "steady_median",
            (F.col("steady_median") - F.col("half_band")).alias("band_low"),
            (F.col("steady_median") + F.col("half_band")).alias("band_high"),
            "peak_ms", "peak_width",
            (F.abs(F.col("peak_width") - F.col("steady_median")) > F.col("half_band")).alias("disturbed"),
            settle.alias("settle_ms"),
            (settle - F.col("peak_ms")).alias("convergence_ms"),
            settle.isNotNull().alias("converged"),
        )
        .orderBy(*_SERIES)
    )
