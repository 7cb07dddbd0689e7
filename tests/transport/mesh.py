"""A Mesh: a few Disseminators of one private topic wired by hand, and what each received.

Peer ids are author keys in hex (the simulator's convention, the engine's
default `peer_key`). Messages go over in flights until nothing is in flight;
every frame a node receives is recorded, so a test can count what of the
topic a non-member was sent: events (Push/Reply/Events/JoinSubmit bytes) and
event ids (heads, since, wanted ids, a template's parents and auth refs).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, replace

from node.core.parents import DepletionPolicy
from node.replica.replica import Replica, ReplicaConfig
from node.core.event import decode_event
from node.state.types import HISTORY_SHARED, RULE_INVITE
from storage.memory import MemoryStore
from tests.transport.pair import PAIR_NOW_MS, identity
from transport.dissemination import Disseminator
from transport.dissemination_config import DisseminationConfig
from transport.effects import Effect, Send
from transport.messages import decode
from transport.sim.checks import exposed

MAX_FLIGHTS = 200
CONFIG = DisseminationConfig(log=False, depletion=False, sync_on_connect=False)
REPLICA_CONFIG = ReplicaConfig(depletion=DepletionPolicy(enabled=False), authorization=True)


@dataclass
class Received:
    """What of the topic one node was sent."""

    kinds: Counter[str] = field(default_factory=Counter)
    events: set[bytes] = field(default_factory=set)  # ids of event bytes received
    payloads: set[bytes] = field(default_factory=set)  # ... of those that came with payload
    ids: set[bytes] = field(default_factory=set)  # event ids named (heads, wants, parents...)

    def note(self, data: bytes, topic: bytes) -> None:
        message = decode(data)
        if message.topic != topic:
            return
        self.kinds[type(message).__name__] += 1
        events, ids = exposed(message)
        self.events |= events
        for raw in getattr(message, "events", ()):
            event = decode_event(raw)
            if not event.withheld:
                self.payloads.add(event.id)
        self.ids |= ids


class Mesh:
    """`creator` made an invite topic; every other name starts with an empty replica."""

    def __init__(self, names: list[str], creator: str = "a", seed: int = 1,
                 config: DisseminationConfig = CONFIG, join_rule: str = RULE_INVITE,
                 history: str = HISTORY_SHARED) -> None:
        self.rng = random.Random(seed)
        self.now_ms = PAIR_NOW_MS
        owner = Replica.create_topic(MemoryStore(), identity(creator), self.now_ms,
                                     name="mesh", config=REPLICA_CONFIG, authorization=True,
                                     join_rule=join_rule, members_write=True, history=history)
        self.topic = owner.topic_id
        self.ids = {name: identity(name).public_key.hex() for name in names}
        self.names = {peer: name for name, peer in self.ids.items()}
        self.replicas: dict[str, Replica] = {}
        self.engines: dict[str, Disseminator] = {}
        self.received = {name: Received() for name in names}
        for name in names:
            replica = owner if name == creator else Replica(
                MemoryStore(), self.topic, identity(name), REPLICA_CONFIG)
            engine = Disseminator(self.ids[name], self.rng, replace(config))
            engine.add_topic(replica)
            self.replicas[name] = replica
            self.engines[name] = engine
        self.links: set[frozenset[str]] = set()

    def key(self, name: str) -> bytes:
        return identity(name).public_key

    def connect(self, a: str, b: str) -> list[tuple[str, Effect]]:
        self.links.add(frozenset((a, b)))
        return ([(a, e) for e in self.engines[a].on_peer_up(self.ids[b], self.now_ms)]
                + [(b, e) for e in self.engines[b].on_peer_up(self.ids[a], self.now_ms)])

    def connect_all(self) -> None:
        names = sorted(self.engines)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                self.pump(self.connect(a, b))

    def invite(self, by: str, name: str) -> None:
        event, _ = self.replicas[by].invite(self.key(name), self.now_ms, self.rng)
        self.pump([(by, e) for e in self.engines[by].on_publish(self.topic, event, self.now_ms)])

    def publish(self, name: str, payload: bytes = b"x") -> bytes:
        event, _ = self.replicas[name].publish(payload, self.now_ms, self.rng)
        self.pump([(name, e) for e in self.engines[name].on_publish(self.topic, event,
                                                                     self.now_ms)])
        return event.id

    def request_join(self, name: str) -> None:
        self.pump([(name, e) for e in self.engines[name].request_join(self.topic, self.now_ms)])

    def tick(self, ms: int = 1_000, times: int = 1) -> None:
        for _ in range(times):
            self.now_ms += ms
            for name in sorted(self.engines):
                self.pump([(name, e) for e in self.engines[name].tick(self.now_ms)])

    def send(self, sender: str, to: str, data: bytes) -> None:
        """Deliver a frame `sender` crafted by hand, then everything it causes."""
        self.pump([(sender, Send(self.ids[to], data))])

    def pump(self, flight: list[tuple[str, Effect]]) -> None:
        for _ in range(MAX_FLIGHTS):
            if not flight:
                return
            answers: list[tuple[str, Effect]] = []
            for sender, effect in flight:
                if not isinstance(effect, Send):
                    continue
                receiver = self.names[effect.peer]
                if frozenset((sender, receiver)) not in self.links:
                    continue
                self.received[receiver].note(effect.data, self.topic)
                self.now_ms += 1
                answers += [(receiver, e) for e in self.engines[receiver].on_message(
                    self.ids[sender], effect.data, self.now_ms)]
            flight = answers
        raise AssertionError("the mesh does not quiesce")

    def same(self, names: list[str]) -> bool:
        graphs = [self.replicas[n].graph for n in names]
        return all(g.extremities() == graphs[0].extremities()
                   and g.delivered_count == graphs[0].delivered_count
                   and g.buffered_count == 0 for g in graphs)
