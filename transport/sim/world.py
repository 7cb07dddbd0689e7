"""The seeded world: n real replicas of one topic, their engines and peer policies, on
the simulated network.

A `Cluster` holds n nodes, each a `Disseminator` over one `Replica` (memory
store) of a single topic, with the node's `PeerPolicy`, and carries out
their effects on the `Network` (transport.sim.network): the real protocol
engine and the real replica run unchanged, the cluster only delivers what
they send and applies what their policies decide (cut a link, record a ban,
redial later). It also makes things happen: write rounds, crashes that
restart a node from its MemoryStore with a fresh engine and policy, and one
optional misbehaving peer (transport.sim.adversary).

With `authorization` the topic is the one a node creates (public join rule,
members write) with `indexers` indexers made by a power-levels state event,
and each tick an indexer may ack, as the node's ticker does. With `invite`
too it is private (issue 15): the creator invites the other n-1 nodes, which
start empty and join through the join handshake (`transport.join_handshake`),
asking again every JOIN_RETRY_MS until they hold the topic; `outsiders` more
nodes know the topic id, were never invited and keep asking (their engines'
offers and join asks, plus a want and a push, `adversary.outsider_frames`).
The checkers then also require that no outsider was sent any event or event
id of the topic (`checks.Exposure`). Without it, a
pure MEG: no topic state, no order, no acks (the paper's model, which the
width and push measurements use).

A run has two phases, as in TigerBeetle's VOPR: a fault phase (writers
publish on a schedule while faults apply), then a liveness phase (partitions
healed, and unless `lossy_liveness` loss/duplication/reordering stop) that
runs until the checkers' `converged` holds or `liveness_bound_ms` passed;
then `check` (transport.sim.checks) raises unless the world is right.
"""

from __future__ import annotations

import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from node.core.identity import Identity
from node.core.parents import DEFAULT_D_MAX, DepletionPolicy
from node.core.peer_policy import Abort, Banned, PeerPolicy, Redial
from node.replica.ordering import OrderConfig
from node.replica.replica import Replica, ReplicaConfig
from node.state.actions import power_levels_content
from node.state import resolution_memo
from node.state.power_levels import CREATOR_LEVEL
from node.state.types import (
    HISTORY_SHARED,
    RULE_INVITE,
    RULE_PUBLIC,
    TYPE_POWER_LEVELS,
    Membership,
    user_id,
)
from node.state.view import StateView
from storage.memory import MemoryStore
from transport.dissemination import Disseminator
from transport.dissemination_config import DisseminationConfig
from transport.effects import Disconnect, Effect, Log, Send
from transport.sim import checks
from transport.sim.adversary import (
    ADVERSARY_NEIGHBOURS,
    Adversary,
    BannedWriter,
    ban_confirmed,
    outsider_frames,
)
from transport.sim.gc_quiet import quiet_gc
from transport.sim.network import Due, Network, ring_with_chords
from transport.sim.scenario import DEFAULT_INDEXERS, LIVENESS_BOUND_MS, Scenario
from transport.sim.simnode import SimNode, seed_bytes
from transport.sim.summary import Summary, engine_totals, summarise

CONVERGENCE_CHECK_MS = 100  # how often the liveness phase looks for convergence
DEFAULT_TICK_MS = 100  # how often each engine's tick runs
MAX_NODES = 10_000
ACK_INTERVAL_MS = 250  # an indexer's acks, at most one per interval (the node's default)
RESTART_AFTER_MS = 1_000  # a crashed node restarts from its store this long after
BOOTSTRAP_EVENTS = 16  # the topic's first events an invite carries (open topics)
JOIN_RETRY_MS = 1_000  # an invitee that holds nothing yet (or an outsider) asks again this often

# The heap's entry kinds as plain ints: the run loop compares them per entry.
_DELIVER, _TICK, _ROUND = int(Due.DELIVER), int(Due.TICK), int(Due.ROUND)
_CRASH, _RESTART = int(Due.CRASH), int(Due.RESTART)

# The process-wide memo of state resolutions (node.state.resolution_memo) holds this
# many items while a world runs here (about 200 MB at most): a world's replicas all
# meet the same merges, the join storm's above all, and with a node's bound the
# 1000-node world resolved them again replica after replica.
SIM_RESOLUTION_MEMO_ITEMS = 2_000_000


