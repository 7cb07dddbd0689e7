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

from node.core.identity import Identity, sign_event
from node.core.parents import DEFAULT_D_MAX, DepletionPolicy
from node.replica.replica import Replica, ReplicaConfig
from node.replica.ordering import KIND_ACK, OrderConfig
from node.core.peer_policy import Abort, PeerPolicy
from node.state.actions import WRITER_LEVEL, power_levels_content
from node.state.power_levels import CREATOR_LEVEL
from node.state.types import RULE_PUBLIC, TYPE_POWER_LEVELS, user_id
from node.state.view import StateView
from storage.memory import MemoryStore
from transport.defaults import DEFAULT_SYNC_INTERVAL_MS
from transport.dissemination import Disseminator
from transport.dissemination_config import (
    DEFAULT_FORWARD_FANOUT,
    DEFAULT_PUSH_FANOUT,
    DisseminationConfig,
)
from transport.effects import Disconnect, Effect, Log, Send
from transport.messages import Push, encode

# Named bounds of a simulation.
LIVENESS_BOUND_MS = 120_000  # virtual time the healed cluster gets to converge
CONVERGENCE_CHECK_MS = 100  # how often the liveness phase looks for convergence
DEFAULT_TICK_MS = 100  # how often each engine's tick runs
REORDER_EXTRA_FACTOR = 4  # a reordered message is delayed up to this many latency bounds more
MAX_NODES = 10_000
DEFAULT_INDEXERS = 3  # an authorized world's indexers: nodes 0..k-1 (node 0 created the topic)
ACK_INTERVAL_MS = 250  # an indexer's acks, at most one per interval (the node's default)
ADVERSARY_FRAMES_PER_TICK = 2  # bad frames the misbehaving peer sends each neighbour per tick
ADVERSARY_NEIGHBOURS = 6
RESTART_AFTER_MS = 1_000  # a crashed node restarts from its store this long after

_DELIVER, _TICK, _ROUND, _CRASH, _RESTART, _REDIAL = 0, 1, 2, 3, 4, 5


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
    # The one world: topic state with auth rules, indexers that ack, the peer
    # policy, crashes that restart from the store, one misbehaving peer.
    authorization: bool = True
    indexers: int = DEFAULT_INDEXERS
    adversary: bool = False
    crashes: int = 0  # nodes (not indexers) that crash once during the fault phase

    def argv(self) -> list[str]:
        args = ["--seed", str(self.seed), "--nodes", str(self.nodes), "--loss", str(self.loss),
                "--duplicate", str(self.duplicate), "--reorder", str(self.reorder),
                "--latency", str(self.latency_ms[0]), str(self.latency_ms[1]),
                "--neighbours", str(self.neighbours), "--rounds", str(self.rounds),
                "--writers", str(self.writers), "--round-ms", str(self.round_ms),
                "--groups", str(self.groups), "--fanout", str(self.fanout),
                "--forward-fanout", str(self.forward_fanout),
                "--sync-interval", str(self.sync_interval_ms), "--d-max", str(self.d_max),
                "--liveness-bound", str(self.liveness_bound_ms),
                "--indexers", str(self.indexers), "--crashes", str(self.crashes)]
        if self.partition_at_ms is not None and self.heal_at_ms is not None:
            args += ["--partition-at", str(self.partition_at_ms), "--heal-at", str(self.heal_at_ms)]
        for flag, on in (("--no-push", not self.push), ("--no-peer-state", not self.peer_state),
                         ("--no-depletion", not self.depletion),
                         ("--clean-liveness", not self.lossy_liveness),
                         ("--no-authorization", not self.authorization),
                         ("--adversary", self.adversary)):
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
    confirmed: int = 0  # length of the confirmed order everywhere (authorized worlds)
    acks: int = 0  # acknowledgements the replicas made
    bans: int = 0  # (node, peer) bans the peer policies recorded

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
            f"order: {self.confirmed} confirmed, {self.acks} acks; {self.bans} bans",
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
    store: MemoryStore | None = None  # what survives a crash
    policy: PeerPolicy | None = None
    alive: bool = True
    seen_confirmed: tuple[bytes, ...] = ()  # the confirmed order last observed here


def _seed_bytes(seed: int, index: int) -> bytes:
    return hashlib.blake2b(f"megnode-sim/{seed}/{index}".encode(), digest_size=32).digest()


