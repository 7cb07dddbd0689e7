"""Soft fail: events valid in their own past whose author no longer stands here.

Why. The auth rules judge an event against the state of its causal past, so
a banned writer that keeps choosing parents from before its ban authors
events that every replica must accept (a verdict that depended on arrival
order would split the graph). Matrix answers with *soft fail*: an event that
passes against its past but fails against the server's current state is
kept (the graph converges) but not passed on. This module is that check.

The rule. After a received batch is applied, each of its events that passed
the auth rules is judged against the state this node resolved at its
current forward extremities (the batch included, so a join, rejoin or
promotion that arrived with it counts). It is soft-failed when its author
no longer stands there *and* the state entry that says so (the author's
member event, or the power levels) was applied here before the event: only
then is that entry surely not the author's own later history (an ancestor
is always applied before its descendants), e.g. a demotion that came in
the same batch as the events written before it:

    the author is banned                              -> soft fail (banned)
    the event is the author's own membership event    -> stands (its own
                                                         rules judged it)
    the author is not joined (left, kicked)           -> soft fail
                                                         (sender_not_joined)
    the author's level is below the event's send
    level (a lost writing role; dummies need none)    -> soft fail
                                                         (insufficient_power)

Only the author's standing is judged, not the whole auth rules: a state
event concurrent with another one (two admins editing power levels) is not
soft-failed for the conflict, which state resolution settles.

What a soft-failed event is, on this node: a vertex of the graph with its
state (its children are judged on their own, and anti-entropy still offers
it, so every correct node converges on the same graph), but it is not
forwarded by push, not used as a parent by local authoring, and not handed
to subscribers of the causal view. The verdict is per node (it reads the
current state, which depends on what has arrived): a node that has not
received the ban yet accepts and forwards the events. The total order does
not depend on it: `node.replica.order_bans` excludes a banned author's
events at the ban's position identically on every node.

The guard. Until a restrictive state change (`node.state.restrictive`: a
ban, kick, leave, knock, power-level decrease or join-rule change) was
applied here, no author can have lost its standing, so nothing is judged and
the current state is not resolved (`SoftFails.restricted`). One more case
trips it: a power-levels event that does not replace the last one applied
here (two concurrent edits), since resolution may then keep a version that
grants less than one an event was judged by. The guard only ever trips (it
is recorded with the events), and `SHORTCUTS = False` judges every batch,
for the equivalence test.

The guard needs to have seen every state event since the create event, so it
starts closed and opens when the create event is noted (`V`): a store from
before it, or a topic that ran with soft fail off, is judged in full.

Records: `s|id -> reason`, `V` (the guard watched from the create event),
`R` (it tripped) and `P -> id` (the last power levels applied) in the topic's state table (TABLE_STATE; the other
prefixes are `node.state.store`'s), written with the events.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from node.core.event import KIND_DUMMY, Event
from node.core.topic_table import TopicTable
from node.state.restrictive import restricts
from node.state.types import (
    POWER_LEVELS_KEY,
    TYPE_MEMBER,
    TYPE_POWER_LEVELS,
    AuthReason,
    EventSource,
    Membership,
    StateKey,
    user_id,
)
from node.state.view import StateView

VERDICT_CACHE_SIZE = 4_096  # (state group, author, kind, is_state) -> verdict

_SOFT_FAILED = b"s"
_RESTRICTED = b"R"
_WATCHED = b"V"
_LAST_POWER_LEVELS = b"P"

# Off: every received batch is judged against the current state (the definition);
# on: nothing is judged until a restrictive change was applied. Same verdicts.
SHORTCUTS = True


def standing(event: Event, state: Mapping[StateKey, bytes], source: EventSource,
             view: StateView | None = None) -> AuthReason | None:
    """None if `event`'s author still stands in `state` (module docstring), else why not."""
    view = view or StateView(state, source)
    sender = user_id(event.author)
    membership = view.membership(sender)
    if membership == Membership.BAN:
        return AuthReason.BANNED
    if event.kind == TYPE_MEMBER and event.state_key == sender:
        return None
    if membership != Membership.JOIN:
        return AuthReason.SENDER_NOT_JOINED
    if event.kind == KIND_DUMMY and event.state_key is None:
        return None
    power = view.power_levels()
    if power.send_level(event.kind, event.is_state) > power.user_level(sender):
        return AuthReason.INSUFFICIENT_POWER
    return None