class Cluster:
    """n replicas of one topic over a simulated network on a virtual clock."""

    def __init__(self, seed: int, n: int, *, loss: float = 0.0, duplicate: float = 0.0,
                 latency_ms: tuple[int, int] = (5, 50), reorder: float = 0.0,
                 neighbours: int = 6, config: DisseminationConfig = DisseminationConfig(log=False),
                 d_max: int = DEFAULT_D_MAX, depletion: bool = True,
                 tick_ms: int = DEFAULT_TICK_MS, log_dir: str | Path | None = None,
                 scenario: Scenario | None = None, authorization: bool = False,
                 indexers: int = DEFAULT_INDEXERS, adversary: bool = False,
                 invite: bool = False, outsiders: int = 0,
                 banned_writer: int | None = None, history: str = HISTORY_SHARED,
                 late: int = 0, late_round: int = 1, fifo_links: bool = True) -> None:
        if not 2 <= n <= MAX_NODES or not 0 <= outsiders <= MAX_NODES - n:
            raise ValueError(f"n must be in [2, {MAX_NODES}], outsiders in [0, {MAX_NODES} - n]")
        if (invite or outsiders) and not authorization:
            raise ValueError("a private topic (invite, outsiders) needs authorization")
        if (late or history != HISTORY_SHARED) and not invite:
            raise ValueError("late members and a history setting need an invite topic")
        if not 0 <= late < n - 1:
            raise ValueError("late members must be fewer than the members but the creator")
        if banned_writer is not None and (not authorization or n < 2
                                          or n - 1 - late < min(indexers, n)):
            raise ValueError("a banned writer needs authorization and a non-indexer member "
                             "invited from the start")
        memo = resolution_memo.SHARED  # (a cache of pure results: no effect on the run)
        memo.max_items = max(memo.max_items, SIM_RESOLUTION_MEMO_ITEMS)
        self.seed = seed
        self.rng = random.Random(seed)
        self.network = Network(self.rng, loss=loss, duplicate=duplicate, reorder=reorder,
                               latency_ms=latency_ms, fifo=fifo_links)
        self.tick_ms = tick_ms
        # Only a Scenario's schedule can be replayed from the command line; a cluster
        # scheduled by hand (partition(), write()) is replayed by rerunning its code.
        self._replayable = scenario is not None
        self.scenario = scenario or Scenario(seed=seed, nodes=n, loss=loss, duplicate=duplicate,
                                             reorder=reorder, latency_ms=latency_ms,
                                             fifo_links=fifo_links,
                                             neighbours=neighbours, d_max=d_max)
        self.created: list[bytes] = []
        self.width_samples: list[float] = []
        self.disconnects: list[tuple[int, str]] = []
        self.bans: list[tuple[int, str]] = []  # (node, banned peer), in the order they happened
        self.order_watch = checks.OrderWatch()
        self.invalid_log_records = 0
        self.authorization = authorization
        self.adversary: Adversary | None = None
        # The member banned at that write round (or the first after it where it has joined),
        # which keeps writing (BannedWriter): the last member invited from the start.
        self.banned = None if banned_writer is None else BannedWriter(
            n - 1 - late, banned_writer, private=invite)
        # What members that had applied the ban sent the banned member of a private
        # topic besides its removal (checks.banned_writer_problems: nothing).
        self.banned_exposure = checks.Exposure()
        # Without authorization: a pure MEG, no topic state or auth rules (the
        # paper's model; the width and push measurements use it). With it: the
        # topic the node creates (public join rule, members write), indexers
        # made by a power-levels state event, acks on every tick.
        self.replica_config = ReplicaConfig(
            depletion=DepletionPolicy(enabled=depletion), authorization=authorization,
            ordering=OrderConfig(ack_interval_ms=ACK_INTERVAL_MS))
        self.config = config = replace(config, log=log_dir is not None)
        self.invite = invite
        total = n + outsiders
        identities = [Identity.from_seed(seed_bytes(seed, i)) for i in range(total)]
        creator_store = MemoryStore()
        creator = Replica.create_topic(
            creator_store, identities[0], now_ms=0, name="sim", d_max=d_max,
            config=self.replica_config, authorization=authorization,
            **({"join_rule": RULE_INVITE if invite else RULE_PUBLIC, "members_write": True,
                "history": history} if authorization else {}))
        self.topic = creator.topic_id
        if authorization:
            self.indexer_keys = frozenset(i.public_key for i in identities[:max(1, indexers)])
            content = power_levels_content(StateView(creator._current_state(), creator.graph))
            for key in sorted(self.indexer_keys):
                content["users"][user_id(key)] = CREATOR_LEVEL
            creator.set_state(TYPE_POWER_LEVELS, "", content, 0, self.rng)
            if invite:  # the members but the late ones; outsiders are never invited
                for ident in identities[1:n - late]:
                    creator.invite(ident.public_key, 0, self.rng)
            creator.commit()
        else:
            self.indexer_keys = frozenset()
        # Joined: the invite carried the topic's first events.
        bootstrap = [e.raw for _, e in creator.graph.deliveries(0, limit=BOOTSTRAP_EVENTS)]
        self.nodes: list[SimNode] = []
        joins: list[tuple[int, Any]] = []
        for i, ident in enumerate(identities):
            store = creator_store if i == 0 else MemoryStore()
            replica = creator if i == 0 else Replica(store, self.topic, ident, self.replica_config)
            if i and i < n and not invite:
                for raw in bootstrap:
                    replica.receive(raw, 0)
                replica.commit()
                if authorization:
                    joins.append((i, replica.join(0, self.rng)[0]))
            node_id = ident.public_key.hex()
            engine = Disseminator(node_id, self.rng, config)
            engine.add_topic(replica)
            if invite and i:
                # Before any link opens: as an invitee it then sends nothing of the topic
                # to anyone but the member that takes its join in (its first tick asks).
                engine.request_join(self.topic, 0)
            self.nodes.append(SimNode(i, node_id, ident, replica, engine,
                                      self._open_log(log_dir, node_id), store,
                                      PeerPolicy(self.rng), member=i < n))
        self.members = self.nodes[:n]
        # Per member, once it holds an event of every member (every join: the join
        # storm is over there): (when, its engine's width_tick_sum, width_ticks) then.
        # The width depletion bounds is measured from there (`summary`): n concurrent
        # joins hold every replica's width near n, whatever depletion does.
        self.joins_held: dict[int, tuple[int, int, int]] = {}
        self._member_keys = [node.identity.public_key for node in self.members]
        # Late members: invited at write round `late_round`; the full payloads each is sent.
        self.late_round = late_round
        self.late_payloads: dict[int, set[bytes]] = {i: set() for i in range(n - late, n)}
        self.exposure = {i: checks.Exposure() for i in range(n, total)}
        self._index = {node.node_id: node.index for node in self.nodes}
        # Members first on the ring: they stay connected among themselves through
        # their ring edges, whatever the outsiders between the chords do.
        self.edges = self._overlay(total, neighbours)
        self.links: set[tuple[int, int]] = set()
        # Each node's open links (index n: the adversary), kept with `links`: a tick asks
        # for its node's peers, and scanning every link per tick was the sim's own hot spot.
        self._adjacent: list[set[int]] = [set() for _ in range(total + 1)]
        for a, b in self.edges:
            self._link(a, b)
        for i, event in joins:
            self._apply(self.nodes[i], self.nodes[i].engine.on_publish(self.topic, event, 0))
        for node in self.nodes:  # random tick phases: nodes do not act in lockstep
            self.network.schedule(self.rng.randrange(tick_ms), Due.TICK, node.index, 0, None)
        if adversary:
            self._add_adversary()

    def _overlay(self, total: int, neighbours: int) -> list[tuple[int, int]]:
        """The links every node keeps (and redials after a restart): a ring with chords.
        The fleet world (transport.sim.fleet) starts with none and forms its own."""
        return ring_with_chords(total, neighbours, self.rng)

    @classmethod
    def from_scenario(cls, scenario: Scenario, log_dir: str | Path | None = None) -> Cluster:
        """The world `scenario` describes, its faults and its writes scheduled."""
        s = scenario
        cluster = cls.built_for(s, log_dir)
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

    @classmethod
    def built_for(cls, scenario: Scenario, log_dir: str | Path | None = None) -> Cluster:
        """The world `scenario` describes (every flag but the schedule), nothing scheduled yet."""
        s = scenario
        return cls(s.seed, s.nodes, loss=s.loss, duplicate=s.duplicate, latency_ms=s.latency_ms,
                   reorder=s.reorder, neighbours=s.neighbours,
                   config=s.dissemination_config(log=False), d_max=s.d_max,
                   depletion=s.depletion, log_dir=log_dir, scenario=s,
                   authorization=s.authorization, indexers=s.indexers, adversary=s.adversary,
                   invite=s.invite, outsiders=s.outsiders,
                   banned_writer=max(1, s.rounds // 3) if s.banned_writer else None,
                   history=s.history, late=s.late, late_round=max(1, s.rounds // 2),
                   fifo_links=s.fifo_links)

    @property
    def now_ms(self) -> int:
        return self.network.now_ms

    @property
    def adversary_neighbours(self) -> list[int]:
        return [] if self.adversary is None else self.adversary.neighbours

    # ------------------------------------------------------------- schedule

    def partition(self, groups: list[set[int]] | list[frozenset[int]], at_ms: int,
                  heal_at_ms: int) -> None:
        """Drop messages between `groups` of node indices from `at_ms` until `heal_at_ms`."""
        self.network.partition(groups, at_ms, heal_at_ms)

    def crash(self, index: int, at_ms: int, restart_after_ms: int) -> None:
        """Node `index` crashes at `at_ms` (its memory and in-flight messages are lost)
        and restarts from its store `restart_after_ms` later."""
        self.network.schedule(at_ms, Due.CRASH, index, 0, None)
        self.network.schedule(at_ms + restart_after_ms, Due.RESTART, index, 0, None)

    def write(self, rounds: int, writers: int, round_ms: int, start_ms: int | None = None) -> None:
        """Each round, `writers` distinct random nodes publish one event each, concurrently."""
        if not 1 <= writers <= len(self.members):
            raise ValueError("writers must be in [1, n]")
        start = self.now_ms + round_ms if start_ms is None else start_ms
        for r in range(rounds):
            self.network.schedule(start + r * round_ms, Due.ROUND, writers, r, None)

    # ------------------------------------------------------------- running

    def run_until(self, end_ms: int) -> None:
        network = self.network
        for at, kind, a, b, payload in network.due(end_ms):
            if kind == _DELIVER:
                self._deliver(a, b, payload)
            elif kind == _TICK:
                self._tick(a)
                network.schedule(at + self.tick_ms, Due.TICK, a, 0, None)
            elif kind == _ROUND:
                self._round(a, b)
            elif kind == _CRASH:
                self._crash(a)
            elif kind == _RESTART:
                self._restart(a)
            else:
                self._redial(a, b)

    def fault_phase_end(self) -> int:
        heals = [p.heal_at_ms for p in self.network.partitions]
        return max(self.network.last(Due.ROUND) + heals + [self.now_ms])

    def heal(self, clean: bool) -> None:
        """Enter the liveness phase: no partitions; with `clean`, no loss/dup/reorder either."""
        self.network.heal(clean)

    def run_to_convergence(self, bound_ms: int = LIVENESS_BOUND_MS) -> int | None:
        """Run until converged (checked every CONVERGENCE_CHECK_MS) or `bound_ms` passed."""
        deadline = self.now_ms + bound_ms
        while self.now_ms < deadline:
            if self.converged():
                return self.now_ms
            self.run_until(min(deadline, self.now_ms + CONVERGENCE_CHECK_MS))
        return self.now_ms if self.converged() else None

    def run_scenario_phases(self) -> tuple[int, int | None]:
        """Fault phase, heal, liveness phase: (the fault phase's end, the time every node
        had converged, None if not within the scenario's liveness bound)."""
        with quiet_gc():  # the world is built: freeze it (transport.sim.gc_quiet)
            end = self.fault_phase_end()
            self.run_until(end)
            self.heal(clean=not self.scenario.lossy_liveness)
            return end, self.run_to_convergence(self.scenario.liveness_bound_ms)

    def run(self) -> Summary:
        """Fault phase, heal, liveness phase, checks; returns the summary (raises on failure)."""
        started = time.perf_counter()
        end, converged_at = self.run_scenario_phases()
        self.close_logs()
        self.check(converged_at is not None)
        return self.summary(end, converged_at, time.perf_counter() - started)

    # ------------------------------------------------------------- checkers and results

    def converged(self) -> bool:
        return checks.converged(self)

    def check(self, converged: bool = True) -> None:
        """Every checker (transport.sim.checks); AssertionError naming the replay otherwise."""
        checks.check(self, converged)

    def replay_hint(self) -> str:
        return (self.scenario.replay_command() if self._replayable else
                f"rerun the code that built this Cluster with seed={self.seed}")

    def event_ids(self, index: int) -> set[bytes]:
        return checks.held_ids(self.nodes[index])

    def totals(self) -> dict[str, int]:
        """The engines' counters, summed over the nodes."""
        return engine_totals(self)

    def summary(self, fault_end: int, converged_at: int | None, wall_s: float) -> Summary:
        return summarise(self, fault_end, converged_at, wall_s)

    # ------------------------------------------------------------- what happens on the heap

    def _is_banned_writer(self, index: int) -> bool:
        return self.banned is not None and self.banned.ban_id is not None \
            and index == self.banned.index

    def _told_banned(self, src: int, dst: int) -> bool:
        """Is this a frame to the banned member of a private topic from a member whose state
        holds its ban, as it sends it? (Such a member may send it its removal and nothing
        else.)"""
        if not self.invite or not self._is_banned_writer(dst) \
                or src >= len(self.nodes) or not self.nodes[src].member:
            return False
        key = self.nodes[dst].identity.public_key
        return self.nodes[src].replica.membership_of(key) is Membership.BAN

    def _deliver(self, src: int, dst: int, data: bytes) -> None:
        if self.network.separated(src, dst):
            self.network.dropped += 1
            return
        if dst == len(self.nodes) or (min(src, dst), max(src, dst)) not in self.links:
            self.network.dropped += 1  # to the adversary (it listens to nobody), or the link closed
            return
        node = self.nodes[dst]
        if not node.member and src < len(self.nodes) and self.nodes[src].member \
                and not self._is_banned_writer(src):
            # What members leak (outsiders' junk aside, and the banned writer's: once
            # banned it is no correct member, and it pushes its writes to every neighbour).
            self.exposure[dst].note(data, self.topic)
        elif dst in self.late_payloads:
            self.late_payloads[dst] |= checks.payloads_carried(data, self.topic)
        sender = self._peer(src).node_id
        now = self.now_ms
        if not node.alive or (node.policy is not None and node.policy.is_banned(sender, now)):
            self.network.dropped += 1
            return
        # As the node's committer: a catch-up page asks for the next one on arrival.
        self._apply(node, node.engine.prefetch(sender, data, now))
        self._apply(node, node.engine.on_message(sender, data, now))

    def _tick(self, index: int) -> None:
        if index == len(self.nodes):
            self._adversary_tick()
            return
        node = self.nodes[index]
        if not node.alive:
            return
        at = self.now_ms
        if self.invite and not node.replica.ready and at >= node.next_join_ms:
            self._ask_to_join(node, at)
        self._apply(node, node.engine.tick(at))
        if node.member and self.authorization and index not in self.joins_held:
            self._note_joins_held(node, at)
        if self.banned is not None and index == self.banned.index and self.banned.due(at):
            self._banned_writes(self.banned)
        assert node.policy is not None
        connected = sorted(self._peer(other).node_id for other in self._adjacent[index])
        self._apply_policy(node, node.policy.tick(at, connected))
        if self.authorization:
            made = node.replica.maybe_ack(at, self.rng)  # as the node's ticker does
            if made is not None:
                self._apply(node, node.engine.on_publish(self.topic, made[0], at))
            self._observe(node)

    def _note_joins_held(self, node: SimNode, at: int) -> None:
        """Does `node` hold an event of every member yet? (`joins_held`; read only)"""
        graph = node.replica.graph
        if all(graph.author_latest_seq(key) is not None for key in self._member_keys):
            stats = node.engine.stats
            self.joins_held[node.index] = (at, stats["width_tick_sum"], stats["width_ticks"])

    def _ask_to_join(self, node: SimNode, at: int) -> None:
        """An invitee (or an outsider) that holds nothing of the topic asks its peers again.

        Only while it holds nothing: once a member took its join in, the
        topic comes by anti-entropy, and asking again would sign a second join.
        """
        node.next_join_ms = at + JOIN_RETRY_MS
        self._apply(node, node.engine.request_join(self.topic, at))
        if not node.member:
            frames = outsider_frames(node.identity, self.topic, at, at)
            for peer in sorted(self._adjacent[node.index]):
                for frame in frames:
                    self.network.transmit(node.index, peer, frame)

    def _observe(self, node: SimNode) -> None:
        """The order watch (transport.sim.checks.OrderWatch) looks at this node's order."""
        if self.authorization:
            self.order_watch.observe(node, self.now_ms)

    def _round(self, writers: int, round_: int = 0) -> None:
        self.width_samples.append(
            sum(n.replica.graph.width for n in self.members) / len(self.members))
        banned = self.banned
        if banned is not None and banned.ban_id is None and round_ >= banned.ban_round \
                and self._joined(banned.index):
            self._ban(banned)
        if self.late_payloads and round_ == self.late_round:
            creator = self.nodes[0]
            for index in sorted(self.late_payloads):
                event, _ = creator.replica.invite(self.nodes[index].identity.public_key,
                                                  self.now_ms, self.rng)
                self.created.append(event.id)
                self._apply(creator, creator.engine.on_publish(self.topic, event, self.now_ms))
        for index in sorted(self.rng.sample(range(len(self.members)), writers)):
            node = self.nodes[index]
            if not node.alive:
                continue  # crashed: it writes nothing until it restarts
            if banned is not None and banned.ban_id is not None and index == banned.index:
                continue  # it writes below, on its pre-ban parents
            if self.invite and node.replica.membership_of(node.identity.public_key) \
                    is not Membership.JOIN:
                continue  # an invitee whose join is not in its state yet writes nothing
            event, _ = node.replica.publish(f"{index}@{self.now_ms}".encode(), self.now_ms, self.rng)
            self.created.append(event.id)
            self._apply(node, node.engine.on_publish(self.topic, event, self.now_ms))

    def _joined(self, index: int) -> bool:
        """Has member `index` joined, in the creator's state and in its own? (An invitee
        whose join has not come round yet is not banned: it could not write, nor be told.)"""
        key = self.nodes[index].identity.public_key
        return all(node.replica.membership_of(key) is Membership.JOIN
                   for node in (self.nodes[0], self.nodes[index]))

    @property
    def correct_members(self) -> list[SimNode]:
        """The members that must converge: all of them, but the banned writer of a private
        topic, which reads nothing once banned (its own writes after that go nowhere)."""
        banned = self.banned
        if banned is None or not self.invite:
            return self.members
        return [node for node in self.members if node.index != banned.index]

    def _ban(self, banned: BannedWriter) -> None:
        """The creator bans the banned writer; its heads at that instant are its pre-ban parents."""
        creator, target = self.nodes[0], self.nodes[banned.index]
        event, _ = creator.replica.ban(target.identity.public_key, self.now_ms, self.rng)
        self.created.append(event.id)
        self._apply(creator, creator.engine.on_publish(self.topic, event, self.now_ms))
        banned.banned(event.id, target.replica.graph.extremities())

    def _banned_writes(self, banned: BannedWriter) -> None:
        """The banned writer signs on its pre-ban chain and pushes to every neighbour."""
        node = self.nodes[banned.index]
        assert banned.ban_id is not None
        confirmed = banned.private and any(ban_confirmed(n.replica, banned.ban_id)
                                           for n in self.correct_members)
        frame = banned.push(self.topic, banned.write(node.replica, self.now_ms, confirmed))
        for peer in sorted(self._adjacent[node.index]):
            self.network.transmit(node.index, peer, frame)

    def _apply(self, node: SimNode, effects: list[Effect]) -> None:
        """Carry out the engine's effects: send, log, and tell the policy of misbehaviour.

        As the node's committer does after each step, the engine is told when the
        step's offers left (`offers_sent_at`): at once here, where steps take no
        time; without it the engine would keep every offer it ever made.
        """
        node.engine.offers_sent_at(self.now_ms)
        for effect in effects:
            if isinstance(effect, Send):
                dst = self._index[effect.peer]
                if self._told_banned(node.index, dst):
                    self.banned_exposure.note(effect.data, self.topic)
                self.network.transmit(node.index, dst, effect.data)
            elif isinstance(effect, Log):
                self._write_log(node, effect.record)
            elif isinstance(effect, Disconnect):
                self.disconnects.append((node.index, effect.peer))
                assert node.policy is not None
                self._apply_policy(node, node.policy.misbehaviour(effect.peer, effect.reason,
                                                                  self.now_ms))

    def _apply_policy(self, node: SimNode, effects: list[Any]) -> None:
        """Carry out the peer policy's effects (node.core.peer_policy) in the simulated network."""
        for effect in effects:
            if isinstance(effect, Abort):
                self._cut(node.index, self._index[effect.peer])
            elif isinstance(effect, Banned):
                self.bans.append((node.index, effect.peer))
            elif isinstance(effect, Redial):
                self.network.schedule(effect.at_ms, Due.REDIAL, node.index,
                                      self._index[effect.peer], None)

    # ------------------------------------------------------------- links, crashes, restarts

    def _peer(self, index: int) -> SimNode | Adversary:
        if self.adversary is not None and index == len(self.nodes):
            return self.adversary
        return self.nodes[index]

    def _link(self, a: int, b: int) -> None:
        """A connection between a and b opens: both engines (and policies) hear of it."""
        key = (min(a, b), max(a, b))
        if key in self.links:
            return
        self.links.add(key)
        self._adjacent[a].add(b)
        self._adjacent[b].add(a)
        for me, other in ((a, b), (b, a)):
            node, peer = self._peer(me), self._peer(other)
            if node.policy is None:
                continue
            assert isinstance(node, SimNode)
            verdict = node.policy.peer_up(peer.node_id, self.now_ms)
            if verdict:
                self._apply_policy(node, verdict)
                return
            self._apply(node, node.engine.on_peer_up(peer.node_id, self.now_ms))

    def _unlink(self, a: int, b: int) -> bool:
        """Forget the link between a and b; False if there was none."""
        key = (min(a, b), max(a, b))
        if key not in self.links:
            return False
        self.links.discard(key)
        self._adjacent[a].discard(b)
        self._adjacent[b].discard(a)
        return True

    def _cut(self, a: int, b: int) -> None:
        """The connection between a and b closes; a live side may redial (its policy says)."""
        if not self._unlink(a, b):
            return
        for me, other in ((a, b), (b, a)):
            node, peer = self._peer(me), self._peer(other)
            if node.policy is None or not node.alive:
                continue
            assert isinstance(node, SimNode)
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
        if self.invite and not node.replica.ready:
            node.engine.request_join(self.topic, self.now_ms)  # an invitee again (see __init__)
            node.next_join_ms = self.now_ms
        node.policy = PeerPolicy(self.rng)
        node.alive = True
        self._observe(node)  # what it confirms from its store extends what it confirmed
        for a, b in self.edges:
            if index in (a, b) and self.nodes[a + b - index].alive:
                self._link(a, b)
        if self.adversary is not None and index in self.adversary.neighbours:
            self._link(self.adversary.index, index)  # it dials back: bans are lost with memory

    def _redial(self, index: int, peer: int) -> None:
        node = self.nodes[index]
        if not node.alive or node.policy is None:
            return
        key = (min(index, peer), max(index, peer))
        target = self._peer(peer)
        for _ in node.policy.redial_due(target.node_id, self.now_ms,
                                        connected=key in self.links):
            if target.alive:
                self._link(index, peer)
                node.policy.dial_succeeded(target.node_id)
            else:
                self._apply_policy(node, node.policy.dial_failed(target.node_id, self.now_ms))

    # ------------------------------------------------------------- the misbehaving peer

    def _add_adversary(self) -> None:
        index = len(self.nodes)
        identity = Identity.from_seed(seed_bytes(self.seed, index))
        count = min(ADVERSARY_NEIGHBOURS, len(self.nodes))
        neighbours = sorted(self.rng.sample(range(len(self.nodes)), count))
        self.adversary = Adversary(index, identity, neighbours)
        self._index[self.adversary.node_id] = index
        for peer in neighbours:
            self._link(index, peer)
        self.network.schedule(self.rng.randrange(self.tick_ms), Due.TICK, index, 0, None)

    def _adversary_tick(self) -> None:
        adversary = self.adversary
        assert adversary is not None
        peers = sorted(self._adjacent[adversary.index])
        for peer, frame in adversary.frames(self.topic, peers, self.now_ms, self.rng):
            self.network.transmit(adversary.index, peer, frame)

    # ------------------------------------------------------------- logs

    def _open_log(self, log_dir: str | Path | None, node_id: str) -> Any:
        if log_dir is None:
            return None
        # Imported only when logs are asked for (it is the simulator's one use of
        # analytics); a broken install then fails loudly instead of writing nothing.
        from node.logschema import JsonLinesLogWriter

        return JsonLinesLogWriter(log_dir, node_id)

    def _write_log(self, node: SimNode, record: dict[str, Any]) -> None:
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
