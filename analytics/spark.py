"""The SparkSession the analytics use: quiet, small, and loopback-only in local mode.

Log sets from a laptop run are small, so the defaults favour latency over
throughput: few shuffle partitions, no UI, no console progress bar (the report
prints its own stage messages). In local mode the driver binds to 127.0.0.1 so
nothing listens on a public interface; against a real cluster
(`spark://...`, `yarn`, `k8s://...`) executors must reach the driver, so the
loopback settings are not applied there and the cluster's defaults rule.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Final

from pyspark.sql import SparkSession

DEFAULT_MASTER: Final = "local[*]"
APP_NAME: Final = "megnode-analytics"
LOCAL_SHUFFLE_PARTITIONS: Final = 8  # enough for 2..8 cores on laptop-sized logs
LOOPBACK: Final = "127.0.0.1"
HOTSPOT_HUGE_METHOD_BYTES: Final = 8000

# Spark's default log4j profile prints INFO/WARN chatter on every start; errors are enough.
_LOG4J2_PROPERTIES: Final = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def create_session(
    master: str = DEFAULT_MASTER,
    *,
    shuffle_partitions: int | None = None,
    driver_memory: str | None = None,
    java_options: str = "",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A new (or the already running) SparkSession configured for the analytics.

    `java_options` are added to the driver JVM's command line and `conf` to
    the Spark configuration (both only take effect when no session runs yet).
    """
    log4j = f"-Dlog4j2.configurationFile=file:{_log4j_config()}"
    builder = (
        SparkSession.builder.master(master)
        .appName(APP_NAME)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        # Spark's advice for HotSpot: HotSpot never JIT-compiles a method over 8000 bytes
        # of bytecode, so larger generated code would run interpreted. At 8000 Spark
        # generates smaller per-operator code instead (the log loader: 1.5x faster, measured).
        .config("spark.sql.codegen.hugeMethodLimit", str(HOTSPOT_HUGE_METHOD_BYTES))
        .config("spark.driver.extraJavaOptions", f"{log4j} {java_options}".strip())
    )
    if is_local(master):
        # Workers and driver share this machine: keep every socket on loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = (
            builder.config("spark.driver.host", LOOPBACK)
            .config("spark.driver.bindAddress", LOOPBACK)
            .config("spark.sql.shuffle.partitions", str(shuffle_partitions or LOCAL_SHUFFLE_PARTITIONS))
        )
    elif shuffle_partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    if driver_memory:
        builder = builder.config("spark.driver.memory", driver_memory)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@contextmanager
def session(master: str = DEFAULT_MASTER, **options: object) -> Iterator[SparkSession]:
    """Use the active session if there is one (tests share theirs); else start one and stop it after."""
    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    spark = create_session(master, **options)  # type: ignore[arg-type]
    try:
        yield spark
    finally:
        spark.stop()


def _log4j_config() -> str:
    """Write the quiet log4j2 profile once per user and return its path."""
    path = os.path.join(tempfile.gettempdir(), f"megnode-spark-log4j2-{os.getuid()}.properties")
    try:
        with open(path, encoding="utf-8") as existing:
            if existing.read() == _LOG4J2_PROPERTIES:
                return path
    except OSError:
        pass
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(_LOG4J2_PROPERTIES)
    os.replace(tmp, path)  # atomic: concurrent sessions never read a half-written file
    return path
