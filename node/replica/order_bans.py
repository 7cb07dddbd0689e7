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
of the confirmed prefix, on a throw-away copy.

Cost, and the two shortcuts. A verdict at a position depends only on the
sequence up to it (confirmed prefix, then tail), so `advance` keeps the
verdicts of the tail it judged last and re-judges only from the first
position where the new sequence (newly confirmed events, then the new tail)
differs from the old tail: a feed that appends to the tail judges the
appended events alone, and confirming a prefix of the tail judges nothing.
And while no restrictive state change (`node.state.restrictive`: a ban,
kick, leave, knock, power-level decrease or join-rule change) was admitted
and no state event failed, every non-state event stands (that module's
docstring proves it), so none is checked. State events are always judged in
full (membership and power-level rules read their content). Both shortcuts
are functions of the ordered sequence alone, so every replica gets the same
views as without them (`SHORTCUTS = False` judges everything, for the
equivalence test). When checks do run, non-state verdicts are memoised by
(author, kind) until the order state next changes, and a state event's
verdict by its id and the values of the keys the auth rules read for it
(`auth_types_for_event`), so a tail the linearizer reorders re-judges its
joins by a lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass

from node.core.event import Event
from node.state.auth_rules import auth_types_for_event, check_auth
from node.state.restrictive import restricts
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
STATE_VERDICT_CACHE_SIZE = 4_096  # state events' verdicts by (id, the state they read)
_CONTENT_RULED = frozenset({TYPE_CREATE, TYPE_MEMBER, TYPE_POWER_LEVELS, TYPE_JOIN_RULES})

# Off: every event is judged against the order state on every feed (the definition);
# on: the incremental tail and the no-restriction guard (module docstring). Same views.
SHORTCUTS = True

Verdicts = dict[tuple[bytes, str], AuthReason | None]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One judged position: why it fails (None: stands), the state key it then sets,
    and whether the order is restricted from the next position on."""

    reason: AuthReason | None
    key: StateKey | None
    restricts: bool


class OrderBans:
    """The order state of one topic's confirmed sequence, and the verdicts it gives."""

    def __init__(self, source: EventSource) -> None:
        self._source = source
        self._state: dict[StateKey, bytes] = {}
        self._verdicts: Verdicts = {}
        # True once a restrictive change was admitted or a state event failed in the
        # confirmed prefix: from then on every event is judged.
        self._restricted = not SHORTCUTS
        self._tail: tuple[bytes, ...] = ()  # the tail judged last (after the confirmed prefix)
        self._tail_verdicts: list[Verdict] = []
        self._read_keys: dict[bytes, tuple[StateKey, ...]] = {}  # state event -> keys read
        self._state_verdicts: dict[tuple[bytes, tuple[bytes | None, ...]], AuthReason | None] = {}

    def advance(self, appended: Sequence[bytes], tail: Sequence[bytes],
                get: Callable[[bytes], Event]) -> tuple[list[AuthReason | None], tuple[bytes, ...]]:
        """Judge newly confirmed events (in order), then the new tentative tail.

        Returns each confirmed event's reason (None: it stays, and its state took
        effect) and the tail's surviving ids, in order.
        """
        sequence = (*appended, *tail)
        old, old_verdicts = self._tail, self._tail_verdicts
        shared = 0
        if SHORTCUTS:
            limit = min(len(old), len(sequence))
            while shared < limit and old[shared] == sequence[shared]:
                shared += 1
        confirmed = len(appended)
        reasons: list[AuthReason | None] = []
        survivors: list[bytes] = []
        verdicts_out: list[Verdict] = []
        state: MutableMapping[StateKey, bytes] = self._state
        verdicts: Verdicts = self._verdicts
        restricted = self._restricted
        for position, event_id in enumerate(sequence):
            if position == confirmed:  # the tail: judged on a throw-away copy (plain dict
                state = dict(self._state)  # reads: the memo keys read several per event)
            if position < shared:
                verdict = old_verdicts[position]
            else:
                verdict = self._judge(get(event_id), state, restricted, verdicts)
            if verdict.key is not None:
                state[verdict.key] = event_id
                if position < confirmed:
                    self._verdicts.clear()  # every cached verdict read the old state
                else:
                    verdicts = {} if verdicts is self._verdicts else verdicts
                    verdicts.clear()
            if verdict.restricts:
                restricted = True
            if position < confirmed:
                reasons.append(verdict.reason)
                self._restricted = restricted
            else:
                verdicts_out.append(verdict)
                if verdict.reason is None:
                    survivors.append(event_id)
        self._tail = tuple(tail)
        self._tail_verdicts = verdicts_out
        return reasons, tuple(survivors)

    def _judge(self, event: Event, state: Mapping[StateKey, bytes], restricted: bool,
               verdicts: MutableMapping[tuple[bytes, str], AuthReason | None]) -> Verdict:
        key = state_key_of(event)
        cacheable = key is None and event.kind not in _CONTENT_RULED
        if cacheable and not restricted:
            return _STANDS  # nothing restrictive placed yet: it passes (module docstring)
        if cacheable:
            cache_key = (event.author, event.kind)
            if cache_key in verdicts:
                return Verdict(verdicts[cache_key], None, False)
        reason = self._check(event, state) if key is not None else check_auth(
            event, state, self._source)
        if cacheable:
            if len(verdicts) >= VERDICT_CACHE_SIZE:
                verdicts.clear()
            verdicts[cache_key] = reason
            return Verdict(reason, None, False)
        if key is None:  # a content-ruled kind without a state key: judged, sets nothing
            return Verdict(reason, None, reason is not None)
        if reason is not None:
            return Verdict(reason, None, True)  # a state event failing: judge from here on
        return Verdict(None, key, restricted or restricts(event, state, self._source))

    def _check(self, event: Event, state: Mapping[StateKey, bytes]) -> AuthReason | None:
        """check_auth for a state event, memoised by the values of the keys it reads."""
        keys = self._read_keys.get(event.id)
        if keys is None:
            if len(self._read_keys) >= STATE_VERDICT_CACHE_SIZE:
                self._read_keys.clear()
            keys = self._read_keys[event.id] = tuple(auth_types_for_event(event))
        memo_key = (event.id, tuple(state.get(k) for k in keys))
        if memo_key in self._state_verdicts:
            return self._state_verdicts[memo_key]
        reason = check_auth(event, state, self._source)
        if len(self._state_verdicts) >= STATE_VERDICT_CACHE_SIZE:
            self._state_verdicts.clear()
        self._state_verdicts[memo_key] = reason
        return reason


_STANDS = Verdict(None, None, False)
