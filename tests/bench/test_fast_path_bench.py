"""Issue 14's cluster figures: push, gossipsub and tree in one run, bytes counted on the wire.

Real `megnode run` daemons on loopback, MEGNODE_BENCH_FP_NODES (default 10)
of them, each dialling MEGNODE_BENCH_FP_DIALS (default 3) random others
(seeded), so each holds 3-8 connections: not a star, not a full mesh. The
connection manager is held there (connections_low 2, connections_high 8,
no redial of known peers) so peer exchange does not complete the mesh.

For each publish mode (single: one `publish` per event; batch: one
`publish_batch` per publisher tick) and each fast path, the first
min(nodes, 5) nodes publish MEGNODE_BENCH_RATE (default 200) events/s in
total for MEGNODE_BENCH_SECONDS (default 30) after a 3 s warm-up, then the
bench waits until every node delivered every event (the bound of the
dissemination bench). The issue's other figures: MEGNODE_BENCH_FP_NODES=5
(bench-results/fast_paths_n5.json) and MEGNODE_BENCH_RATE=1000
(fast_paths_r1000.json). Figures:

* wire_bytes_per_node_event: TCP payload bytes the daemons' sockets received
  (`ss -ti` bytes_received, per connection, sampled every WIRE_SAMPLE_S: all
  libp2p framing, noise, yamux, acks and anti-entropy included; gossipsub's
  own traffic too), from just before publishing to the end of the drain,
  / nodes / events in the run;
  `wire_x_event` divides that by the mean encoded event size (the engines'
  `event_bytes_sent / events_sent`); the target is <= 1.5;
* duplicates_per_node_event: the `duplicate` records / events / nodes;
* latency_ms: created -> delivered at every other node (p50/p90/p99);
  latency_from_due_ms: from the time the event was due at its publisher
  (what the application sees: it includes the publish call's wait when the
  daemon is behind); events_in_run against events_offered, and
  publish_start_lag_ms, say whether the publishers kept the rate (see
  tests/bench/test_cluster_bench.py, "Publishing");
* cpu_ms_per_node_event (user, system) and cpu_cores_busy: the daemons' CPU
  from the first publish to the end of the drain (/proc), per node and event
  and in cores. Ten daemons on two cores keep a rate only while the cores
  busy stay below two: past that every path falls behind and its latency is
  the queue's (docs/anti-entropy.md, "What the bench's machine sustains");
  `cpu_saturated` says a run was there (SATURATED_SHARE of the cores or more);
* delivery_ratio: must be 1;
* where the bytes and duplicates come from (issue 14's tree work):
  `breakdown` (bytes sent by message kind and the framing, per node and
  event, x event; the tree's counters per node and event), `per_node` (the
  tree's counters of each node: one node holding copies back shows there;
  and its `tree_lateness_ms` at the end of the drain, the measure its tree
  timers stretch to, transport.tree_lateness: absent when the tree had been
  quiet for SYNC_HOLD_MS by then, since the measure starts afresh),
  `duplicates_by_channel` and `latency_by_channel` (gossip: the fast path,
  grafts included; sync: exchanges and wants). MEGNODE_BENCH_FP_CONFIG adds
  node config lines (`;`-separated) for experiments.

The machine is shared (other benches may run at once): compare ratios
between the fast paths of one run, not absolute times. MEGNODE_BENCH_REPEATS
(default 1) runs each mode's paths that many times, in turn forwards and
backwards, and the ratios take each path's medians: one run's p99 is at the
mercy of a second of load. JSON goes to
bench-results/fast_paths.json (`record_figures`). Not part of `make test`.
"""

from __future__ import annotations

import os
import random
import re
import statistics
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from deploy.cluster import ClusterError, LocalCluster
from tests.bench.test_cluster_bench import (
    JOIN_TIMEOUT_S,
    DRAIN_TIMEOUT_S,
    WARMUP_S,
    LogTail,
    Observed,
    run_publishers,
    stats_of,
    summary_ms,
    summed_delta,
    wait_all_delivered,
)

