"""End to end: real `megnode run` processes on 127.0.0.1, driven through the CLI.

Every wait is bounded by a named timeout and polls a condition; nothing
sleeps and hopes.
"""

import json
import signal
import subprocess

import pytest

from deploy.cluster import LocalCluster, megnode_command

DELIVERY_TIMEOUT_S = 60.0
CATCH_UP_TIMEOUT_S = 120.0
# Anti-entropy alone delivers whatever its interval; a short one only makes it sooner.
FAST_ANTI_ENTROPY = "anti_entropy_interval_ms = 500\nanti_entropy_jitter_ms = 100\n"


def subscribe_all(cluster: LocalCluster, index: int, topic: str, count: int) -> list[dict]:
    result = cluster.cli_raw(index, "subscribe", topic, "--kinds", "message,state,ack",
                              "--count", str(count), timeout_s=60)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def subscribe_all_order(cluster: LocalCluster, index: int, topic: str, count: int) -> list[str]:
    result = cluster.cli_raw(index, "subscribe", topic, "--kinds", "message,state,ack",
                             "--order", "confirmed", "--count",
                             str(count), timeout_s=60)
    assert result.returncode == 0, result.stderr
    return [json.loads(line)["id"] for line in result.stdout.splitlines()]


def all_delivered(cluster: LocalCluster, index: int, topic: str) -> list[dict]:
    """Everything node `index` delivered so far (acks included), via `subscribe`."""
    return subscribe_all(cluster, index, topic, cluster.topic_status(index, topic)["delivered"])


def non_acks(events: list[dict]) -> set[str]:
    return {e["id"] for e in events if e["kind"] != "ack"}


def assert_causal_exactly_once(events: list[dict], expected_ids: set[str]) -> None:
    ids = [e["id"] for e in events]
    assert len(ids) == len(set(ids)), "an event was delivered twice"
    assert non_acks(events) == expected_ids
    seen: set[str] = set()
    for event in events:
        assert all(parent in seen for parent in event["parents"]), "delivered before a parent"
        seen.add(event["id"])
    assert [e["position"] for e in events] == list(range(len(events)))


def bootstrap_events(nodes: int) -> int:
    """Create, the creator's join, power levels, join rule, then one join per other node."""
    return 4 + (nodes - 1)


def run_topic(cluster: LocalCluster, publishes_per_node: int) -> tuple[str, int]:
    topic = cluster.cli(0, "topic", "create", "e2e")["topic"]
    for i in range(1, len(cluster.nodes)):
        cluster.cli(i, "topic", "join", topic)
    cluster.wait_joined(topic, DELIVERY_TIMEOUT_S)  # each node's join event is in its state
    for i in range(len(cluster.nodes)):
        lines = "\n".join(f"node {i} message {n}" for n in range(publishes_per_node))
        result = cluster.cli_raw(i, "publish", topic, "-", "--lines", input_text=lines)
        assert result.returncode == 0, result.stderr
    total = bootstrap_events(len(cluster.nodes)) + publishes_per_node * len(cluster.nodes)
    cluster.wait_delivered(topic, total, DELIVERY_TIMEOUT_S)
    return topic, total


@pytest.mark.parametrize("nodes", [2, 5])
def test_every_subscriber_gets_every_event_once_in_causal_order(tmp_path, nodes):
    with LocalCluster(tmp_path, nodes) as cluster:
        topic, total = run_topic(cluster, publishes_per_node=20)
        # One status per node (each CLI call is a process): what it delivered so far,
        # its buffer and rejections, and how long its confirmed order is.
        statuses = [cluster.topic_status(i, topic) for i in range(nodes)]
        delivered = [subscribe_all(cluster, i, topic, statuses[i]["delivered"]) for i in range(nodes)]
        expected = non_acks(delivered[0])
        assert len(expected) == total
        for i in range(nodes):
            assert_causal_exactly_once(delivered[i], expected)
            assert statuses[i]["buffered"] == 0 and statuses[i]["rejected"] == {}
        # The quorum-confirmed order is the same sequence on every node.
        lengths = [status["order"]["confirmed_length"] for status in statuses]
        common = min(lengths)
        assert common > 0
        confirmed = [subscribe_all_order(cluster, i, topic, common) for i in range(nodes)]
        assert all(view == confirmed[0] for view in confirmed)


def test_anti_entropy_alone_delivers_everything(tmp_path):
    config = tmp_path / "node.toml"
    config.write_text(FAST_ANTI_ENTROPY)
    with LocalCluster(tmp_path / "c", 3, fast_path="none", extra_args=("--config", str(config))) as cluster:
        topic, total = run_topic(cluster, publishes_per_node=30)
        for i in range(3):
            status = cluster.topic_status(i, topic)
            assert status["delivered"] - status["acks"] == total