class SoftFails:
    """This node's soft-fail verdicts for one topic, and their records."""

    def __init__(self, table: TopicTable, source: EventSource) -> None:
        self._table = table
        self._source = source
        self._verdicts: dict[tuple[int, bytes, str, bool], AuthReason | None] = {}
        self.stats: Counter[str] = Counter()
        self._load_guard()

    def _load_guard(self) -> None:
        self._tripped = self._table.get(_RESTRICTED) is not None
        self._watched = self._table.get(_WATCHED) is not None
        self._last_power_levels = self._table.get(_LAST_POWER_LEVELS)

    @property
    def restricted(self) -> bool:
        """False while no author can have lost its standing here (module docstring)."""
        return self._tripped or not self._watched or not SHORTCUTS

    @property
    def watching(self) -> bool:
        """True while applied state events should be noted (`note_applied`)."""
        return not self._tripped and SHORTCUTS

    def note_applied(self, event: Event, before: Mapping[StateKey, bytes]) -> None:
        """Note an applied, authorized state event (`before`: the state it was judged by)."""
        if self._tripped or event.state_key is None:
            return
        if event.is_create:  # the first event applied anywhere: the guard has seen all
            self._watched = True
            self._table.put(_WATCHED, b"")
            return
        if not self._watched:
            return
        trips = restricts(event, before, self._source)
        if event.kind == TYPE_POWER_LEVELS and event.state_key == POWER_LEVELS_KEY[1]:
            trips = trips or before.get(POWER_LEVELS_KEY) != self._last_power_levels
            self._last_power_levels = event.id
            self._table.put(_LAST_POWER_LEVELS, event.id)
        if trips:
            self._tripped = True
            self._table.put(_RESTRICTED, b"")
            self.stats["guard_tripped"] += 1

    def judge(self, events: Iterable[Event], group: int, state: Mapping[StateKey, bytes],
              position: Callable[[bytes], int | None]) -> list[tuple[bytes, AuthReason]]:
        """Judge `events` (applied, authorized) against the current state `state` (group
        `group`); record and return the soft-failed ones with their reasons.

        `position` gives an event's delivery position here (`Graph.position`).
        """
        failed: list[tuple[bytes, AuthReason]] = []
        view: StateView | None = None
        for event in events:
            cacheable = event.kind != TYPE_MEMBER
            key = (group, event.author, event.kind, event.state_key is not None)
            if cacheable and key in self._verdicts:
                reason = self._verdicts[key]
            else:
                view = view or StateView(state, self._source)
                reason = standing(event, state, self._source, view)
                if cacheable:
                    if len(self._verdicts) >= VERDICT_CACHE_SIZE:
                        self._verdicts.clear()
                    self._verdicts[key] = reason
            if reason is not None and not self._after_cause(event, reason, state, position):
                self.stats["stood_cause_later"] += 1
                reason = None
            if reason is not None:
                self._table.put(_SOFT_FAILED + event.id, str(reason).encode())
                failed.append((event.id, reason))
        return failed

    @staticmethod
    def _after_cause(event: Event, reason: AuthReason, state: Mapping[StateKey, bytes],
                     position: Callable[[bytes], int | None]) -> bool:
        """True if the state entry that makes `event` fail was applied here before it.

        Only such an entry can be concurrent with the event for certain (an
        ancestor is applied first, so an entry applied earlier is never a
        descendant). An entry applied later, or the event itself, may be the
        author's own later history (a demotion, a leave, the event's own
        effect) that arrived in the same batch: the event stands.
        """
        key = ((TYPE_POWER_LEVELS, "") if reason == AuthReason.INSUFFICIENT_POWER
               else (TYPE_MEMBER, user_id(event.author)))
        cause = state.get(key)
        if cause is None:
            return False
        at, mine = position(cause), position(event.id)
        return at is not None and mine is not None and at < mine

    def is_soft_failed(self, event_id: bytes) -> bool:
        return self._table.get(_SOFT_FAILED + event_id) is not None

    def reason(self, event_id: bytes) -> str | None:
        value = self._table.get(_SOFT_FAILED + event_id)
        return None if value is None else value.decode()

    def clear_caches(self) -> None:
        self._verdicts.clear()  # group ids are only meaningful with the writes that made them
        self._load_guard()  # discarded writes may have tripped it
