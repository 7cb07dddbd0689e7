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
by sync. a rejects an event of the topic (bad_signature) at 4500 and, at 4600,
a frame from b it could not decode: a peer-level rejection with no topic. Remote latencies, sorted: 2 2 2 5 10 20 30 40 100 500 990 995 1000.
Width samples: a at 0,1000..7000 = 2 3 9 6 4 3 2 3; b at 500, 2500 = 3 3;
c at 0..4000 = 2 2 10 2 6. Node c's log ends with a line torn by a crash.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from node import logschema as ls
from tests.analytics.test_model import fixed_point_by_iteration

A, B, C = "0a", "0b", "0c"
TOPIC = "7f"
NODES = (A, B, C)


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
    logs[A].append(r("rejected", ts_ms=4600, node=A, peer=B, reason="bad_message:truncated frame"))
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


# --------------------------------------------------------------------------- schema and writer (no Spark)

BASE = '"v":1,"ts_ms":5,"node":"0a","topic":"7f","type":"created","event":"e1"'
CREATED_LINE = "{" + BASE + "}"
DELIVERED = '"v":1,"ts_ms":5,"node":"0a","topic":"7f","type":"delivered","event":"e1"'

# (line, the reason every reader must give; None = a valid record)
LINE_CASES = [
    (CREATED_LINE, None),
    ("{" + BASE + ',"extra":[1,{"x":2}]}', None),  # unknown keys are ignored
    ("{" + BASE + ',"depth":null}', None),  # null equals absent
    ('{"v":1,"ts_ms":5,"node":"0a","type":"peer_up","peer":"0b"}', None),  # no topic needed
    ('{"v":1,"ts_ms":5,"node":"0a","type":"rejected","reason":"bad_message:x","peer":"0b"}', None),  # peer-level
    ('{"v":1,"ts_ms":5,"node":"0a","type":"rejected","reason":"bad_message:x"}', ls.MISSING_FIELD),  # nor peer
    ('{"v":1,"ts_ms":5,"node":"0a","type":"rejected","peer":"0b"}', ls.MISSING_FIELD),  # no reason
    ('{"v":1,"ts_ms":5,"node":"0a","topic":"7f","type":"cre', ls.BAD_JSON),  # torn by a crash
    ("", ls.BAD_JSON),
    (CREATED_LINE + CREATED_LINE, ls.BAD_JSON),  # a lost newline
    (CREATED_LINE + "]", ls.BAD_JSON),
    ('{"v":1,"v":1,"ts_ms":5,"node":"0a","topic":"7f","type":"created","event":"e1"}', ls.BAD_JSON),
    ('{"v":1,"ts_ms":NaN,"node":"0a","topic":"7f","type":"created","event":"e1"}', ls.BAD_JSON),
    ("[1,2]", ls.NOT_OBJECT),
    ('"created"', ls.NOT_OBJECT),
    ('{"ts_ms":5,"node":"0a","topic":"7f","type":"created","event":"e1"}', ls.MISSING_FIELD),
    ('{"v":"1","ts_ms":5,"node":"0a","topic":"7f","type":"created","event":"e1"}', ls.WRONG_TYPE),
    ('{"v":2,"ts_ms":5,"node":"0a","topic":"7f","type":"created","event":"e1"}', ls.BAD_VERSION),
    ('{"v":2,"ts_ms":5}', ls.BAD_VERSION),  # the version is judged before anything else
    ('{"v":1,"ts_ms":5,"node":"0a","topic":"7f","event":"e1"}', ls.MISSING_FIELD),
    ('{"v":1,"ts_ms":5,"node":"0a","topic":"7f","type":7,"event":"e1"}', ls.WRONG_TYPE),
    ('{"v":1,"ts_ms":5,"node":"0a","topic":"7f","type":"teleported","event":"e1"}', ls.UNKNOWN_TYPE),
    ('{"v":1,"ts_ms":"5","node":"0a","topic":"7f","type":"created","event":"e1"}', ls.WRONG_TYPE),
    ('{"v":1,"ts_ms":5.0,"node":"0a","topic":"7f","type":"created","event":"e1"}', ls.WRONG_TYPE),
    ('{"v":1,"ts_ms":true,"node":"0a","topic":"7f","type":"created","event":"e1"}', ls.WRONG_TYPE),
    ('{"v":1,"ts_ms":9223372036854775808,"node":"0a","topic":"7f","type":"created","event":"e1"}', ls.WRONG_TYPE),
    ('{"v":1,"ts_ms":5,"node":10,"topic":"7f","type":"created","event":"e1"}', ls.WRONG_TYPE),
    ("{" + DELIVERED + "}", ls.MISSING_FIELD),  # no channel
    ("{" + DELIVERED + ',"channel":null}', ls.MISSING_FIELD),
    ('{"v":1,"ts_ms":5,"node":"0a","type":"created","event":"e1"}', ls.MISSING_FIELD),  # no topic
    ('{"v":1,"ts_ms":5,"node":"0a","topic":"7f","type":"width","width":3}', ls.MISSING_FIELD),
    ("{" + DELIVERED + ',"channel":"pigeon"}', ls.BAD_VALUE),
    ('{"v":1,"ts_ms":5,"node":"0A","topic":"7f","type":"created","event":"e1"}', ls.BAD_VALUE),
    ('{"v":1,"ts_ms":5,"node":"0a\\n","topic":"7f","type":"created","event":"e1"}', ls.BAD_VALUE),
    ('{"v":1,"ts_ms":-1,"node":"0a","topic":"7f","type":"created","event":"e1"}', ls.BAD_VALUE),
    ("{" + BASE + ',"kind":"' + "k" * (ls.MAX_KIND_CHARS + 1) + '"}', ls.BAD_VALUE),
    ('{"v":1,"ts_ms":5,"node":"0a","topic":"7f","type":"rejected","reason":""}', ls.BAD_VALUE),
    ("{" + BASE + ',"kind":"' + "k" * ls.MAX_LINE_CHARS + '"}', ls.TOO_LONG),
]