NODES = int(os.environ.get("MEGNODE_BENCH_FP_NODES", "10"))
DIALS = int(os.environ.get("MEGNODE_BENCH_FP_DIALS", "3"))
SECONDS = float(os.environ.get("MEGNODE_BENCH_SECONDS", "30"))
RATE_PER_S = float(os.environ.get("MEGNODE_BENCH_RATE", "200"))
PATHS = [p for p in os.environ.get("MEGNODE_BENCH_FAST_PATHS", "tree,push,gossipsub").split(",")
         if p]
MODES = [m for m in os.environ.get("MEGNODE_BENCH_PUBLISH_MODES", "single,batch").split(",") if m]
# Each mode's paths run this many times, in turn forwards and backwards (tree, push;
# push, tree; ...), so a slow drift of the shared machine's load falls on every path
# alike; the ratios compare each path's median p99 over its runs.
REPEATS = int(os.environ.get("MEGNODE_BENCH_REPEATS", "1"))
OVERLAY_SEED = 14
MAX_PUBLISHERS = 5
CONNECT_TIMEOUT_S = 60.0
WIRE_SAMPLE_S = 0.5
# The daemons kept this share of the machine's cores busy or more: the run measured
# a queue, not the path (`cpu_saturated`; the bench process and the kernel have the rest).
SATURATED_SHARE = 0.85
# The connection manager's marks for the sparse overlay (node.core.connection_manager).
SPARSE_CONFIG = ("connections_low = 2\nconnections_high = 8\ndial_known_peers = false\n")
# Engine counters summed over the nodes: where the bytes and duplicates come from.
MESSAGE_KINDS = ("push", "ihave", "graft", "prune", "offer", "reply", "want", "events")
TREE_COUNTERS = ("grafts_sent", "graft_ids_sent", "graft_events_served", "prunes_sent",
                 "tree_duplicate_pushes", "tree_duplicates_grafted", "tree_fresh_grafted",
                 "tree_forwarded_sync", "tree_held_back", "tree_peers_forgotten", "received_gossip",
                 "received_sync", "duplicates", "pruned",
                 "grafted", "wants_sent", "tree_duplicate_pushes_lazy", "tree_duplicate_pushes_parent",
                 "tree_duplicate_pushes_root", "tree_duplicate_pushes_other", "tree_sync_races", "tree_fetches_sent", "tree_fetch_ids_sent")
PER_NODE_COUNTERS = ("duplicates", "tree_held_back", "tree_duplicate_pushes_parent",
                     "tree_duplicate_pushes_root", "tree_duplicate_pushes_lazy",
                     "tree_duplicate_pushes_other", "prunes_sent", "pruned",
                     "grafted", "tree_root_news_over_lazy", "wants_sent", "received_sync",
                     "tree_lateness_ms")
GAUGES = ("tree_lateness_ms",)  # reported as they stand at the end, not as a difference
_BYTES_RECEIVED = re.compile(r"bytes_received:(\d+)")
_PID = re.compile(r"pid=(\d+)")


class ChannelObserved(Observed):
    """`Observed`, plus duplicates counted by the channel that brought them."""

    def __init__(self) -> None:
        super().__init__()
        self.duplicates_by_channel: Counter[str] = Counter()

    def add(self, records: list[dict[str, Any]]) -> None:
        super().add(records)
        for record in records:
            if record["type"] == "duplicate":
                self.duplicates_by_channel[record.get("channel", "?")] += 1


def breakdown(before: dict[int, Counter[str]], after: dict[int, Counter[str]], per: int,
              event_size: float, wire: int) -> dict[str, Any]:
    """Bytes sent by message kind (x event, per node per event) and the tree's counters."""
    sent = {kind: summed_delta(before, after, f"bytes_sent_{kind}") for kind in MESSAGE_KINDS}
    engine = summed_delta(before, after, "bytes_sent")
    return {
        "sent_x_event": {k: round(v / per / event_size, 3) for k, v in sent.items() if v},
        "framing_x_event": round((wire - engine) / per / event_size, 3),
        "per_node_event": {k: round(summed_delta(before, after, k) / per, 3)
                           for k in TREE_COUNTERS},
        "other_counters": {k: summed_delta(before, after, k)
                           for k in sorted({k for c in after.values() for k in c})
                           if k not in TREE_COUNTERS and k not in GAUGES and isinstance(after[0].get(k), int)
                           and summed_delta(before, after, k)},
    }


