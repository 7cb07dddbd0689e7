"""`make demo`: the project's main job, end to end, on one machine.

1. Starts a local cluster of real `megnode run` daemons on 127.0.0.1.
2. Creates an open topic on node 0; the others join it by id.
3. Several writers publish for a while (in bursts).
4. Cuts a partition: nodes 3 and 4 are restarted knowing only each other, and
   both sides keep writing; then heals it by dialling across.
5. Waits until every node holds every event, collects the dissemination logs.
6. Runs a deterministic simulation of a larger network (the same protocol on a
   virtual clock, with loss and a partition) and collects its logs too. There
   SIM_WRITERS replicas write concurrently every round with at most SIM_D_MAX
   parents per event and no depletion dummies: the paper's setting with
   k > d, where the model's fixed point lies above k (for k <= d it is k by
   construction and the model check would show nothing).
7. Runs the Spark analyses over both log sets, each with its real k and d, and
   prints where the reports are.

Every wait is bounded; progress goes to stderr. Output lands in `demo-output/`
(override with `--out`).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from deploy.cluster import LocalCluster
from node.core.parents import DEFAULT_D_MAX

NODES = 5
WRITERS = (0, 1, 2)
PARTITION_WRITERS = (0, 3)  # one writer on each side of the cut
BURSTS = 5
EVENTS_PER_BURST = 40
PARTITION_BURSTS = 3
WAIT_S = 120.0
CLUSTER_D_MAX = DEFAULT_D_MAX  # `topic create` without --d-max
SIM_NODES = 100
SIM_SEED = 7
SIM_WRITERS = 20  # concurrent writers per round: the model's k
SIM_D_MAX = 3  # parents per event: the model's d (k > d, so the fixed point is not just k)
SIM_ROUNDS = 30


def say(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def publish_burst(cluster: LocalCluster, index: int, topic: str, label: str) -> None:
    lines = "\n".join(f"{label} node{index} #{n}" for n in range(EVENTS_PER_BURST))
    result = cluster.cli_raw(index, "publish", topic, "-", "--lines", input_text=lines)
    if result.returncode != 0:
        raise SystemExit(f"publish on node {index} failed: {result.stderr.strip()}")


def run_cluster(out: Path) -> tuple[Path, int]:
    """The cluster part; returns its log directory and k, the nodes that wrote messages."""
    cluster_dir = out / "cluster"
    say(f"starting {NODES} megnode daemons on 127.0.0.1 (data in {cluster_dir})")
    with LocalCluster(cluster_dir, NODES) as cluster:
        topic = cluster.cli(0, "topic", "create", "demo-sensors")["topic"]
        say(f"topic {topic} created on node 0; the others join it by id")
        for i in range(1, NODES):
            cluster.cli(i, "topic", "join", topic)
        cluster.wait_joined(topic, WAIT_S)
        published = 0
        for burst in range(BURSTS):
            for writer in WRITERS:
                publish_burst(cluster, writer, topic, f"burst{burst}")
                published += EVENTS_PER_BURST
        say(f"{published} events published by nodes {list(WRITERS)}; cutting a partition "
            "{0,1,2} | {3,4}")
        for i in (3, 4):
            cluster.stop(i)
        # The partition: nodes 3 and 4 come back knowing only each other. Their peer
        # books (docs/fleet.md) would otherwise redial the other side at once.
        partitioned = out / "partitioned.toml"
        partitioned.write_text("dial_known_peers = false\n")
        extra_args = cluster.extra_args
        cluster.extra_args = (*extra_args, "--config", str(partitioned))
        cluster.start_node(3, bootstrap=[])
        cluster.start_node(4, bootstrap=[cluster.nodes[3].address])
        cluster.extra_args = extra_args
        cluster.wait_connected(indices=[3, 4])
        for burst in range(PARTITION_BURSTS):
            for writer in PARTITION_WRITERS:
                publish_burst(cluster, writer, topic, f"partition{burst}")
                published += EVENTS_PER_BURST
        say("both sides wrote while partitioned; healing (node 3 dials node 0)")
        cluster.cli(3, "connect", cluster.nodes[0].address)
        total = 4 + (NODES - 1) + published  # bootstrap state + joins + messages
        took = cluster.wait_delivered(topic, total, WAIT_S)
        say(f"all {NODES} nodes hold all {total} events ({took:.1f} s after the heal)")
        for i in range(NODES):
            status = cluster.topic_status(i, topic)
            say(f"  node{i}: delivered={status['delivered']} extremities={status['extremities']} "
                f"buffered={status['buffered']}")
        logs = out / "cluster-logs"
        for node in cluster.nodes:
            cluster.cli_raw(node.index, "export-logs", str(logs / f"node{node.index}"))
    return logs, len(set(WRITERS) | set(PARTITION_WRITERS))


def run_simulation(out: Path) -> Path:
    from transport.sim import Scenario, run_scenario

    logs = out / "sim-logs"
    scenario = Scenario(seed=SIM_SEED, nodes=SIM_NODES, loss=0.1, rounds=SIM_ROUNDS,
                        writers=SIM_WRITERS, d_max=SIM_D_MAX, depletion=False,
                        partition_at_ms=1_000, heal_at_ms=4_000)
    say(f"simulating {SIM_NODES} replicas, {SIM_WRITERS} writers a round, d_max {SIM_D_MAX}, "
        f"10% loss, a partition healed at 4 s (replay: {scenario.replay_command()} --log-dir DIR)")
    summary = run_scenario(scenario, logs)
    for line in summary.lines():
        say(f"  {line}")
    return logs


def analyze(logs: Path, report: Path, k: int, d: int) -> None:
    # `python -m analytics` as its own process: deploy never imports analytics
    # (the layering contract), and the Spark driver is a program of its own.
    say(f"Spark analysis of {logs} -> {report}")
    status = subprocess.run([sys.executable, "-m", "analytics", "analyze", str(logs),
                             "--out", str(report), "--k", str(k), "--d", str(d)],
                            check=False).returncode
    if status != 0:
        raise SystemExit(f"analysis of {logs} failed ({status})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.demo", description=__doc__)
    parser.add_argument("--out", default="demo-output")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    started = time.monotonic()
    cluster_logs, writers = run_cluster(out)
    sim_logs = run_simulation(out)
    analyze(cluster_logs, out / "report-cluster", k=writers, d=CLUSTER_D_MAX)
    analyze(sim_logs, out / "report-simulation", k=SIM_WRITERS, d=SIM_D_MAX)
    say(f"done in {time.monotonic() - started:.0f} s")
    print(f"\nReports:\n  real cluster: {out / 'report-cluster' / 'index.html'}\n"
          f"  simulation:   {out / 'report-simulation' / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
