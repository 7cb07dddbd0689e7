"""End to end: the `megnode` commands a user meets, and their misuse, against real daemons.

Each documented command and mistake runs as a user would run it (a `megnode`
process against a running daemon) and is checked for its stdout, its one line
on stderr and its exit status (node.cli_surface.EXIT_CODES, docs/control.md).
Two daemons serve most cases (a module-scoped cluster, reused); the cases that
kill a daemon get one of their own. Every wait is bounded; nothing sleeps and hopes.
"""

from __future__ import annotations

import base64
import json
import os
import select
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.cluster import LocalCluster, megnode_command
from node.cli_surface import (EXIT_DAEMON_GONE, EXIT_ENCODING, EXIT_NOT_ALLOWED,
                              EXIT_TOO_LARGE, EXIT_TOPIC_LEFT, EXIT_TOPIC_NOT_FOUND)
from node.core.event import MAX_PAYLOAD_BYTES

WAIT_S = 30.0
ALL_KINDS = ("--kinds", "message,state,ack")
pytestmark = pytest.mark.xdist_group("cli_surface")  # one worker: one cluster for the module


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("cli") / "c", 2) as running:
        yield running


@pytest.fixture(scope="module")
def topic(cluster: LocalCluster) -> str:
    """An open topic node 0 created and node 1 joined (--wait)."""
    topic = cluster.cli(0, "topic", "create", "surface")["topic"]
    joined = cluster.cli(1, "topic", "join", topic, "--wait", "--timeout", str(WAIT_S))
    assert joined == {"topic": topic, "ready": True, "membership": "join"}
    return topic


def run(cluster: LocalCluster, index: int, *args: str, stdin: bytes | None = None,
        ) -> subprocess.CompletedProcess:
    """A `megnode` command on node `index`, bytes in, text out."""
    command = megnode_command(*args, "--data-dir", str(cluster.nodes[index].data_dir))
    result = subprocess.run(command, capture_output=True, input=stdin, timeout=WAIT_S * 2,
                            env=cluster.env)
    return subprocess.CompletedProcess(result.args, result.returncode,
                                       result.stdout.decode(), result.stderr.decode())


def one_line_error(result: subprocess.CompletedProcess, status: int, *words: str) -> str:
    """The failure is one `megnode: ...` line on stderr, nothing on stdout but results."""
    assert result.returncode == status, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("megnode: "), result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert all(word in lines[0] for word in words), lines[0]
    return lines[0]


def events(cluster: LocalCluster, index: int, topic: str, *args: str) -> list[dict]:
    """Every event node `index` delivered so far, as `subscribe` prints them."""
    count = cluster.topic_status(index, topic)["delivered"]
    result = run(cluster, index, "subscribe", topic, *ALL_KINDS, "--count", str(count), *args)
    assert result.returncode == 0 and not result.stderr, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def message_payloads(cluster: LocalCluster, index: int, topic: str) -> list[str]:
    return [e.get("payload", "") for e in events(cluster, index, topic) if e["kind"] == "message"]


def daemon_log_clean(cluster: LocalCluster, index: int) -> None:
    """Bad input never leaves a traceback (or an error) in the daemon's log."""
    log = cluster.nodes[index].stderr_tail()
    assert "Traceback" not in log and "ERROR" not in log, log


def test_publish_one_payload_and_its_misuse(cluster: LocalCluster, topic: str,
                                            tmp_path: Path) -> None:
    published = run(cluster, 0, "publish", topic, "21.5C")
    assert published.returncode == 0 and not published.stderr
    event_id = json.loads(published.stdout)["id"]
    assert len(event_id) == 64

    big = tmp_path / "big"
    big.write_bytes(b"a" * (MAX_PAYLOAD_BYTES + 1))
    one_line_error(run(cluster, 0, "publish", topic, "--file", str(big)), EXIT_TOO_LARGE,
                   f"{MAX_PAYLOAD_BYTES + 1} bytes", f"limit of {MAX_PAYLOAD_BYTES} bytes")
    at_limit = tmp_path / "at-limit"
    at_limit.write_bytes(b"a" * MAX_PAYLOAD_BYTES)
    assert run(cluster, 0, "publish", topic, "--file", str(at_limit)).returncode == 0

    one_line_error(run(cluster, 0, "publish", topic, "-", stdin=b"caf\xe9"), EXIT_ENCODING,
                   "not UTF-8", "--binary")
    one_line_error(run(cluster, 0, "publish", topic, "--base64", "not base64!"), EXIT_ENCODING,
                   "base64")
    one_line_error(run(cluster, 0, "publish", "ab" * 32, "hello"), EXIT_TOPIC_NOT_FOUND,
                   "not replicated here")
    one_line_error(run(cluster, 0, "publish", "xyz", "hello"), 2, "not a topic id")
    one_line_error(run(cluster, 0, "publish", topic), 2, "give a MESSAGE")
    daemon_log_clean(cluster, 0)