def test_python_validator_gives_each_line_its_reason():
    assert [ls.parse_line(line)[1] for line, _ in LINE_CASES] == [reason for _, reason in LINE_CASES]


def test_make_record_omits_absent_fields_and_refuses_invalid_ones():
    record = ls.make_record("delivered", ts_ms=7, node="0a", topic="7f", event="e1", channel="sync")
    assert record == {"v": 1, "ts_ms": 7, "node": "0a", "topic": "7f", "type": "delivered", "event": "e1",
                      "channel": "sync"}
    assert ls.encode_record(record) == (
        b'{"v":1,"ts_ms":7,"node":"0a","topic":"7f","type":"delivered","event":"e1","channel":"sync"}\n'
    )
    with pytest.raises(ValueError, match="missing_field"):
        ls.make_record("delivered", ts_ms=7, node="0a", topic="7f", event="e1")
    with pytest.raises(ValueError, match="bad_value"):
        ls.make_record("created", ts_ms=7, node="0A", topic="7f", event="e1")
    long_reason = ls.make_record("rejected", ts_ms=7, node="0a", topic="7f", reason="x" * 1000)
    assert len(long_reason["reason"]) == ls.MAX_REASON_CHARS
    # An undecodable frame names no topic: the rejection is the sending peer's.
    assert ls.make_record("rejected", ts_ms=7, node="0a", peer="0b", reason="bad_message:eof") == {
        "v": 1, "ts_ms": 7, "node": "0a", "type": "rejected", "reason": "bad_message:eof", "peer": "0b"
    }
    with pytest.raises(ValueError, match="missing_field"):
        ls.make_record("rejected", ts_ms=7, node="0a", reason="bad_message:eof")


def test_writer_keeps_a_peer_level_rejection(tmp_path):
    # What transport.dissemination logs for an undecodable frame: topic None, peer set.
    record = {"v": 1, "ts_ms": 3, "node": A, "type": "rejected", "reason": "bad_message:eof", "peer": B}
    with ls.JsonLinesLogWriter(tmp_path, A) as writer:
        writer.write(record)
        path = writer.path
    assert ls.parse_line(open(path).read()) == (record, None)


def _width_record(ts_ms: int) -> dict:
    return ls.make_record("width", ts_ms=ts_ms, node=A, topic=TOPIC, width=3, buffered=0)


