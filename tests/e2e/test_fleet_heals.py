"""A fleet that heals itself, with real `megnode run` processes (issue 12).

* A node restarted with an empty bootstrap list, on a new port, is back with
  its peers within seconds: it dials them from its peer book.
"""

from __future__ import annotations

import time

from deploy.cluster import LocalCluster

RECONNECT_BOUND_S = 10.0  # the target is 3 s; generous for a loaded 2-core machine
POLL_S = 0.05
WAIT_S = 30.0


def wait_for(condition, timeout_s: float = WAIT_S) -> float:
    """Poll `condition` until true; the seconds it took (AssertionError past the bound)."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not within {timeout_s} s")
        time.sleep(POLL_S)
    return time.monotonic() - start


def test_a_restarted_node_is_back_with_its_peers_within_seconds(tmp_path) -> None:
    with LocalCluster(tmp_path / "c", 3) as cluster:
        others = {cluster.nodes[i].info["peer_id"] for i in (0, 1)}
        wait_for(lambda: not cluster.status(2)["peer_book"]["unsaved"]
                 and cluster.status(2)["peer_book"]["peers"] >= 2)
        cluster.stop(2)
        cluster.start_node(2, bootstrap=[])  # a new port, no bootstrap list
        took = wait_for(lambda: others <= set(cluster.status(2)["peers"]), RECONNECT_BOUND_S)
        me = cluster.nodes[2].info["peer_id"]
        wait_for(lambda: all(me in cluster.status(i)["peers"] for i in (0, 1)), RECONNECT_BOUND_S)
        print(f"reconnected in {took:.2f} s after the restarted node said it started")
