"""What determines a simulated run: `Scenario`, and the command line that replays it.

A `Scenario` is a value: the seed and every knob of the world. Two runs of
one scenario are the same run, bit for bit, in any process; `argv()` is the
command line that replays it (`python -m transport.sim ...`), which is why a
failure names `replay_command()` and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

from node.core.parents import DEFAULT_D_MAX
from transport.defaults import DEFAULT_SYNC_INTERVAL_MS
from transport.depletion import DepletionMode
from transport.dissemination_config import (
    DEFAULT_FORWARD_FANOUT,
    DEFAULT_PUSH_FANOUT,
    DisseminationConfig,
)

LIVENESS_BOUND_MS = 120_000  # virtual time the healed cluster gets to converge
DEFAULT_INDEXERS = 3  # an authorized world's indexers: nodes 0..k-1 (node 0 created the topic)
PROGRAM = "python -m transport.sim"


@dataclass(frozen=True)
class Scenario:
    """Everything that determines a run; `argv()` is the command line that replays it."""

    seed: int
    nodes: int = 50
    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    latency_ms: tuple[int, int] = (5, 50)
    # Links keep order, as a libp2p stream does (`transport.sim.network`, fifo); the
    # default since 2026-11-27 (before it each message drew its own latency and
    # overtook others on its link: `--reordering-links` replays runs recorded then).
    fifo_links: bool = True
    neighbours: int = 6
    rounds: int = 30
    writers: int = 4  # concurrent writers per round
    round_ms: int = 200
    partition_at_ms: int | None = None
    heal_at_ms: int | None = None
    groups: int = 2  # a partition splits the nodes into this many groups (round robin)
    push: bool = True
    tree: bool = False  # with push: the eager/lazy tree (transport.eager_lazy), not random push
    fanout: int = DEFAULT_PUSH_FANOUT
    forward_fanout: int = DEFAULT_FORWARD_FANOUT
    sync_interval_ms: int = DEFAULT_SYNC_INTERVAL_MS
    peer_state: bool = True
    witnessed_since: bool = True  # DisseminationConfig.since_from_fast_path
    d_max: int = DEFAULT_D_MAX
    depletion: bool = True
    depletion_mode: str = DepletionMode.COORDINATED.value  # who writes dummies
    lossy_liveness: bool = True
    liveness_bound_ms: int = LIVENESS_BOUND_MS
    # The one world: topic state with auth rules, indexers that ack, the peer
    # policy, crashes that restart from the store, one misbehaving peer.
    authorization: bool = True
    indexers: int = DEFAULT_INDEXERS
    adversary: bool = False
    crashes: int = 0  # nodes (not indexers) that crash once during the fault phase
    # A private topic (issue 15): the creator invites the other nodes, which join
    # through the join handshake, and `outsiders` more nodes that know the topic
    # id keep asking; they must receive none of its events or event ids.
    invite: bool = False
    outsiders: int = 0
    # Issue 16: the last member is banned a third of the way through the write
    # rounds and keeps writing on pre-ban parents (adversary.BannedWriter).
    banned_writer: bool = False
    # Issue 15's history setting of the private topic, and `late` members (the last
    # ones) invited only half-way through the write rounds: with `joined` they must
    # be sent no payload from before their join, and must hold every later one.
    history: str = "shared"
    late: int = 0
    # Issue 12's fleet world (transport.sim.fleet): no fixed overlay; every node starts
    # knowing only node 0 and forms its links by the runtime's own decisions (peer book,
    # peer exchange, connection manager, redial backoff); `churn` of the nodes restart
    # per virtual minute (half of them on a new address), node 0 is killed at
    # `kill_bootstrap_at_ms`; writes are spread over `fleet_ms`.
    fleet: bool = False
    churn: float = 0.1
    fleet_ms: int = 150_000
    # Late enough for every node to have met another than node 0 (a full node 0 refuses
    # the last joiners for a while: docs/fleet.md, "The fleet world").
    kill_bootstrap_at_ms: int = 40_000
    low_water: int = 8
    high_water: int = 16

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
        if self.push and self.tree:
            args += ["--fast-path", "tree"]
        if self.outsiders:
            args += ["--outsiders", str(self.outsiders)]
        if self.depletion_mode != DepletionMode.COORDINATED.value:
            args += ["--depletion-mode", self.depletion_mode]
        if self.history != "shared":
            args += ["--history", self.history]
        if self.late:
            args += ["--late", str(self.late)]
        if self.fleet:
            args += ["--fleet", "--churn", str(self.churn), "--fleet-ms", str(self.fleet_ms),
                     "--kill-bootstrap-at", str(self.kill_bootstrap_at_ms),
                     "--low-water", str(self.low_water), "--high-water", str(self.high_water)]
        if self.partition_at_ms is not None and self.heal_at_ms is not None:
            args += ["--partition-at", str(self.partition_at_ms), "--heal-at", str(self.heal_at_ms)]
        for flag, on in (("--no-push", not self.push), ("--no-peer-state", not self.peer_state),
                         ("--no-witnessed-since", not self.witnessed_since),
                         ("--no-depletion", not self.depletion),
                         ("--clean-liveness", not self.lossy_liveness),
                         ("--no-authorization", not self.authorization),
                         ("--adversary", self.adversary), ("--invite", self.invite),
                         ("--banned-writer", self.banned_writer),
                         ("--reordering-links", not self.fifo_links)):
            if on:
                args.append(flag)
        return args

    def replay_command(self) -> str:
        return PROGRAM + " " + " ".join(self.argv())

    def dissemination_config(self, log: bool) -> DisseminationConfig:
        return DisseminationConfig(push=self.push, tree=self.tree, push_fanout=self.fanout,
                                   forward_fanout=self.forward_fanout,
                                   sync_interval_ms=self.sync_interval_ms,
                                   sync_jitter_ms=self.sync_interval_ms // 4,
                                   use_peer_state=self.peer_state,
                                   since_from_fast_path=self.witnessed_since,
                                   depletion=self.depletion,
                                   depletion_mode=DepletionMode(self.depletion_mode),
                                   log=log)