def test_writer_rotates_by_size_and_keeps_at_most_max_files(tmp_path):
    line_bytes = len(ls.encode_record(_width_record(10_000)))  # five-digit timestamps: equal lines
    per_segment = ls.MIN_MAX_BYTES // line_bytes
    with ls.JsonLinesLogWriter(tmp_path, A, max_bytes=ls.MIN_MAX_BYTES, max_files=2) as writer:
        for ts in range(10_000, 10_000 + 3 * per_segment + 5):  # fills segments 0, 1, 2 and starts 3
            writer.write(_width_record(ts))
    names = sorted(os.listdir(tmp_path))
    assert names == ["0a.000002.jsonl", "0a.000003.jsonl"]
    full, last = (tmp_path / name for name in names)
    assert full.stat().st_size == per_segment * line_bytes <= ls.MIN_MAX_BYTES
    lines = full.read_text().splitlines() + last.read_text().splitlines()
    assert [json.loads(line)["ts_ms"] for line in lines] == list(
        range(10_000 + 2 * per_segment, 10_000 + 3 * per_segment + 5)
    )


def test_writer_flushes_every_record_and_restarts_in_a_new_segment(tmp_path):
    writer = ls.JsonLinesLogWriter(tmp_path, A)
    assert os.listdir(tmp_path) == []  # a node that logs nothing leaves no file
    writer.write(_width_record(1))
    first = tmp_path / "0a.000000.jsonl"
    assert first.read_bytes() == ls.encode_record(_width_record(1))  # readable before close
    writer.close()
    writer.close()  # idempotent
    with open(first, "a") as torn:
        torn.write('{"v":1,"ts')  # the process died mid-line
    with ls.JsonLinesLogWriter(tmp_path, A) as again:
        again.write(_width_record(2))
    assert first.read_text().endswith('{"v":1,"ts')  # never glued onto the torn line
    assert (tmp_path / "0a.000001.jsonl").read_bytes() == ls.encode_record(_width_record(2))


def test_writer_refuses_what_is_not_its_nodes_valid_record(tmp_path):
    with ls.JsonLinesLogWriter(tmp_path, A) as writer:
        with pytest.raises(ValueError, match="node 0b"):
            writer.write(ls.make_record("width", ts_ms=1, node=B, topic=TOPIC, width=1, buffered=0))
        with pytest.raises(ValueError, match="missing_field"):
            writer.write({"v": 1, "ts_ms": 1, "node": A, "type": "width"})
    with pytest.raises(ValueError, match="closed"):
        writer.write(_width_record(1))
    with pytest.raises(ValueError, match="hex"):
        ls.JsonLinesLogWriter(tmp_path, "Node-A")
    with pytest.raises(ValueError, match="max_bytes"):
        ls.JsonLinesLogWriter(tmp_path, A, max_bytes=ls.MIN_MAX_BYTES - 1)


# --------------------------------------------------------------------------- loading (Spark)


@pytest.mark.spark
def test_spark_loader_gives_each_line_the_python_reason(spark):
    from analytics.jobs.validate import MALFORMED, classify_lines

    lines = spark.createDataFrame([(i, line) for i, (line, _) in enumerate(LINE_CASES)], "i int, value string")
    rows = classify_lines(lines).orderBy("i").collect()
    assert [row[MALFORMED] for row in rows] == [reason for _, reason in LINE_CASES]
    valid = rows[0]
    assert (valid["v"], valid["ts_ms"], valid["node"], valid["type"], valid["event"]) == (1, 5, "0a", "created", "e1")


@pytest.mark.spark
def test_load_counts_malformed_lines_per_reason_and_keeps_going(spark, tmp_path):
    from analytics.jobs.load import load_logs

    (tmp_path / "node").mkdir()
    (tmp_path / "node" / "x.jsonl").write_text("\n".join(line for line, _ in LINE_CASES) + "\n")
    (tmp_path / "node" / "notes.txt").write_text("not a log file\n")  # ignored: not *.jsonl
    loaded = load_logs(spark, str(tmp_path))
    expected = Counter(reason for _, reason in LINE_CASES if reason is not None)
    assert dict(loaded.report.malformed) == dict(expected)
    assert list(loaded.report.malformed) == [r for r in ls.REASONS if r in expected]  # schema order
    valid = sum(1 for _, reason in LINE_CASES if reason is None)
    assert (loaded.report.lines, loaded.report.records) == (len(LINE_CASES), valid)
    assert loaded.records.count() == valid == 5
    samples = [s for s in loaded.report.samples if s.reason == ls.BAD_VERSION]
    assert sorted(s.line for s in samples) == sorted(
        ['{"v":2,"ts_ms":5}', '{"v":2,"ts_ms":5,"node":"0a","topic":"7f","type":"created","event":"e1"}']
    )
    assert all(s.file.endswith("node/x.jsonl") for s in samples)


