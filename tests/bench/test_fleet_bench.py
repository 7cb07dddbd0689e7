"""A fleet that heals itself (issue 12): reconnects, mesh from one bootstrap, discovery traffic.

bench-results/fleet.json:

* reconnect_s: a node restarted on the same port with no bootstrap list; seconds
  from its start until its peer is connected again. "after" is the node as it
  is (py-libp2p's negative dial cache lifted before each dial, the restarted
  node dials its peer book); "before" reproduces the old behaviour in the same
  run (the cache left alone, `dial_known_peers = false`): its peer's redials
  are refused by the library for 60 s after the first failed one. In-process
  nodes on 127.0.0.1.
* mesh_10_s: ten real daemons, nine bootstrapped only from node 0, one open
  topic they all join; seconds from the last join until each has the other
  nine as peers (peer exchange).
* discovery_bytes_per_s_per_node: peer-exchange bytes (sent + received) per
  node per second over a window at rest after the mesh formed.
"""

from __future__ import annotations

import socket
import time

import pytest
import trio

from deploy.cluster import LocalCluster
from node.config import NodeConfig
from node.runtime import Node
from transport import libp2p_host

MESH_NODES = 10
REST_WINDOW_S = 30.0
WAIT_S = 120.0
POLL_S = 0.05


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def restart_reconnect_s(tmp_path, legacy: bool, monkeypatch) -> float:
    if legacy:
        monkeypatch.setattr(libp2p_host, "forget_failed_dials", lambda host, peer: None)
    config = NodeConfig(dial_known_peers=not legacy)
    listen = [f"/ip4/127.0.0.1/tcp/{free_port()}"]
    async with Node.open(tmp_path / "a", seed=1) as a:
        async with Node.open(tmp_path / "b", listen=listen, seed=2) as b:
            await b.connect(a.addresses[0])
            with trio.fail_after(WAIT_S):
                while not b.status()["peer_book"]["peers"] or b.status()["peer_book"]["unsaved"]:
                    await trio.sleep(POLL_S)
        await trio.sleep(3.0)  # down long enough for a's first redials to fail
        start = trio.current_time()
        async with Node.open(tmp_path / "b", listen=listen, seed=2, config=config) as b:
            with trio.fail_after(WAIT_S):
                while a.host.peer_id not in b.host.peers():
                    await trio.sleep(POLL_S)
            return trio.current_time() - start


@pytest.mark.parametrize("legacy", [False, True])
async def test_reconnect_after_restart(tmp_path, legacy, monkeypatch, record_figures) -> None:
    took = await restart_reconnect_s(tmp_path, legacy, monkeypatch)
    record_figures(f"fleet_reconnect_{'before' if legacy else 'after'}",
                   {"reconnect_s": round(took, 2)})


def test_mesh_from_one_bootstrap_and_discovery_at_rest(tmp_path, record_figures) -> None:
    cluster = LocalCluster(tmp_path / "c", MESH_NODES)
    try:
        cluster.start_node(0, bootstrap=[])
        for i in range(1, MESH_NODES):
            cluster.start_node(i, bootstrap=[cluster.nodes[0].address])
        topic = cluster.cli(0, "topic", "create", "fleet")["topic"]
        for i in range(1, MESH_NODES):
            cluster.cli(i, "topic", "join", topic)
        start = time.monotonic()
        cluster.wait_connected(WAIT_S)
        mesh_s = time.monotonic() - start

        def px_bytes() -> int:
            return sum(cluster.status(i)["stats"]["px_bytes_sent"]
                       + cluster.status(i)["stats"]["px_bytes_received"]
                       for i in range(MESH_NODES))

        before = px_bytes()
        time.sleep(REST_WINDOW_S)
        rest = (px_bytes() - before) / REST_WINDOW_S / MESH_NODES
        record_figures("fleet_mesh", {"nodes": MESH_NODES, "mesh_10_s": round(mesh_s, 2),
                                      "discovery_bytes_per_s_per_node": round(rest, 1),
                                      "rest_window_s": REST_WINDOW_S})
    finally:
        cluster.close()
