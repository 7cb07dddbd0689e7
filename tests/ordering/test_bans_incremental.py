"""The order's ban check judges only what changed, and gives the views of the full check.

`OrderBans.advance` with shortcuts keeps the verdicts of the tail it judged
last and re-judges only the part of the new sequence that differs from it,
plus those later events whose verdict read a key the difference changed
(node.replica.order_bans, "Cost"). These tests feed random sequences -
events inserted, dropped, moved, shuffled, confirmed as a prefix of the tail
or out of it - to one `OrderBans` with shortcuts and one without (every event
judged against the order state at its position: the definition), and
require the same answer at every step. Each sequence is a linear extension
of the causal order, as the linearizer's always is (the no-restriction guard
relies on it: an event never stands before its own past).
"""

from __future__ import annotations

import random

from node.core.event import Event
from node.core.order.linearizer import common_prefix
from node.replica.order_bans import OrderBans, _common_suffix
from tests.state.builder import Graph, create, join_rules, member, message, power, topic

SEEDS = range(40)
STEPS = 150


def _topic() -> tuple[Graph, Event, list[Event]]:
    """A topic with joins, messages, a ban, a kick, a leave, a demotion and a rule change,
    some built on parents from before the change that takes their right (valid in
    their own past, so the order is what must leave them out)."""
    g = Graph()
    g.add(create("create", "alice"), [])
    g.add(member("join_alice", "alice", "alice", "join"), ["create"])
    g.add(power("pl1", "alice", {"alice": 100}), ["join_alice"])
    g.add(join_rules("public", "alice", "public"), ["pl1"])
    head = "public"
    for name in ("bob", "charlie", "evelyn", "zara"):
        g.add(member(f"join_{name}", name, name, "join"), [head])
        head = f"join_{name}"
    g.add(power("pl2", "alice", {"alice": 100, "bob": 50}, state_default=50), [head])
    g.add(topic("topic_bob", "bob"), ["pl2"])
    for name in ("alice", "bob", "charlie", "evelyn", "zara"):
        for n in range(3):
            g.add(message(f"m_{name}_{n}", name), ["topic_bob"])
    g.add(member("ban_zara", "alice", "zara", "ban"), ["topic_bob"])
    g.add(member("leave_charlie", "charlie", "charlie", "leave"), ["ban_zara"])
    g.add(member("rejoin_zara", "zara", "zara", "join"), ["topic_bob"])  # pre-ban parents
    g.add(member("rejoin_charlie", "charlie", "charlie", "join"), ["leave_charlie"])
    g.add(power("pl3", "alice", {"alice": 100}, state_default=50), ["leave_charlie"])
    g.add(topic("topic_bob_2", "bob"), ["topic_bob"])  # needs bob's 50: fails after pl3
    g.add(member("kick_evelyn", "alice", "evelyn", "leave"), ["pl3"])
    g.add(join_rules("invite", "alice", "invite"), ["kick_evelyn"])
    g.add(member("rejoin_evelyn", "evelyn", "evelyn", "join"), ["topic_bob"])
    for name in ("bob", "evelyn", "zara"):
        g.add(message(f"late_{name}", name), ["topic_bob"])
    assert not g.rejected, g.rejected
    root = g.events["create"]
    return g, root, [e for e in g.events.values() if e is not root]


class _Feed:
    """A random linearizer: a tail kept a linear extension of the causal order, and
    changed each step as the real one might (or more wildly), confirming as it goes."""

    def __init__(self, rng: random.Random, pool: list[Event]) -> None:
        self.rng = rng
        self.parents = {e.id: set(e.parents) for e in pool}
        self.unplaced = [e.id for e in pool]
        self.placed: set[bytes] = set()  # confirmed or in the tail
        self.tail: list[bytes] = []

    def _bounds(self, event_id: bytes) -> tuple[int, int]:
        """Where in the tail `event_id` may stand: after its parents, before its children."""
        low = max((i + 1 for i, e in enumerate(self.tail) if e in self.parents[event_id]),
                  default=0)
        high = min((i for i, e in enumerate(self.tail) if event_id in self.parents[e]),
                   default=len(self.tail))
        return low, high

    def step(self) -> list[bytes]:
        """Change the tail; returns the events it confirms (in order)."""
        rng, tail = self.rng, self.tail
        op = rng.random()
        ready = [e for e in self.unplaced if self.parents[e] <= self.placed]
        if op < 0.45 and ready:  # a new event, anywhere its parents allow
            event_id = rng.choice(ready)
            self.unplaced.remove(event_id)
            self.placed.add(event_id)
            low, high = self._bounds(event_id)
            tail.insert(rng.randint(low, high), event_id)
        elif op < 0.52 and tail:  # dropped again (if nothing in the tail needs it)
            event_id = rng.choice(tail)
            if not any(event_id in self.parents[e] for e in tail):
                tail.remove(event_id)
                self.placed.discard(event_id)
                self.unplaced.append(event_id)
        elif op < 0.7 and tail:  # moved
            event_id = tail.pop(rng.randrange(len(tail)))
            low, high = self._bounds(event_id)
            tail.insert(rng.randint(low, high), event_id)
        elif op < 0.78 and len(tail) > 1:  # a slice reordered (a random topological order)
            i, j = sorted(rng.sample(range(len(tail) + 1), 2))
            part, order = set(tail[i:j]), []
            while part:
                event_id = rng.choice(sorted(e for e in part if not self.parents[e] & part))
                part.remove(event_id)
                order.append(event_id)
            tail[i:j] = order
        elif op < 0.88 and tail:  # a prefix confirmed
            k = rng.randint(1, min(len(tail), 4))
            confirmed = tail[:k]
            del tail[:k]
            return confirmed
        elif op < 0.93 and tail:  # an event and its ancestors confirmed, out of the tail's order
            wanted = {rng.choice(tail)}
            for event_id in reversed(tail):
                if event_id in wanted:
                    wanted |= self.parents[event_id]
            confirmed = [e for e in tail if e in wanted]
            tail[:] = [e for e in tail if e not in wanted]
            return confirmed
        return []


