"""mDNS discovery: daemons with `mdns = true` and no bootstrap find each other.

The daemons run in network namespaces on one private switch (deploy.netns),
so the multicast stays off the host's own network and the test does not
depend on what the machine's LAN carries. Skipped (with the reason) where
namespaces cannot be built.
"""

import time

import pytest

from deploy.netns import unavailable_reason
from deploy.netns_cluster import NetnsCluster

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no network namespaces: {REASON}")

DISCOVERY_TIMEOUT_S = 30.0
NO_DIAL_WINDOW_S = 4.0  # longer than an mDNS probe + announce + the deferred dial
CONVERGE_TIMEOUT_S = 30.0


def write_config(tmp_path, mdns: bool):
    path = tmp_path / "node.toml"
    path.write_text(f"mdns = {'true' if mdns else 'false'}\n")
    return path


def test_nodes_with_mdns_and_no_bootstrap_find_each_other_and_replicate(tmp_path):
    config = write_config(tmp_path, mdns=True)
    with NetnsCluster(tmp_path / "run", 3, connect=False,
                      extra_args=("--config", str(config))) as cluster:
        cluster.wait_connected(DISCOVERY_TIMEOUT_S)
        topic = cluster.cli(0, "topic", "create", "lan")["topic"]
        for i in (1, 2):
            cluster.cli(i, "topic", "join", topic)
        cluster.wait_joined(topic, CONVERGE_TIMEOUT_S)
        cluster.cli(2, "publish", topic, "found you")
        cluster.wait_delivered(topic, 4 + 2 + 1, CONVERGE_TIMEOUT_S)


def test_mdns_off_means_no_discovery(tmp_path):
    config = write_config(tmp_path, mdns=False)
    with NetnsCluster(tmp_path / "run", 2, connect=False,
                      extra_args=("--config", str(config))) as cluster:
        deadline = time.monotonic() + NO_DIAL_WINDOW_S
        while time.monotonic() < deadline:
            assert cluster.status(0)["peers"] == [] and cluster.status(1)["peers"] == []
            time.sleep(0.5)
