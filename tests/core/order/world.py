"""A seeded world of writers and replicas for the ordering core.

Writers append nodes that reference heads of their *own* partial view; views
grow by pulling causally closed parts of other writers' views (partial
knowledge, lagging, out of order; `partition()` confines pulls to two groups
until `heal()`). Every writer is a replica (its linearizer sees what its view
holds); observers only pull; late observers get everything at the end in one
causal order that favours the newest nodes. An equivocating writer's two
siblings (one seq, different references) travel together, in one `extend`
call, unless `forks_apart`: then each travels on its own, so replicas hold
one sibling for a while and count what its branch says. After every
delivery the checker asserts the safety properties:

* a replica's confirmed sequence only grows (and `OrderUpdate` says so truly),
* every replica's confirmed sequence is a prefix of every other's,
* `rewind_to` is exactly the shared prefix of the old and new full orders.

`quiesce()` then heals everything: all views merge, the relays reference what
they carry, and the live indexers append acknowledgement rounds until every
content node is confirmed everywhere (or the round budget runs out).

One seed reproduces one run; a failing assertion names the seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from node.core.order import Linearizer, OrderNode, OrderUpdate

MAX_DEPS = 4  # references a writer picks among its heads
ACK_ROUNDS_MAX = 6  # acknowledgement rounds quiesce() may use
NEWEST_FIRST = 0.7  # late observers deliver the newest ready node this often
APPEND_SHARE = 0.45  # of steps: a writer appends
OBSERVER_SHARE = 0.1  # of steps: an observer pulls (the rest of pull_rate: anyone pulls)
FORK_CHANCE = 0.3  # an equivocating writer's append is a fork this often


@dataclass
class View:
    """A causally closed set of node ids and its heads."""

    ids: set[bytes] = field(default_factory=set)
    heads: set[bytes] = field(default_factory=set)


@dataclass
class Replica:
    name: str
    linearizer: Linearizer
    view: View = field(default_factory=View)


class World:
    def __init__(
        self,
        seed: int,
        indexers: int = 3,
        others: int = 2,
        observers: int = 2,
        relayed: int = 0,
        late_observers: int = 1,
        pull_rate: float = 0.45,
        forks_apart: bool = False,
    ) -> None:
        self.pull_rate = pull_rate
        self.forks_apart = forks_apart
        self.seed = seed
        self.rng = random.Random(seed)
        self.indexers = [f"i{k}".encode() for k in range(indexers)]
        self.others = [f"n{k}".encode() for k in range(others)]
        self.relayed = [f"r{k}".encode() for k in range(relayed)]
        self.relay_of = {r: self.others[k % len(self.others)] for k, r in enumerate(self.relayed)}
        self.role_changes: dict[bytes, frozenset[bytes]] = {}
        self.acks: set[bytes] = set()
        self.crashed: set[bytes] = set()
        self.nodes: dict[bytes, OrderNode] = {}
        self.created: dict[bytes, int] = {}  # creation order
        self.ancestors: dict[bytes, frozenset[bytes]] = {}
        self.next_seq: dict[bytes, int] = {}
        self.latest: dict[bytes, list[bytes]] = {}  # writer -> its current tips
        writers = self.indexers + self.others + self.relayed
        self.replicas = {w: self._replica(w.decode()) for w in writers}
        for k in range(observers):
            self.replicas[f"o{k}".encode()] = self._replica(f"o{k}")
        for k in range(late_observers):
            # Receives nothing until heal(), then everything in one random causal order.
            self.replicas[f"late{k}".encode()] = self._replica(f"late{k}")
        self.best: list[bytes] = []  # longest confirmed sequence seen anywhere
        self.groups: list[set[bytes]] | None = None  # a partition: pulls stay inside a group

    def _replica(self, name: str) -> Replica:
        hook = lambda n: self.role_changes.get(n.id)  # noqa: E731 - one expression
        return Replica(name, Linearizer(frozenset(self.indexers), role_change=hook))

    def fail(self, message: str) -> str:
        return f"seed {self.seed}: {message}"

    # -- writing ---------------------------------------------------------------

    def append(
        self,
        writer: bytes,
        everything: bool = False,
        fork: bool = False,
        role_change: frozenset[bytes] | None = None,
    ) -> list[OrderNode]:
        """Writer appends one node (two siblings if `fork`) over heads of its view.

        `role_change`: the indexer set this node installs once confirmed.
        """
        view = self.replicas[writer].view
        heads = [h for h in sorted(view.heads) if self._may_reference(writer, h)]
        if not everything:
            heads = self.rng.sample(heads, min(len(heads), self.rng.randint(1, MAX_DEPS)))
        deps = set(heads)
        # The writer's chain: its previous node must be in the past.
        for tip in self.latest.get(writer, []):
            if not any(tip == d or tip in self.ancestors[d] for d in deps):
                deps.add(tip)
        if writer in self.relay_of.values():
            # A relay references the relayed nodes it carries promptly.
            deps |= {h for h in view.heads if self.nodes[h].writer in self.relay_of}
        seq = self.next_seq.get(writer, 0)
        name = writer + b"." + str(seq).encode()
        made = [OrderNode(name, writer, seq, tuple(sorted(deps)))]
        if fork:
            # The equivocating sibling: same seq, a different (smaller) view.
            tips = set(self.latest.get(writer, []))
            extra = sorted(deps - tips)
            fewer = tips | set(self.rng.sample(extra, self.rng.randint(0, max(0, len(extra) - 1))))
            made.append(OrderNode(name + b"'", writer, seq, tuple(sorted(fewer or deps))))
        self.next_seq[writer] = seq + 1
        for n in made:
            self.created[n.id] = len(self.created)
            if role_change is not None:
                self.role_changes[n.id] = role_change
            self.nodes[n.id] = n
            self.ancestors[n.id] = frozenset(n.deps).union(*(self.ancestors[d] for d in n.deps))
        # Keep writing on one branch (or both, merged later): a random choice.
        self.latest[writer] = [made[0].id] if not fork or self.rng.random() < 0.5 else [m.id for m in made]
        self._deliver(self.replicas[writer], {n.id for n in made})
        return made

    def _may_reference(self, writer: bytes, head: bytes) -> bool:
        # Relayed nodes are never heads for anyone but their relay.
        relayed_by = self.relay_of.get(self.nodes[head].writer)
        return relayed_by is None or relayed_by == writer

    def ack(self, writer: bytes) -> OrderNode:
        made = self.append(writer, everything=True)[0]
        self.acks.add(made.id)
        return made

    # -- knowledge -------------------------------------------------------------

    def pull(self, into: bytes, source: bytes, partial: bool = True) -> None:
        """`into` learns a causally closed part of what `source` knows."""
        src = self.replicas[source].view if source else View(set(self.nodes), set())
        if not src.ids:
            return
        if partial:
            tops = self.rng.sample(sorted(src.heads), self.rng.randint(1, len(src.heads)))
            wanted = set(tops).union(*(self.ancestors[t] for t in tops))
        else:
            wanted = set(src.ids)
        # Evidence of a fork travels together: a sibling comes with its sibling.
        for sibling in [s for s in self.nodes if s.endswith(b"'") and not self.forks_apart]:
            twin = sibling[:-1]
            if twin in wanted or sibling in wanted:
                wanted |= {twin, sibling} | self.ancestors[twin] | self.ancestors[sibling]
        self._deliver(self.replicas[into], wanted)

    def _deliver(self, replica: Replica, wanted: set[bytes]) -> None:
        new = {i for i in wanted if i not in replica.view.ids}
        while new:
            ready = [i for i in sorted(new) if all(d in replica.view.ids for d in self.nodes[i].deps)]
            # Siblings of a fork are delivered in one call, once both are ready.
            units = [u for u in map(self._unit, ready) if all(i in ready or i not in new for i in u)]
            assert units, self.fail("delivery stuck: wanted set not causally closed")
            if replica.name.startswith("late") and self.rng.random() < NEWEST_FIRST:
                unit = max(units, key=lambda u: self.created[u[0]])  # starve old nodes
            else:
                unit = self.rng.choice(units)
            unit = [i for i in unit if i in new]
            self._receive(replica, unit)
            new.difference_update(unit)

    def _unit(self, node_id: bytes) -> tuple[bytes, ...]:
        twin = node_id.rstrip(b"'")
        together = twin + b"'" in self.nodes and not self.forks_apart
        return (twin, twin + b"'") if together else (node_id,)

    def _receive(self, replica: Replica, unit: list[bytes]) -> None:
        view = replica.view
        nodes = [self.nodes[i] for i in unit]
        for node in nodes:
            view.ids.add(node.id)
            view.heads -= set(node.deps)
            view.heads.add(node.id)
        lin = replica.linearizer
        old_confirmed = lin.confirmed
        old_full = old_confirmed + lin.tentative
        update = lin.extend(nodes, relayed=nodes[0].writer in self.relay_of)
        self._check(replica, old_confirmed, old_full, update)

    # -- the checker -------------------------------------------------------------

    def _check(self, replica: Replica, old_confirmed, old_full, update: OrderUpdate) -> None:
        lin = replica.linearizer
        confirmed = lin.confirmed
        assert confirmed == old_confirmed + update.confirmed_appended, self.fail(
            f"{replica.name}: confirmed prefix changed"
        )
        assert update.tentative == lin.tentative, self.fail("update.tentative is not the tentative tail")
        new_full = confirmed + lin.tentative
        rewind = update.rewind_to
        assert len(old_confirmed) <= rewind, self.fail(f"{replica.name}: rewind into the confirmed prefix")
        assert old_full[:rewind] == new_full[:rewind], self.fail(f"{replica.name}: rewind_to too long")
        assert rewind == min(len(old_full), len(new_full)) or old_full[rewind] != new_full[rewind], self.fail(
            f"{replica.name}: rewind_to too short"
        )
        start = len(old_confirmed)
        overlap = min(len(confirmed), len(self.best))
        assert confirmed[start:overlap] == tuple(self.best[start:overlap]), self.fail(
            f"{replica.name} confirmed {confirmed[start:overlap]!r} where another replica "
            f"confirmed {self.best[start:overlap]!r} at position {start}"
        )
        if len(confirmed) > len(self.best):
            self.best = list(confirmed)

    # -- scenarios ---------------------------------------------------------------

    def partition(self) -> None:
        """Split the replicas in two random groups; `heal()` ends it."""
        names = sorted(self.replicas)
        self.rng.shuffle(names)
        cut = self.rng.randint(1, len(names) - 1)
        self.groups = [set(names[:cut]), set(names[cut:])]

    def _reachable(self, into: bytes, source: bytes) -> bool:
        return self.groups is None or any(into in g and source in g for g in self.groups)

    def writers(self) -> list[bytes]:
        return [w for w in self.indexers + self.others + self.relayed if w not in self.crashed]

    def step(self, fork_writer: bytes | None = None) -> None:
        """One random action: an append (maybe a fork), a pull, an observer's pull, or nothing."""
        roll = self.rng.random()
        online = sorted(w for w in self.replicas if not w.startswith(b"late"))
        if roll < APPEND_SHARE:
            writer = self.rng.choice(self.writers())
            self.append(writer, fork=writer == fork_writer and self.rng.random() < FORK_CHANCE)
        elif roll < APPEND_SHARE + self.pull_rate:
            into, source = self.rng.choice([w for w in online if w not in self.crashed]), self.rng.choice(online)
            if into != source and self._reachable(into, source):
                self.pull(into, source)
        elif roll < APPEND_SHARE + self.pull_rate + OBSERVER_SHARE:
            observers = [w for w in online if w.startswith(b"o")]
            into, source = self.rng.choice(observers or online), self.rng.choice(online)
            if into != source and self._reachable(into, source):
                self.pull(into, source)

    def heal(self) -> None:
        """Every replica learns everything; late observers first, in one shuffled go."""
        self.groups = None
        for late in sorted(w for w in self.replicas if w.startswith(b"late")):
            self.pull(late, b"", partial=False)
        everyone = sorted(self.replicas)
        for into in everyone:
            for source in everyone:
                if into != source:
                    self.pull(into, source, partial=False)

    def content(self) -> set[bytes]:
        """Nodes that must end up confirmed: all but acks and unreferenced relayed ones."""
        referenced = set()
        for n in self.nodes.values():
            if n.writer not in self.relay_of:
                referenced |= self.ancestors[n.id] | {n.id}
        return {i for i in referenced if i not in self.acks}

    def quiesce(self, ackers: list[bytes] | None = None) -> int:
        """Heal, let relays reference their load, ack until all content is confirmed.

        Returns the acknowledgement rounds used.
        """
        self.heal()
        for relay in sorted(set(self.relay_of.values()) - self.crashed):
            self.append(relay, everything=True)
        self.heal()
        replicas = [r for _, r in sorted(self.replicas.items())]
        ackers = ackers if ackers is not None else [w for w in self.indexers if w not in self.crashed]
        content = self.content()
        for round_ in range(ACK_ROUNDS_MAX + 1):
            if all(content <= set(r.linearizer.confirmed) for r in replicas):
                return round_
            for writer in ackers:
                self.ack(writer)
            self.heal()
        missing = max((content - set(r.linearizer.confirmed) for r in replicas), key=len)
        late = sorted(missing)[:5]
        raise AssertionError(self.fail(f"unconfirmed after {ACK_ROUNDS_MAX} ack rounds: {late}"))
