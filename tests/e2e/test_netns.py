"""End to end on a network we control: real daemons in network namespaces.

Each node runs in its own namespace behind a userspace switch
(deploy.netwire) that adds delay and loss and cuts links. The properties:
a lossy, slow LAN still delivers everything to everyone; a partition in
which both sides keep publishing converges after it heals, within a bound;
and teardown leaves no namespace behind. The first two are phases of one
test on one cluster (daemons and a topic cost seconds to set up), which runs
anti-entropy every 500 ms instead of 2 s so that a round fits into a short
partition window. Every wait polls a condition with a bound. Skipped (with
the reason) where namespaces cannot be built: not root, no `ip`, no
/dev/net/tun.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.netns import NetnsLan, cleanup_stale, existing_namespaces, unavailable_reason
from deploy.netns_cluster import NetnsCluster
from deploy.netwire import Netem

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no network namespaces: {REASON}")

DELAY_MS = 50
LOSS_PERCENT = 10
JOIN_TIMEOUT_S = 30.0
CONVERGE_TIMEOUT_S = 30.0
ANTI_ENTROPY_INTERVAL_MS = 500
ANTI_ENTROPY_JITTER_MS = 100
# Long enough for pushes and (twice over) an anti-entropy round to be tried and cut.
PARTITION_SETTLE_S = 2 * (ANTI_ENTROPY_INTERVAL_MS + ANTI_ENTROPY_JITTER_MS) / 1000
MESSAGES_PER_NODE = 5
ECHO_PORT = 9_000
PROBE_TIMEOUT_S = 3.0  # a connect across a cut link gives up after this

ECHO_SERVER = f"""
import socket
server = socket.create_server(("0.0.0.0", {ECHO_PORT}))
print("ready", flush=True)
while True:
    connection, _ = server.accept()
    connection.sendall(connection.recv(16))
    connection.close()
"""

ROUND_TRIP_CLIENT = """
import socket, sys, time
start = time.monotonic()
try:
    with socket.create_connection((sys.argv[1], {port}), timeout={timeout}) as s:
        s.sendall(b"ping")
        s.recv(16)
except OSError:
    print("unreachable")
else:
    print(round((time.monotonic() - start) * 1000))
""".format(port=ECHO_PORT, timeout=PROBE_TIMEOUT_S)


def bootstrap_events(nodes: int) -> int:
    """Create, the creator's join, power levels, join rule, then one join per other node."""
    return 4 + (nodes - 1)


def our_namespaces() -> list[str]:
    mine = f"mn{os.getpid()}x"
    return [name for name in existing_namespaces() if name.startswith(mine)]


@pytest.fixture(autouse=True)
def no_namespaces_left():
    cleanup_stale()  # leftovers of killed runs must not be mistaken for ours
    yield
    assert our_namespaces() == [], "teardown left namespaces behind"


def publish(cluster: NetnsCluster, index: int, topic: str, label: str) -> None:
    lines = "\n".join(f"{label} node {index} message {n}" for n in range(MESSAGES_PER_NODE))
    result = cluster.cli_raw(index, "publish", topic, "-", "--lines", input_text=lines)
    assert result.returncode == 0, result.stderr


def event_ids(cluster: NetnsCluster, index: int, topic: str) -> set[str]:
    delivered = cluster.topic_status(index, topic)["delivered"]
    result = cluster.cli_raw(index, "subscribe", topic, "--kinds", "message,state,ack",
                             "--count", str(delivered), timeout_s=30)
    assert result.returncode == 0, result.stderr
    return {json.loads(line)["id"] for line in result.stdout.splitlines()
            if json.loads(line)["kind"] != "ack"}


def create_and_join(cluster: NetnsCluster) -> str:
    topic = cluster.cli(0, "topic", "create", "lan")["topic"]
    for i in range(1, len(cluster.nodes)):
        cluster.cli(i, "topic", "join", topic)
    cluster.wait_joined(topic, JOIN_TIMEOUT_S)
    return topic


def write_config(directory: Path) -> Path:
    path = directory / "node.toml"
    path.write_text(f"anti_entropy_interval_ms = {ANTI_ENTROPY_INTERVAL_MS}\n"
                    f"anti_entropy_jitter_ms = {ANTI_ENTROPY_JITTER_MS}\n")
    return path


