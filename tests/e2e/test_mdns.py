"""mDNS discovery: daemons with `mdns = true` and no bootstrap find each other.

The daemons run in network namespaces on one private switch (deploy.netns),
so the multicast stays off the host's own network and the test does not
depend on what the machine's LAN carries. Skipped (with the reason) where
namespaces cannot be built.

One LAN holds both cases, so the negative one costs no daemons of its own
and is the stronger for it: three nodes with mDNS on find each other and
replicate, while a fourth with mDNS off, on the same switch, stays alone —
it neither answers their queries (else they would dial it) nor browses
(else it would dial them) — for a window longer than discovery takes.
"""

import time
from pathlib import Path

import pytest

from deploy.netns import unavailable_reason
from deploy.netns_cluster import NetnsCluster

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no network namespaces: {REASON}")

DISCOVERY_TIMEOUT_S = 30.0
NO_DIAL_WINDOW_S = 4.0  # longer than an mDNS probe + announce + the deferred dial
CONVERGE_TIMEOUT_S = 30.0
POLL_S = 0.5
MDNS_NODES = [0, 1, 2]
SILENT_NODE = 3  # mDNS off


def write_config(directory: Path, mdns: bool) -> Path:
    path = directory / f"node-mdns-{'on' if mdns else 'off'}.toml"
    path.write_text(f"mdns = {'true' if mdns else 'false'}\n")
    return path


class MixedCluster(NetnsCluster):
    """A NetnsCluster whose SILENT_NODE runs with mDNS off, the others with it on."""

    def __init__(self, base_dir: Path, config_dir: Path) -> None:
        super().__init__(base_dir, len(MDNS_NODES) + 1, connect=False)
        self.configs = {True: write_config(config_dir, True), False: write_config(config_dir, False)}

    def start_node(self, index: int, bootstrap: list[str] | None = None):
        self.extra_args = ("--config", str(self.configs[index != SILENT_NODE]))
        return super().start_node(index, bootstrap)


def assert_silent_node_alone(cluster: NetnsCluster) -> None:
    assert cluster.status(SILENT_NODE)["peers"] == []
    silent_peer = cluster.nodes[SILENT_NODE].info["peer_id"]
    for i in MDNS_NODES:
        assert silent_peer not in cluster.status(i)["peers"]


def test_mdns_nodes_find_each_other_and_replicate_and_mdns_off_means_no_discovery(tmp_path):
    with MixedCluster(tmp_path / "run", tmp_path) as cluster:
        silent_since = time.monotonic()  # the silent node started last
        cluster.wait_connected(DISCOVERY_TIMEOUT_S, indices=MDNS_NODES)
        assert_silent_node_alone(cluster)
        topic = cluster.cli(0, "topic", "create", "lan")["topic"]
        for i in (1, 2):
            cluster.cli(i, "topic", "join", topic)
        cluster.wait_joined(topic, CONVERGE_TIMEOUT_S, indices=MDNS_NODES)
        cluster.cli(2, "publish", topic, "found you")
        cluster.wait_delivered(topic, 4 + 2 + 1, CONVERGE_TIMEOUT_S, indices=MDNS_NODES)
        # The window is counted from the silent node's start; discovery above
        # took part of it, with every mDNS node announcing and browsing.
        while True:
            assert_silent_node_alone(cluster)
            if time.monotonic() - silent_since >= NO_DIAL_WINDOW_S:
                break
            time.sleep(POLL_S)
