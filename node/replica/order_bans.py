"""Bans that hold in the total order: each ordered event is judged again at its position.

Why. The auth rules judge an event against the state of its own causal past
(`node.state.tracker`), so a banned (or kicked, or demoted) writer that keeps
choosing parents from before its ban authors events that are valid in their
past and concurrent with the ban. The graph keeps them (the MEG's SEC needs
every correct node to hold the same vertices), but the order must not let a
ban be ignored. So the views of the order are filtered by a second check,
Matrix's "soft fail" moved from "the server's current state" to "the
order's own state at this position", which every correct replica shares.

The rule. Walk the confirmed sequence the linearizer produces, in order,
keeping the *order state*: a map (type, state key) -> event id, empty
before the create event. At each event e:

    check_auth(e, order state)   (the Matrix auth rules, auth refs aside)
    passes   -> e stays in the views; if e is a state event it replaces
                its key in the order state
    fails    -> e is *excluded*: left out of the confirmed and tentative
                views (it stays in the graph and in the linearizer, so the
                order of everything else does not move)

A ban, kick or role loss therefore takes effect at its own position: every
later event of that author fails `sender_not_joined` or `insufficient_power`
(and a self-join on pre-ban parents fails `banned`). The confirmed sequence
is the same on every correct replica and the walk reads nothing else (no
clock, no current state, no arrival order), so the exclusions are the same
everywhere, and a replay after a restart, which rebuilds the same confirmed
sequence, rebuilds them too. The order state is applied linearly (no state
resolution): at this point of the order every earlier state change is
already placed, and the last one placed for a key is the one in force.

The tentative tail is filtered the same way, starting from the order state
of the confirmed prefix, on a throw-away overlay (`survivors`).

Cost. One `check_auth` per ordered event, memoised for non-state events by
(author, kind) until the order state next changes; state events are always
judged in full (membership and power-level rules read their content).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Iterable, Mapping, MutableMapping

from node.core.event import Event
from node.state.auth_rules import check_auth
from node.state.types import (
    TYPE_CREATE,
    TYPE_JOIN_RULES,
    TYPE_MEMBER,
    TYPE_POWER_LEVELS,
    AuthReason,
    EventSource,
    StateKey,
    state_key_of,
)

VERDICT_CACHE_SIZE = 4_096  # (author, kind) verdicts kept per order state
_CONTENT_RULED = frozenset({TYPE_CREATE, TYPE_MEMBER, TYPE_POWER_LEVELS, TYPE_JOIN_RULES})

Verdicts = dict[tuple[bytes, str], AuthReason | None]


class OrderBans:
    """The order state of one topic's confirmed sequence, and the verdicts it gives."""

    def __init__(self, source: EventSource) -> None:
        self._source = source
        self._state: dict[StateKey, bytes] = {}
        self._verdicts: Verdicts = {}

    def admit(self, event: Event) -> AuthReason | None:
        """Judge the next confirmed event; None: it stays (and its state takes effect)."""
        reason = self._judge(event, self._state, self._verdicts)
        if reason is None:
            key = state_key_of(event)
            if key is not None:
                self._state[key] = event.id
                self._verdicts.clear()  # every cached verdict read the old state
        return reason

    def survivors(self, ids: Iterable[bytes], get: Callable[[bytes], Event]) -> tuple[bytes, ...]:
        """The ids of a tentative tail (in order) that pass, judged after the confirmed prefix."""
        overlay: dict[StateKey, bytes] = {}
        state: Mapping[StateKey, bytes] = ChainMap(overlay, self._state)
        verdicts = self._verdicts  # shared until the tail changes the state
        out: list[bytes] = []
        for event_id in ids:
            event = get(event_id)
            if self._judge(event, state, verdicts) is not None:
                continue
            out.append(event_id)
            key = state_key_of(event)
            if key is not None:
                overlay[key] = event_id
                verdicts = {}
        return tuple(out)

    def _judge(self, event: Event, state: Mapping[StateKey, bytes],
               verdicts: MutableMapping[tuple[bytes, str], AuthReason | None]) -> AuthReason | None:
        cacheable = event.state_key is None and event.kind not in _CONTENT_RULED
        if cacheable:
            key = (event.author, event.kind)
            if key in verdicts:
                return verdicts[key]
        reason = check_auth(event, state, self._source)
        if cacheable:
            if len(verdicts) >= VERDICT_CACHE_SIZE:
                verdicts.clear()
            verdicts[key] = reason
        return reason
