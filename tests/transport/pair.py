"""A NodePair: two Disseminators wired by hand, for exact round-trip and byte counts.

Messages are delivered in *flights*: every message in flight goes over at
once, the answers form the next flight. Two flights are one round trip. No
loss, no clock beyond a counter — this measures the protocol, not a network.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from node.core.event import Event
from node.core.identity import Identity
from node.core.parents import DepletionPolicy
from node.core.replica import Replica, ReplicaConfig
from storage.memory import MemoryStore
from transport.dissemination import Disseminator, DisseminationConfig, Effect, Send
from transport.messages import decode, event_bytes

PAIR_NOW_MS = 1_000_000
MAX_FLIGHTS = 1_000  # a reconciliation that needs more is a bug, not a slow network


def identity(name: str) -> Identity:
    return Identity.from_seed(name.encode().ljust(32, b"\0")[:32])


@dataclass
class Exchange:
    """What one reconciliation cost."""

    flights: int = 0
    messages: int = 0
    bytes: int = 0
    event_bytes: int = 0
    events: int = 0
    log: list[tuple[str, str, int]] = field(default_factory=list)  # (sender, type, size)

    @property
    def round_trips(self) -> float:
        return self.flights / 2

    @property
    def overhead_bytes(self) -> int:
        return self.bytes - self.event_bytes


class NodePair:
    """Nodes "a" and "b" holding replicas of one topic, connected to each other only."""

    def __init__(self, seed: int = 1, config: DisseminationConfig | None = None,
                 d_max: int = 10) -> None:
        self.rng = random.Random(seed)
        # Exchanges start only when a test says so: no connect-time sync, no timers.
        self.config = replace(config or DisseminationConfig(push=False, log=False, depletion=False),
                              sync_on_connect=False)
        no_dummies = ReplicaConfig(depletion=DepletionPolicy(enabled=False))
        self.now_ms = PAIR_NOW_MS
        a = Replica.create_topic(MemoryStore(), identity("a"), self.now_ms, name="pair",
                                 d_max=d_max, config=no_dummies)
        b = Replica(MemoryStore(), a.topic_id, identity("b"), no_dummies)
        b.receive(a.graph.get(a.topic_id).raw, self.now_ms)
        b.commit()
        self.topic = a.topic_id
        self.replicas = {"a": a, "b": b}
        self.engines = {
            name: Disseminator(self.replicas[name].identity.public_key.hex(), self.rng, self.config)
            for name in ("a", "b")
        }
        for name, engine in self.engines.items():
            engine.add_topic(self.replicas[name])
            engine.on_peer_up("b" if name == "a" else "a", self.now_ms)

    def write(self, name: str, count: int, payload_bytes: int = 100) -> list[Event]:
        """`count` events by node `name`, each on top of its current heads (a chain)."""
        replica = self.replicas[name]
        made = []
        for i in range(count):
            self.now_ms += 1
            payload = f"{name}{i}".encode().ljust(payload_bytes, b".")
            event, _ = replica.publish(payload, self.now_ms, self.rng)
            made.append(event)
        replica.commit()
        return made

    def copy(self, src: str, dst: str) -> None:
        """Give `dst` every event of `src` directly (a shared past)."""
        graph = self.replicas[src].graph
        for _, event in graph.deliveries(0, graph.delivered_count):
            self.replicas[dst].receive(event.raw, self.now_ms)
        self.replicas[dst].commit()

    def sync(self, initiator: str = "a") -> Exchange:
        """One reconciliation opened by `initiator`, delivered flight by flight to quiescence."""
        other = "b" if initiator == "a" else "a"
        exchange = Exchange()
        flight = [(initiator, e) for e in self.engines[initiator].sync_with(other, self.topic,
                                                                             self.now_ms)]
        while flight:
            exchange.flights += 1
            assert exchange.flights <= MAX_FLIGHTS, "reconciliation does not terminate"
            next_flight: list[tuple[str, Effect]] = []
            for sender, effect in flight:
                if not isinstance(effect, Send):
                    continue
                message = decode(effect.data)
                exchange.messages += 1
                exchange.bytes += len(effect.data)
                exchange.event_bytes += event_bytes(message)
                exchange.events += len(getattr(message, "events", ()))
                exchange.log.append((sender, type(message).__name__, len(effect.data)))
                receiver = effect.peer
                self.now_ms += 1
                for answer in self.engines[receiver].on_message(sender, effect.data, self.now_ms):
                    next_flight.append((receiver, answer))
            flight = next_flight
        return exchange

    def same(self) -> bool:
        a, b = self.replicas["a"].graph, self.replicas["b"].graph
        return (a.extremities() == b.extremities() and a.delivered_count == b.delivered_count
                and a.buffered_count == 0 and b.buffered_count == 0)


def lagging(m: int, seed: int = 1, base: int = 20, payload_bytes: int = 100,
            **kwargs) -> NodePair:
    """b is m events ahead of a (a shared past of `base` events)."""
    pair = NodePair(seed, **kwargs)
    pair.write("a", base, payload_bytes)
    pair.copy("a", "b")
    pair.write("b", m, payload_bytes)
    return pair


def diverged(m: int, seed: int = 1, base: int = 20, synced_before: bool = True,
             payload_bytes: int = 100, **kwargs) -> NodePair:
    """a and b share `base` events, then each writes m of its own (two partitions).

    With `synced_before` they reconciled once before splitting, so each holds
    the other's last heads (KH Algorithm 2's per-peer state); otherwise this
    is their first contact.
    """
    pair = NodePair(seed, **kwargs)
    pair.write("a", base, payload_bytes)
    if synced_before:
        pair.sync("a")
    else:
        pair.copy("a", "b")
    pair.write("a", m, payload_bytes)
    pair.write("b", m, payload_bytes)
    return pair