def _run(seed: int) -> int:
    """One seeded feed through both; returns how many exclusions it met."""
    g, root, pool = _topic()
    rng = random.Random(seed)
    fast, full = OrderBans(g.source, shortcuts=True), OrderBans(g.source, shortcuts=False)
    get = g.source.__getitem__
    assert fast.advance([root.id], [], get) == full.advance([root.id], [], get) == ([None], ())
    feed = _Feed(rng, pool)
    feed.placed.add(root.id)
    confirmed = [root.id]
    excluded = 0
    for step in range(STEPS):
        appended = feed.step()
        expected = full.advance(appended, feed.tail, get)
        assert fast.advance(appended, feed.tail, get) == expected, f"seed {seed}, step {step}"
        confirmed += appended
        # and what it keeps for the next step is what a fresh start would keep
        fresh = OrderBans(g.source, shortcuts=True)
        fresh.advance(confirmed, feed.tail, get)
        assert fast._tail_verdicts == fresh._tail_verdicts, f"seed {seed}, step {step}"
        assert (fast._state, fast._restricted) == (fresh._state, fresh._restricted)
        # the state at a point of the tail is read through this index (`_StateAt`)
        for event_id, entry in zip(fast._tail, fast._tail_sets):
            assert entry is None or event_id in fast._setters[entry[0]], f"seed {seed}"
        excluded += len(expected[0]) - expected[0].count(None) + len(feed.tail) - len(expected[1])
    return excluded


def test_random_feeds_give_the_verdicts_of_the_full_check() -> None:
    excluded = [_run(seed) for seed in SEEDS]
    assert sum(1 for e in excluded if e) > len(SEEDS) // 2  # the feeds do exercise the bans


def test_an_event_inserted_early_in_a_long_tail_rejudges_only_what_it_changes(monkeypatch):
    g, root, pool = _topic()
    get = g.source.__getitem__
    bans = OrderBans(g.source, shortcuts=True)
    ids = {name: e.id for name, e in g.events.items()}
    setup = [ids[n] for n in ("join_alice", "pl1", "public", "join_bob", "join_charlie", "join_evelyn",
                              "join_zara", "pl2", "topic_bob", "ban_zara")]
    bans.advance([root.id, *setup], [], get)  # a ban confirmed: every event is judged
    tail = [ids[f"m_{name}_{n}"] for n in range(3) for name in ("alice", "bob", "evelyn")]
    tail.append(ids["leave_charlie"])
    bans.advance([], tail, get)
    judged: list[bytes] = []
    real = OrderBans._judge

    def counting(self, event, state, restricted):
        judged.append(event.id)
        return real(self, event, state, restricted)

    monkeypatch.setattr(OrderBans, "_judge", counting)
    # zara's message, inserted first: judged (and left out); nothing after it reads zara
    _, survivors = bans.advance([], [ids["m_zara_0"], *tail], get)
    assert judged == [ids["m_zara_0"]] and survivors == tuple(tail)
    judged.clear()
    # charlie's rejoin, first: charlie's messages and leave read his membership
    _, survivors = bans.advance([], [ids["rejoin_charlie"], ids["m_zara_0"], *tail], get)
    assert judged[0] == ids["rejoin_charlie"] and ids["m_bob_0"] not in judged
    assert set(judged[1:]) <= {ids["leave_charlie"]}
    judged.clear()
    # confirming the tail's prefix judges nothing
    bans.advance([ids["rejoin_charlie"], ids["m_zara_0"]], tail, get)
    assert judged == []


def test_the_common_prefix_and_suffix_are_those_of_a_plain_walk():
    rng = random.Random(7)
    for _ in range(2_000):
        a = tuple(rng.choice(b"abc") for _ in range(rng.randint(0, 12)))
        b = tuple(rng.choice(b"abc") for _ in range(rng.randint(0, 12)))
        prefix = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert common_prefix(a, b) == prefix
        limit = rng.randint(0, min(len(a), len(b)))
        suffix = next((i for i, (x, y) in enumerate(zip(a[::-1], b[::-1])) if x != y),
                      min(len(a), len(b)))
        assert _common_suffix(a, b, limit) == min(suffix, limit)
