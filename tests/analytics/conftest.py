"""One local SparkSession for every analytics test: starting Spark costs ~10 s.

Two local cores and two shuffle partitions: the fixture logs have tens of rows,
so more partitions would only add scheduling overhead. The session binds to
127.0.0.1 and has no UI (see `analytics.spark`).
"""

from __future__ import annotations

import shutil

import pytest

SPARK_MASTER = "local[2]"
SHUFFLE_PARTITIONS = 2


@pytest.fixture(scope="session")
def spark():
    if shutil.which("java") is None:
        pytest.skip("Spark tests need a Java runtime (Java 17) on PATH")
    from analytics.spark import create_session

    session = create_session(SPARK_MASTER, shuffle_partitions=SHUFFLE_PARTITIONS)
    yield session
    session.stop()
