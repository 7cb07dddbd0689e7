"""Load dissemination logs (JSON lines or Parquet) into one typed DataFrame.

Lines that break the schema never stop a job: each is classified with the
reason `node.logschema` defines, counted, and a few are kept as samples so
a user can find them. Only valid records reach the analyses.

Why parse in the JVM (`jobs.validate`) rather than read text and call the
Python validator per line: a Python worker round trip costs roughly ten times
more per row than Spark's own parsing, and the loader sees every line of a log
set (tens of millions). The Python validator stays the reference; the tests
hold the two to the same answers.

`to_parquet` converts JSON lines into Parquet partitioned by topic and UTC date
(`topic=<hex>/date=YYYY-MM-DD/`), so large log sets are parsed once and later
jobs read only the columns and topics they need.
"""

from __future__ import annotations

import os
from types import MappingProxyType
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, StructField, StructType

from node import logschema as ls
from analytics.jobs import validate
from analytics.jobs.validate import MALFORMED

# Which files under a log directory are log files (Hadoop glob; .gz is read transparently).
LOG_FILE_GLOB: Final = "*.{jsonl,jsonl.gz,json,json.gz}"
MAX_SAMPLES_PER_REASON: Final = 3
MAX_SAMPLE_CHARS: Final = 200
DATE_COLUMN: Final = "date"
_MS_PER_DAY: Final = 86_400_000

LogFormat = Literal["auto", "jsonl", "parquet"]


@dataclass(frozen=True)
class MalformedSample:
    """One unusable line, to show the user where to look."""

    reason: str
    file: str
    line: str


@dataclass(frozen=True)
class LoadReport:
    """What the loader read: lines (or Parquet rows), valid records, rejects by reason."""

    lines: int
    records: int
    malformed: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    samples: tuple[MalformedSample, ...] = ()

    @property
    def malformed_total(self) -> int:
        return sum(self.malformed.values())


@dataclass(frozen=True)
class LoadedLogs:
    """Valid records (columns = logschema.FIELDS, backed by a cache) and the load report."""

    records: DataFrame
    report: LoadReport
    cached: DataFrame  # the classified lines behind `records`

    def release(self) -> None:
        """Drop the cache; `records` stays usable but re-reads the logs."""
        self.cached.unpersist()


def load_logs(
    spark: SparkSession, paths: str | Sequence[str], *, fmt: LogFormat = "auto"
) -> LoadedLogs:
    """Read log files/directories; malformed lines are counted, never fatal."""
    path_list = [paths] if isinstance(paths, str) else list(paths)
    if not path_list:
        raise ValueError("no log path given")
    chosen = fmt if fmt != "auto" else _detect_format(path_list)
    if chosen == "parquet":
        classified = _classify_parquet(spark, path_list)
    else:
        classified = _classify_json_lines(spark, path_list)
    classified = classified.persist()
    report = _report(classified)
    records = classified.where(F.col(MALFORMED).isNull()).select(*ls.FIELD_NAMES)
    return LoadedLogs(records, report, classified)


def to_parquet(
    spark: SparkSession, input_paths: str | Sequence[str], output_path: str, *, overwrite: bool = False
) -> LoadReport:
    """Convert logs to Parquet partitioned by topic and UTC date; returns the load report."""
    loaded = load_logs(spark, input_paths)
    dated = loaded.records.withColumn(
        DATE_COLUMN, F.date_from_unix_date(F.floor(F.col("ts_ms") / _MS_PER_DAY).cast("int"))
    )
    (
        dated.write.mode("overwrite" if overwrite else "errorifexists")
        .partitionBy("topic", DATE_COLUMN)
        .parquet(output_path)
    )
    loaded.release()
    return loaded.report


def _detect_format(paths: list[str]) -> LogFormat:
    """Parquet if a local path is or holds .parquet files; JSON lines otherwise."""
    for path in paths:
        if path.rstrip("/").endswith(".parquet"):
            return "parquet"
        if os.path.isdir(path):
            for _root, _dirs, files in os.walk(path):
                if any(name.endswith(".parquet") for name in files):
                    return "parquet"
    return "jsonl"


def _classify_json_lines(spark: SparkSession, paths: list[str]) -> DataFrame:
    for path in paths:
        if "://" not in path and not os.path.exists(path):
            raise FileNotFoundError(f"no such log path: {path}")
    reader = spark.read
    if all(os.path.isdir(p) for p in paths if "://" not in p):
        # Logs collected from many devices often sit in one directory per node.
        reader = reader.option("recursiveFileLookup", "true").option("pathGlobFilter", LOG_FILE_GLOB)
    lines = reader.text(paths).select("value", F.col("_metadata.file_path").alias("file"))
    reason = F.col(MALFORMED)
    return validate.classify_lines(lines).select(
        *ls.FIELD_NAMES,
        reason,
        # Keep the raw line only where it is needed, so the cache stays small.
        F.when(reason.isNotNull(), F.substring("value", 1, MAX_SAMPLE_CHARS)).alias("raw"),
        F.when(reason.isNotNull(), F.col("file")).alias("file"),
    )


def _classify_parquet(spark: SparkSession, paths: list[str]) -> DataFrame:
    schema = StructType([*ls.spark_schema().fields, StructField(DATE_COLUMN, DateType())])
    rows = spark.read.schema(schema).parquet(*paths).drop(DATE_COLUMN)
    reason = validate.record_reason(validate.typed_field_columns())
    return rows.select(
        *ls.FIELD_NAMES,
        reason.alias(MALFORMED),
        F.when(reason.isNotNull(), F.substring(F.to_json(F.struct(*ls.FIELD_NAMES)), 1, MAX_SAMPLE_CHARS)).alias("raw"),
        F.when(reason.isNotNull(), F.col("_metadata.file_path")).alias("file"),
    )


def _report(classified: DataFrame) -> LoadReport:
    counts = {row[MALFORMED]: row["count"] for row in classified.groupBy(MALFORMED).count().collect()}
    valid = counts.pop(None, 0)
    samples: tuple[MalformedSample, ...] = ()
    if counts:
        # A few lines per reason; which ones does not matter, but keep it deterministic.
        rank = F.row_number().over(Window.partitionBy(MALFORMED).orderBy("file", "raw"))
        rows = (
            classified.where(F.col(MALFORMED).isNotNull())
            .select(MALFORMED, "file", "raw", rank.alias("rank"))
            .where(F.col("rank") <= MAX_SAMPLES_PER_REASON)
            .orderBy(MALFORMED, "rank")
            .collect()
        )
        samples = tuple(MalformedSample(r[MALFORMED], r["file"] or "", r["raw"] or "") for r in rows)
    ordered = {reason: counts[reason] for reason in ls.REASONS if reason in counts}
    return LoadReport(valid + sum(ordered.values()), valid, MappingProxyType(ordered), samples)