class SparseCluster(LocalCluster):
    """A LocalCluster whose nodes each dial DIALS random others instead of all earlier ones."""

    def __init__(self, base_dir: Path, nodes: int, fast_path: str) -> None:
        base_dir.mkdir(parents=True, exist_ok=True)
        config = base_dir / "sparse.toml"
        config.write_text(SPARSE_CONFIG + os.environ.get("MEGNODE_BENCH_FP_CONFIG", "").replace(
            ";", "\n") + "\n")
        super().__init__(base_dir, nodes, fast_path=fast_path, extra_args=("--config", str(config)))
        rng = random.Random(OVERLAY_SEED)
        self.overlay = sorted({tuple(sorted((i, j))) for i in range(nodes)
                               for j in rng.sample([k for k in range(nodes) if k != i], DIALS)})

    def start(self) -> None:
        for node in self.nodes:
            self._spawn(node.index, bootstrap=[])
        for node in self.nodes:
            node.info = self._read_started(node)
        for a, b in self.overlay:
            self.dial(b, self.nodes[a].address)

    def wait_connected(self, timeout_s: float = CONNECT_TIMEOUT_S,
                       indices: list[int] | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        want = {i: {self.nodes[j].info["peer_id"] for a, b in self.overlay
                    for j in ((b,) if a == i else (a,) if b == i else ())}
                for i in range(len(self.nodes))}
        while True:
            lacking = {i: len(w - set(self.status(i)["peers"])) for i, w in want.items()}
            if not any(lacking.values()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"overlay not connected after {timeout_s} s: {lacking}")
            time.sleep(0.3)

    def open_topic(self, name: str) -> str:
        """Create a topic on node 0; the others join layer by layer from it (breadth first):
        a join asks the connected peers, so each node joins once a neighbour holds it."""
        topic = self.cli(0, "topic", "create", name)["topic"]
        holders = {0}
        while len(holders) < len(self.nodes):
            layer = sorted({j for a, b in self.overlay for i, j in ((a, b), (b, a))
                            if i in holders and j not in holders})
            assert layer, "the overlay is not connected"
            for j in layer:
                self.cli(j, "topic", "join", topic)
            self.wait_joined(topic, JOIN_TIMEOUT_S, layer)
            holders.update(layer)
        return topic

    def degrees(self) -> list[int]:
        return [len(self.status(i)["peers"]) for i in range(len(self.nodes))]


def wire_bytes_received(pids: set[int]) -> dict[str, int]:
    """bytes_received of every TCP socket the processes `pids` own, by socket (ss -tinp)."""
    out = subprocess.run(["ss", "-tinpH", "state", "established"], capture_output=True,
                         text=True, check=True).stdout
    sockets: dict[str, int] = {}
    key, owned = None, False
    for line in out.splitlines():
        if not line.startswith((" ", "\t")):
            fields = line.split()
            key = " ".join(fields[2:4]) if len(fields) >= 4 else None
            owned = any(int(p) in pids for p in _PID.findall(line))
        else:
            match = _BYTES_RECEIVED.search(line)
            if match and key and owned:
                sockets[key] = int(match.group(1))
    return sockets


def cpu_seconds(pids: set[int]) -> tuple[float, float]:
    """(user, system) CPU seconds the processes `pids` have used so far (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    user = system = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited: its time is lost (the run reports what it measured)
        user += int(fields[11]) / tick
        system += int(fields[12]) / tick
    return user, system


class WireMeter:
    """Samples the daemons' sockets every WIRE_SAMPLE_S while it runs (a thread).

    Connections may close and reopen during a run; a closed socket's count is
    gone from `ss`, so each socket's last sample is kept: what a socket
    received in its last WIRE_SAMPLE_S before closing is missed (an undercount,
    reported as `sockets_seen`).
    """

    def __init__(self, pids: set[int]) -> None:
        self.pids = pids
        self.first = wire_bytes_received(pids)
        self.last = dict(self.first)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(WIRE_SAMPLE_S):
            self.last.update(wire_bytes_received(self.pids))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.last.update(wire_bytes_received(self.pids))
        return sum(v - self.first.get(k, 0) for k, v in self.last.items())


def measure(base_dir: Path, fast_path: str, mode: str) -> dict[str, Any]:
    with SparseCluster(base_dir, NODES, fast_path) as cluster:
        topic = cluster.open_topic(f"fp-{fast_path}-{mode}")
        degrees = cluster.degrees()
        indices = list(range(NODES))
        node_ids = [n.node_id for n in cluster.nodes]
        pids = {n.process.pid for n in cluster.nodes if n.process is not None}
        tails = [LogTail(n.data_dir / "logs") for n in cluster.nodes]
        observed = ChannelObserved()
        for tail in tails:
            observed.add(tail.read_new())  # the join's records: not part of the window
        before = stats_of(cluster, indices)
        meter = WireMeter(pids)
        cpu_before, cpu_since = cpu_seconds(pids), time.monotonic()
        publishers = min(NODES, MAX_PUBLISHERS)
        results = run_publishers(cluster, topic, publishers, WARMUP_S + SECONDS, mode=mode,
                                 rate_per_s=RATE_PER_S)
        all_ids = [i for r in results for _, i in r.ids]
        measured = [i for r in results for t, i in r.ids if t >= WARMUP_S]
        drain_s = wait_all_delivered(tails, observed, node_ids, all_ids, DRAIN_TIMEOUT_S)
        wire = meter.stop()
        cpu_after, cpu_for_s = cpu_seconds(pids), time.monotonic() - cpu_since
        cores_busy = (sum(cpu_after) - sum(cpu_before)) / cpu_for_s
        after = stats_of(cluster, indices)
        load = os.getloadavg()[0]
    events = len(all_ids)
    event_size = (summed_delta(before, after, "event_bytes_sent")
                  / max(1, summed_delta(before, after, "events_sent")))
    due_ms = {i: t for r in results for i, t in r.due_ms.items()}
    latencies, from_due, pairs, delivered = [], [], 0, 0
    by_channel: dict[str, list[float]] = {}
    for event in measured:
        author, created_ms = observed.created[event]
        for node in node_ids:
            pairs += 1
            delivered += observed.has(node, event)
            if node != author:
                delivered_ms, channel = observed.delivered[node][event]
                latencies.append(delivered_ms - created_ms)
                from_due.append(delivered_ms - due_ms[event])
                by_channel.setdefault(channel, []).append(delivered_ms - created_ms)
    duplicates = sum(observed.duplicates[e] for e in all_ids)
    per = events * NODES
    return {
        "fast_path": fast_path, "publish_mode": mode, "nodes": NODES, "degrees": degrees,
        "rate_per_s": RATE_PER_S, "seconds": SECONDS, "events_in_run": events,
        "events_offered": int(RATE_PER_S / publishers * (WARMUP_S + SECONDS)) * publishers,
        "publish_start_lag_ms": summary_ms([1000 * lag for r in results
                                            for lag in r.start_lag_s]),
        "publish_errors": sum(r.errors for r in results),
        "delivery_ratio": delivered / max(1, pairs),
        "event_bytes": round(event_size, 1),
        "wire_bytes_per_node_event": round(wire / per, 1),
        # The daemons' CPU from the first publish to the end of the drain: on a
        # shared 2-core machine the resource that sets the rate they can keep.
        "cpu_ms_per_node_event": {
            "user": round(1000 * (cpu_after[0] - cpu_before[0]) / per, 3),
            "system": round(1000 * (cpu_after[1] - cpu_before[1]) / per, 3)},
        "cpu_cores_busy": round(cores_busy, 2),
        "cpu_saturated": cores_busy >= SATURATED_SHARE * (os.cpu_count() or 1),
        "wire_x_event": round(wire / per / event_size, 3) if event_size else None,
        "sockets_seen": len(meter.last),
        "engine_bytes_received_x_event": round(
            summed_delta(before, after, "bytes_received") / per / event_size, 3)
        if event_size else None,
        "duplicates_per_node_event": round(duplicates / per, 3),
        "latency_ms": summary_ms(latencies),
        "latency_from_due_ms": summary_ms(from_due),
        "grafts": summed_delta(before, after, "grafts_sent"),
        "prunes": summed_delta(before, after, "prunes_sent"),
        "drain_after_window_s": round(drain_s, 1),
        "latency_by_channel": {c: dict(summary_ms(v), n=len(v)) for c, v in by_channel.items()},
        "duplicates_by_channel": {c: round(n / per, 3)
                                  for c, n in observed.duplicates_by_channel.items()},
        "breakdown": breakdown(before, after, per, event_size, wire),
        "per_node": {node_ids[i][:6]: {k: after[i][k] if k in GAUGES else after[i][k] - before[i][k]
                                       for k in PER_NODE_COUNTERS
                                       if (after[i][k] if k in GAUGES else after[i][k] - before[i][k])}
                     for i in indices},
        "load_average_1m_at_end": load,
    }


def test_fast_paths_on_the_wire(tmp_path, record_figures):
    started = time.monotonic()
    runs = []
    for mode in MODES:
        for repeat, path in ((r, p) for r in range(REPEATS)
                             for p in (PATHS if r % 2 == 0 else PATHS[::-1])):
            try:
                figures = measure(tmp_path / f"{path}-{mode}-{repeat}", path, mode)
                figures["repeat"] = repeat
            except (AssertionError, ClusterError) as failure:
                # One fast path failing (gossipsub on a loaded machine: a publisher
                # stuck past its slack) is a figure too; the others still run.
                figures = {"fast_path": path, "publish_mode": mode, "error": str(failure)[:500]}
            print(figures, flush=True)
            runs.append(figures)
    failed = [r for r in runs if "error" in r or r["delivery_ratio"] != 1.0
              or r["publish_errors"]]
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        if "error" not in run and run["latency_ms"]:
            by.setdefault((run["publish_mode"], run["fast_path"]), []).append(run)

    ratios: dict[str, Any] = {}
    for mode in MODES:
        base = by.get((mode, "push"))
        for path in PATHS:
            these = by.get((mode, path))
            if base and these:
                p99s = [r["latency_ms"]["p99"] for r in these]
                due_p99s = [r["latency_from_due_ms"]["p99"] for r in these]
                ratios[f"{mode}/{path}"] = {
                    "wire_x_event": statistics.median([r["wire_x_event"] for r in these]),
                    "duplicates_per_node_event": statistics.median(
                        [r["duplicates_per_node_event"] for r in these]),
                    "events_in_run": [r["events_in_run"] for r in these],
                    "cpu_saturated": [r["cpu_saturated"] for r in these],
                    "p99_ms": p99s,
                    "p99_vs_push": round(statistics.median(p99s) / statistics.median(
                        [r["latency_ms"]["p99"] for r in base]), 2),
                    "p99_from_due_ms": due_p99s,
                    "p99_from_due_vs_push": round(statistics.median(due_p99s) / statistics.median(
                        [r["latency_from_due_ms"]["p99"] for r in base]), 2),
                }
    # The other figures (5 nodes; 1000 events/s) get their own file.
    name = "fast_paths" + (f"_n{NODES}" if NODES != 10 else "") + (
        f"_r{RATE_PER_S:g}" if RATE_PER_S != 200 else "")
    record_figures(name, {"cpus": os.cpu_count(), "overlay_dials": DIALS, "repeats": REPEATS,
                                  "join_timeout_s": JOIN_TIMEOUT_S, "runs": runs,
                                  "ratios": ratios, "wall_s": round(time.monotonic() - started, 1)})
    assert not failed, failed
