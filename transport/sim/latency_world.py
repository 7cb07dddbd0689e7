"""The fixed-writers world: delivery latency of the fast paths where an application's writers are fixed.

Issue 14 asks the tree for push's p99 latency at a fraction of its bytes. The
cluster bench (tests/bench/test_fast_path_bench.py) measures that with real
daemons in minutes; this world measures it in seconds, seeded (and explains
it: docs/anti-entropy.md, "Why the tree's p99 trails push's"): `nodes`
replicas on a ring with chords (`neighbours` links each, latencies drawn per
message from `latency_ms`, links that keep order as a stream does), `writers`
of them (the greatest keys) each publishing every `interval_ms` for
`duration_ms`, as the bench's publishers do. With `moving`, half-way through
two writers stop and the two least keys start, so the tree's root moves
(as `tests/transport/test_eager_lazy.py`'s fixed-writers world). With
`loss` and a partition (`partition_ms`: from, to) the checkers run too: every
node converges, SEC holds.

Figures (`measure`): the writes' delivery latency (created at the writer ->
delivered at each other node; p50/p90/p99, from `from_ms` on, once the tree
has formed), how many came by an exchange, the steady counters per node and
write (`duplicates`, `bytes_received`, `tree_held_back`...) from `from_ms`
on, and with the tree, how many hops a write crosses from its writer to each
other node: along the tree's parent links, and on the shortest path over the
links (`paths`).

`python -m transport.sim.latency_world --seeds 1,2,3 --paths push,tree`
prints one JSON line per seed and path.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transport.dissemination_config import DisseminationConfig
from transport.sim.world import Cluster

PATHS = ("push", "tree")
STEADY_KEYS = ("duplicates", "bytes_received", "tree_held_back", "wants_sent",
               "tree_fetches_sent", "received_sync")


@dataclass(frozen=True)
class LatencyWorld:
    seed: int = 1
    path: str = "tree"  # push or tree
    nodes: int = 10
    neighbours: int = 4
    latency_ms: tuple[int, int] = (20, 120)
    writers: int = 5
    interval_ms: int = 25  # each writer publishes this often (5 writers: 200 events/s)
    duration_ms: int = 4_000
    moving: bool = False
    loss: float = 0.0
    partition_ms: tuple[int, int] | None = None
    from_ms: int = 1_000  # latencies and steady counters from here on
    settle_ms: int = 3_000  # after the last write (and the heal)

    def config(self) -> DisseminationConfig:
        if self.path == "push":
            return DisseminationConfig()
        if self.path == "tree":
            return DisseminationConfig(tree=True)
        raise ValueError(f"unknown fast path {self.path!r}")


def _bfs(adjacent: dict[int, set[int]], start: int) -> dict[int, int]:
    hops = {start: 0}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for peer in sorted(adjacent[node]):
            if peer not in hops:
                hops[peer] = hops[node] + 1
                queue.append(peer)
    return hops


def paths(cluster: Cluster, writers: list[int]) -> dict[str, float | None]:
    """Mean hops from a writer to another node: on the shortest path over the links, along
    the tree's parent links (unreachable there: counted as `nodes` hops), and along a
    tree of fewest hops from the same root and from the best root there is."""
    n = len(cluster.members)
    index = {node.node_id: node.index for node in cluster.nodes}
    links: dict[int, set[int]] = {i: set() for i in range(n)}
    tree_links: dict[int, set[int]] = {i: set() for i in range(n)}
    for a, b in cluster.links:
        if a < n and b < n:
            links[a].add(b)
            links[b].add(a)
    for node in cluster.members:
        tree = node.engine.tree_of(cluster.topic)
        parent = None if tree is None else tree.parent
        if parent is not None and parent in index:
            tree_links[node.index].add(index[parent])
            tree_links[index[parent]].add(node.index)
    first = cluster.members[0].engine.tree_of(cluster.topic)
    root_key = None if first is None else first.root(cluster.now_ms)  # (as node 0 sees it)
    root = next((node.index for node in cluster.members
                 if node.identity.public_key == root_key), None)
    breadth_first = {r: _mean_hops(_breadth_first_tree(links, r), writers, n) for r in range(n)}
    return {"shortest": _mean_hops(links, writers, n), "tree": _mean_hops(tree_links, writers, n),
            "breadth_first_from_root": None if root is None else breadth_first[root],
            "breadth_first_best_root": min(breadth_first.values())}


def _mean_hops(adjacent: dict[int, set[int]], writers: list[int], n: int) -> float:
    hops = []
    for writer in writers:
        reach = _bfs(adjacent, writer)
        hops += [reach.get(other, n) for other in range(n) if other != writer]
    return round(sum(hops) / max(1, len(hops)), 2)


def _breadth_first_tree(links: dict[int, set[int]], root: int) -> dict[int, set[int]]:
    """The tree of fewest hops from `root` over `links` (each node's parent: its least
    neighbour one hop nearer), as Plumtree's optimisation of the tree would approach."""
    depth = _bfs(links, root)
    tree: dict[int, set[int]] = {i: set() for i in links}
    for node, d in depth.items():
        if node != root:
            parent = min(p for p in links[node] if depth.get(p) == d - 1)
            tree[node].add(parent)
            tree[parent].add(node)
    return tree