def test_binary_payloads_round_trip(cluster: LocalCluster, topic: str, tmp_path: Path) -> None:
    blob = bytes(range(256)) * 4
    path = tmp_path / "blob.bin"
    path.write_bytes(blob)
    first = json.loads(run(cluster, 0, "publish", topic, "--file", str(path), "--binary").stdout)
    encoded = base64.b64encode(b"\x00\xff\xfe").decode()
    second = json.loads(run(cluster, 0, "publish", topic, "--base64", encoded).stdout)
    cluster.wait_delivered(topic, cluster.topic_status(0, topic)["delivered"]
                           - cluster.topic_status(0, topic)["acks"], WAIT_S)
    by_id = {e["id"]: e for e in events(cluster, 1, topic, "--base64")}  # at the other node
    assert base64.b64decode(by_id[first["id"]]["payload_b64"]) == blob
    assert base64.b64decode(by_id[second["id"]]["payload_b64"]) == b"\x00\xff\xfe"
    assert all("payload" not in e for e in by_id.values())  # --base64: every payload so


def test_publish_lines_stops_at_a_bad_line_and_says_what_was_stored(
        cluster: LocalCluster, topic: str) -> None:
    lines = [f"reading {n}".encode() for n in range(5)] + [b"\xff bad"] + [b"never"] * 3
    result = run(cluster, 0, "publish", topic, "--lines", stdin=b"\n".join(lines) + b"\n")
    error = one_line_error(result, EXIT_ENCODING, "line 6", "not UTF-8",
                           "lines 1-5 stored", "line 6 and after not published")
    reports = [json.loads(line) for line in result.stdout.splitlines()]
    assert reports and reports[-1]["lines"][1] == 5, (reports, error)
    assert sum(r["published"] for r in reports) == 5
    stored = message_payloads(cluster, 0, topic)
    assert [f"reading {n}" for n in range(5)] == [p for p in stored if p.startswith("reading")]
    assert "never" not in stored

    oversize = b"ok\n" + b"x" * (MAX_PAYLOAD_BYTES + 10) + b"\nafter\n"
    one_line_error(run(cluster, 0, "publish", topic, "--lines", stdin=oversize), EXIT_TOO_LARGE,
                   "line 2", "lines 1-1 stored")
    assert "after" not in message_payloads(cluster, 0, topic)
    daemon_log_clean(cluster, 0)


def test_join_wait_list_members_info(cluster: LocalCluster, topic: str) -> None:
    invite = cluster.cli(0, "topic", "create", "members only", "--access", "invite")["topic"]
    one_line_error(run(cluster, 1, "topic", "join", invite, "--wait"), EXIT_TOPIC_NOT_FOUND,
                   "not found or you are not invited")
    node1 = cluster.nodes[1].node_id
    cluster.cli(0, "topic", "invite", invite, node1)
    joined = cluster.cli(1, "topic", "join", invite, "--wait", "--timeout", str(WAIT_S))
    assert joined["membership"] == "join"
    # Invited and joined, but an invite topic's member may not write until granted.
    one_line_error(run(cluster, 1, "publish", invite, "hello"), EXIT_NOT_ALLOWED, "not a writer")
    cluster.cli(0, "topic", "add-writer", invite, node1)
    deadline = time.monotonic() + WAIT_S
    while (result := run(cluster, 1, "publish", invite, "granted")).returncode != 0:
        assert time.monotonic() < deadline, result.stderr  # the grant reaches node 1
        one_line_error(result, EXIT_NOT_ALLOWED)

    listed = cluster.cli(1, "topic", "list")["topics"]
    assert {t["topic"] for t in listed} == {topic, invite}
    assert all(t["membership"] == "join" for t in listed)
    members = cluster.cli(0, "topic", "members", invite)
    assert members["count"] == 2
    roles = {m["member"]: (m["membership"], m["role"]) for m in members["members"]}
    assert roles[cluster.nodes[0].node_id] == ("join", "indexer")
    assert roles[node1][0] == "join"
    info = cluster.cli(0, "topic", "info", invite)["info"]
    assert info["access"] == "invite" and info["members"] == {"join": 2}
    assert info["peers"] == [node1]
    one_line_error(run(cluster, 0, "topic", "info", "cd" * 32), EXIT_TOPIC_NOT_FOUND)


