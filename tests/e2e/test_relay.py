"""End to end: a keys-only device publishes through a real `megnode run` relay.

Two daemons on 127.0.0.1 (deploy.cluster.LocalCluster) share an invite-only
topic. An admin grants a device key the writing level; the device, with
nothing but its key file, joins as a relayed writer and publishes lines via
`megnode relay-publish`. The lines must reach the other daemon and appear,
in the device's order, in its confirmed total order. A key nobody granted
is refused with one line: "not found", as for an unknown topic. Every wait is bounded and polls.
"""

import json
import subprocess
import time
from pathlib import Path

import pytest

from deploy.cluster import LocalCluster, megnode_command

DELIVERY_TIMEOUT_S = 60.0
CLI_TIMEOUT_S = 60.0
POLL_S = 0.3
LINES = 10


def keygen(path: Path) -> str:
    result = subprocess.run(megnode_command("keygen", "--key-file", str(path)),
                            capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["public_key"]


def relay_publish(key: Path, relay: str, topic: str, *extra: str,
                  input_text: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        megnode_command("relay-publish", topic, *extra, "--key", str(key), "--relay", relay),
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S, input=input_text)


def wait_confirmed(cluster: LocalCluster, index: int, topic: str, ids: list[str]) -> list[str]:
    """Node `index`'s confirmed order once it holds every id of `ids` (bounded)."""
    deadline = time.monotonic() + DELIVERY_TIMEOUT_S
    while True:
        order = cluster.topic_status(index, topic).get("order") or {}
        length = order.get("confirmed_length", 0)
        if length:
            result = cluster.cli_raw(index, "subscribe", topic, "--order", "confirmed",
                                     "--kinds", "message,state,ack",
                                     "--count", str(length), timeout_s=CLI_TIMEOUT_S)
            assert result.returncode == 0, result.stderr
            confirmed = [json.loads(line)["id"] for line in result.stdout.splitlines()]
            if set(ids) <= set(confirmed):
                return confirmed
        assert time.monotonic() < deadline, f"{ids} not all confirmed on node {index}"
        time.sleep(POLL_S)


@pytest.mark.parametrize("fast_path", ["tree", "push", "gossipsub"])
def test_device_publishes_via_relay_into_the_confirmed_order(tmp_path, fast_path):
    with LocalCluster(tmp_path / "cluster", 2, fast_path=fast_path) as cluster:
        topic = cluster.cli(0, "topic", "create", "sensors", "--access", "invite")["topic"]
        cluster.cli(0, "topic", "add-writer", topic, cluster.nodes[1].node_id)
        cluster.cli(1, "topic", "join", topic)
        cluster.wait_joined(topic, DELIVERY_TIMEOUT_S)
        device_key = tmp_path / "device.key"
        cluster.cli(0, "topic", "add-writer", topic, keygen(device_key))
        relay = cluster.nodes[0].address
        lines = "\n".join(f"reading {n}" for n in range(LINES))

        result = relay_publish(device_key, relay, topic, "-", "--join", "--lines",
                               input_text=lines)
        assert result.returncode == 0, result.stderr
        printed = [json.loads(line) for line in result.stdout.splitlines()]
        assert "joined" in printed[0]
        ids = [entry["id"] for entry in printed[1:]]
        assert len(ids) == LINES

        confirmed = wait_confirmed(cluster, 1, topic, ids)
        positions = [confirmed.index(i) for i in ids]
        assert positions == sorted(positions)  # the device's chain, in its order
        assert wait_confirmed(cluster, 0, topic, ids)[:len(confirmed)] == confirmed

        stranger_key = tmp_path / "stranger.key"
        keygen(stranger_key)
        result = relay_publish(stranger_key, relay, topic, "hello")
        assert result.returncode == 2
        # An invite-only topic: a key that is no member hears "not found", as for a topic
        # the relay never heard of (docs/access.md), in one line.
        assert "unknown_topic" in result.stderr and len(result.stderr.strip().splitlines()) == 1
        result = relay_publish(stranger_key, relay, "beef", "hello")
        assert result.returncode == 2 and "not a topic id" in result.stderr
