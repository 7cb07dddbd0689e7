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
event, the order state before it and whether the order is restricted there
(below). `advance` keeps the verdicts of the tail it judged last. The new
sequence (newly confirmed events, then the new tail) and the old tail share
a prefix and an end, found by slice comparisons (C speed, logarithmic
steps); between them, the linearizer inserted, moved or dropped events:

    old tail       P P P P | a b c   d | E E E E E E
    new sequence   P P P P | a x b c   | E E E E E E   (x: judged; the rest kept)

The prefix keeps its verdicts; the order state after it is not copied but
read through a view (`_StateAt`): a key the old tail's prefix set is found
through an index of the tail's setters, any other in the confirmed state,
so a feed costs what it judges, not the size of the state. After it, the
two are walked side by side: an event found further on in the old tail is
matched (the old events before it are passed
over), any other is judged. A matched event keeps its verdict unless the
verdict read a key whose value differs between the two sequences at that
point (`differ`: the judged events' setters and the passed-over ones'; a
key leaves it where both set it to the same event) or the restricted flags
differ. In the shared end, once nothing differs, or no later event's
verdict read a key that does (an index of which tail events read each
key), the rest is kept whole. So the linearizer inserting an event into a
long tail (a join storm: each join lands at a random place among the
unconfirmed ones) judges that event alone, and confirming a prefix of the
tail judges nothing. The keys a verdict read are recorded when it is
judged: the auth keys (`auth_types_for_event`), none for an event that
stood unchecked (below), and every key for a power-levels or join-rules
change (`restricts` reads more of the state for them).

And while no restrictive state change (`node.state.restrictive`: a ban,
kick, leave, knock, power-level decrease or join-rule change) was admitted
and no state event failed, every non-state event stands (that module's
docstring proves it: the sequence is a linear extension of the causal
order, so every event's past is placed before it), so none is checked.
State events are always judged in full (membership and power-level rules
read their content). Both shortcuts are functions of the ordered sequence
alone, so every replica gets the same views as without them (`SHORTCUTS =
False` judges everything, for the equivalence tests). When checks do run,
an ordinary non-state event's verdict is memoised by (author, kind, the
values of the keys the auth rules read for it), any other by (id, those
values), so a tail the linearizer reorders re-judges its joins by a lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass

from node.core.event import Event
from node.core.order.linearizer import common_prefix
from node.core.order.topolist import TailView
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
READERS_LOOKUP_LIMIT = 256  # readers of the differing keys looked up before walking on
POSITIONS_SCAN_LIMIT = 8  # readers looked for by scanning the old tail, not indexing it
_CONTENT_RULED = frozenset({TYPE_CREATE, TYPE_MEMBER, TYPE_POWER_LEVELS, TYPE_JOIN_RULES})
_RESTRICTS_READS_ALL = frozenset({TYPE_POWER_LEVELS, TYPE_JOIN_RULES})  # `restricts` reads more

# Off: every event is judged against the order state on every feed (the definition);
# on: the incremental tail and the no-restriction guard (module docstring). Same views.
SHORTCUTS = True

Reads = frozenset[StateKey]
_READS_NOTHING: Reads = frozenset()
_ANY_KEY: StateKey = ("*", "*")  # not a real key (no event type is "*")
_READS_ALL: Reads = frozenset({_ANY_KEY})  # a marker: the verdict may read any key