def test_subscribe_filters_resumes_and_ends_on_leave_and_ban(cluster: LocalCluster,
                                                             topic: str) -> None:
    for n in range(2):
        cluster.cli(0, "publish", topic, f"to resume {n}")
    everything = events(cluster, 0, topic)
    messages = run(cluster, 0, "subscribe", topic, "--count", "2")
    assert messages.returncode == 0
    lines = [json.loads(line) for line in messages.stdout.splitlines()]
    assert [e["kind"] for e in lines] == ["message", "message"]  # default: messages only
    resumed = run(cluster, 0, "subscribe", topic, "--since", lines[0]["id"], "--count", "1")
    assert json.loads(resumed.stdout)["id"] == lines[1]["id"]
    by_cursor = run(cluster, 0, "subscribe", topic, *ALL_KINDS, "--since",
                    str(everything[-2]["cursor"]), "--count", "1")
    assert json.loads(by_cursor.stdout)["id"] == everything[-1]["id"]
    one_line_error(run(cluster, 0, "subscribe", topic, "--since", "ef" * 32), 2, "not in")
    one_line_error(run(cluster, 0, "subscribe", topic, "--kinds", "gossip"), 2, "kinds")

    # Left while streaming: one line on stderr, exit 9, nothing but events on stdout.
    # (An open topic: an invite topic's members send a banned node nothing after its
    # ban, the ban itself included, so there its subscription cannot learn of it.)
    banning = cluster.cli(0, "topic", "create", "ban test")["topic"]
    node1 = cluster.nodes[1].node_id
    cluster.cli(1, "topic", "join", banning, "--wait", "--timeout", str(WAIT_S))
    streaming = subscriber(cluster, 1, topic)
    cluster.cli(1, "topic", "leave", topic)
    result = finished(streaming)
    one_line_error(result, EXIT_TOPIC_LEFT, "topic was left")
    assert all(json.loads(line)["kind"] == "message" for line in result.stdout.splitlines())

    # Banned while streaming: exit 7 once the ban reaches it.
    streaming = subscriber(cluster, 1, banning)
    cluster.cli(0, "topic", "ban", banning, node1)
    one_line_error(finished(streaming), EXIT_NOT_ALLOWED, "banned")
    cluster.cli(1, "topic", "join", topic, "--wait", "--timeout", str(WAIT_S))  # as it was


def subscriber(cluster: LocalCluster, index: int, topic: str) -> subprocess.Popen:
    """A `megnode subscribe` left streaming; returns once it printed a message node
    `index` published for it (so the daemon is streaming to it)."""
    before = cluster.cli(index, "publish", topic, "before the subscriber")["id"]
    marker = cluster.cli(index, "publish", topic, "marker")["id"]
    process = subprocess.Popen(
        megnode_command("subscribe", topic, "--since", before,
                        "--data-dir", str(cluster.nodes[index].data_dir)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env)
    assert process.stdout is not None
    readable, _, _ = select.select([process.stdout], [], [], WAIT_S)
    assert readable, "the subscriber printed nothing"
    assert json.loads(process.stdout.readline())["id"] == marker
    return process


def finished(process: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = process.communicate(timeout=WAIT_S)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def test_a_daemon_that_dies_is_one_line_and_exit_3(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", 1) as single:
        topic = single.cli(0, "topic", "create", "doomed")["topic"]
        streaming = subscriber(single, 0, topic)
        data_dir = str(single.nodes[0].data_dir)
        # A sensor pipe: lines keep coming; the daemon is killed while they do.
        feeder = subprocess.Popen(
            megnode_command("publish", topic, "--lines", "--data-dir", data_dir),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=single.env)
        assert feeder.stdin is not None and feeder.stdout is not None
        feeder.stdin.write(b"one\ntwo\n")
        feeder.stdin.flush()
        report = json.loads(feeder.stdout.readline())  # streamed: stored before stdin closes
        assert report["lines"] == [1, 2] and report["published"] == 2
        single.kill(0)
        rest, stderr = feeder.communicate(b"three\n", timeout=WAIT_S)
        result = subprocess.CompletedProcess(feeder.args, feeder.returncode, rest.decode(),
                                             stderr.decode())
        one_line_error(result, EXIT_DAEMON_GONE, "lines 3-3", "lines 1-2 stored")
        one_line_error(finished(streaming), EXIT_DAEMON_GONE, "daemon went away")
        one_line_error(run(single, 0, "status"), EXIT_DAEMON_GONE, "no megnode daemon")


def test_no_daemon_and_help(tmp_path: Path) -> None:
    result = subprocess.run(megnode_command("publish", "ab" * 32, "x", "--data-dir",
                                            str(tmp_path)), capture_output=True, text=True,
                            timeout=WAIT_S, env={**os.environ})
    one_line_error(result, EXIT_DAEMON_GONE, "no megnode daemon is running")
    help_text = subprocess.run(megnode_command("topic", "join", "--help"), capture_output=True,
                               text=True, timeout=WAIT_S).stdout
    assert "megnode topic join" in help_text and "example:" in help_text
    assert "(default: 10.0)" in help_text