class Cluster:
    """n replicas of one topic over a simulated network on a virtual clock."""

    def __init__(self, seed: int, n: int, *, loss: float = 0.0, duplicate: float = 0.0,
                 latency_ms: tuple[int, int] = (5, 50), reorder: float = 0.0,
                 neighbours: int = 6, config: DisseminationConfig = DisseminationConfig(log=False),
                 d_max: int = DEFAULT_D_MAX, depletion: bool = True,
                 tick_ms: int = DEFAULT_TICK_MS, log_dir: str | Path | None = None,
                 scenario: Scenario | None = None, authorization: bool = False,
                 indexers: int = DEFAULT_INDEXERS, adversary: bool = False) -> None:
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
        self.bans: list[tuple[int, str]] = []  # (node, banned peer), in the order they happened
        self.violations: list[str] = []  # safety failures seen while running
        self.invalid_log_records = 0
        self.authorization = authorization
        self.adversary: _Node | None = None
        self.adversary_neighbours: list[int] = []
        self.best_confirmed: tuple[bytes, ...] = ()
        # Without authorization: a pure MEG, no topic state or auth rules (the
        # paper's model; the width and push measurements use it). With it: the
        # topic the node creates (public join rule, members write), indexers
        # made by a power-levels state event, acks on every tick.
        self.replica_config = ReplicaConfig(
            depletion=DepletionPolicy(enabled=depletion), authorization=authorization,
            ordering=OrderConfig(ack_interval_ms=ACK_INTERVAL_MS))
        self.config = config = replace(config, log=log_dir is not None)
        identities = [Identity.from_seed(_seed_bytes(seed, i)) for i in range(n)]
        creator_store = MemoryStore()
        creator = Replica.create_topic(
            creator_store, identities[0], now_ms=0, name="sim", d_max=d_max,
            config=self.replica_config, authorization=authorization,
            **({"join_rule": RULE_PUBLIC, "members_write": True} if authorization else {}))
        self.topic = creator.topic_id
        if authorization:
            self.indexer_keys = frozenset(i.public_key for i in identities[:max(1, indexers)])
            content = power_levels_content(StateView(creator._current_state(), creator.graph))
            for key in sorted(self.indexer_keys):
                content["users"][user_id(key)] = CREATOR_LEVEL
            creator.set_state(TYPE_POWER_LEVELS, "", content, 0, self.rng)
            creator.commit()
        else:
            self.indexer_keys = frozenset()
        # Joined: the invite carried the topic's first events.
        bootstrap = [e.raw for _, e in creator.graph.deliveries(0, limit=16)]
        self.nodes: list[_Node] = []
        joins: list[tuple[_Node, Any]] = []
        for i, ident in enumerate(identities):
            store = creator_store if i == 0 else MemoryStore()
            replica = creator if i == 0 else Replica(store, self.topic, ident, self.replica_config)
            if i:
                for raw in bootstrap:
                    replica.receive(raw, 0)
                replica.commit()
                if authorization:
                    joins.append((i, replica.join(0, self.rng)[0]))
            node_id = ident.public_key.hex()
            engine = Disseminator(node_id, self.rng, config)
            engine.add_topic(replica)
            self.nodes.append(_Node(i, node_id, ident, replica, engine,
                                    self._open_log(log_dir, node_id), store,
                                    PeerPolicy(self.rng)))
        self._index = {node.node_id: node.index for node in self.nodes}
        self.edges = self._topology(n, neighbours)
        self.links: set[tuple[int, int]] = set()
        for a, b in self.edges:
            self._link(a, b)
        for i, event in joins:
            self._apply(self.nodes[i], self.nodes[i].engine.on_publish(self.topic, event, 0))
        for node in self.nodes:  # random tick phases: nodes do not act in lockstep
            self._schedule(self.rng.randrange(tick_ms), _TICK, node.index, 0, None)
        if adversary:
            self._add_adversary()

    @classmethod
    def from_scenario(cls, scenario: Scenario, log_dir: str | Path | None = None) -> "Cluster":
        s = scenario
        cluster = cls(s.seed, s.nodes, loss=s.loss, duplicate=s.duplicate, latency_ms=s.latency_ms,
                      reorder=s.reorder, neighbours=s.neighbours,
                      config=s.dissemination_config(log=False), d_max=s.d_max,
                      depletion=s.depletion, log_dir=log_dir, scenario=s,
                      authorization=s.authorization, indexers=s.indexers, adversary=s.adversary)
        if s.partition_at_ms is not None and s.heal_at_ms is not None:
            groups = [set(range(g, s.nodes, s.groups)) for g in range(s.groups)]
            cluster.partition(groups, s.partition_at_ms, s.heal_at_ms)
        cluster.write(s.rounds, s.writers, s.round_ms)
        if s.crashes:
            end = s.round_ms * (s.rounds + 1)
            first = min(s.indexers, s.nodes - 1) if s.authorization else 1
            for index in sorted(cluster.rng.sample(range(first, s.nodes), s.crashes)):
                cluster.crash(index, cluster.rng.randrange(s.round_ms, end), RESTART_AFTER_MS)
        return cluster

    # ------------------------------------------------------------- schedule

    def partition(self, groups: list[set[int]] | list[frozenset[int]], at_ms: int,
                  heal_at_ms: int) -> None:
        """Drop messages between `groups` of node indices from `at_ms` until `heal_at_ms`."""
        if heal_at_ms < at_ms:
            raise ValueError("heal_at_ms must not precede at_ms")
        self._partitions.append(_Partition([frozenset(g) for g in groups], at_ms, heal_at_ms))

    def crash(self, index: int, at_ms: int, restart_after_ms: int) -> None:
        """Node `index` crashes at `at_ms` (its memory and in-flight messages are lost)
        and restarts from its store `restart_after_ms` later."""
        self._schedule(at_ms, _CRASH, index, 0, None)
        self._schedule(at_ms + restart_after_ms, _RESTART, index, 0, None)

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
                self._tick(a)
                self._schedule(at + self.tick_ms, _TICK, a, 0, None)
            elif kind == _ROUND:
                self._round(a)
            elif kind == _CRASH:
                self._crash(a)
            elif kind == _RESTART:
                self._restart(a)
            else:
                self._redial(a, b)
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
        if not all(n.alive and n.replica.graph.buffered_count == 0
                   and n.replica.graph.delivered_count == count
                   and n.replica.graph.extremities() == heads for n in self.nodes):
            return False
        if self.adversary is not None and not all(
                self.nodes[i].policy.is_banned(self.adversary.node_id, self.now_ms)
                for i in self.adversary_neighbours):
            return False  # the liveness phase also waits for every neighbour to ban it
        return not self.authorization or self._order_settled()

    def _order_settled(self) -> bool:
        """Every replica confirmed the same sequence, and it holds every non-ack event."""
        orders = [n.replica.ordering for n in self.nodes]
        if any(o is None for o in orders):
            return False
        confirmed = orders[0].confirmed
        if any(o.confirmed != confirmed for o in orders[1:]):
            return False
        graph = self.nodes[0].replica.graph
        return all(graph.get(i).kind == KIND_ACK for i in orders[0].tentative[len(confirmed):])

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
        problems += self.violations[:5]
        if self.authorization and converged:
            confirmed = {n.replica.ordering.confirmed for n in self.nodes}
            if len(confirmed) != 1:
                problems.append(f"{len(confirmed)} different confirmed orders after healing")
        if self.adversary is not None:
            banned_by = {node for node, peer in self.bans if peer == self.adversary.node_id}
            talked = set(self.adversary_neighbours)
            if talked - banned_by:
                problems.append(f"honest nodes {sorted(talked - banned_by)} never banned "
                                "the misbehaving peer")
        wrongly = sorted({(node, peer) for node, peer in self.bans
                          if self.adversary is None or peer != self.adversary.node_id})
        if wrongly:
            problems.append(f"honest peers banned: {wrongly[:5]}")
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
            wall_s=round(wall_s, 3), digest=digest,
            confirmed=(self.nodes[0].replica.order_status().confirmed_length
                       if self.authorization and self.nodes[0].replica.ordering is not None
                       else 0),
            acks=sum(n.replica.counters["acks"] for n in self.nodes), bans=len(self.bans))

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
                assert node.policy is not None
                self._apply_policy(node, node.policy.misbehaviour(effect.peer, effect.reason,
                                                                  self.now_ms))

    def _apply_policy(self, node: _Node, effects: list[Any]) -> None:
        """Carry out the peer policy's effects (node.core.peer_policy) in the simulated network."""
        for effect in effects:
            if isinstance(effect, Abort):
                self._cut(node.index, self._index[effect.peer])
            elif type(effect).__name__ == "Banned":
                self.bans.append((node.index, effect.peer))
            elif type(effect).__name__ == "Redial":
                self._schedule(effect.at_ms, _REDIAL, node.index, self._index[effect.peer], None)

    # ------------------------------------------------------------- links, crashes

    def _peer(self, index: int) -> _Node:
        return self.adversary if self.adversary is not None and index == len(self.nodes) \
            else self.nodes[index]

    def _link(self, a: int, b: int) -> None:
        """A connection between a and b opens: both engines (and policies) hear of it."""
        key = (min(a, b), max(a, b))
        if key in self.links:
            return
        self.links.add(key)
        for me, other in ((a, b), (b, a)):
            node, peer = self._peer(me), self._peer(other)
            if node.policy is None:
                continue
            verdict = node.policy.peer_up(peer.node_id, self.now_ms)
            if verdict:
                self._apply_policy(node, verdict)
                return
            self._apply(node, node.engine.on_peer_up(peer.node_id, self.now_ms))

    def _cut(self, a: int, b: int) -> None:
        """The connection between a and b closes; a live side may redial (its policy says)."""
        key = (min(a, b), max(a, b))
        if key not in self.links:
            return
        self.links.discard(key)
        for me, other in ((a, b), (b, a)):
            node, peer = self._peer(me), self._peer(other)
            if node.policy is None or not node.alive:
                continue
            self._apply(node, node.engine.on_peer_down(peer.node_id, self.now_ms))
            self._apply_policy(node, node.policy.peer_down(peer.node_id, self.now_ms))

    def _crash(self, index: int) -> None:
        node = self.nodes[index]
        if not node.alive:
            return
        for a, b in sorted(self.links):
            if index in (a, b):
                node.alive = True  # its side closes too, then it is gone
                self._cut(a, b)
        node.alive = False

    def _restart(self, index: int) -> None:
        """Reopen the replica and a fresh engine from the node's store; dial the neighbours."""
        node = self.nodes[index]
        assert node.store is not None
        node.replica = Replica(node.store, self.topic, node.identity, self.replica_config)
        node.engine = Disseminator(node.node_id, self.rng, self.config)
        node.engine.add_topic(node.replica)
        node.policy = PeerPolicy(self.rng)
        node.alive = True
        self._observe(node)  # what it confirms from its store extends what it confirmed
        for a, b in self.edges:
            if index in (a, b) and self.nodes[a + b - index].alive:
                self._link(a, b)
        if self.adversary is not None and index in self.adversary_neighbours:
            self._link(self.adversary.index, index)  # it dials back: bans are lost with memory

    def _redial(self, index: int, peer: int) -> None:
        node = self.nodes[index]
        if not node.alive or node.policy is None:
            return
        key = (min(index, peer), max(index, peer))
        target = self._peer(peer)
        for effect in node.policy.redial_due(target.node_id, self.now_ms,
                                              connected=key in self.links):
            if target.alive:
                self._link(index, peer)
                node.policy.dial_succeeded(target.node_id)
            else:
                self._apply_policy(node, node.policy.dial_failed(target.node_id, self.now_ms))

    def _tick(self, index: int) -> None:
        if index == len(self.nodes):
            self._adversary_tick()
            return
        node = self.nodes[index]
        if not node.alive:
            return
        at = self.now_ms
        self._apply(node, node.engine.tick(at))
        assert node.policy is not None
        connected = [self._peer(a + b - index).node_id for a, b in self.links if index in (a, b)]
        self._apply_policy(node, node.policy.tick(at, sorted(connected)))
        if self.authorization:
            made = node.replica.maybe_ack(at, self.rng)  # as the node's ticker does
            if made is not None:
                self._apply(node, node.engine.on_publish(self.topic, made[0], at))
            self._observe(node)

    def _observe(self, node: _Node) -> None:
        """Safety of the order: a confirmed prefix never changes, and every replica's
        confirmed order is a prefix of every other's."""
        order = node.replica.ordering if self.authorization else None
        if order is None:
            return
        confirmed = order.confirmed
        old = node.seen_confirmed
        if confirmed[:len(old)] != old:
            self.violations.append(f"node {node.index}: a confirmed position changed "
                                   f"at {self.now_ms} ms")
        overlap = min(len(confirmed), len(self.best_confirmed))
        if confirmed[:overlap] != self.best_confirmed[:overlap]:
            self.violations.append(f"node {node.index}: confirmed order disagrees with "
                                   f"another node's at {self.now_ms} ms")
        if len(confirmed) > len(self.best_confirmed):
            self.best_confirmed = confirmed
        node.seen_confirmed = confirmed

    # ------------------------------------------------------------- the misbehaving peer

    def _add_adversary(self) -> None:
        """One more peer, with a key of its own and no replica, that sends its
        neighbours garbage frames and events with bad signatures."""
        index = len(self.nodes)
        identity = Identity.from_seed(_seed_bytes(self.seed, index))
        node_id = identity.public_key.hex()
        self.adversary = _Node(index, node_id, identity, None, None)  # type: ignore[arg-type]
        self._index[node_id] = index
        count = min(ADVERSARY_NEIGHBOURS, len(self.nodes))
        self.adversary_neighbours = sorted(self.rng.sample(range(len(self.nodes)), count))
        for peer in self.adversary_neighbours:
            self._link(index, peer)
        self._adversary_seq = 0
        self._schedule(self.rng.randrange(self.tick_ms), _TICK, index, 0, None)

    def _adversary_tick(self) -> None:
        adversary = self.adversary
        assert adversary is not None
        for a, b in sorted(self.links):
            if adversary.index not in (a, b):
                continue
            peer = a + b - adversary.index
            for _ in range(ADVERSARY_FRAMES_PER_TICK):
                self._adversary_seq += 1
                if self._adversary_seq % 2:
                    frame = bytes(self.rng.getrandbits(8) for _ in range(32))  # garbage
                else:
                    event = sign_event(adversary.identity, topic=self.topic,
                                       seq=self._adversary_seq, parents=(self.topic,),
                                       timestamp_ms=self.now_ms, kind="message", state_key=None,
                                       payload=b"forged")
                    raw = bytearray(event.raw)
                    raw[-1] ^= 0xFF  # the signature no longer verifies
                    frame = encode(Push(self.topic, (bytes(raw),)))
                self._transmit(adversary.index, peer, frame)

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
        if dst == len(self.nodes) or (min(src, dst), max(src, dst)) not in self.links:
            self.dropped += 1  # to the adversary (it listens to nobody), or the link closed
            return
        node = self.nodes[dst]
        sender = self._peer(src).node_id
        if not node.alive or (node.policy is not None and node.policy.is_banned(sender, self.now_ms)):
            self.dropped += 1
            return
        self._apply(node, node.engine.on_message(sender, data, self.now_ms))

    def _round(self, writers: int) -> None:
        self.width_samples.append(
            sum(n.replica.graph.width for n in self.nodes) / len(self.nodes))
        for index in sorted(self.rng.sample(range(len(self.nodes)), writers)):
            node = self.nodes[index]
            if not node.alive:
                continue  # crashed: it writes nothing until it restarts
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
    p.add_argument("--indexers", type=int, default=d.indexers)
    p.add_argument("--crashes", type=int, default=d.crashes,
                   help="nodes that crash once in the fault phase and restart from their store")
    p.add_argument("--adversary", action="store_true",
                   help="add one misbehaving peer the honest nodes must ban")
    p.add_argument("--no-authorization", action="store_true",
                   help="a pure MEG: no topic state, no order, no acks")
    p.add_argument("--sweep", type=int, default=None, metavar="N",
                   help="run seeds SEED..SEED+N-1 of this scenario and report")
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
        liveness_bound_ms=ns.liveness_bound, authorization=not ns.no_authorization,
        indexers=ns.indexers, adversary=ns.adversary, crashes=ns.crashes)


def sweep(scenario: Scenario, count: int) -> int:
    """Run `count` seeds from scenario.seed on; print one line each and a total."""
    started = time.perf_counter()
    failed: list[int] = []
    for seed in range(scenario.seed, scenario.seed + count):
        try:
            summary = run_scenario(replace(scenario, seed=seed))
            print(f"seed {seed}: ok, {summary.events} events, {summary.confirmed} confirmed, "
                  f"{summary.acks} acks, {summary.bans} bans, converged "
                  f"{summary.convergence_ms} ms after faults, wall {summary.wall_s:.1f} s",
                  flush=True)
        except AssertionError as failure:
            failed.append(seed)
            print(failure, flush=True)
    wall = time.perf_counter() - started
    print(f"sweep: {count - len(failed)}/{count} seeds passed in {wall:.0f} s"
          + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    scenario = scenario_from_args(ns)
    if ns.sweep is not None:
        return sweep(scenario, ns.sweep)
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
