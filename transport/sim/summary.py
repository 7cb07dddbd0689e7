"""What a simulated run measured: `Summary`, and how it is taken from a finished world.

Traffic (messages, bytes, event bytes against overhead, anti-entropy
exchanges, duplicates), how long the healed world took to converge, the
width (mean before each write round, mean and maximum over every tick of
every replica) against the depletion dummies it cost, and for an authorized
world the order (confirmed length, acks, bans). `digest` hashes the final
event ids and the byte counts: equal runs show equal digests, which is how a
replay in another process is compared.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Protocol

from node.core.event import KIND_DUMMY
from transport.sim.adversary import BannedWriter
from transport.sim.network import Network
from transport.sim.scenario import Scenario
from transport.sim.simnode import SimNode

DIGEST_BYTES = 16


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
    excluded: int = 0  # confirmed events a ban left out of the views (node 0's order)
    soft_failed: int = 0  # events soft-failed on receipt, summed over the replicas
    banned_writes: tuple[int, int] = (0, 0)  # the banned writer's (concurrent, after) writes
    notes: tuple[str, ...] = ()  # a world's own figures (the fleet world's overlay)
    # The width every engine saw at its ticks (transport.dissemination stats), the
    # whole run: what depletion bounds (docs/anti-entropy.md, "Coordinated depletion").
    tick_mean_width: float = 0.0
    max_width: int = 0
    real_events: int = 0  # events in the topic that are not dummies (joins, acks, writes)
    # The same tick width, counted only from when each member held an event of every
    # member (the join storm over there; authorized worlds), and when the last member
    # got there (None: not every member did).
    tick_mean_width_after_joins: float | None = None
    joins_held_ms: int | None = None

    @property
    def dummies_per_write(self) -> float:
        return self.dummies / max(self.created, 1)

    @property
    def dummies_per_real_event(self) -> float:
        return self.dummies / max(self.real_events, 1)

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
            f"depletion: {self.dummies} dummies, {self.dummies_per_write:.2f} per written event, "
            f"{self.dummies_per_real_event:.3f} per real event ({self.real_events}); width "
            f"per tick mean {self.tick_mean_width:.2f}, max {self.max_width}"
            + ("" if self.tick_mean_width_after_joins is None else
               f"; from each member holding every join (all by {self.joins_held_ms} ms) "
               f"mean {self.tick_mean_width_after_joins:.2f}"),
            f"order: {self.confirmed} confirmed, {self.acks} acks; {self.bans} bans",
        ] + ([f"banned writer: {self.banned_writes[0]} writes concurrent with its ban, "
              f"{self.banned_writes[1]} after it; {self.excluded} excluded from the order, "
              f"{self.soft_failed} soft-failed on receipt"] if any(self.banned_writes) else []) \
            + list(self.notes)


class World(Protocol):
    """What a summary reads of a world (transport.sim.world.Cluster)."""

    seed: int
    scenario: Scenario
    nodes: list[SimNode]
    members: list[SimNode]  # the nodes of the topic (all but outsiders)
    network: Network
    authorization: bool
    created: list[bytes]
    width_samples: list[float]
    joins_held: dict[int, tuple[int, int, int]]
    bans: list[tuple[int, str]]
    banned: BannedWriter | None

    def event_ids(self, index: int) -> set[bytes]: ...


def engine_totals(cluster: World) -> dict[str, int]:
    """The engines' counters (transport.dissemination stats), summed over the nodes."""
    total: dict[str, int] = {}
    for node in cluster.nodes:
        for key, value in node.engine.stats.items():
            total[key] = total.get(key, 0) + value
    return total


def summarise(cluster: World, fault_end: int, converged_at: int | None,
              wall_s: float) -> Summary:
    totals = engine_totals(cluster)
    nodes = cluster.members
    ids = sorted(cluster.event_ids(0))
    net = cluster.network
    dummies = sum(n.replica.counters["dummies"] for n in nodes)
    digest = hashlib.blake2b(b"".join(ids) + f"{net.messages}/{net.bytes}".encode(),
                             digest_size=DIGEST_BYTES).hexdigest()
    convergence = None if converged_at is None else converged_at - fault_end
    interval = cluster.scenario.sync_interval_ms
    widths = cluster.width_samples
    first = nodes[0].replica
    graph = first.graph
    real = sum(1 for _, e in graph.deliveries(0, graph.delivered_count) if e.kind != KIND_DUMMY)
    return Summary(
        seed=cluster.seed, nodes=len(nodes), events=len(ids), created=len(cluster.created),
        dummies=dummies, messages=net.messages, bytes=net.bytes,
        event_bytes=totals.get("event_bytes_sent", 0),
        overhead_bytes=net.bytes - totals.get("event_bytes_sent", 0),
        sync_sessions=totals.get("sessions", 0), converged=converged_at is not None,
        fault_phase_end_ms=fault_end, converged_at_ms=converged_at,
        convergence_ms=convergence,
        sync_rounds=None if convergence is None else convergence / interval,
        mean_width=sum(widths) / len(widths) if widths else 0.0,
        duplicates=totals.get("duplicates", 0),
        wall_s=round(wall_s, 3), digest=digest,
        confirmed=(first.order_status().confirmed_length
                   if cluster.authorization and first.ordering is not None else 0),
        acks=sum(n.replica.counters["acks"] for n in nodes), bans=len(cluster.bans),
        excluded=(first.ordering.stats["excluded"]
                  if cluster.authorization and first.ordering is not None else 0),
        soft_failed=sum(n.replica.counters["soft_failed"] for n in nodes),
        banned_writes=((len(cluster.banned.concurrent), len(cluster.banned.after))
                       if cluster.banned is not None else (0, 0)),
        tick_mean_width=round(totals.get("width_tick_sum", 0)
                              / max(totals.get("width_ticks", 0), 1), 3),
        max_width=max((n.engine.stats["width_max"] for n in nodes), default=0),
        real_events=real, **_after_joins(cluster))


def _after_joins(cluster: World) -> dict[str, Any]:
    """The tick width from each member's end of the join storm (`Summary`), if all got there."""
    held = cluster.joins_held
    members = cluster.members
    if not cluster.authorization or any(n.index not in held for n in members):
        return {}
    width_sum = sum(n.engine.stats["width_tick_sum"] - held[n.index][1] for n in members)
    ticks = sum(n.engine.stats["width_ticks"] - held[n.index][2] for n in members)
    return {"tick_mean_width_after_joins": round(width_sum / max(ticks, 1), 3),
            "joins_held_ms": max(held[n.index][0] for n in members)}
