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

from collections.abc import Callable, Mapping, Sequence
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

VERDICT_CACHE_SIZE = 4_096  # non-state verdicts by (author, kind, the state they read)
STATE_VERDICT_CACHE_SIZE = 4_096  # state events' verdicts by (id, the state they read)
READ_KEYS_CACHE_SIZE = 8_192  # events' auth keys (auth_types_for_event), by id
_CONTENT_RULED = frozenset({TYPE_CREATE, TYPE_MEMBER, TYPE_POWER_LEVELS, TYPE_JOIN_RULES})
_RESTRICTS_READS_ALL = frozenset({TYPE_POWER_LEVELS, TYPE_JOIN_RULES})  # `restricts` reads more

# Off: every event is judged against the order state on every feed (the definition);
# on: the incremental tail and the no-restriction guard (module docstring). Same views.
SHORTCUTS = True

Reads = frozenset[StateKey]
_READS_NOTHING: Reads = frozenset()
_READS_ALL: Reads = frozenset({("*", "*")})  # a marker: the verdict may read any key


@dataclass(frozen=True, slots=True)
class Verdict:
    """One judged position: why it fails (None: stands), the state key it then sets,
    and whether the order is restricted from the next position on."""

    reason: AuthReason | None
    key: StateKey | None
    restricts: bool


