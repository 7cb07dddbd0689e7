"""Properties of state resolution over random forks of a topic.

Hypothesis draws a topic: the base chain, then up to a dozen events by random
cast members (topics, power level changes, joins, leaves, kicks, bans, join
rule changes, messages), each on 1-3 random earlier events. Many are refused
by the auth rules on their own branch, which is part of the point.

What must hold, because every replica must reach the same state:

- a replica that receives the events in another topological order, holds them
  in another order, and lists each event's parent states in another order
  computes the same state after every event;
- resolving the same states in any order, or with repeats, gives one answer;
- keys the inputs agree on keep their value.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.core.event import Event
from node.state import check_auth, resolve
from node.state.resolution import split
from node.state.types import StateKey, state_key_of
from tests.state.builder import Graph, Node, join_rules, member, message, power, topic
from tests.state.conftest import build_topic

SENDERS = ("alice", "bob", "charlie", "zara", "evelyn")
LEVELS = (0, 50, 100)
KINDS = ("topic", "power", "ban", "kick", "join", "leave", "rules", "message")
MAX_EVENTS = 12
MAX_PARENTS = 3


@dataclass(frozen=True)
class Step:
    sender: str
    kind: str
    target: str
    levels: tuple[int, int, int]
    public: bool
    parents: tuple[int, ...]


steps = st.builds(
    Step,
    sender=st.sampled_from(SENDERS),
    kind=st.sampled_from(KINDS),
    target=st.sampled_from(SENDERS),
    levels=st.tuples(*[st.sampled_from(LEVELS)] * 3),
    public=st.booleans(),
    parents=st.lists(st.integers(0, 10_000), min_size=1, max_size=MAX_PARENTS).map(tuple),
)


def node_of(name: str, step: Step) -> Node:
    bob, charlie, zara = step.levels
    return {
        "topic": lambda: topic(name, step.sender),
        "power": lambda: power(name, step.sender,
                               {"alice": 100, "bob": bob, "charlie": charlie, "zara": zara}),
        "ban": lambda: member(name, step.sender, step.target, "ban"),
        "kick": lambda: member(name, step.sender, step.target, "leave"),
        "join": lambda: member(name, step.sender, step.sender, "join"),
        "leave": lambda: member(name, step.sender, step.sender, "leave"),
        "rules": lambda: join_rules(name, step.sender, "public" if step.public else "invite"),
        "message": lambda: message(name, step.sender),
    }[step.kind]()


def build_forks(plan: list[Step], tick_ms: int) -> Graph:
    nodes, chains, pool = [], [], ["START"]
    for i, step in enumerate(plan):
        name = f"E{i:02d}"
        nodes.append(node_of(name, step))
        for parent in sorted({pool[p % len(pool)] for p in step.parents}):
            chains.append([parent, name])
        pool.append(name)
    return build_topic(nodes, chains, tick_ms)


def replay(graph: Graph, rng: random.Random) -> dict[str, dict[StateKey, bytes]]:
    """Another replica: another arrival order, storage order and parent order."""
    names = {e.id: n for n, e in graph.events.items()}
    parents = {n: [names[p] for p in e.parents] for n, e in graph.events.items()}
    source: dict[bytes, Event] = {}
    states: dict[str, dict[StateKey, bytes]] = {}
    waiting = dict(parents)
    while waiting:
        ready = sorted(n for n, ps in waiting.items() if all(p in states for p in ps))
        name = rng.choice(ready)
        del waiting[name]
        event = graph.events[name]
        source[event.id] = event
        inputs = [states[p] for p in parents[name]]
        rng.shuffle(inputs)
        state = resolve(inputs, source) if inputs else {}
        key = state_key_of(event)
        if key is not None and check_auth(event, state, source) is None:
            state[key] = event.id
        states[name] = state
    return states


slow_ok = settings(max_examples=40, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@slow_ok
@given(plan=st.lists(steps, min_size=2, max_size=MAX_EVENTS), seed=st.integers(0, 2**32),
       tick_ms=st.sampled_from([0, 1]))
def test_every_replica_computes_the_same_states(plan: list[Step], seed: int, tick_ms: int) -> None:
    graph = build_forks(plan, tick_ms)
    assert replay(graph, random.Random(seed)) == graph.state_after


@slow_ok
@given(plan=st.lists(steps, min_size=2, max_size=MAX_EVENTS), tick_ms=st.sampled_from([0, 1]))
def test_resolution_ignores_the_order_of_states(plan: list[Step], tick_ms: int) -> None:
    graph = build_forks(plan, tick_ms)
    heads = [n for n in graph.events if n.startswith("E")][-MAX_PARENTS:]
    states = [graph.state_after[n] for n in heads]
    expected = resolve(states, graph.source)
    for permutation in itertools.permutations(states):
        assert resolve(list(permutation), graph.source) == expected
    assert resolve([*states, states[0]], graph.source) == expected
    assert_unconflicted_kept(states, expected)


def assert_unconflicted_kept(states: list[dict[StateKey, bytes]],
                             resolved: Mapping[StateKey, bytes]) -> None:
    unconflicted, _ = split(states)
    assert all(resolved[k] == v for k, v in unconflicted.items())


# --- replicas in other processes ----------------------------------------------------------
#
# Inside one process, sets of ids iterate in a repeatable order, which can
# hide a resolution that depends on it. Replicas are separate processes with
# their own hash seeds: run the same random topics under two seeds and compare.

REPLICA_TOPICS = 40
HASH_SEEDS = ("1", "2")


def random_plan(rng: random.Random) -> list[Step]:
    return [
        Step(rng.choice(SENDERS), rng.choice(KINDS), rng.choice(SENDERS),
             (rng.choice(LEVELS), rng.choice(LEVELS), rng.choice(LEVELS)), rng.random() < 0.5,
             tuple(rng.randrange(10_000) for _ in range(rng.randint(1, MAX_PARENTS))))
        for _ in range(rng.randint(2, MAX_EVENTS))
    ]


def digest_of_random_topics(count: int) -> str:
    """A digest of the state after every event of `count` seeded random topics."""
    rng = random.Random(4)
    digest = hashlib.blake2b(digest_size=16)
    for _ in range(count):
        graph = build_forks(random_plan(rng), tick_ms=0)  # equal timestamps: ids decide
        for name in sorted(graph.state_after):
            digest.update(name.encode())
            for key, event_id in sorted(graph.state_after[name].items()):
                digest.update(repr(key).encode() + event_id)
    return digest.hexdigest()


def test_replicas_with_other_hash_seeds_agree() -> None:
    code = ("from tests.state.test_resolution_properties import digest_of_random_topics as d; "
            f"print(d({REPLICA_TOPICS}))")
    root = Path(__file__).resolve().parents[2]
    digests = {
        subprocess.run([sys.executable, "-c", code], cwd=root, check=True, capture_output=True,
                       text=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        for seed in HASH_SEEDS
    }
    assert len(digests) == 1
