"""A NodePair: two Disseminators wired by hand, for exact round-trip and byte counts.

Messages are delivered in *flights*: every message in flight goes over at
once, the answers form the next flight. Two flights are one round trip. No
loss, no clock beyond a counter — this measures the protocol, not a network.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from node.core.event import Event
from node.core.identity import Identity, sign_event
from node.core.parents import DepletionPolicy
from node.replica.replica import Replica, ReplicaConfig
from storage.memory import MemoryStore
from transport.dissemination import Disseminator
from transport.dissemination_config import DisseminationConfig
from transport.effects import Effect, Send
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
    log: list[tuple[str, str, int, int]] = field(default_factory=list)  # sender, type, size, events

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
        no_dummies = ReplicaConfig(depletion=DepletionPolicy(enabled=False), authorization=False)
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
                count = len(getattr(message, "events", ()))
                exchange.events += count
                exchange.log.append((sender, type(message).__name__, len(effect.data), count))
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


def random_universe(seed: int, topic_replica: Replica, count: int, writers: int = 4,
                    lag: int = 4, d_max: int = 4) -> list[Event]:
    """`count` events on top of `topic_replica`'s root, by `writers` authors, in causal order.

    Each event picks up to `d_max` parents from the extremities of one of the
    last `lag` states (stale views make concurrency); any state's extremities
    form an antichain, so every event is valid.
    """
    return _Grower(seed, topic_replica.topic_id, writers).grow(count, lag, d_max)


def random_fork(seed: int, topic_replica: Replica, common: int, each: int,
                writers: int = 4) -> tuple[list[Event], list[Event], list[Event]]:
    """A random shared past, then two random branches grown apart (two partitions)."""
    grower = _Grower(seed, topic_replica.topic_id, writers)
    past = grower.grow(common)
    state = (set(grower.heads), list(grower.history))
    left = grower.grow(each)
    grower.heads, grower.history = state
    right = grower.grow(each)
    return past, left, right


class _Grower:
    def __init__(self, seed: int, root: bytes, writers: int) -> None:
        self.rng = random.Random(seed)
        self.root = root
        self.authors = [identity(f"w{seed}-{i}") for i in range(writers)]
        self.seqs = [0] * writers
        self.heads: set[bytes] = {root}
        self.history: list[list[bytes]] = [[root]]
        self.made = 0

    def grow(self, count: int, lag: int = 4, d_max: int = 4) -> list[Event]:
        rng = self.rng
        events: list[Event] = []
        for _ in range(count):
            view = rng.choice(self.history[-lag:])
            parents = rng.sample(view, min(len(view), rng.randint(1, d_max)))
            w = rng.randrange(len(self.authors))
            self.seqs[w] += 1  # a branch may reuse seqs: equivocation is legal in a MEG
            self.made += 1
            event = sign_event(self.authors[w], topic=self.root, seq=self.seqs[w],
                               parents=parents, timestamp_ms=PAIR_NOW_MS, kind="message",
                               payload=b"u%d" % self.made, auth=(self.root,))
            events.append(event)
            self.heads -= set(parents)
            self.heads.add(event.id)
            self.history.append(sorted(self.heads))
        return events


def closure(events: list[Event], chosen: set[bytes]) -> list[Event]:
    """The events of `chosen` and all their ancestors among `events`, in causal order."""
    by_id = {e.id: e for e in events}
    keep: set[bytes] = set()
    stack = [i for i in chosen if i in by_id]
    while stack:
        event_id = stack.pop()
        if event_id in keep:
            continue
        keep.add(event_id)
        stack.extend(p for p in by_id[event_id].parents if p in by_id)
    return [e for e in events if e.id in keep]


def load(replica: Replica, events: list[Event]) -> None:
    for event in events:
        replica.receive(event.raw, PAIR_NOW_MS)
    replica.commit()
