"""Deterministic simulator: many replicas, one process, a simulated network, one seed.

Theory of operation
-------------------
A `Cluster` holds n nodes, each a `Disseminator` over one `Replica` (memory
store) of a single topic, and a simulated network: a heap of timed
deliveries on a virtual clock. The real protocol engine runs unchanged; the
cluster only carries out its effects. Every random choice — latencies,
losses, duplicates, reordering, the neighbour graph, who writes when, the
engines' own choices — comes from one `random.Random(seed)`, and every
iteration is over sorted or insertion-ordered collections, so a seed replays
a run bit for bit in any process (whatever PYTHONHASHSEED is).

Faults, drawn per message: loss, duplication (a second copy with its own
latency), reordering (extra delay up to REORDER_EXTRA_FACTOR times the
latency bound), and partitions — a schedule of `(groups, at_ms, heal_at_ms)`
during which messages between groups are dropped at delivery time.

A run has two phases, as in TigerBeetle's VOPR:

1. fault phase: writers publish on a schedule (`writers` random nodes each
   round, concurrently) while the faults above apply;
2. liveness phase: partitions are healed (and, unless `lossy_liveness`,
   loss/duplication/reordering stop) and the cluster runs until it has
   converged or `liveness_bound_ms` of virtual time has passed.

Checkers (`Cluster.check`): every replica holds the identical graph (same
event ids, same forward extremities, nothing buffered) and nothing any
replica accepted is lost (every created event and every event any replica
applied is everywhere). A failure raises AssertionError naming the seed and
the command that replays it:

    python -m transport.sim --seed 7 --nodes 50 --loss 0.2 --partition-at 1000 --heal-at 5000
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from node.core.identity import Identity
from node.core.parents import DEFAULT_D_MAX, DepletionPolicy
from node.replica.replica import Replica, ReplicaConfig
from storage.memory import MemoryStore
from transport.defaults import DEFAULT_SYNC_INTERVAL_MS
from transport.dissemination import Disseminator
from transport.dissemination_config import (
    DEFAULT_FORWARD_FANOUT,
    DEFAULT_PUSH_FANOUT,
    DisseminationConfig,
)
from transport.effects import Disconnect, Effect, Log, Send

# Named bounds of a simulation.
LIVENESS_BOUND_MS = 120_000  # virtual time the healed cluster gets to converge
CONVERGENCE_CHECK_MS = 100  # how often the liveness phase looks for convergence
DEFAULT_TICK_MS = 100  # how often each engine's tick runs
REORDER_EXTRA_FACTOR = 4  # a reordered message is delayed up to this many latency bounds more
MAX_NODES = 10_000

_DELIVER, _TICK, _ROUND = 0, 1, 2


@dataclass(frozen=True)
class Scenario:
    """Everything that determines a run; `argv()` is the command line that replays it."""

    seed: int
    nodes: int = 50
    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    latency_ms: tuple[int, int] = (5, 50)
    neighbours: int = 6
    rounds: int = 30
    writers: int = 4  # concurrent writers per round
    round_ms: int = 200
    partition_at_ms: int | None = None
    heal_at_ms: int | None = None
    groups: int = 2  # a partition splits the nodes into this many groups (round robin)
    push: bool = True
    fanout: int = DEFAULT_PUSH_FANOUT
    forward_fanout: int = DEFAULT_FORWARD_FANOUT
    sync_interval_ms: int = DEFAULT_SYNC_INTERVAL_MS
    peer_state: bool = True
    d_max: int = DEFAULT_D_MAX
    depletion: bool = True
    lossy_liveness: bool = True
    liveness_bound_ms: int = LIVENESS_BOUND_MS

    def argv(self) -> list[str]:
        args = ["--seed", str(self.seed), "--nodes", str(self.nodes), "--loss", str(self.loss),
                "--duplicate", str(self.duplicate), "--reorder", str(self.reorder),
                "--latency", str(self.latency_ms[0]), str(self.latency_ms[1]),
                "--neighbours", str(self.neighbours), "--rounds", str(self.rounds),
                "--writers", str(self.writers), "--round-ms", str(self.round_ms),
                "--groups", str(self.groups), "--fanout", str(self.fanout),
                "--forward-fanout", str(self.forward_fanout),
                "--sync-interval", str(self.sync_interval_ms), "--d-max", str(self.d_max),
                "--liveness-bound", str(self.liveness_bound_ms)]
        if self.partition_at_ms is not None and self.heal_at_ms is not None:
            args += ["--partition-at", str(self.partition_at_ms), "--heal-at", str(self.heal_at_ms)]
        for flag, on in (("--no-push", not self.push), ("--no-peer-state", not self.peer_state),
                         ("--no-depletion", not self.depletion),
                         ("--clean-liveness", not self.lossy_liveness)):
            if on:
                args.append(flag)
        return args

    def replay_command(self) -> str:
        return "python -m transport.sim " + " ".join(self.argv())

    def dissemination_config(self, log: bool) -> DisseminationConfig:
        return DisseminationConfig(push=self.push, push_fanout=self.fanout,
                                   forward_fanout=self.forward_fanout,
                                   sync_interval_ms=self.sync_interval_ms,
                                   sync_jitter_ms=self.sync_interval_ms // 4,
                                   use_peer_state=self.peer_state, depletion=self.depletion,
                                   log=log)


@dataclass(frozen=True)
class Summary:
    seed: int
    nodes: int
    events: int  # distinct events in the converged topic (root included)
    created: int  # events writers published (dummies excluded)
    dummies: int
    messages: int
    bytes: int
    event_bytes: int
    overhead_bytes: int
    sync_sessions: int
    converged: bool
    fault_phase_end_ms: int
    converged_at_ms: int | None
    convergence_ms: int | None  # from the end of the fault phase
    sync_rounds: float | None  # convergence_ms in anti-entropy intervals
    mean_width: float  # mean width over replicas, sampled before each write round
    duplicates: int  # copies of events replicas already held (push and sync), all replicas
    wall_s: float
    digest: str  # hash of the final event ids and the byte counts: equal runs, equal digests

    def lines(self) -> list[str]:
        conv = (f"converged {self.convergence_ms} ms after the fault phase "
                f"({self.sync_rounds:.1f} sync intervals)" if self.converged else "NOT converged")
        return [
            f"seed {self.seed}: {self.nodes} nodes, {self.events} events "
            f"({self.created} written, {self.dummies} dummies), {conv}",
            f"network: {self.messages} messages, {self.bytes} bytes "
            f"({self.event_bytes} event bytes, {self.overhead_bytes} overhead), "
            f"{self.sync_sessions} anti-entropy exchanges",
            f"duplicates {self.duplicates} ({self.duplicates / max(self.events, 1):.1f} per event)",
            f"mean width {self.mean_width:.2f}; wall {self.wall_s:.2f} s; digest {self.digest}",
        ]


@dataclass
class _Partition:
    groups: list[frozenset[int]]
    at_ms: int
    heal_at_ms: int

    def separates(self, a: int, b: int, now_ms: int) -> bool:
        if not self.at_ms <= now_ms < self.heal_at_ms:
            return False
        return self._group(a) != self._group(b)

    def _group(self, node: int) -> int:
        for index, group in enumerate(self.groups):
            if node in group:
                return index
        return -1  # unlisted nodes form one more group


@dataclass
class _Node:
    index: int
    node_id: str
    identity: Identity
    replica: Replica
    engine: Disseminator
    writer: Any = None  # node.logschema.JsonLinesLogWriter when logging


def _seed_bytes(seed: int, index: int) -> bytes:
    return hashlib.blake2b(f"megnode-sim/{seed}/{index}".encode(), digest_size=32).digest()


class Cluster:
    """n replicas of one topic over a simulated network on a virtual clock."""

    def __init__(self, seed: int, n: int, *, loss: float = 0.0, duplicate: float = 0.0,
                 latency_ms: tuple[int, int] = (5, 50), reorder: float = 0.0,
                 neighbours: int = 6, config: DisseminationConfig = DisseminationConfig(log=False),
                 d_max: int = DEFAULT_D_MAX, depletion: bool = True,
                 tick_ms: int = DEFAULT_TICK_MS, log_dir: str | Path | None = None,
                 scenario: Scenario | None = None) -> None:
        if not 2 <= n <= MAX_NODES:
            raise ValueError(f"n must be in [2, {MAX_NODES}]")
        if not (0 <= latency_ms[0] <= latency_ms[1]):
            raise ValueError("latency_ms must be (lo, hi) with 0 <= lo <= hi")
        for name, p in (("loss", loss), ("duplicate", duplicate), ("reorder", reorder)):
            if not 0.0 <= p < 1.0:
                raise ValueError(f"{name} must be in [0, 1)")
        self.seed = seed
        self.rng = random.Random(seed)
        self.loss, self.duplicate, self.reorder = loss, duplicate, reorder
        self.latency_ms = latency_ms
        self.tick_ms = tick_ms
        # Only a Scenario's schedule can be replayed from the command line; a cluster
        # scheduled by hand (partition(), write()) is replayed by rerunning its code.
        self._replayable = scenario is not None
        self.scenario = scenario or Scenario(seed=seed, nodes=n, loss=loss, duplicate=duplicate,
                                             reorder=reorder, latency_ms=latency_ms,
                                             neighbours=neighbours, d_max=d_max)
        self.now_ms = 0
        self._heap: list[tuple[int, int, int, int, int, Any]] = []
        self._seq = 0
        self._partitions: list[_Partition] = []
        self.created: list[bytes] = []
        self.width_samples: list[float] = []
        self.messages = 0
        self.bytes = 0
        self.dropped = 0
        self.disconnects: list[tuple[int, str]] = []
        self.invalid_log_records = 0
        # A pure MEG: no topic state or auth rules (node.state), which this simulator
        # does not exercise.
        replica_config = ReplicaConfig(depletion=DepletionPolicy(enabled=depletion),
                                       authorization=False)
        config = replace(config, log=log_dir is not None)
        identities = [Identity.from_seed(_seed_bytes(seed, i)) for i in range(n)]
        creator = Replica.create_topic(MemoryStore(), identities[0], now_ms=0, name="sim",
                                       d_max=d_max, config=replica_config)
        self.topic = creator.topic_id
        root = creator.graph.get(self.topic)
        assert root is not None
        self.nodes: list[_Node] = []
        for i, ident in enumerate(identities):
            replica = creator if i == 0 else Replica(MemoryStore(), self.topic, ident, replica_config)
            if i:
                replica.receive(root.raw, 0)  # joined: the invite carried the create event
                replica.commit()
            node_id = ident.public_key.hex()
            engine = Disseminator(node_id, self.rng, config)
            engine.add_topic(replica)
            self.nodes.append(_Node(i, node_id, ident, replica, engine,
                                    self._open_log(log_dir, node_id)))
        self._index = {node.node_id: node.index for node in self.nodes}
        self.edges = self._topology(n, neighbours)
        for a, b in self.edges:
            self._apply(self.nodes[a], self.nodes[a].engine.on_peer_up(self.nodes[b].node_id, 0))
            self._apply(self.nodes[b], self.nodes[b].engine.on_peer_up(self.nodes[a].node_id, 0))
        for node in self.nodes:  # random tick phases: nodes do not act in lockstep
            self._schedule(self.rng.randrange(tick_ms), _TICK, node.index, 0, None)

    @classmethod
    def from_scenario(cls, scenario: Scenario, log_dir: str | Path | None = None) -> "Cluster":
        s = scenario
        cluster = cls(s.seed, s.nodes, loss=s.loss, duplicate=s.duplicate, latency_ms=s.latency_ms,
                      reorder=s.reorder, neighbours=s.neighbours,
                      config=s.dissemination_config(log=False), d_max=s.d_max,
                      depletion=s.depletion, log_dir=log_dir, scenario=s)
        if s.partition_at_ms is not None and s.heal_at_ms is not None:
            groups = [set(range(g, s.nodes, s.groups)) for g in range(s.groups)]
            cluster.partition(groups, s.partition_at_ms, s.heal_at_ms)
        cluster.write(s.rounds, s.writers, s.round_ms)
        return cluster

    # ------------------------------------------------------------- schedule

    def partition(self, groups: list[set[int]] | list[frozenset[int]], at_ms: int,
                  heal_at_ms: int) -> None:
        """Drop messages between `groups` of node indices from `at_ms` until `heal_at_ms`."""
        if heal_at_ms < at_ms:
            raise ValueError("heal_at_ms must not precede at_ms")
        self._partitions.append(_Partition([frozenset(g) for g in groups], at_ms, heal_at_ms))

    def write(self, rounds: int, writers: int, round_ms: int, start_ms: int | None = None) -> None:
        """Each round, `writers` distinct random nodes publish one event each, concurrently."""
        if not 1 <= writers <= len(self.nodes):
            raise ValueError("writers must be in [1, n]")
        start = self.now_ms + round_ms if start_ms is None else start_ms
        for r in range(rounds):
            self._schedule(start + r * round_ms, _ROUND, writers, r, None)

    # ------------------------------------------------------------- running

    def run_until(self, end_ms: int) -> None:
        heap = self._heap
        while heap and heap[0][0] <= end_ms:
            at, _, kind, a, b, payload = heapq.heappop(heap)
            self.now_ms = at
            if kind == _DELIVER:
                self._deliver(a, b, payload)
            elif kind == _TICK:
                node = self.nodes[a]
                self._apply(node, node.engine.tick(at))
                self._schedule(at + self.tick_ms, _TICK, a, 0, None)
            else:
                self._round(a)
        self.now_ms = max(self.now_ms, end_ms)

    def fault_phase_end(self) -> int:
        last = [at for at, _, kind, *_ in self._heap if kind == _ROUND]
        heals = [p.heal_at_ms for p in self._partitions]
        return max(last + heals + [self.now_ms])

    def heal(self, clean: bool) -> None:
        """Enter the liveness phase: no partitions; with `clean`, no loss/dup/reorder either."""
        for p in self._partitions:
            p.heal_at_ms = min(p.heal_at_ms, self.now_ms)
        if clean:
            self.loss = self.duplicate = self.reorder = 0.0

    def run_to_convergence(self, bound_ms: int = LIVENESS_BOUND_MS) -> int | None:
        """Run until converged (checked every CONVERGENCE_CHECK_MS) or `bound_ms` passed."""
        deadline = self.now_ms + bound_ms
        while self.now_ms < deadline:
            if self.converged():
                return self.now_ms
            self.run_until(min(deadline, self.now_ms + CONVERGENCE_CHECK_MS))
        return self.now_ms if self.converged() else None

    def run(self) -> Summary:
        """Fault phase, heal, liveness phase, checks; returns the summary (raises on failure)."""
        started = time.perf_counter()
        end = self.fault_phase_end()
        self.run_until(end)
        self.heal(clean=not self.scenario.lossy_liveness)
        converged_at = self.run_to_convergence(self.scenario.liveness_bound_ms)
        self.close_logs()
        self.check(converged_at is not None)
        return self.summary(end, converged_at, time.perf_counter() - started)

    # ------------------------------------------------------------- checkers

    def converged(self) -> bool:
        first = self.nodes[0].replica.graph
        heads = first.extremities()
        count = first.delivered_count
        return all(n.replica.graph.buffered_count == 0 and n.replica.graph.delivered_count == count
                   and n.replica.graph.extremities() == heads for n in self.nodes)

    def event_ids(self, index: int) -> set[bytes]:
        graph = self.nodes[index].replica.graph
        return {e.id for _, e in graph.deliveries(0, graph.delivered_count)}

    def check(self, converged: bool = True) -> None:
        """Identical graphs everywhere and nothing accepted lost; AssertionError otherwise."""
        problems: list[str] = []
        if not converged:
            problems.append(f"no convergence within {self.scenario.liveness_bound_ms} ms of healing")
        sets = [self.event_ids(i) for i in range(len(self.nodes))]
        union = set().union(*sets)
        accepted = union | set(self.created)
        for i, ids in enumerate(sets):
            graph = self.nodes[i].replica.graph
            if ids != accepted:
                problems.append(f"node {i} lacks {len(accepted - ids)} of {len(accepted)} events")
            if graph.extremities() != self.nodes[0].replica.graph.extremities():
                problems.append(f"node {i} has other extremities than node 0")
            if graph.buffered_count:
                problems.append(f"node {i} still buffers {graph.buffered_count} events")
            if len(problems) > 5:
                break
        if problems:
            replay = (self.scenario.replay_command() if self._replayable else
                      f"rerun the code that built this Cluster with seed={self.seed}")
            raise AssertionError(
                f"simulation failed (seed {self.seed}): " + "; ".join(problems)
                + f"\nreplay: {replay}")

    # ------------------------------------------------------------- results

    def totals(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for node in self.nodes:
            for key, value in node.engine.stats.items():
                total[key] = total.get(key, 0) + value
        return total

    def summary(self, fault_end: int, converged_at: int | None, wall_s: float) -> Summary:
        totals = self.totals()
        ids = sorted(self.event_ids(0))
        dummies = sum(n.replica.counters["dummies"] for n in self.nodes)
        digest = hashlib.blake2b(b"".join(ids) + f"{self.messages}/{self.bytes}".encode(),
                                 digest_size=16).hexdigest()
        convergence = None if converged_at is None else converged_at - fault_end
        interval = self.scenario.sync_interval_ms
        widths = self.width_samples
        return Summary(
            seed=self.seed, nodes=len(self.nodes), events=len(ids), created=len(self.created),
            dummies=dummies, messages=self.messages, bytes=self.bytes,
            event_bytes=totals.get("event_bytes_sent", 0),
            overhead_bytes=self.bytes - totals.get("event_bytes_sent", 0),
            sync_sessions=totals.get("sessions", 0), converged=converged_at is not None,
            fault_phase_end_ms=fault_end, converged_at_ms=converged_at,
            convergence_ms=convergence,
            sync_rounds=None if convergence is None else convergence / interval,
            mean_width=sum(widths) / len(widths) if widths else 0.0,
            duplicates=totals.get("duplicates", 0),
            wall_s=round(wall_s, 3), digest=digest)

    # ------------------------------------------------------------- internals

    def _topology(self, n: int, degree: int) -> list[tuple[int, int]]:
        """A ring (so the graph is connected) plus random chords up to `degree` per node."""
        edges: set[tuple[int, int]] = set()
        for i in range(n):
            edges.add((min(i, (i + 1) % n), max(i, (i + 1) % n)))
        count = [0] * n
        for a, b in edges:
            count[a] += 1
            count[b] += 1
        target = min(degree, n - 1)
        for i in range(n):
            attempts = 0
            while count[i] < target and attempts < 10 * n:
                attempts += 1
                j = self.rng.randrange(n)
                edge = (min(i, j), max(i, j))
                if j == i or edge in edges:
                    continue
                edges.add(edge)
                count[i] += 1
                count[j] += 1
        return sorted(edges)

    def _schedule(self, at_ms: int, kind: int, a: int, b: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at_ms, self._seq, kind, a, b, payload))

    def _latency(self) -> int:
        lo, hi = self.latency_ms
        delay = self.rng.randint(lo, hi)
        if self.reorder and self.rng.random() < self.reorder:
            delay += self.rng.randint(0, REORDER_EXTRA_FACTOR * hi)
        return delay

    def _apply(self, node: _Node, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Send):
                self._transmit(node.index, self._index[effect.peer], effect.data)
            elif isinstance(effect, Log):
                self._write_log(node, effect.record)
            elif isinstance(effect, Disconnect):
                self.disconnects.append((node.index, effect.peer))

    def _transmit(self, src: int, dst: int, data: bytes) -> None:
        self.messages += 1
        self.bytes += len(data)
        if self.loss and self.rng.random() < self.loss:
            self.dropped += 1
            return
        self._schedule(self.now_ms + self._latency(), _DELIVER, src, dst, data)
        if self.duplicate and self.rng.random() < self.duplicate:
            self._schedule(self.now_ms + self._latency(), _DELIVER, src, dst, data)

    def _deliver(self, src: int, dst: int, data: bytes) -> None:
        if any(p.separates(src, dst, self.now_ms) for p in self._partitions):
            self.dropped += 1
            return
        node = self.nodes[dst]
        self._apply(node, node.engine.on_message(self.nodes[src].node_id, data, self.now_ms))

    def _round(self, writers: int) -> None:
        self.width_samples.append(
            sum(n.replica.graph.width for n in self.nodes) / len(self.nodes))
        for index in sorted(self.rng.sample(range(len(self.nodes)), writers)):
            node = self.nodes[index]
            event, _ = node.replica.publish(f"{index}@{self.now_ms}".encode(), self.now_ms, self.rng)
            self.created.append(event.id)
            self._apply(node, node.engine.on_publish(self.topic, event, self.now_ms))

    def _open_log(self, log_dir: str | Path | None, node_id: str) -> Any:
        if log_dir is None:
            return None
        # Imported only when logs are asked for (it is the simulator's one use of
        # analytics); a broken install then fails loudly instead of writing nothing.
        from node.logschema import JsonLinesLogWriter

        return JsonLinesLogWriter(log_dir, node_id)

    def _write_log(self, node: _Node, record: dict[str, Any]) -> None:
        if node.writer is None:
            return
        try:
            node.writer.write(record)
        except ValueError:
            self.invalid_log_records += 1

    def close_logs(self) -> None:
        for node in self.nodes:
            if node.writer is not None:
                node.writer.close()


def run_scenario(scenario: Scenario, log_dir: str | Path | None = None) -> Summary:
    """Build the cluster of `scenario`, run both phases, check, summarise."""
    return Cluster.from_scenario(scenario, log_dir).run()


# ----------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m transport.sim",
                                description="Replay a deterministic megnode simulation.")
    d = Scenario(seed=0)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--nodes", type=int, default=d.nodes)
    p.add_argument("--loss", type=float, default=d.loss)
    p.add_argument("--duplicate", type=float, default=d.duplicate)
    p.add_argument("--reorder", type=float, default=d.reorder)
    p.add_argument("--latency", type=int, nargs=2, default=list(d.latency_ms), metavar=("LO", "HI"))
    p.add_argument("--neighbours", type=int, default=d.neighbours)
    p.add_argument("--rounds", type=int, default=d.rounds)
    p.add_argument("--writers", type=int, default=d.writers)
    p.add_argument("--round-ms", type=int, default=d.round_ms)
    p.add_argument("--partition-at", type=int, default=None)
    p.add_argument("--heal-at", type=int, default=None)
    p.add_argument("--groups", type=int, default=d.groups)
    p.add_argument("--fanout", type=int, default=d.fanout, help="an author's push fanout")
    p.add_argument("--forward-fanout", type=int, default=d.forward_fanout,
                   help="a relay's fanout for an event first received by push")
    p.add_argument("--sync-interval", type=int, default=d.sync_interval_ms)
    p.add_argument("--d-max", type=int, default=d.d_max)
    p.add_argument("--liveness-bound", type=int, default=d.liveness_bound_ms)
    p.add_argument("--no-push", action="store_true")
    p.add_argument("--no-peer-state", action="store_true")
    p.add_argument("--no-depletion", action="store_true")
    p.add_argument("--clean-liveness", action="store_true",
                   help="no loss/duplication/reordering after healing")
    p.add_argument("--log-dir", default=None, help="write dissemination logs (JSON lines) here")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def scenario_from_args(ns: argparse.Namespace) -> Scenario:
    if (ns.partition_at is None) != (ns.heal_at is None):
        raise SystemExit("--partition-at and --heal-at go together")
    return Scenario(
        seed=ns.seed, nodes=ns.nodes, loss=ns.loss, duplicate=ns.duplicate, reorder=ns.reorder,
        latency_ms=(ns.latency[0], ns.latency[1]), neighbours=ns.neighbours, rounds=ns.rounds,
        writers=ns.writers, round_ms=ns.round_ms, partition_at_ms=ns.partition_at,
        heal_at_ms=ns.heal_at, groups=ns.groups, push=not ns.no_push, fanout=ns.fanout,
        forward_fanout=ns.forward_fanout,
        sync_interval_ms=ns.sync_interval, peer_state=not ns.no_peer_state, d_max=ns.d_max,
        depletion=not ns.no_depletion, lossy_liveness=not ns.clean_liveness,
        liveness_bound_ms=ns.liveness_bound)


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    scenario = scenario_from_args(ns)
    try:
        summary = run_scenario(scenario, ns.log_dir)
    except AssertionError as failure:
        print(failure, file=sys.stderr)
        return 1
    if ns.json:
        print(json.dumps(asdict(summary), sort_keys=True))
    else:
        print("\n".join(summary.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