@pytest.mark.spark
def test_fixture_loads_with_the_torn_line_counted(loaded):
    assert (loaded.report.lines, loaded.report.records) == (FIXTURE_RECORDS + 1, FIXTURE_RECORDS)
    assert dict(loaded.report.malformed) == {ls.BAD_JSON: 1}
    assert loaded.report.samples[0].line == TORN_LINE


# --------------------------------------------------------------------------- dissemination


@pytest.mark.spark
def test_latency_of_each_event_at_each_node(records):
    from analytics.jobs.dissemination import latencies

    rows = {(r["event"], r["node"]): (r["latency_ms"], r["channel"]) for r in latencies(records).collect()}
    assert rows == {
        ("e1", B): (10, "gossip"), ("e1", C): (30, "gossip"),
        ("e2", A): (5, "gossip"), ("e2", C): (500, "sync"),
        ("e3", A): (20, "gossip"),
        ("e4", B): (40, "sync"), ("e4", C): (100, "sync"),
        ("e5", A): (2, "gossip"), ("e5", C): (1000, "sync"),
        ("e6", A): (2, "gossip"), ("e6", C): (995, "sync"),
        ("e7", A): (2, "gossip"), ("e7", C): (990, "sync"),
    }


@pytest.mark.spark
def test_latency_percentiles_overall_per_channel_per_node(records):
    from analytics.jobs.dissemination import latencies, latency_summary, overall_latency

    rows = latencies(records).cache()
    # Sorted: 2 2 2 5 10 20 30 40 100 500 990 995 1000; rank (n-1)q = 12q, interpolated.
    overall = overall_latency(rows)
    assert overall.count == 13
    assert overall.mean == pytest.approx(3696 / 13)
    assert (overall.p50, overall.p90, overall.p99, overall.max) == pytest.approx((30, 994, 999.4, 1000))
    by_channel = {r["channel"]: r for r in latency_summary(rows, ("channel",)).collect()}
    gossip, sync = by_channel["gossip"], by_channel["sync"]  # 2 2 2 5 10 20 30 | 40 100 500 990 995 1000
    assert (gossip["deliveries"], gossip["p50_ms"], gossip["p90_ms"], gossip["max_ms"]) == pytest.approx((7, 5, 24, 30))
    assert (sync["deliveries"], sync["p50_ms"], sync["p99_ms"], sync["max_ms"]) == pytest.approx((6, 745, 999.75, 1000))
    by_node = {
        r["node"]: (r["deliveries"], r["p50_ms"], r["max_ms"]) for r in latency_summary(rows, ("node",)).collect()
    }
    assert by_node == {A: (5, 2.0, 20.0), B: (2, 25.0, 40.0), C: (6, 745.0, 1000.0)}
    rows.unpersist()


