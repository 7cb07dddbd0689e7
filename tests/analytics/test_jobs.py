"""The Spark jobs on a hand-written log set whose every number is computed by hand.

The world: topic 7f with three nodes a (0a), b (0b), c (0c), seven events.

    event  author  created  kind     delivered at (latency, channel)
    e1     a       1000     message  b 1010 (10 g)    c 1030 (30 g)   + dup at c (sync)
    e2     b       2000     dummy    a 2005 (5 g)     c 2500 (500 s)  + 2 dups at a (gossip, sync)
    e3     c       3000     message  a 3020 (20 g)    b never (received and buffered only)
    e4     a       4000     dummy    b 4040 (40 s)    c 4100 (100 s)
    e5     b       5000     message  a 5002 (2 g)     c 6000 (1000 s)
    e6     b       5010     message  a 5012 (2 g)     c 6005 (995 s)
    e7     b       5020     message  a 5022 (2 g)     c 6010 (990 s)

c is cut off from 4500 (peer_down) to 5900 (peer_up) and catches up on e5..e7
by sync. Remote latencies, sorted: 2 2 2 5 10 20 30 40 100 500 990 995 1000.
Width samples: a at 0,1000..7000 = 2 3 9 6 4 3 2 3; b at 500, 2500 = 3 3;
c at 0..4000 = 2 2 10 2 6. Node c's log ends with a line torn by a crash.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from analytics import logschema as ls

A, B, C = "0a", "0b", "0c"
TOPIC = "7f"
NODES = (A, B, C)

pytestmark = pytest.mark.spark


def _fixture_records() -> dict[str, list[dict]]:
    r = ls.make_record
    t = TOPIC
    logs: dict[str, list[dict]] = {A: [], B: [], C: []}
    for ts, width in zip(range(0, 8000, 1000), (2, 3, 9, 6, 4, 3, 2, 3)):
        logs[A].append(r("width", ts_ms=ts, node=A, topic=t, width=width, buffered=0))
    for ts, width in ((500, 3), (2500, 3)):
        logs[B].append(r("width", ts_ms=ts, node=B, topic=t, width=width, buffered=0))
    for ts, width in zip(range(0, 5000, 1000), (2, 2, 10, 2, 6)):
        logs[C].append(r("width", ts_ms=ts, node=C, topic=t, width=width, buffered=1 if width == 10 else 0))

    def created(node: str, event: str, ts: int, kind: str = "message") -> None:
        logs[node].append(r("created", ts_ms=ts, node=node, topic=t, event=event, author=node, kind=kind, depth=1))
        if kind == "dummy":
            logs[node].append(r("dummy", ts_ms=ts, node=node, topic=t, event=event, width=6))

    def delivered(node: str, event: str, ts: int, channel: str) -> None:
        logs[node].append(r("received", ts_ms=ts, node=node, topic=t, event=event, channel=channel))
        logs[node].append(r("delivered", ts_ms=ts, node=node, topic=t, event=event, channel=channel))

    def duplicate(node: str, event: str, ts: int, channel: str) -> None:
        logs[node].append(r("duplicate", ts_ms=ts, node=node, topic=t, event=event, channel=channel))

    created(A, "e1", 1000)
    delivered(B, "e1", 1010, "gossip")
    delivered(C, "e1", 1030, "gossip")
    duplicate(C, "e1", 1040, "sync")
    created(B, "e2", 2000, kind="dummy")
    delivered(A, "e2", 2005, "gossip")
    duplicate(A, "e2", 2006, "gossip")
    duplicate(A, "e2", 2100, "sync")
    delivered(C, "e2", 2500, "sync")
    created(C, "e3", 3000)
    delivered(A, "e3", 3020, "gossip")
    logs[B].append(r("received", ts_ms=3030, node=B, topic=t, event="e3", channel="gossip"))
    logs[B].append(r("buffered", ts_ms=3030, node=B, topic=t, event="e3"))
    created(A, "e4", 4000, kind="dummy")
    delivered(B, "e4", 4040, "sync")
    delivered(C, "e4", 4100, "sync")
    logs[A].append(r("rejected", ts_ms=4500, node=A, topic=t, event="ee", reason="bad_signature", channel="gossip"))
    logs[C].append(r("peer_down", ts_ms=4500, node=C, peer=A))
    for index, event in enumerate(("e5", "e6", "e7")):
        created(B, event, 5000 + 10 * index)
        delivered(A, event, 5002 + 10 * index, "gossip")
    logs[C].append(r("peer_up", ts_ms=5900, node=C, peer=A))
    for index, event in enumerate(("e5", "e6", "e7")):
        delivered(C, event, 6000 + 5 * index, "sync")
    return logs


FIXTURE_RECORDS = sum(len(records) for records in _fixture_records().values())
TORN_LINE = '{"v":1,"ts_ms":7000,"node":"0c","topic":"7f","type":"wid'


def write_fixture_logs(directory: Path) -> Path:
    """The world above, one log per node as the node runtime writes it."""
    for node, records in _fixture_records().items():
        with ls.JsonLinesLogWriter(directory / node, node) as writer:
            for record in sorted(records, key=lambda rec: rec["ts_ms"]):
                writer.write(record)
            torn_path = writer.path
    with open(torn_path, "a", encoding="ascii") as log:  # the last writer was c's
        log.write(TORN_LINE)  # a crash mid-line: no newline
    return directory


@pytest.fixture(scope="module")
def logdir(tmp_path_factory) -> Path:
    return write_fixture_logs(tmp_path_factory.mktemp("logs"))


@pytest.fixture(scope="module")
def loaded(spark, logdir):
    from analytics.jobs.load import load_logs

    return load_logs(spark, str(logdir))


@pytest.fixture(scope="module")
def records(loaded):
    return loaded.records
