"""The two event orderings of state resolution v2.

*Reverse topological power ordering* (for power events): the DAG is the auth
links among the events being sorted; Kahn's algorithm emits an event only
after all its auth events, and among the events ready at each step takes the
smallest by (−sender's power level, timestamp, id). So older events come
first and, among concurrent ones, those of the more powerful sender: power
granted earlier, or by someone stronger, is applied before what depends on it.
The sender's level is read from the power levels event among the event's own
auth refs (none: the creator has 100, others 0), as Matrix does.

*Mainline ordering* (for the other state events): the mainline is the chain
of power levels events from the resolved one back through each one's power
levels auth ref. Each event is placed by the first power levels event on that
mainline reached through its own power levels auth refs (the *epoch* it was
sent in); events of older epochs come first, then by (timestamp, id).
An event whose chain never reaches the mainline sorts first of all.

Event ids are bytes and compare bytewise (Matrix compares id strings; ours are
BLAKE2b digests, so bytewise order is the natural total order). Timestamps
(`timestamp_ms`, Matrix's origin_server_ts) only break ties: the orderings stay
deterministic however wrong an author's clock is.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Set

from node.core.event import Event
from node.state.power_levels import CREATOR_LEVEL, PowerLevels
from node.state.types import (
    JOIN_RULES_KEY,
    POWER_LEVELS_KEY,
    TYPE_CREATE,
    TYPE_MEMBER,
    EventSource,
    Membership,
    content_of,
    state_key_of,
    user_id,
)

SortKey = tuple[int, int, bytes]


def is_power_event(event: Event) -> bool:
    """Power levels, join rules, or a leave/ban of somebody else (a kick or a ban)."""
    key = state_key_of(event)
    if key in (POWER_LEVELS_KEY, JOIN_RULES_KEY):
        return True
    if event.kind == TYPE_MEMBER and event.state_key != user_id(event.author):
        return content_of(event).get("membership") in (Membership.LEAVE, Membership.BAN)
    return False


def sender_power_level(event: Event, source: EventSource) -> int:
    """The sender's level according to the event's own auth refs."""
    power_levels = create = None
    for ref in event.auth:
        auth_event = source.get(ref)
        if auth_event is None:
            continue
        key = state_key_of(auth_event)
        if key == POWER_LEVELS_KEY:
            power_levels = auth_event
        elif key == (TYPE_CREATE, ""):
            create = auth_event
    if power_levels is not None:
        return PowerLevels.from_content(content_of(power_levels)).user_level(user_id(event.author))
    if create is not None and create.author == event.author:
        return CREATOR_LEVEL
    return 0


def power_order(
    power_ids: Iterable[bytes], full_conflicted: Set[bytes], source: EventSource
) -> list[Event]:
    """Power events plus their auth ancestors within the full conflicted set, sorted."""
    graph = _auth_subgraph(power_ids, full_conflicted, source)
    keys = {
        eid: (-sender_power_level(event, source), event.timestamp_ms, eid)
        for eid, (event, _) in graph.items()
    }
    waiting = {eid: len(deps) for eid, (_, deps) in graph.items()}
    citers: dict[bytes, list[bytes]] = {eid: [] for eid in graph}
    for eid, (_, deps) in graph.items():
        for dep in deps:
            citers[dep].append(eid)
    ready = [keys[eid] for eid, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    ordered: list[Event] = []
    while ready:
        eid = heapq.heappop(ready)[2]
        ordered.append(graph[eid][0])
        for citer in citers[eid]:
            waiting[citer] -= 1
            if waiting[citer] == 0:
                heapq.heappush(ready, keys[citer])
    # Ids hash their auth refs, so the auth links cannot form a cycle and
    # every event of the subgraph is emitted.
    return ordered


def _auth_subgraph(
    roots: Iterable[bytes], within: Set[bytes], source: EventSource
) -> dict[bytes, tuple[Event, frozenset[bytes]]]:
    """id -> (event, its auth refs inside `within`), for `roots` and their ancestors there."""
    graph: dict[bytes, tuple[Event, frozenset[bytes]]] = {}
    todo = list(roots)
    while todo:
        eid = todo.pop()
        if eid in graph:
            continue
        event = source.get(eid)
        if event is None:
            continue
        deps = frozenset(a for a in event.auth if a in within and source.get(a) is not None)
        graph[eid] = (event, deps)
        todo.extend(d for d in deps if d not in graph)
    return graph


def mainline_order(
    events: Iterable[Event], power_levels_id: bytes | None, source: EventSource
) -> list[Event]:
    """`events` sorted by mainline position under `power_levels_id`, then timestamp, id."""
    mainline = _chain_of_power_levels(power_levels_id, source)
    # Depth counts from the oldest mainline event (1) up to the resolved one;
    # 0 means "never reaches the mainline", which sorts first.
    depth_of = {eid: len(mainline) - i for i, eid in enumerate(mainline)}
    memo: dict[bytes, int] = {}

    def depth(event: Event) -> int:
        path: list[bytes] = []
        on_path: set[bytes] = set()
        current = _power_levels_ref(event, source)
        found = 0
        while current is not None:
            if current in depth_of:
                found = depth_of[current]
                break
            if current in memo:
                found = memo[current]
                break
            if current in on_path:  # impossible with hashed ids; never loop on a bad source
                break
            path.append(current)
            on_path.add(current)
            pl_event = source.get(current)
            current = None if pl_event is None else _power_levels_ref(pl_event, source)
        for eid in path:
            memo[eid] = found
        return found

    keyed = [((depth(e), e.timestamp_ms, e.id), e) for e in events]
    keyed.sort(key=lambda pair: pair[0])
    return [e for _, e in keyed]


def _chain_of_power_levels(start: bytes | None, source: EventSource) -> list[bytes]:
    chain: list[bytes] = []
    seen: set[bytes] = set()
    current = start
    while current is not None and current not in seen:  # a bad source must not loop us
        chain.append(current)
        seen.add(current)
        event = source.get(current)
        current = None if event is None else _power_levels_ref(event, source)
    return chain


def _power_levels_ref(event: Event, source: EventSource) -> bytes | None:
    """The id of the power levels event among `event`'s auth refs, if any."""
    for ref in event.auth:
        auth_event = source.get(ref)
        if auth_event is not None and state_key_of(auth_event) == POWER_LEVELS_KEY:
            return ref
    return None