class OrderBans:
    """The order state of one topic's confirmed sequence, and the verdicts it gives."""

    def __init__(self, source: EventSource, shortcuts: bool | None = None) -> None:
        self._source = source
        self._shortcuts = SHORTCUTS if shortcuts is None else shortcuts
        self._state: dict[StateKey, bytes] = {}
        # True once a restrictive change was admitted or a state event failed in the
        # confirmed prefix: from then on every event is judged.
        self._restricted = not self._shortcuts
        self._tail: tuple[bytes, ...] = ()  # the tail judged last (after the confirmed prefix)
        self._tail_verdicts: list[Verdict] = []
        self._reads: dict[bytes, Reads] = {}  # tail event -> the keys its verdict read
        self._read_keys: dict[bytes, tuple[StateKey, ...]] = {}  # event -> its auth keys
        self._memo: dict[tuple[object, ...], AuthReason | None] = {}  # non-state verdicts
        self._state_verdicts: dict[tuple[bytes, tuple[bytes | None, ...]], AuthReason | None] = {}

    def advance(self, appended: Sequence[bytes], tail: Sequence[bytes],
                get: Callable[[bytes], Event]) -> tuple[list[AuthReason | None], tuple[bytes, ...]]:
        """Judge newly confirmed events (in order), then the new tentative tail.

        Returns each confirmed event's reason (None: it stays, and its state took
        effect) and the tail's surviving ids, in order.
        """
        if not self._shortcuts:
            return self._advance_in_full(appended, tail, get)
        sequence = (*appended, *tail)
        old, old_verdicts = self._tail, self._tail_verdicts
        total, confirmed = len(sequence), len(appended)
        # The new sequence is old[:shared] + middle + old[len(old) - same_end:].
        shared = _common_prefix(old, sequence)
        same_end = _common_suffix(old, sequence, min(len(old), total) - shared)
        end_start = total - same_end  # the shared end's first position in `sequence`
        shift = total - len(old)  # its positions in `sequence` minus those in `old`
        reasons: list[AuthReason | None] = []
        verdicts_out: list[Verdict] = []
        state: dict[StateKey, bytes] = self._state
        restricted = self._restricted
        # Only needed when something after the shared prefix is judged.
        need_state = shared < total
        # While judging the middle: each key's value before it (for the difference below).
        before_middle: dict[StateKey, bytes | None] = {}
        old_restricted = restricted  # the old sequence's flag, at the aligned position
        differ: set[StateKey] = set()  # keys whose value differs from the old sequence's
        reads = self._reads
        for position, event_id in enumerate(sequence):
            if position == confirmed:
                if not need_state:
                    verdicts_out.extend(old_verdicts[position:total])
                    break
                state = dict(state)  # the tail: judged on a throw-away copy
            if position < shared:
                verdict = old_verdicts[position]
                old_restricted = restricted = restricted or verdict.restricts
            elif position < end_start:
                if position == shared:
                    old_restricted = restricted
                verdict = self._judge_at(event_id, get, state, restricted)
                if verdict.key is not None and verdict.key not in before_middle:
                    before_middle[verdict.key] = state.get(verdict.key)
                restricted = restricted or verdict.restricts
            else:
                if position == end_start:
                    old_restricted, differ = self._difference(
                        old, old_verdicts, shared, end_start - shift, state, before_middle,
                        old_restricted)
                old_verdict = old_verdicts[position - shift]
                if not differ and restricted == old_restricted and position >= confirmed:
                    verdicts_out.extend(old_verdicts[position - shift:])  # the rest is the same
                    break
                if restricted != old_restricted or (differ and _reads_any(
                        reads.get(event_id, _READS_ALL), differ)):
                    verdict = self._judge_at(event_id, get, state, restricted)
                else:
                    verdict = old_verdict
                _follow(differ, old_verdict.key, verdict.key)
                old_restricted = old_restricted or old_verdict.restricts
                restricted = restricted or verdict.restricts
            if verdict.key is not None:
                state[verdict.key] = event_id
            if position < confirmed:
                reasons.append(verdict.reason)
                self._restricted = restricted
                reads.pop(event_id, None)
            else:
                verdicts_out.append(verdict)
        self._tail = tuple(tail)
        self._tail_verdicts = verdicts_out
        if len(reads) > 2 * len(tail) + READ_KEYS_CACHE_SIZE:  # ids the linearizer dropped
            self._reads = {i: reads[i] for i in tail if i in reads}
        if all(v.reason is None for v in verdicts_out):
            return reasons, self._tail
        return reasons, tuple(i for i, v in zip(tail, verdicts_out) if v.reason is None)

    def _difference(self, old: Sequence[bytes], old_verdicts: Sequence[Verdict], shared: int,
                    old_end: int, state: Mapping[StateKey, bytes],
                    before_middle: Mapping[StateKey, bytes | None],
                    restricted: bool) -> tuple[bool, set[StateKey]]:
        """The old sequence at the start of the shared end, against the new one.

        Returns the old restricted flag there and the keys whose values differ
        (the old middle's setters and the new middle's, compared).
        """
        old_values: dict[StateKey, bytes] = {}
        for index in range(shared, old_end):
            verdict = old_verdicts[index]
            if verdict.key is not None:
                old_values[verdict.key] = old[index]
            restricted = restricted or verdict.restricts
        differ = set()
        for key in old_values.keys() | before_middle.keys():
            before = before_middle[key] if key in before_middle else state.get(key)
            if state.get(key) != old_values.get(key, before):
                differ.add(key)
        return restricted, differ

    def _judge_at(self, event_id: bytes, get: Callable[[bytes], Event],
                  state: Mapping[StateKey, bytes], restricted: bool) -> Verdict:
        verdict, self._reads[event_id] = self._judge(get(event_id), state, restricted)
        return verdict

    def _advance_in_full(self, appended: Sequence[bytes], tail: Sequence[bytes],
                         get: Callable[[bytes], Event]
                         ) -> tuple[list[AuthReason | None], tuple[bytes, ...]]:
        """The definition: every event judged against the order state at its position."""
        reasons: list[AuthReason | None] = []
        for event_id in appended:
            verdict, _ = self._judge(get(event_id), self._state, True)
            if verdict.key is not None:
                self._state[verdict.key] = event_id
            reasons.append(verdict.reason)
        state = dict(self._state)
        survivors: list[bytes] = []
        for event_id in tail:
            verdict, _ = self._judge(get(event_id), state, True)
            if verdict.key is not None:
                state[verdict.key] = event_id
            if verdict.reason is None:
                survivors.append(event_id)
        return reasons, tuple(survivors)

    def _judge(self, event: Event, state: Mapping[StateKey, bytes],
               restricted: bool) -> tuple[Verdict, Reads]:
        """The verdict at a position, and the keys of the state it read."""
        key = state_key_of(event)
        cacheable = key is None and event.kind not in _CONTENT_RULED
        if cacheable and not restricted:
            return _STANDS, _READS_NOTHING  # nothing restrictive placed yet (module docstring)
        keys = self._auth_keys(event)
        values = tuple(state.get(k) for k in keys)
        if cacheable:  # its verdict reads its author, kind and `keys` alone (auth_rules)
            memo_key = (event.author, event.kind, values)
            if memo_key in self._memo:
                reason = self._memo[memo_key]
            else:
                reason = check_auth(event, state, self._source)
                if len(self._memo) >= VERDICT_CACHE_SIZE:
                    self._memo.clear()
                self._memo[memo_key] = reason
            return Verdict(reason, None, False), frozenset(keys)
        reason = self._check(event, state, values)
        if key is None:  # a content-ruled kind without a state key: judged, sets nothing
            return Verdict(reason, None, reason is not None), frozenset(keys)
        if reason is not None:  # a state event failing: judge from here on
            return Verdict(reason, None, True), frozenset(keys)
        if restricted:
            return Verdict(None, key, True), frozenset(keys)
        reads = _READS_ALL if event.kind in _RESTRICTS_READS_ALL else frozenset(keys)
        return Verdict(None, key, restricts(event, state, self._source)), reads

    def _auth_keys(self, event: Event) -> tuple[StateKey, ...]:
        keys = self._read_keys.get(event.id)
        if keys is None:
            if len(self._read_keys) >= READ_KEYS_CACHE_SIZE:
                self._read_keys.clear()
            keys = self._read_keys[event.id] = tuple(auth_types_for_event(event))
        return keys

    def _check(self, event: Event, state: Mapping[StateKey, bytes],
               values: tuple[bytes | None, ...]) -> AuthReason | None:
        """check_auth for an event judged by its content too, memoised by its id and the
    values of the keys it reads."""
        memo_key = (event.id, values)
        if memo_key in self._state_verdicts:
            return self._state_verdicts[memo_key]
        reason = check_auth(event, state, self._source)
        if len(self._state_verdicts) >= STATE_VERDICT_CACHE_SIZE:
            self._state_verdicts.clear()
        self._state_verdicts[memo_key] = reason
        return reason