def read_writes(log_dir: Path) -> tuple[dict[str, tuple[str, int]],
                                         list[tuple[str, str, int, str]]]:
    """From a world's logs: each write (a message event) -> (its writer, when it was
    created), and every delivery as (node, event, when, channel)."""
    created: dict[str, tuple[str, int]] = {}
    delivered: list[tuple[str, str, int, str]] = []
    for path in sorted(log_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["type"] == "created" and record.get("kind") == "message":
                created[record["event"]] = (record["node"], record["ts_ms"])
            elif record["type"] == "delivered":
                delivered.append((record["node"], record["event"], record["ts_ms"],
                                  record["channel"]))
    return created, delivered


def measure(world: LatencyWorld) -> dict[str, Any]:
    """Run `world`; its figures (module docstring). Raises AssertionError if a checker fails."""
    with tempfile.TemporaryDirectory() as log_dir:
        cluster = Cluster(world.seed, world.nodes, neighbours=world.neighbours,
                          latency_ms=world.latency_ms, log_dir=log_dir, config=world.config(),
                          authorization=True, loss=world.loss)
        if world.partition_ms is not None:
            cluster.partition([set(range(0, world.nodes, 2)), set(range(1, world.nodes, 2))],
                              world.partition_ms[0], world.partition_ms[1])
        by_key = sorted(cluster.members, key=lambda node: node.identity.public_key)
        steady: dict[str, int] = {}
        steps = world.duration_ms // world.interval_ms
        for step in range(steps):
            now = cluster.now_ms + world.interval_ms
            cluster.run_until(now)
            if now >= world.from_ms and not steady:
                steady = dict(cluster.totals())
            writers = by_key[-world.writers:]
            if world.moving and step >= steps // 2:
                writers = by_key[-world.writers:][:world.writers - 2] + by_key[:2]
            for node in writers:
                event, _ = node.replica.publish(b"reading", now, cluster.rng)
                cluster._apply(node, node.engine.on_publish(cluster.topic, event, now))
        end = max([cluster.now_ms] + ([world.partition_ms[1]] if world.partition_ms else []))
        cluster.run_until(end)
        cluster.heal(clean=False)
        converged_at = cluster.run_to_convergence()
        cluster.check(converged_at is not None)
        cluster.run_until(cluster.now_ms + world.settle_ms)
        totals = cluster.totals()
        hops = paths(cluster, [node.index for node in by_key[-world.writers:]]) \
            if world.path != "push" else None
        cluster.close_logs()
        created, delivered = read_writes(Path(log_dir))
    late = [(at - created[e][1], channel) for node, e, at, channel in delivered
            if e in created and created[e][0] != node and created[e][1] >= world.from_ms]
    latencies = sorted(latency for latency, _ in late)
    writes = sum(1 for _, at in created.values() if at >= world.from_ms)
    per = max(1, writes * world.nodes)

    def quantile(q: int) -> int | None:
        return latencies[len(latencies) * q // 100] if latencies else None

    return {
        "seed": world.seed, "path": world.path, "nodes": world.nodes, "moving": world.moving,
        "loss": world.loss, "p50_ms": quantile(50), "p90_ms": quantile(90),
        "p99_ms": quantile(99), "deliveries": len(latencies),
        "by_exchange": sum(1 for _, channel in late if channel != "gossip"),
        "convergence_ms": None if converged_at is None else converged_at - end,
        "per_node_write": {key: round((totals.get(key, 0) - steady.get(key, 0)) / per, 3)
                           for key in STEADY_KEYS},
        "hops": hops,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m transport.sim.latency_world",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1", help="comma-separated seeds")
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated fast paths")
    parser.add_argument("--nodes", type=int, default=LatencyWorld.nodes)
    parser.add_argument("--moving", action="store_true", help="two writers change half-way")
    parser.add_argument("--loss", type=float, default=0.0)
    parser.add_argument("--partition", type=int, nargs=2, metavar=("FROM", "TO"), default=None,
                        help="split the nodes in two (even, odd) from FROM to TO virtual ms")
    ns = parser.parse_args(argv)
    try:
        for seed in [int(s) for s in ns.seeds.split(",") if s]:
            for path in [p for p in ns.paths.split(",") if p]:
                world = LatencyWorld(seed=seed, path=path, nodes=ns.nodes, moving=ns.moving,
                                     loss=ns.loss, partition_ms=tuple(ns.partition)
                                     if ns.partition else None)
                print(json.dumps(measure(world), sort_keys=True), flush=True)
    except AssertionError as failure:
        print(failure, file=sys.stderr)
        return 1
    except ValueError as bad:
        print(f"latency_world: {bad}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