def test_stopped_node_catches_up_and_killed_node_loses_nothing(tmp_path):
    with LocalCluster(tmp_path, 3) as cluster:
        topic = cluster.cli(0, "topic", "create", "catch-up")["topic"]
        for i in (1, 2):
            cluster.cli(i, "topic", "join", topic)
        cluster.wait_joined(topic, DELIVERY_TIMEOUT_S)
        # Node 2 acknowledges events of its own, then is killed without warning.
        lines = "\n".join(f"from node 2, {n}" for n in range(200))
        assert cluster.cli_raw(2, "publish", topic, "-", "--lines", input_text=lines).returncode == 0
        acknowledged = {e["id"] for e in all_delivered(cluster, 2, topic)}
        assert len(acknowledged) >= bootstrap_events(3) + 200
        cluster.kill(2)
        # Node 1 is frozen (SIGSTOP) while node 0 publishes a few thousand events.
        cluster.signal(1, signal.SIGSTOP)
        lines = "\n".join(f"from node 0, {n}" for n in range(3_000))
        assert cluster.cli_raw(0, "publish", topic, "-", "--lines", input_text=lines,
                               timeout_s=120).returncode == 0
        cluster.signal(1, signal.SIGCONT)
        # Node 2 comes back alone (a new port: nobody redials it; it does not dial
        # its peer book), so what it holds now is what its own store kept through
        # the SIGKILL.
        alone = tmp_path / "alone.toml"
        alone.write_text("dial_known_peers = false\n")
        cluster.extra_args = ("--config", str(alone))
        cluster.start_node(2, bootstrap=[])
        assert cluster.status(2)["peers"] == []
        assert acknowledged <= {e["id"] for e in all_delivered(cluster, 2, topic)}
        for address in (cluster.nodes[0].address, cluster.nodes[1].address):
            cluster.cli(2, "connect", address)
        total = bootstrap_events(3) + 200 + 3_000
        cluster.wait_delivered(topic, total, CATCH_UP_TIMEOUT_S)


def test_cli_misuse_gives_one_clear_line_and_sigterm_stops_the_daemon_cleanly(tmp_path):
    """Misuse of the CLI, then (on the same one-node cluster, started with `-v
    --log-file`) a SIGTERM: a clean exit, and the daemon's log in the log file."""
    def run(*args, data_dir=tmp_path / "nodeless"):
        return subprocess.run(megnode_command(*args, "--data-dir", str(data_dir)),
                              capture_output=True, text=True, timeout=60)

    result = run("status")
    assert result.returncode == 3 and "no megnode daemon is running" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1

    bad_key_dir = tmp_path / "badkey"
    bad_key_dir.mkdir()
    (bad_key_dir / "node.key").write_text("not a key\n")
    (bad_key_dir / "node.key").chmod(0o600)
    result = run("run", data_dir=bad_key_dir)
    assert result.returncode == 2 and "malformed" in result.stderr and "Traceback" not in result.stderr

    def assert_one_line(result, *words):
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
        assert all(word in result.stderr for word in words), result.stderr

    assert_one_line(run("run", "--listen", "not-an-address"), "multiaddr")
    assert_one_line(run("run", "--listen", "/ip4/127.0.0.1/tcp/99999"), "not a valid multiaddr")
    assert_one_line(run("run", "--listen", "/ip4/999.0.0.1/tcp/1"), "not a valid multiaddr")
    assert_one_line(run("run", "--bootstrap", "/ip4/127.0.0.1/tcp/4001"), "/p2p/")

    log_file = tmp_path / "daemon.log"
    with LocalCluster(tmp_path / "c", 1, extra_args=("-v", "--log-file", str(log_file))) as cluster:
        result = cluster.cli_raw(0, "topic", "join", "xyz")
        assert result.returncode == 2 and "not a topic id" in result.stderr
        result = cluster.cli_raw(0, "publish", "00" * 32, "hello")
        assert result.returncode == 6 and "not replicated here" in result.stderr
        result = cluster.cli_raw(0, "connect", "/ip4/127.0.0.1/tcp/1")
        assert result.returncode == 2 and "p2p" in result.stderr
        # the data dir is locked by the running daemon
        result = subprocess.run(
            megnode_command("run", "--data-dir", str(cluster.nodes[0].data_dir)),
            capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and "in use" in result.stderr
        assert all("Traceback" not in r for r in (result.stderr,))
        # another node asked to listen on the port the daemon holds
        taken = cluster.nodes[0].address.split("/p2p/")[0]
        assert_one_line(run("run", "--listen", taken, data_dir=tmp_path / "second"),
                        "cannot listen", "in use")
        unwritable = tmp_path / "a-file"
        unwritable.write_text("")
        assert_one_line(run("export-logs", str(unwritable / "logs"),
                            data_dir=cluster.nodes[0].data_dir), "cannot export logs")

        node = cluster.nodes[0]
        assert node.process is not None
        node.process.send_signal(signal.SIGTERM)
        out, _ = node.process.communicate(timeout=60)
        assert node.process.returncode == 0, node.stderr_tail()
        assert {"event": "stopped"} in [json.loads(line) for line in out.splitlines() if line]
    assert "INFO" in log_file.read_text()  # -v: info lines, written to the file
    assert "INFO" not in (cluster.nodes[0].data_dir / "stderr.log").read_text()
