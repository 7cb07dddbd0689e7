"""A seeded world of real Replicas of one authorized topic, exchanging raw events.

`Net` builds the topic: its creator invites every member, each member joins
from its own replica (relayed devices with the relayed flag), and one power
levels event by the creator gives the indexers `indexer_level` and everyone
else the writing level (the creator keeps the indexer level only if it is
listed as an indexer). `settle()` then syncs and acknowledges until that
role change is confirmed everywhere, so every test starts from a topic
whose whole history is confirmed and whose indexer set is the one asked for
(a fresh epoch: the next indexer node is the first of round 0).

Events move only as bytes: `exchange` hands a (random part of, in random
order) what one replica has and another lacks, so out-of-order arrivals
wait in the graph's buffer and come out as cascades. After every call that
can change an order, `observe` checks the safety properties:

* a replica's confirmed sequence only grows (positions never change), and
  `Received.order` says truly what was appended;
* every replica's confirmed sequence is a prefix of every other's;
* the indexer set changes at the same confirmed length on every replica.

A failing assertion names the seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from node.core.event import Event
from node.core.order import OrderUpdate
from node.core.outcomes import AddStatus
from node.core.parents import DEFAULT_D_MAX
from node.replica.replica import Received, Replica, ReplicaConfig
from node.replica.ordering import KIND_ACK, OrderConfig, TopicOrder
from node.state.actions import WRITER_LEVEL, power_levels_content
from node.state.power_levels import CREATOR_LEVEL
from node.state.types import TYPE_POWER_LEVELS, user_id
from node.state.view import StateView
from storage.memory import MemoryStore
from tests.helpers import identity

STEP_MS = 10  # virtual time per step
ACK_INTERVAL_MS = 20  # acks are rate-limited to one per two steps
SETTLE_ROUNDS_MAX = 30


class Net:
    def __init__(self, seed: int, creator: str, indexers: list[str], writers: list[str] = (),
                 relayed: list[str] = (), readers: list[str] = (), stores: dict | None = None,
                 check: bool = True, d_max: int = DEFAULT_D_MAX) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now_ms = 2_000
        self.checking = check
        self.config = ReplicaConfig(ordering=OrderConfig(ack_interval_ms=ACK_INTERVAL_MS))
        stores = stores or {}
        self.creator = creator
        self.indexer_names = list(indexers)
        names = list(dict.fromkeys([creator, *indexers, *writers, *relayed, *readers]))
        self.replicas: dict[str, Replica] = {
            creator: Replica.create_topic(stores.get(creator) or MemoryStore(), identity(creator),
                                          self.now_ms, d_max=d_max, authorization=True,
                                          config=self.config)}
        topic = self.replicas[creator].topic_id
        for name in names[1:]:
            self.replicas[name] = Replica(stores.get(name) or MemoryStore(), topic, identity(name),
                                          self.config)
        self.seen: dict[str, tuple[bytes, ...]] = {}
        self.switches: dict[str, list[tuple[int, frozenset[bytes]]]] = {}
        self.best: tuple[bytes, ...] = ()
        self.listeners: dict[str, Callable[[OrderUpdate], None]] = {}
        self.observe(creator)
        self._bootstrap(names[1:], set(indexers), set(relayed), set(readers))

    def fail(self, message: str) -> str:
        return f"seed {self.seed}: {message}"

    def key(self, name: str) -> bytes:
        return identity(name).public_key

    def tick(self) -> int:
        self.now_ms += STEP_MS
        return self.now_ms

    # -- building the topic ------------------------------------------------------

    def _bootstrap(self, members: list[str], indexers: set[str], relayed: set[str],
                   readers: set[str]) -> None:
        owner = self.replicas[self.creator]
        for name in members:
            self.observe(self.creator, owner.invite(self.key(name), self.tick(), self.rng)[1])
        self.sync_all()
        for name in members:
            joined = self.replicas[name].join(self.tick(), self.rng, relayed=name in relayed)
            self.observe(name, joined[1])
        self.sync_all()
        content = power_levels_content(StateView(owner._current_state(), owner.graph))
        users = content["users"]
        for name in [self.creator, *members]:
            if name in readers:
                continue
            users[user_id(self.key(name))] = CREATOR_LEVEL if name in indexers else WRITER_LEVEL
        self.observe(self.creator, owner.set_state(TYPE_POWER_LEVELS, "", content, self.tick(),
                                                   self.rng)[1])
        self.settle()
        want = frozenset(self.key(n) for n in indexers)
        for name, replica in self.replicas.items():
            assert replica.ordering.indexers == want, self.fail(f"{name}: indexers not switched")

    # -- moving events -------------------------------------------------------------

    def observe(self, name: str, received: Received | None = None) -> None:
        """Check the safety properties on `name`'s replica after a change."""
        if not self.checking:
            return
        order = self.replicas[name].ordering
        if order is None:
            return  # the create event has not arrived yet
        confirmed = order.confirmed
        old = self.seen.get(name, ())
        assert confirmed[:len(old)] == old, self.fail(f"{name}: a confirmed position changed")
        if received is not None and received.order is not None:
            update = received.order
            assert confirmed == old + update.confirmed_appended, self.fail(
                f"{name}: the update does not describe what was confirmed")
            assert update.rewind_to >= len(old), self.fail(f"{name}: rewind into confirmed")
            assert update.tentative == order.tentative, self.fail(f"{name}: stale tentative")
            if name in self.listeners:
                self.listeners[name](update)
        overlap = min(len(confirmed), len(self.best))
        assert confirmed[:overlap] == self.best[:overlap], self.fail(
            f"{name} confirmed {len(confirmed)} events that disagree with another replica's")
        if len(confirmed) > len(self.best):
            self.best = confirmed
        self.seen[name] = confirmed
        switches = self.switches.setdefault(name, [])
        if not switches or switches[-1][1] != order.indexers:
            switches.append((len(confirmed), order.indexers))

    def receive(self, name: str, raw: bytes) -> Received:
        received = self.replicas[name].receive(raw, self.now_ms)
        if received.status is AddStatus.APPLIED:
            self.observe(name, received)
        return received

    def publish(self, name: str, payload: bytes) -> Event:
        event, received = self.replicas[name].publish(payload, self.tick(), self.rng)
        self.observe(name, received)
        return event

    def ack(self, name: str) -> Event | None:
        made = self.replicas[name].maybe_ack(self.now_ms, self.rng)
        if made is None:
            return None
        self.observe(name, made[1])
        return made[0]

    def missing(self, into: str, source: str) -> list[bytes]:
        """Raw events `source` holds that `into` lacks, parents first."""
        src, dst = self.replicas[source].graph, self.replicas[into].graph
        return [src.get(i).raw for i in src.not_below(dst.extremities()) if not dst.has(i)]

    def exchange(self, into: str, source: str, share: float = 1.0) -> int:
        """`into` receives a random `share` of what it lacks from `source`, shuffled."""
        raws = self.missing(into, source)
        if share < 1.0:
            raws = [r for r in raws if self.rng.random() < share]
            self.rng.shuffle(raws)
        for raw in raws:
            self.receive(into, raw)
        return len(raws)

    def sync_all(self, names: list[str] | None = None) -> None:
        names = names or sorted(self.replicas)
        moved = True
        while moved:
            moved = False
            for into in names:
                for source in names:
                    if into != source and self.exchange(into, source):
                        moved = True

    # -- liveness -------------------------------------------------------------------

    def unconfirmed(self, name: str) -> list[bytes]:
        """Events of `name`'s graph that must be confirmed but are not (acks and
        events excluded by a ban excepted)."""
        replica = self.replicas[name]
        order = replica.ordering
        done = set(order.confirmed)
        # An event a ban excludes from the views need not (and may never) be confirmed.
        dropped = order.excluded_tail()
        return [e.id for _, e in replica.ordered("causal", 0, 10**9)
                if e.kind != KIND_ACK and e.id not in done and e.id not in dropped
                and not order.is_excluded(e.id)]

    def settle(self, rounds_max: int = SETTLE_ROUNDS_MAX) -> int:
        """Sync and acknowledge until every replica has confirmed every non-ack event
        and they all hold one confirmed sequence; returns the ack rounds used."""
        for round_ in range(rounds_max):
            self.sync_all()
            if not any(self.unconfirmed(n) for n in self.replicas):
                sequences = {r.ordering.confirmed for r in self.replicas.values()}
                assert len(sequences) == 1, self.fail("settled replicas disagree")
                return round_
            self.now_ms += ACK_INTERVAL_MS
            for name in sorted(self.replicas):
                self.ack(name)
        left = {n: len(self.unconfirmed(n)) for n in self.replicas}
        raise AssertionError(self.fail(f"still unconfirmed after {rounds_max} rounds: {left}"))

    def audit(self, name: str) -> None:
        """Rebuild `name`'s order from its graph, as a restart would; it must equal the live one."""
        replica = self.replicas[name]
        live = replica.ordering
        rebuilt = TopicOrder(replica.graph, replica.tracker, self.config.ordering)
        assert rebuilt.confirmed == live.confirmed, self.fail(f"{name}: replay confirms otherwise")
        assert rebuilt.tentative == live.tentative, self.fail(f"{name}: replay orders otherwise")
        assert rebuilt.indexers == live.indexers, self.fail(f"{name}: replay has other indexers")

    def commit_all(self) -> None:
        for replica in self.replicas.values():
            replica.commit()

    def restart(self, name: str, store) -> Replica:
        """Replace `name`'s replica by one opened on `store` (its committed data)."""
        old = self.replicas[name]
        self.replicas[name] = Replica(store, old.topic_id, old.identity, self.config)
        self.observe(name)
        return self.replicas[name]
