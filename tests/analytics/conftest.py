"""One local SparkSession for every analytics test: starting Spark costs ~10 s.

The fixture logs have tens of rows, so the session is tuned for many tiny
queries, not for throughput (none of this changes a result):
- two local cores and one shuffle partition: more only adds task overhead;
- adaptive query execution off: it re-plans after every stage, which costs
  more than it saves on tiny data;
- the JVM's optimising compiler (C2) off: on a 2-core machine its background
  compilations compete with the queries themselves, and tiny queries never run
  long enough to profit (measured: the job tests ran in half the time);
- no generated code: Spark evaluates every operator with its interpreted
  implementation (the one its own test suite checks codegen against) instead
  of compiling Java source for each of the hundreds of tiny queries with
  Janino (measured: the whole report ran in 9 s instead of 14 s).
The session binds to 127.0.0.1 and has no UI (see `analytics.spark`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent

SPARK_MASTER = "local[2]"
SHUFFLE_PARTITIONS = 1
JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
SPARK_CONF = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}


@pytest.fixture(scope="session")
def spark():
    if shutil.which("java") is None:
        pytest.skip("Spark tests need a Java runtime (Java 17) on PATH")
    from analytics.spark import create_session

    session = create_session(
        SPARK_MASTER, shuffle_partitions=SHUFFLE_PARTITIONS, java_options=JAVA_OPTIONS, conf=SPARK_CONF
    )
    yield session
    session.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test` runs two workers) every Spark test goes to one
    worker (`--dist loadgroup`), so the suite starts one JVM, not one per worker."""
    for item in items:
        if item.path.resolve().parent == _HERE:
            item.add_marker(pytest.mark.xdist_group("spark"))