@pytest.mark.spark
def test_coverage_curve_steps_at_every_delivery(records):
    from analytics.jobs.coverage import coverage_curve

    # 7 events x 3 members = 21 (event, node) pairs; 7 authors at t=0, then one pair per
    # remote delivery; b never gets e3, so the curve stops at 20/21.
    curve = [(r["t_ms"], r["coverage"]) for r in coverage_curve(records).collect()]
    steps = [0, 2, 5, 10, 20, 30, 40, 100, 500, 990, 995, 1000]
    held = [7, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    assert [t for t, _ in curve] == steps
    assert [c for _, c in curve] == pytest.approx([h / 21 for h in held])
    coarse = [(r["t_ms"], r["coverage"]) for r in coverage_curve(records, resolution_ms=100).collect()]
    assert [t for t, _ in coarse] == [0, 100, 500, 1000]
    assert [c for _, c in coarse] == pytest.approx([7 / 21, 16 / 21, 17 / 21, 20 / 21])


@pytest.mark.spark
def test_event_coverage_and_time_to_reach(records):
    from analytics.jobs.coverage import event_coverage

    rows = {r["event"]: r for r in event_coverage(records).collect()}
    e1, e3 = rows["e1"], rows["e3"]
    assert (e1["holders"], e1["coverage"], e1["t50_ms"], e1["t90_ms"], e1["t100_ms"]) == (3, 1.0, 10, 30, 30)
    assert (e3["holders"], e3["t50_ms"], e3["t90_ms"], e3["t100_ms"]) == (2, 20, None, None)
    assert e3["coverage"] == pytest.approx(2 / 3)


@pytest.mark.spark
def test_never_delivered_with_inferred_and_explicit_members(spark, records):
    from analytics.jobs.dissemination import never_delivered
    from analytics.jobs.events import basis

    assert [tuple(r) for r in never_delivered(records).collect()] == [(TOPIC, "e3", C, B)]
    # A fourth member that logged nothing at all missed every event; the cached
    # building blocks (a Basis) answer like the bare records.
    members = spark.createDataFrame([(TOPIC, n) for n in (A, B, C, "0d")], "topic string, node string")
    cached = basis(records)
    missing = [(r["event"], r["node"]) for r in never_delivered(cached, members).collect()]
    cached.release()
    assert missing == [("e1", "0d"), ("e2", "0d"), ("e3", B), ("e3", "0d"), ("e4", "0d"),
                       ("e5", "0d"), ("e6", "0d"), ("e7", "0d")]


@pytest.mark.spark
def test_duplicates_per_delivered_event(records):
    from analytics.jobs.dissemination import duplicate_totals, duplicates_by_channel, duplicates_per_event

    per_event = duplicates_per_event(records).cache()
    rows = {r["event"]: (r["deliveries"], r["duplicates"], r["duplicates_per_delivery"]) for r in per_event.collect()}
    assert rows == {"e1": (2, 1, 0.5), "e2": (2, 2, 1.0), "e3": (1, 0, 0.0), "e4": (2, 0, 0.0),
                    "e5": (2, 0, 0.0), "e6": (2, 0, 0.0), "e7": (2, 0, 0.0)}
    totals = duplicate_totals(per_event)
    assert (totals.events, totals.deliveries, totals.duplicates, totals.max_per_event) == (7, 13, 3, 2)
    assert totals.duplicates_per_delivery == pytest.approx(3 / 13)
    assert [tuple(r) for r in duplicates_by_channel(records).collect()] == [("gossip", 1), ("sync", 2)]
    per_event.unpersist()


@pytest.mark.spark
def test_catchup_episode_after_the_partition(records):
    from analytics.jobs.catchup import catchup_episodes

    # c's sync deliveries: 2500 | 4100 | 6000 6005 6010 (gaps over 1000 ms split runs).
    [episode] = catchup_episodes(records).collect()
    assert episode.asDict() == {
        "topic": TOPIC, "node": C, "start_ms": 6000, "end_ms": 6010, "duration_ms": 10, "events": 3,
        "max_lag_ms": 1000, "mean_lag_ms": 995.0, "quiet_before_ms": 1900,
    }
    singles = catchup_episodes(records, min_events=1).collect()
    assert [(r["node"], r["start_ms"], r["events"]) for r in singles] == [
        (B, 4040, 1), (C, 2500, 1), (C, 4100, 1), (C, 6000, 3)
    ]


# --------------------------------------------------------------------------- width


@pytest.mark.spark
def test_width_series_distribution_and_dummies(records):
    from analytics.jobs.width import dummy_counts, width_histogram, width_series, width_summary

    series = [(r["node"], r["ts_ms"], r["width"]) for r in width_series(records).where("node = '0a'").collect()]
    assert series == [(A, ts, w) for ts, w in zip(range(0, 8000, 1000), (2, 3, 9, 6, 4, 3, 2, 3))]
    # a: 2 2 3 3 3 4 6 9 -> mean 4, p50 = 3, p99 = 6 + 0.93 * 3 at rank 6.93.
    per_node = {r["node"]: r for r in width_summary(records, ("topic", "node")).collect()}
    a = per_node[A]
    assert (a["samples"], a["mean"], a["p50"], a["p99"], a["max"]) == pytest.approx((8, 4.0, 3.0, 8.79, 9.0))
    [topic] = width_summary(records).collect()
    assert (topic["samples"], topic["mean"]) == (15, 60 / 15)
    histogram = [(r["width"], r["samples"]) for r in width_histogram(records).collect()]
    assert histogram == [(2, 5), (3, 5), (4, 1), (6, 2), (9, 1), (10, 1)]
    assert [(r["node"], r["dummies"]) for r in dummy_counts(records).collect()] == [(A, 1), (B, 1), (C, 0)]


@pytest.mark.spark
def test_convergence_after_the_width_peak(records):
    from analytics.jobs.convergence import convergence

    rows = {r["node"]: r for r in convergence(records).collect()}
    # a: steady window t >= 5250 -> {2, 3}, median 2.5, band 2.5 +- 1; peak 9 at 2000; last
    # sample outside the band is 4 at 4000, so it settles at 5000: 3000 ms after the peak.
    a = rows[A]
    assert (a["steady_median"], a["band_low"], a["band_high"]) == (2.5, 1.5, 3.5)
    assert (a["peak_ms"], a["peak_width"], a["disturbed"], a["settle_ms"], a["convergence_ms"], a["converged"]) == (
        2000, 9, True, 5000, 3000, True
    )
    # b never left its band; c's last sample (6, band 4 +- 1) is still outside: not converged.
    assert (rows[B]["disturbed"], rows[B]["convergence_ms"], rows[B]["converged"]) == (False, 0, True)
    assert (rows[C]["steady_median"], rows[C]["peak_width"], rows[C]["convergence_ms"], rows[C]["converged"]) == (
        4.0, 10, None, False
    )


@pytest.mark.spark
def test_model_check_against_the_fixed_point(records):
    from analytics.jobs.modelcheck import model_check

    # k = 3 writers <= d = 3: the fixed point is exactly k. Steady samples: a {2, 3},
    # b {3}, c {2, 6} -> 16 / 5.
    [check] = model_check(records, d=3, k=3)
    assert (check.k, check.samples, check.measured_mean, check.steady_mean, check.predicted) == (3, 15, 4.0, 3.2, 3.0)
    assert check.steady_over_predicted == pytest.approx(3.2 / 3)
    [inferred] = model_check(records, d=3)
    assert inferred.k == 3  # a, b and c all created message events
    # k = 5 > d = 2: replicas' picks overlap, so the fixed point lies above k:
    # 5.62542013469471... (the iteration with 40-digit decimals gives the same digits).
    [wide] = model_check(records, d=2, k=5)
    expected = fixed_point_by_iteration(2, 5)
    assert expected == pytest.approx(5.62542013469471, rel=1e-12)
    assert (wide.k, wide.d, wide.steady_mean) == (5, 2, 3.2)
    assert wide.predicted == pytest.approx(expected, rel=1e-9)
    assert wide.steady_over_predicted == pytest.approx(3.2 / expected, rel=1e-9)


@pytest.mark.spark
def test_inferred_k_counts_only_nodes_that_wrote_messages(spark):
    from analytics.jobs.modelcheck import writer_counts

    r, t, u = ls.make_record, TOPIC, "7e"
    rows = [
        r("created", ts_ms=1, node="01", topic=t, event="e1", author="01", kind="message"),  # a writer
        r("created", ts_ms=2, node="02", topic=t, event="e2", author="02", kind="m.room.member"),  # join only
        r("created", ts_ms=3, node="02", topic=t, event="e3", author="02", kind="ack"),  # indexer ack
        r("created", ts_ms=4, node="03", topic=t, event="e4", author="03", kind="dummy"),  # depletion
        r("dummy", ts_ms=4, node="03", topic=t, event="e4", width=12),
        r("created", ts_ms=5, node="04", topic=t, event="e5", author="0e", kind="message"),  # relayed device's
        r("created", ts_ms=6, node="05", topic=t, event="e6", author="05", kind="m.room.create"),  # the root
        r("created", ts_ms=7, node="06", topic=t, event="e7"),  # no kind logged, not a dummy: counted
        r("created", ts_ms=8, node="07", topic=t, event="e8"),  # no kind logged, but a dummy: not counted
        r("dummy", ts_ms=8, node="07", topic=t, event="e8", width=9),
        r("created", ts_ms=9, node="01", topic=u, event="f1", author="01", kind="message"),
        r("created", ts_ms=9, node="02", topic=u, event="f2", author="02", kind="message"),
        r("created", ts_ms=9, node="02", topic=u, event="f3", author="02", kind="message"),
        r("rejected", ts_ms=9, node="02", peer="01", reason="bad_message:eof"),  # no topic at all
    ]
    records = spark.createDataFrame([tuple(row.get(name) for name in ls.FIELD_NAMES) for row in rows],
                                    ls.spark_schema())
    assert writer_counts(records) == {t: 2, u: 2}  # 01 and 06; 01 and 02
    assert writer_counts(records, write_kinds=("message", "ack")) == {t: 3, u: 2}


@pytest.mark.spark
def test_rejections_by_topic_and_reason_keep_the_peer_level_ones(records):
    from analytics.jobs.rejections import rejections

    rows = [tuple(row) for row in rejections(records).collect()]
    assert rows == [(None, "bad_message", 1, 1, 1), (TOPIC, "bad_signature", 1, 1, 0)]


@pytest.mark.spark
def test_a_model_argument_out_of_range_leaves_a_note_not_a_crash(records, tmp_path, monkeypatch):
    from analytics import report
    from analytics.jobs import modelcheck

    # --d 1 is refused by the command line; a direct call must not die after the Spark work.
    tables, texts, plots = report._model(records, tmp_path, k=3, d=1)
    [table] = tables
    assert table.rows == () and table.note.startswith("Model check skipped: d must be >= 2")
    assert [path.name for path in plots] == ["figure4.png", "figure5.png"]  # the paper's figures still come
    assert [title for title, _ in texts] == [
        "Paper Figure 4 (table)", "Paper Figure 4: Monte-Carlo check", "Paper Figure 5 (table)"
    ]
    # The paper's figures take neither k nor d: the second call reuses the first's
    # (drawing them and their Monte-Carlo check again costs seconds and shows nothing new).
    texts_by_title = dict(texts)
    monkeypatch.setattr(modelcheck, "paper_figures", lambda out: modelcheck.PaperFigures(
        figure4_table=texts_by_title["Paper Figure 4 (table)"],
        figure5_table=texts_by_title["Paper Figure 5 (table)"],
        figure4_png=plots[0], figure5_png=plots[1],
        figure4_monte_carlo_table=texts_by_title["Paper Figure 4: Monte-Carlo check"],
    ))
    [huge], huge_texts, huge_plots = report._model(records, tmp_path, k=10**7, d=3)
    assert huge.rows == () and "k must be in" in huge.note
    assert (huge_texts, huge_plots) == (texts, plots)


# --------------------------------------------------------------------------- command line


@pytest.mark.spark
def test_to_parquet_partitions_by_topic_and_date_and_reads_back(spark, logdir, tmp_path, capsys):
    from analytics.__main__ import main
    from analytics.jobs.dissemination import latencies, overall_latency
    from analytics.jobs.load import load_logs

    out = tmp_path / "parquet"
    assert main(["to-parquet", str(logdir), str(out), "--master", "local[2]"]) == 0
    assert f"wrote {FIXTURE_RECORDS} records" in capsys.readouterr().out
    assert (out / f"topic={TOPIC}" / "date=1970-01-01").is_dir()  # simulated clock starts at 0
    assert (out / "topic=__HIVE_DEFAULT_PARTITION__").is_dir()  # peer records have no topic
    loaded = load_logs(spark, str(out))
    assert (loaded.report.records, loaded.report.malformed_total) == (FIXTURE_RECORDS, 0)
    assert overall_latency(latencies(loaded.records)).p90 == pytest.approx(994)
    loaded.release()
    assert main(["to-parquet", str(logdir), str(out)]) == 1  # never overwrites silently
    assert "error:" in capsys.readouterr().err


@pytest.mark.spark
def test_analyze_writes_the_report_and_prints_the_summary(logdir, tmp_path, capsys):
    from analytics.__main__ import main

    out = tmp_path / "report"
    assert main(["analyze", str(logdir), "--out", str(out), "--k", "3", "--d", "3"]) == 0
    captured = capsys.readouterr()
    assert "[1/5] loading logs ..." in captured.err and "[5/5] writing report" in captured.err
    assert "Latency by channel (ms)" in captured.out and f"Report: {out / 'index.html'}" in captured.out
    assert "999.4" in captured.out  # the overall p99
    page = (out / "index.html").read_text()
    expected_plots = ["coverage.png", "latency_cdf.png", "width_over_time.png", "width_histogram.png",
                      "dummies.png", "figure4.png", "figure5.png"]
    for name in expected_plots:
        assert f'src="{name}"' in page
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Never delivered" in page and "Catch-up episodes" in page and "Model check: width" in page
    assert "Rejections" in page and "bad_message" in page and "Monte-Carlo check" in page
    # Issue 13: times in seconds after the run's start, "none" for empty tables, the two
    # event counts side by side with the reason they differ, the model check explained.
    assert "None." not in page and "None." not in captured.out
    assert "<th>start_s</th>" in page and "<th>settle_s</th>" in page and "<th>start_ms</th>" not in page
    assert "max_convergence_s" in captured.out
    assert "events (created or delivered)" in captured.out and "no created record" in captured.out
    assert "Compares the width this run measured" in captured.out and "expected" in captured.out


@pytest.mark.parametrize(
    "option,value,message",
    [
        ("--d", "1", "argument --d: must be in [2, 10000] (with d = 1 the width never converges), got 1"),
        ("--d", "0", "argument --d: must be in [2, 10000]"),
        ("--d", "10001", "argument --d: must be in [2, 10000]"),
        ("--k", "0", "argument --k: must be in [1, 1000000], got 0"),
        ("--k", "1000001", "argument --k: must be in [1, 1000000]"),
        ("--k", "five", "argument --k: not an integer: 'five'"),
    ],
)
def test_analyze_refuses_model_arguments_out_of_range_before_spark(tmp_path, capsys, option, value, message):
    from analytics.__main__ import main

    other = ["--d", "3"] if option == "--k" else []
    with pytest.raises(SystemExit) as exit_info:  # argparse: exit status 2, before any JVM
        main(["analyze", str(tmp_path), "--out", str(tmp_path / "r"), option, value, *other])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("error:") == 1


def test_cli_bounds_are_the_models():
    from analytics import __main__ as cli
    from analytics import model

    assert (cli.MIN_D, cli.MAX_D, cli.MAX_K) == (model.MIN_CONVERGENT_PARENTS, model.MAX_PARENTS, model.MAX_REPLICAS)


@pytest.mark.spark
def test_report_times_are_seconds_after_the_run_start_and_empty_tables_say_none(spark):
    from analytics import report

    df = spark.createDataFrame([(1_700_000_001_500, 2_500, 7)], ["peak_ms", "convergence_ms", "max_lag_ms"])
    table = report.table_from(df, "t", start_ms=1_700_000_000_000)
    assert table.columns == ("peak_s", "convergence_s", "max_lag_ms") and table.rows == ((1.5, 2.5, 7),)
    empty = report.Table("Empty", ("a", "b"), ())
    assert report.format_table(empty).splitlines()[-1] == "none"
    assert '<td colspan="2">none</td>' in report._html_table(empty)


def test_analyze_reports_a_missing_log_directory(tmp_path, capsys):
    from analytics.__main__ import main

    assert main(["analyze", str(tmp_path / "nowhere"), "--out", str(tmp_path / "r")]) == 2
    assert "no such log path" in capsys.readouterr().err


def test_analyze_refuses_an_empty_or_unreadable_log_directory_before_spark(tmp_path, capsys,
                                                                          monkeypatch):
    from analytics import __main__ as cli

    empty = tmp_path / "empty"
    (empty / "node0").mkdir(parents=True)
    (empty / "node0" / "notes.txt").write_text("not a log\n")
    assert cli.main(["analyze", str(empty), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: no log files in {empty}" in err and "*.jsonl" in err
    blank = tmp_path / "blank.jsonl"
    blank.write_text("")
    assert cli.main(["analyze", str(blank), "--out", str(tmp_path / "r")]) == 2
    assert "is empty" in capsys.readouterr().err
    # Tests run as root, for whom every mode bit reads: unreadable as the OS would say it.
    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setattr(cli.os, "access", lambda path, mode: str(path) != str(locked))
    assert cli.main(["analyze", str(locked), "--out", str(tmp_path / "r")]) == 2
    assert f"cannot read the log path {locked}: permission denied" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_analyze_without_the_analytics_extra_prints_the_install_line(tmp_path, capsys,
                                                                     monkeypatch):
    from analytics import __main__ as cli

    monkeypatch.setattr(cli, "missing_modules", lambda: ["pyspark", "pandas"])
    assert cli.main(["analyze", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err == ("error: analyze needs the analytics extra (missing: pyspark, pandas); "
                   "install it with: pip install 'megnode[analytics]'\n")


def test_the_restated_constants_are_the_loaders_and_the_sessions():
    from analytics import __main__ as cli
    from analytics.jobs import load
    from analytics.spark import DEFAULT_MASTER

    assert cli.DEFAULT_MASTER == DEFAULT_MASTER
    suffixes = load.LOG_FILE_GLOB.removeprefix("*.{").removesuffix("}").split(",")
    assert cli.LOG_FILE_SUFFIXES == tuple(f".{s}" for s in suffixes)


@pytest.mark.spark
def test_analyze_of_logs_without_one_valid_record_writes_no_report(spark, tmp_path):
    from analytics import report

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "n.jsonl").write_text("not json\n{\"v\": 1}\n")
    with pytest.raises(report.NoRecords, match=r"no valid log records in .* \(2 lines read, 2 malformed\)"):
        report.analyze(spark, str(logs), tmp_path / "r", progress=open(os.devnull, "w"))
    assert not (tmp_path / "r").exists()