def _follow(differ: set[StateKey], old_key: StateKey | None, new_key: StateKey | None) -> None:
    """Keep `differ` true past one position of the shared end (the same event in both)."""
    if old_key == new_key:
        if old_key is not None:
            differ.discard(old_key)  # both sequences now hold this event for the key
        return
    if old_key is not None:
        differ.add(old_key)
    if new_key is not None:
        differ.add(new_key)


def _reads_any(reads: Reads, keys: set[StateKey]) -> bool:
    return reads is _READS_ALL or not keys.isdisjoint(reads)


def _common_prefix(a: Sequence[bytes], b: Sequence[bytes]) -> int:
    """Length of the longest common prefix (slice comparisons: C speed, log steps)."""
    low, high = 0, min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    while low < high:  # the prefix is at least low and at most high long
        middle = (low + high + 1) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _common_suffix(a: Sequence[bytes], b: Sequence[bytes], limit: int) -> int:
    """Length of the longest common suffix, at most `limit`."""
    low, high = 0, limit
    len_a, len_b = len(a), len(b)
    if a[len_a - high:] == b[len_b - high:]:
        return high
    while low < high:
        middle = (low + high + 1) // 2
        if a[len_a - middle:len_a - low] == b[len_b - middle:len_b - low]:
            low = middle
        else:
            high = middle - 1
    return low


_STANDS = Verdict(None, None, False)