def delivered_counts(cluster: NetnsCluster, topic: str) -> dict[int, int]:
    counts = {}
    for i in range(len(cluster.nodes)):
        status = cluster.topic_status(i, topic)
        counts[i] = status["delivered"] - status.get("acks", 0)
    return counts


def test_lossy_lan_delivers_everything_then_a_partition_converges_after_heal(tmp_path):
    nodes = 4
    netem = Netem(delay_ms=DELAY_MS, loss_percent=LOSS_PERCENT)
    with NetnsCluster(tmp_path / "run", nodes, netem=netem, seed=1,
                      extra_args=("--config", str(write_config(tmp_path)))) as cluster:
        assert all(n.address.startswith("/ip4/10.77.") for n in cluster.nodes)
        topic = create_and_join(cluster)

        # Phase 1, a lossy, slow LAN: everything reaches everyone.
        for i in range(nodes):
            publish(cluster, i, topic, "lossy")
        before = bootstrap_events(nodes) + nodes * MESSAGES_PER_NODE
        cluster.wait_delivered(topic, before, CONVERGE_TIMEOUT_S)
        assert cluster.lan.wire is not None and cluster.lan.wire.stats["lost"] > 0
        reference = event_ids(cluster, 0, topic)
        assert len(reference) == before
        assert all(event_ids(cluster, i, topic) == reference for i in range(1, nodes))

        # Phase 2, a partition with writes on both sides (no loss, a little delay).
        cluster.lan.set_netem(delay_ms=DELAY_MS / 5)
        cluster.lan.partition([[0, 1], [2, 3]])
        for i in range(nodes):
            publish(cluster, i, topic, "split")
        side = before + 2 * MESSAGES_PER_NODE
        cluster.wait_delivered(topic, side, CONVERGE_TIMEOUT_S)  # each side has its own writes
        deadline = time.monotonic() + PARTITION_SETTLE_S
        while True:  # and, while cut, never the other side's
            counts = delivered_counts(cluster, topic)
            assert all(c == side for c in counts.values()), counts
            if time.monotonic() >= deadline:
                break
            time.sleep(0.25)

        cluster.lan.heal()
        healed_at = time.monotonic()
        total = before + nodes * MESSAGES_PER_NODE
        cluster.wait_delivered(topic, total, CONVERGE_TIMEOUT_S)
        print(f"converged {time.monotonic() - healed_at:.1f} s after heal")
        reference = event_ids(cluster, 0, topic)
        assert len(reference) == total
        assert all(event_ids(cluster, i, topic) == reference for i in range(1, nodes))


def probe_ms(lan: NetnsLan, source: int, target: int) -> float | None:
    """Connect + one echo from `source` to `target` (two round trips), or None if cut."""
    result = subprocess.run([*lan.exec_prefix(source), sys.executable, "-c", ROUND_TRIP_CLIENT,
                             lan.address(target)], capture_output=True, text=True,
                            timeout=PROBE_TIMEOUT_S + 5)
    out = result.stdout.strip()
    assert out, result.stderr
    return None if out == "unreachable" else float(out)


def test_the_lan_delays_and_cuts_real_packets():
    with NetnsLan(3) as lan:
        servers = [subprocess.Popen([*lan.exec_prefix(i), sys.executable, "-c", ECHO_SERVER],
                                    stdout=subprocess.PIPE, text=True) for i in (1, 2)]
        try:
            for server in servers:  # a server that dies closes stdout: fails here, never hangs
                assert server.stdout is not None and server.stdout.readline().strip() == "ready"
            clean = probe_ms(lan, 0, 1)
            assert clean is not None
            lan.set_netem(delay_ms=DELAY_MS)
            slow = probe_ms(lan, 0, 1)
            # Two round trips, each crossing two shaped egresses: at least 4 x the delay.
            assert slow is not None and slow >= 4 * DELAY_MS
            lan.clear_netem()
            lan.partition([[0], [1, 2]])
            assert probe_ms(lan, 0, 1) is None
            assert probe_ms(lan, 1, 2) is not None  # inside a group the link still works
            lan.heal()
            assert probe_ms(lan, 0, 2) is not None
        finally:
            for server in servers:
                server.kill()
                server.wait()


def test_lan_teardown_runs_when_the_body_fails():
    with pytest.raises(RuntimeError):
        with NetnsLan(2) as lan:
            assert len(our_namespaces()) == 2 and lan.wire is not None
            raise RuntimeError("the test body failed")
    assert our_namespaces() == []