@dataclass(frozen=True, slots=True)
class _Out:
    """What `advance` builds: the confirmed events' reasons; the tail's verdicts and sets."""

    reasons: list[AuthReason | None]
    verdicts: list[Verdict]
    sets: list[tuple[StateKey, bytes] | None]


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
        # The tail judged last (after the confirmed prefix), its verdicts, and the
        # (key, id) each position sets (None: none), aligned.
        self._tail: Sequence[bytes] = ()  # a tuple, or the linearizer's view
        self.shared_with_last = -1  # ids the last `advance` found shared with the tail before
        self._tail_verdicts: list[Verdict] = []
        self._tail_sets: list[tuple[StateKey, bytes] | None] = []
        # Tail events whose verdict excludes them / restricts the order (both rare).
        self._excluded: set[bytes] = set()
        self._restricting: set[bytes] = set()
        self._reads: dict[bytes, Reads] = {}  # tail event -> the keys its verdict read
        self._readers: dict[StateKey, set[bytes]] = {}  # key -> tail events that read it
        self._setters: dict[StateKey, set[bytes]] = {}  # key -> tail events that set it
        self._set_keys: dict[bytes, StateKey] = {}  # tail event -> the key it sets
        self._read_keys: dict[bytes, tuple[StateKey, ...]] = {}  # event -> its auth keys
        self._memo: dict[tuple[object, ...], AuthReason | None] = {}  # non-state verdicts
        self._state_verdicts: dict[tuple[object, ...], AuthReason | None] = {}  # the others

    @property
    def tail(self) -> Sequence[bytes]:
        """The tail the last `advance` was given."""
        return self._tail

    def advance(self, appended: Sequence[bytes], tail: Sequence[bytes],
                get: Callable[[bytes], Event], *, previous: Sequence[bytes] | None = None,
                shared: int = -1) -> tuple[list[AuthReason | None], Sequence[bytes]]:
        """Judge newly confirmed events (in order), then the new tentative tail.

        Returns each confirmed event's reason (None: it stays, and its state took
        effect) and the tail's surviving ids, in order. `previous` and `shared`
        (`OrderUpdate`'s): if `previous` is the tail this was last given, the
        new sequence shares `shared` ids with it, and that is not compared
        again. After the call `shared_with_last` says how many ids were shared.
        """
        if not self._shortcuts:
            self.shared_with_last = -1
            return self._advance_in_full(appended, tail, get)
        old = self._tail
        # The tail as it comes (a tuple, or the linearizer's view): a copy costs the
        # tail's length, on every event.
        immutable = isinstance(tail, (tuple, TailView))
        sequence = (*appended, *tail) if appended or not immutable else tail
        total, confirmed = len(sequence), len(appended)
        if previous is not old or not 0 <= shared <= min(len(old), total):
            shared = common_prefix(old, sequence)
        self.shared_with_last = shared
        # The old tail's end that the new sequence ends with too; `shift` maps its
        # positions in `sequence` to those in `old`.
        end_start = total - _common_suffix(old, sequence, min(len(old), total) - shared)
        out = _Out([], [], [])
        restricted = self._restricted
        for position in range(min(shared, confirmed)):  # confirmed, verdicts kept
            verdict = self._tail_verdicts[position]
            if verdict.key is not None:
                self._state[verdict.key] = sequence[position]
            restricted = restricted or verdict.restricts
            out.reasons.append(verdict.reason)
        self._restricted = restricted
        # The tail's part of the shared prefix keeps its verdicts: the old lists are
        # cut to it in place once the walk (which reads them from `shared` on) is done.
        if shared < total:
            state: MutableMapping[StateKey, bytes] = self._state
            # Judged in the walk: at or after `shared` in the new sequence, so never in
            # old[:shared] (the two agree there), nor a later reader in the old tail (such
            # an event sits before the walk's old position, or not in the old tail).
            judged: set[bytes] = set()
            if shared > confirmed:
                # The order state after old[confirmed:shared], answered per key (its
                # setters are indexed) instead of copied: a copy cost the whole state.
                state = _StateAt(self._state, self._setters, old, self._tail_sets, confirmed,
                                 shared, judged)
                if self._restricting and not restricted:
                    restricted = any(i in self._restricting for i in old[confirmed:shared])
            self._walk_rest(sequence, confirmed, shared, end_start, total - len(old), state,
                            restricted, get, out, judged)
        for event_id in appended:
            self._forget(event_id)
        self._tail = tail if immutable else tuple(tail)
        if shared > confirmed:  # old[confirmed:shared], then what the walk found
            verdicts, sets = self._tail_verdicts, self._tail_sets
            del verdicts[shared:], sets[shared:]
            del verdicts[:confirmed], sets[:confirmed]
            verdicts.extend(out.verdicts)
            sets.extend(out.sets)
        else:
            self._tail_verdicts, self._tail_sets = out.verdicts, out.sets
        if len(self._reads) > 2 * len(tail) + READ_KEYS_CACHE_SIZE:  # ids no longer ordered
            for event_id in set(self._reads).difference(tail):
                self._forget(event_id)
        if self._excluded or self._restricting:  # ids dropped from the tail
            self._excluded.intersection_update(tail)
            self._restricting.intersection_update(tail)
        if not self._excluded:
            return out.reasons, self._tail
        return out.reasons, tuple(i for i in tail if i not in self._excluded)

    def _walk_rest(self, sequence: Sequence[bytes], confirmed: int, shared: int,
                   end_start: int, shift: int, state: MutableMapping[StateKey, bytes],
                   restricted: bool,
                   get: Callable[[bytes], Event], out: _Out, judged: set[bytes]) -> None:
        """Judge the sequence after its shared prefix, keeping the old verdicts that hold.

        Walks the new sequence and the old tail side by side: an event found
        later in the old tail is matched (the old events before it are passed
        over), any other is judged. `differ` holds each key whose value differs
        between the two (key -> the old value); a matched event is judged again
        only if its verdict read such a key or the restricted flags differ. In
        the shared end, once no later event read a key that differs, the rest
        is kept whole.
        """
        old, old_verdicts, old_sets = self._tail, self._tail_verdicts, self._tail_sets
        reads = self._reads
        where = _Positions(old, shared)
        next_old = shared  # the old tail's first position not passed yet
        old_restricted = restricted
        differ: dict[StateKey, bytes | None] = {}
        checked: tuple[object, ...] | None = None  # `differ` when its readers were last looked up
        for position in range(shared, len(sequence)):
            if position == confirmed:
                state = dict(state)  # the tail: judged on a throw-away copy
            event_id = sequence[position]
            # Most events sit where the old tail had them: one comparison, no index.
            # Every old tail event was judged, so one never judged (an insertion) is new.
            if next_old < len(old) and old[next_old] == event_id:
                at = next_old
            else:
                at = where.get(event_id, -1) if event_id in reads else -1
            if at >= next_old:
                for passed in range(next_old, at):  # in the old tail only, here
                    old_verdict = old_verdicts[passed]
                    if old_verdict.key is not None:
                        _old_sets(differ, state, old_verdict.key, old[passed])
                    old_restricted = old_restricted or old_verdict.restricts
                next_old = at + 1
                old_verdict = old_verdicts[at]
                if (restricted == old_restricted and position >= end_start
                        and position >= confirmed and at == position - shift):
                    snapshot = tuple(differ.items())
                    if not differ or (snapshot != checked and not self._read_later(
                            differ, where, at, judged)):
                        out.verdicts.extend(old_verdicts[at:])  # the rest is the same
                        out.sets.extend(old_sets[at:])
                        return
                    checked = snapshot
                if restricted != old_restricted or (differ and _reads_any(
                        reads.get(event_id, _READS_ALL), differ)):
                    verdict = self._judge_at(event_id, get, state, restricted)
                    judged.add(event_id)
                else:
                    verdict = old_verdict
                if verdict.key is not None:
                    _new_sets(differ, state, verdict.key, event_id)
                if old_verdict.key is not None:
                    _old_sets(differ, state, old_verdict.key, event_id)
                old_restricted = old_restricted or old_verdict.restricts
            else:
                verdict = self._judge_at(event_id, get, state, restricted)
                judged.add(event_id)
                if verdict.key is not None:
                    _new_sets(differ, state, verdict.key, event_id)
            restricted = restricted or verdict.restricts
            if position < confirmed:
                out.reasons.append(verdict.reason)
                self._restricted = restricted
            else:
                out.verdicts.append(verdict)
                out.sets.append(None if verdict.key is None else (verdict.key, event_id))

    def _read_later(self, differ: Mapping[StateKey, object], where: _Positions,
                    at: int, judged: set[bytes]) -> bool:
        """True if an event of the old tail from `at` on read a key of `differ` (or might:
        too many readers to look up)."""
        readers = [self._readers.get(key, ()) for key in differ]
        readers.append(self._readers.get(_ANY_KEY, ()))
        if sum(len(r) for r in readers) > READERS_LOOKUP_LIMIT:
            return True
        return where.any_from((i for r in readers for i in r if i not in judged), at)

    def _judge_at(self, event_id: bytes, get: Callable[[bytes], Event],
                  state: Mapping[StateKey, bytes], restricted: bool) -> Verdict:
        """Judge a tail or newly confirmed event, and index what its verdict read."""
        verdict, reads = self._judge(get(event_id), state, restricted)
        self._forget(event_id)
        self._reads[event_id] = reads
        for key in (_ANY_KEY,) if reads is _READS_ALL else reads:
            readers = self._readers.get(key)
            if readers is None:
                readers = self._readers[key] = set()
            readers.add(event_id)
        if verdict.key is not None:
            setters = self._setters.get(verdict.key)
            if setters is None:
                setters = self._setters[verdict.key] = set()
            setters.add(event_id)
            self._set_keys[event_id] = verdict.key
        if verdict.reason is not None:
            self._excluded.add(event_id)
        if verdict.restricts:
            self._restricting.add(event_id)
        return verdict

    def _forget(self, event_id: bytes) -> None:
        """Drop what is indexed of an event (it left the tail, or is judged again)."""
        reads = self._reads.pop(event_id, None)
        if reads:
            for key in (_ANY_KEY,) if reads is _READS_ALL else reads:
                readers = self._readers.get(key)
                if readers is not None:
                    readers.discard(event_id)
                    if not readers:
                        del self._readers[key]
        key = self._set_keys.pop(event_id, None)
        if key is not None:
            setters = self._setters[key]
            setters.discard(event_id)
            if not setters:
                del self._setters[key]
        self._excluded.discard(event_id)
        self._restricting.discard(event_id)

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
            reason = self._checked(self._memo, VERDICT_CACHE_SIZE,
                                   (event.author, event.kind, values), event, state)
            return Verdict(reason, None, False), frozenset(keys)
        # Judged by its content too: memoised by its id and the values it reads.
        reason = self._checked(self._state_verdicts, STATE_VERDICT_CACHE_SIZE,
                               (event.id, values), event, state)
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

    def _checked(self, cache: dict[tuple[object, ...], AuthReason | None], limit: int,
                 memo_key: tuple[object, ...], event: Event,
                 state: Mapping[StateKey, bytes]) -> AuthReason | None:
        """check_auth, memoised in `cache` (cleared once it holds `limit`) by `memo_key`:
        all the verdict depends on."""
        if memo_key in cache:
            return cache[memo_key]
        reason = check_auth(event, state, self._source)
        if len(cache) >= limit:
            cache.clear()
        cache[memo_key] = reason
        return reason


