"""Build small topics of signed events by name, and the state after each event.

Scenarios are written like Synapse's tests/state/test_v2.py: named nodes and
chains of edges. Senders are cast names ("alice"), turned into deterministic
identities; member state keys and power level user keys are the cast
members' user ids (hex of their keys).

The state after each event follows the Matrix definition: the state before it
is its single parent's state, or the resolution of its parents' states; a state
event that passes the auth rules against that state then replaces its key.
Events are built in a topological order that breaks ties by node name, and
their timestamps increase in that order (as Synapse's tests do), so the
tie-breaks of the resolution see the same relative timestamps as Synapse's.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from node.core.event import KIND_CREATE, KIND_MESSAGE, Event, pack_payload
from node.core.identity import Identity, sign_event
from node.state import EventFields, check_auth, check_auth_refs, resolve, select_auth_refs
from node.state.types import StateKey, state_key_of

CAST_NAMES = ("alice", "bob", "charlie", "evelyn", "zara")
CAST: dict[str, Identity] = {
    name: Identity.from_seed(hashlib.sha256(b"megnode-test-" + name.encode()).digest())
    for name in CAST_NAMES
}


def uid(name: str) -> str:
    """User id of a cast member."""
    return CAST[name].public_key.hex()


@dataclass(frozen=True)
class Node:
    name: str
    sender: str
    kind: str
    state_key: str | None = None
    content: Mapping[str, Any] = field(default_factory=dict)


def create(name: str, sender: str, **content: Any) -> Node:
    return Node(name, sender, KIND_CREATE, "", content)


def member(name: str, sender: str, target: str, membership: str, **extra: Any) -> Node:
    return Node(name, sender, "m.room.member", uid(target), {"membership": membership, **extra})


def power(name: str, sender: str, users: Mapping[str, int], **extra: Any) -> Node:
    """A power levels event; `users` maps cast names to levels."""
    content = {"users": {uid(who): level for who, level in users.items()}, **extra}
    return Node(name, sender, "m.room.power_levels", "", content)


def join_rules(name: str, sender: str, rule: str) -> Node:
    return Node(name, sender, "m.room.join_rules", "", {"join_rule": rule})


def topic(name: str, sender: str, text: str = "") -> Node:
    return Node(name, sender, "m.room.topic", "", {"topic": text or name})


def message(name: str, sender: str) -> Node:
    return Node(name, sender, KIND_MESSAGE, None, {"body": name})


class Graph:
    """A topic under construction: events by name, a source by id, states by name."""

    def __init__(self, tick_ms: int = 1) -> None:
        # tick_ms = 0 gives every event the same timestamp, so that orderings
        # fall through to their last tie-break, the event id.
        self.tick_ms = tick_ms
        self.events: dict[str, Event] = {}
        self.source: dict[bytes, Event] = {}
        self.state_after: dict[str, dict[StateKey, bytes]] = {}
        self.rejected: dict[str, str] = {}
        self._seq: dict[str, int] = {}
        self._clock_ms = 0

    @property
    def topic_id(self) -> bytes:
        return next(e.id for e in self.events.values() if e.is_create)

    def id(self, name: str) -> bytes:
        return self.events[name].id

    def key(self, name: str) -> StateKey:
        key = state_key_of(self.events[name])
        assert key is not None, f"{name} is not a state event"
        return key

    def state_before(self, parents: Sequence[str]) -> dict[StateKey, bytes]:
        if not parents:
            return {}
        return resolve([self.state_after[p] for p in parents], self.source)

    def make(self, node: Node, parents: Sequence[str],
             state: Mapping[StateKey, bytes] | None = None) -> Event:
        """Sign `node` on top of `parents` with auth refs picked from the state before it."""
        if state is None:
            state = self.state_before(parents)
        author = CAST[node.sender]
        fields = EventFields(node.kind, author.public_key, node.state_key, node.content)
        self._clock_ms += self.tick_ms
        seq = self._seq.get(node.sender, 0)
        self._seq[node.sender] = seq + 1
        return sign_event(
            author,
            topic=b"" if not parents else self.topic_id,
            seq=seq,
            parents=[self.id(p) for p in parents],
            timestamp_ms=self._clock_ms,
            kind=node.kind,
            payload=pack_payload(dict(node.content)),
            state_key=node.state_key,
            auth=select_auth_refs(fields, state),
        )

    def check(self, event: Event, parents: Sequence[str],
              state: Mapping[StateKey, bytes] | None = None) -> str | None:
        """Auth-ref checks, then the auth rules against the state before the event."""
        if state is None:
            state = self.state_before(parents)
        return check_auth_refs(event, self.source) or check_auth(event, state, self.source)

    def add(self, node: Node, parents: Sequence[str]) -> Event:
        state = self.state_before(parents)
        event = self.make(node, parents, state)
        reason = self.check(event, parents, state)
        self.events[node.name] = event
        self.source[event.id] = event
        key = state_key_of(event)
        if reason is not None:
            self.rejected[node.name] = reason
        elif key is not None:
            state[key] = event.id
        self.state_after[node.name] = state
        return event


def on_top(graph: Graph, *nodes: Node, head: str = "START") -> list[str]:
    """Add `nodes` as a chain on `head`, each accepted; returns the new head as parents."""
    for node in nodes:
        graph.add(node, [head])
        assert node.name not in graph.rejected, graph.rejected
        head = node.name
    return [head]


def build(nodes: Sequence[Node], chains: Sequence[Sequence[str]], tick_ms: int = 1) -> Graph:
    """A graph of `nodes`; each chain lists nodes oldest first, each a parent of the next."""
    by_name = {n.name: n for n in nodes}
    parents: dict[str, set[str]] = {n.name: set() for n in nodes}
    for chain in chains:
        for older, newer in pairwise(chain):
            parents[newer].add(older)
    graph = Graph(tick_ms)
    for name in _topological_by_name(parents):
        graph.add(by_name[name], sorted(parents[name]))
    return graph


def _topological_by_name(parents: Mapping[str, set[str]]) -> list[str]:
    """Kahn's algorithm over parent links, smallest name first among the ready nodes."""
    waiting = {name: len(ps) for name, ps in parents.items()}
    children: dict[str, list[str]] = {name: [] for name in parents}
    for name, ps in parents.items():
        for p in ps:
            children[p].append(name)
    ready = [name for name, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        name = heapq.heappop(ready)
        order.append(name)
        for child in children[name]:
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, child)
    assert len(order) == len(parents), "the chains form a cycle"
    return order
