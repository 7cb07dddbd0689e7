"""State resolution v2: one state out of the states of several forks.

When an event has parents whose states differ, the state before it is the
resolution of those states. This is Matrix's state resolution v2
(`seeds/stateres-v2.md`, matrix-spec `rooms/fragments/v2-state-res.md`):

1. Split the keys: a key held by the same event in every state is
   *unconflicted*; every other (key, event) pair is *conflicted*.
2. The *full conflicted set* is the conflicted events plus the auth chain
   difference of the states (`auth_chain`): what some fork knew and another
   did not.
3. Take the *power events* of the full conflicted set (power levels, join
   rules, kicks, bans) with their auth ancestors inside the set, in reverse
   topological power order (`ordering.power_order`), and apply each that
   passes the auth rules against the *partial state*, which starts as the
   unconflicted state.
4. Sort the remaining events by the mainline of the power levels event that
   step 3 left in the partial state (`ordering.mainline_order`) and apply
   each that passes the auth rules, in that order.
5. Put the unconflicted state back on top.

An event is authorised against its own auth refs overlaid with the partial
state at every key the auth rules read for it: what the resolution has decided
so far wins over what the event's author believed.

Pure and deterministic: the result depends only on the set of input states and
the events they reach, never on the order of `state_sets`, on set iteration
order, or on anything but the events (ids compare bytewise).

What it leaves to the caller: events are not marked rejected here, and
rejected events are never reached. The `EventSource` is the graph, which
may hold rejected events from a store older than the replica's gate (a
vertex marked rejected by `node.state.tracker`; the Reference Monitor does
not check auth refs). But the input states hold accepted events
only, and an accepted event's auth refs are exactly `select_auth_refs` of
its state before (the tracker rejects anything else), which holds accepted
events only - so every walk through auth refs from the input states stays
among accepted events. Matrix's rule that rejected events are not replayed
thus holds without a check here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from node.core.event import Event
from node.state.auth_chain import auth_chain_difference
from node.state.auth_rules import auth_types_for_event, check_auth
from node.state.ordering import is_power_event, mainline_order, power_order
from node.state.types import POWER_LEVELS_KEY, EventSource, StateKey, StateMap, state_key_of


def resolve(state_sets: Sequence[StateMap], source: EventSource) -> dict[StateKey, bytes]:
    """The resolved state of several states (each: state key -> event id)."""
    if not state_sets:
        return {}
    unconflicted, conflicted = split(state_sets)
    if not conflicted:
        return unconflicted
    difference = auth_chain_difference(state_sets, set(unconflicted.values()), source)
    full = {
        eid for eid in conflicted.union(difference)
        if (event := source.get(eid)) is not None and event.is_state
    }
    powers = power_order((eid for eid in full if is_power_event(_get(source, eid))), full, source)
    partial = dict(unconflicted)
    apply_authorised(partial, powers, source)
    applied = {e.id for e in powers}
    rest = mainline_order(
        (_get(source, eid) for eid in full if eid not in applied),
        partial.get(POWER_LEVELS_KEY),
        source,
    )
    apply_authorised(partial, rest, source)
    partial.update(unconflicted)
    return partial


def split(state_sets: Sequence[StateMap]) -> tuple[dict[StateKey, bytes], set[bytes]]:
    """(unconflicted state, ids of the conflicted events)."""
    holders: dict[StateKey, set[bytes]] = {}
    present: dict[StateKey, int] = {}
    for state in state_sets:
        for key, event_id in state.items():
            holders.setdefault(key, set()).add(event_id)
            present[key] = present.get(key, 0) + 1
    unconflicted: dict[StateKey, bytes] = {}
    conflicted: set[bytes] = set()
    for key, ids in holders.items():
        if len(ids) == 1 and present[key] == len(state_sets):
            unconflicted[key] = next(iter(ids))
        else:
            conflicted.update(ids)
    return unconflicted, conflicted


def apply_authorised(
    partial: dict[StateKey, bytes], events: Iterable[Event], source: EventSource
) -> None:
    """Iterative auth checks: apply, in order, each event the partial state allows."""
    for event in events:
        key = state_key_of(event)
        if key is None:
            continue
        if check_auth(event, _auth_state(event, partial, source), source) is None:
            partial[key] = event.id


def _auth_state(event: Event, partial: StateMap, source: EventSource) -> dict[StateKey, bytes]:
    """The event's own auth refs by key, overridden by the partial state where it has the key."""
    auth_state: dict[StateKey, bytes] = {}
    for ref in event.auth:
        auth_event = source.get(ref)
        key = None if auth_event is None else state_key_of(auth_event)
        if key is not None:
            auth_state[key] = ref
    for key in auth_types_for_event(event):
        if key in partial:
            auth_state[key] = partial[key]
    return auth_state


def _get(source: EventSource, event_id: bytes) -> Event:
    event = source.get(event_id)
    assert event is not None  # callers only pass ids already found in the source
    return event