class _Positions:
    """Positions in the old tail from `start` on, by id; the index is built on first use
    (an insertion into a long tail is matched position by position and never needs it)."""

    __slots__ = ("_old", "_start", "_index")

    def __init__(self, old: Sequence[bytes], start: int) -> None:
        self._old, self._start = old, start
        self._index: dict[bytes, int] | None = None

    def get(self, event_id: bytes, default: int) -> int:
        if self._index is None:
            self._index = dict(zip(self._old[self._start:], range(self._start, len(self._old))))
        return self._index.get(event_id, default)

    def any_from(self, ids: Iterable[bytes], at: int) -> bool:
        """True if one of `ids` sits in the old tail at `at` or later (`at` >= start)."""
        wanted = list(ids)
        if self._index is None and len(wanted) <= POSITIONS_SCAN_LIMIT:
            # A few ids are looked for in C, without building the index (a join inserted
            # into a long tail has its author's events, if any, as the readers of its key).
            return any(_find(self._old, i, at, len(self._old)) >= 0 for i in wanted)
        return any(self.get(i, -1) >= at for i in wanted)


def _find(ids: Sequence[bytes], event_id: bytes, start: int, stop: int) -> int:
    """Position of `event_id` in ids[start:stop] (scanned in C), -1 if absent."""
    try:
        return ids.index(event_id, start, stop)
    except ValueError:
        return -1


class _StateAt(MutableMapping[StateKey, bytes]):
    """The order state at a point of the old tail, without copying it: `base` (the state
    after the confirmed prefix) updated by the old tail's sets in [start, stop), then by
    what the walk writes.

    A key is answered by its setters in the tail (`setters`, usually none or one, each
    found by a scan in C), else by `base`; `base` is never written. Iterating (the
    rare verdict that reads the whole state) builds the copy once.
    """

    __slots__ = ("_base", "_setters", "_old", "_sets", "_start", "_stop", "_skip", "_own",
                 "_whole")

    def __init__(self, base: Mapping[StateKey, bytes], setters: Mapping[StateKey, set[bytes]],
                 old: Sequence[bytes], sets: Sequence[tuple[StateKey, bytes] | None],
                 start: int, stop: int, skip: set[bytes]) -> None:
        self._base, self._setters, self._old, self._sets = base, setters, old, sets
        self._start, self._stop = start, stop
        self._skip = skip  # setters known not to be in old[start:stop] (judged since)
        self._own: dict[StateKey, bytes] = {}  # written by the walk
        self._whole: dict[StateKey, bytes] | None = None

    def _lookup(self, key: StateKey) -> bytes | None:
        if self._whole is not None:
            return self._whole.get(key)
        value = self._own.get(key)
        if value is not None:
            return value
        best = -1
        for event_id in self._setters.get(key, ()):
            if event_id in self._skip:
                continue
            at = _find(self._old, event_id, self._start, self._stop)
            if at > best and (entry := self._sets[at]) is not None and entry[0] == key:
                best = at
        return self._base.get(key) if best < 0 else self._old[best]

    def get(self, key: StateKey, default: bytes | None = None) -> bytes | None:  # type: ignore[override]
        value = self._lookup(key)
        return default if value is None else value

    def __contains__(self, key: object) -> bool:
        return self._lookup(key) is not None  # type: ignore[arg-type]

    def __getitem__(self, key: StateKey) -> bytes:
        value = self._lookup(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: StateKey, value: bytes) -> None:
        if self._whole is not None:
            self._whole[key] = value
        self._own[key] = value

    def __delitem__(self, key: StateKey) -> None:
        raise TypeError("the order state is only ever set")

    def _materialised(self) -> dict[StateKey, bytes]:
        if self._whole is None:
            whole = dict(self._base)
            whole.update(filter(None, self._sets[self._start:self._stop]))
            whole.update(self._own)
            self._whole = whole
        return self._whole

    def __iter__(self) -> Iterator[StateKey]:
        return iter(self._materialised())

    def __len__(self) -> int:
        return len(self._materialised())


def _new_sets(differ: dict[StateKey, bytes | None], state: MutableMapping[StateKey, bytes],
              key: StateKey, event_id: bytes) -> None:
    """The new sequence sets `key`: keep `differ` (key -> the old value) true."""
    if key in differ:
        if differ[key] == event_id:
            del differ[key]
    else:
        differ[key] = state.get(key)  # the old value was the new one until now
    state[key] = event_id


def _old_sets(differ: dict[StateKey, bytes | None], state: Mapping[StateKey, bytes],
              key: StateKey, event_id: bytes) -> None:
    """The old sequence sets `key` (the new state is `state`): keep `differ` true."""
    if state.get(key) == event_id:
        differ.pop(key, None)
    else:
        differ[key] = event_id


def _reads_any(reads: Reads, keys: Mapping[StateKey, object]) -> bool:
    return reads is _READS_ALL or not keys.keys().isdisjoint(reads)


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
