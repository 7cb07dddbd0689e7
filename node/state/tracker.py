"""The per-topic state machine: the state before and after every applied event.

Theory of operation
-------------------
The graph applies events parents first (`Graph.add` returns them in
application order); `StateTracker.apply` follows it, event by event:

1. **State before.** The create event starts from the empty state. Any other
   event takes the *state after* of its parents: if they all point at one
   state group, that group is reused as is (a chain of messages costs a dict
   lookup); otherwise the parents' states are resolved with state resolution
   v2 (`node.state.resolve`), memoised per set of input groups (in memory and
   on disk), so a merge of the same forks is resolved once, ever; and by the
   exact input maps across the trackers of one process
   (`node.state.resolution_memo`), so replicas meeting one merge resolve it once.
2. **Authorization.** Matrix checks a received event three times: against its
   auth events (spec step 4: reject), against the state before it (step 5:
   reject) and against the server's current state (step 6: "soft fail").
   Here the auth refs must be *exactly* `select_auth_refs(event, state
   before)`: every replica computes the same state before an event from its
   parents alone, so the author can always name those refs, and then the
   auth-event state is the state before restricted to the keys the rules
   read - steps 4 and 5 become one `check_auth` against the state before.
   (A mismatch is rejected: `auth_refs_not_selected`, or the more precise
   `check_auth_refs` reason.) This also keeps the verdict a function of the
   event's ancestry, never of arrival order: an auth ref that is not in the
   state before - a concurrent or later event - could be present on one
   replica and absent on another. Step 6 is left out on purpose: it depends
   on what each replica happens to hold, so replicas would deliver different
   events; state resolution already gives every replica the same answer.
   For events whose verdict does not depend on their content (non-state
   events other than create / member / power levels / join rules kinds),
   the verdict is cached per (state group, author, kind, auth refs).
3. **State after.** A state event that passed becomes the value of its key
   in a new group derived from the state before; a non-state event has state
   after = state before. A rejected event never enters state. The replica
   judges each event *before* it becomes a vertex (`admit`, the graph's
   gate): a rejected one is then not recorded here at all and never enters
   the graph (remembered by the graph as a rejection, `node.core.rejections`).
   Events applied without the gate (a store from before it, or a replica that
   ran without authorization) are judged after the fact by `apply`, and a
   rejected one stays a vertex with a record saying why, as it always did.

The records (`StateGroups`) are written through the graph's write-set and
commit with the events; after a restart nothing is recomputed. If an applied
event has no record (the replica ran with authorization off, or an older
store), its missing ancestry is processed first, parents first, by depth.

The current state - the state at the forward extremities - is the state
before a hypothetical event whose parents are all extremities; it is cached
per extremity set. Resolution can refuse a pathological graph
(`AuthChainTooLarge`): the event that needed it is then rejected as
`state_unresolvable` and takes the state after its greatest parent id, a
choice every replica makes alike. Reads of the current state make the same
choice (the state after the greatest extremity id) rather than raise, and a
refusal is remembered per set of input groups (in memory, bounded), so a
read is not a fresh million-event walk each time; `group_before` itself
still raises `StateResolutionError`, for callers that must not guess
(checking a local event before signing it).

Sans-IO: no clock, no randomness; the graph and the store come in.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from typing import Protocol

from node.core.event import Event
from node.core.store import DamagedTopicError
from node.state.auth_chain import AuthChainTooLarge
from node.state.auth_rules import EventFields, check_auth, check_auth_refs, select_auth_refs
from node.state import resolution_memo
from node.state.resolution import resolve
from node.state.resolution_memo import ResolutionMemo
from node.state.store import EMPTY_GROUP, EventState, StateGroups
from node.state.types import (
    TYPE_CREATE,
    TYPE_JOIN_RULES,
    TYPE_MEMBER,
    TYPE_POWER_LEVELS,
    AuthReason,
    StateKey,
    state_key_of,
)

VERDICT_CACHE_SIZE = 4_096
# Sets of input groups whose resolution was refused, remembered so that a
# retry fails at once. Each entry is a few gids and a message.
UNRESOLVABLE_CACHE_SIZE = 1_024

# Kinds whose auth verdict reads the event's content, so it cannot be shared
# between two events with the same (state, author, kind).
_CONTENT_RULED = frozenset({TYPE_CREATE, TYPE_MEMBER, TYPE_POWER_LEVELS, TYPE_JOIN_RULES})


class StateResolutionError(Exception):
    """The state at a set of events cannot be computed (resolution refused the graph)."""


class GraphView(Protocol):
    """What the tracker reads from the graph (`node.core.graph.Graph`)."""

    def get(self, event_id: bytes, /) -> Event | None: ...
    def parents_of(self, event_id: bytes) -> tuple[bytes, ...] | None: ...
    def depth(self, event_id: bytes) -> int | None: ...
    def extremities(self) -> list[bytes]: ...


class StateTracker:
    """State before/after every applied event of one topic, and the current state."""

    def __init__(self, graph: GraphView, groups: StateGroups,
                 memo: ResolutionMemo | None = None) -> None:
        self.graph = graph
        self.groups = groups
        # Resolutions by their exact inputs, shared by every tracker of the process
        # unless one is given (node.state.resolution_memo): replicas that meet the
        # same merge resolve it once between them.
        self._memo = resolution_memo.SHARED if memo is None else memo
        self.stats: Counter[str] = Counter()
        self._verdicts: OrderedDict[tuple, AuthReason | None] = OrderedDict()
        self._verdict_cache_size = VERDICT_CACHE_SIZE  # a node's cache budget may shrink it
        self._current: tuple[tuple[bytes, ...], int] | None = None
        self._caught_up: set[bytes] = set()
        # Input gids -> why resolution refused them. Gids are only meaningful
        # with the writes that made them, so this goes with the other caches.
        self._unresolvable: OrderedDict[tuple[int, ...], str] = OrderedDict()

    def resize_caches(self, verdicts: int) -> None:
        """Hold at most `verdicts` auth verdicts (the oldest dropped)."""
        self._verdict_cache_size = verdicts
        while len(self._verdicts) > verdicts:
            self._verdicts.popitem(last=False)

    def clear_caches(self) -> None:
        self.groups.clear_caches()
        self._verdicts.clear()
        self._current = None
        self._unresolvable.clear()

    # ---------------------------------------------------------------- queries

    def event_state(self, event_id: bytes) -> EventState | None:
        """The recorded groups of an applied event (None: not applied, or not processed)."""
        return self.groups.event_state(event_id)

    def is_rejected(self, event_id: bytes) -> bool:
        record = self.groups.event_state(event_id)
        return record is not None and record.reason is not None

    def state(self, gid: int) -> Mapping[StateKey, bytes]:
        return self.groups.load(gid)

    def current_group(self) -> int:
        """The group of the state at the forward extremities.

        Never raises StateResolutionError: if the extremities' states cannot
        be resolved, this is the state after the greatest extremity id - what
        an event merging them would get (`_process`), on every replica.
        """
        extremities = tuple(self.graph.extremities())
        if self._current is not None and self._current[0] == extremities:
            return self._current[1]
        try:
            gid = self.group_before(extremities)
        except StateResolutionError:
            self.stats["unresolvable_reads"] += 1
            gid = self._after(max(extremities))
        self._current = (extremities, gid)
        return gid

    def group_before(self, parents: Sequence[bytes]) -> int:
        """The group of the state before an event with these parents."""
        if len(parents) == 1:  # the common case: a chain reuses its parent's group
            return self._after(parents[0])
        gids = sorted({self._after(p) for p in parents})
        if not gids:
            return EMPTY_GROUP
        if len(gids) == 1:
            return gids[0]
        known = self.groups.memo(gids)
        if known is not None:
            self.stats["resolution_memo_hits"] += 1
            return known
        key = tuple(gids)
        refused = self._unresolvable.get(key)
        if refused is not None:
            self.stats["unresolvable_memo_hits"] += 1
            raise StateResolutionError(refused)
        self.stats["resolutions"] += 1
        try:
            resolved = self._memo.resolve([self.groups.load(g) for g in gids], self.graph, resolve)
        except AuthChainTooLarge as error:
            self._unresolvable[key] = str(error)
            if len(self._unresolvable) > UNRESOLVABLE_CACHE_SIZE:
                self._unresolvable.popitem(last=False)
            raise StateResolutionError(str(error)) from error
        gid = self.groups.store_state(resolved, gids)
        self.groups.remember(gids, gid)
        return gid

    def check(self, event: Event, before: int) -> AuthReason | None:
        """None if `event` is authorised in the state of group `before`, else the reason."""
        cacheable = not event.is_state and event.kind not in _CONTENT_RULED
        if cacheable:
            key = (before, event.author, event.kind, event.auth)
            if key in self._verdicts:
                self.stats["verdict_cache_hits"] += 1
                return self._verdicts[key]
        state = self.groups.load(before)
        if event.kind == TYPE_MEMBER:
            fields = EventFields.of(event)  # the membership decides whether join rules count
        else:
            fields = EventFields(event.kind, event.author, event.state_key)
        if list(event.auth) != select_auth_refs(fields, state):
            reason = check_auth_refs(event, self.graph) or AuthReason.AUTH_REFS_NOT_SELECTED
        else:
            reason = check_auth(event, state, self.graph)
        if cacheable:
            self._verdicts[key] = reason
            if len(self._verdicts) > self._verdict_cache_size:
                self._verdicts.popitem(last=False)
        return reason

    # ---------------------------------------------------------------- updates

    def admit(self, event: Event) -> AuthReason | None:
        """Judge an event about to become a vertex (the graph's gate): record its state
        groups if it passes; if not, record nothing (it never enters the graph)."""
        self._caught_up.clear()
        if self.groups.event_state(event.id) is not None:
            return self.groups.event_state(event.id).reason  # type: ignore[union-attr]
        return self._process(event, keep_rejected=False)

    def apply(self, events: Sequence[Event]) -> list[tuple[bytes, str]]:
        """Process newly applied events (in application order); returns the rejected ones.

        Events the gate admitted (`admit`) have their records already and are skipped.
        """
        rejected: list[tuple[bytes, str]] = []
        self._caught_up.clear()
        for event in events:
            if event.id in self._caught_up:
                continue  # processed already, as the ancestor of an event without a record
            if self.groups.event_state(event.id) is not None:
                continue  # admitted by the gate
            reason = self._process(event)
            if reason is not None:
                rejected.append((event.id, reason))
        return rejected

    def _process(self, event: Event, keep_rejected: bool = True) -> AuthReason | None:
        key = state_key_of(event)
        if event.is_create:
            before = EMPTY_GROUP
            reason = check_auth(event, {}, self.graph)
        else:
            try:
                before = self.group_before(event.parents)
                reason = self.check(event, before)
            except StateResolutionError:
                before = self._after(max(event.parents))
                reason = AuthReason.STATE_UNRESOLVABLE
        if reason is not None and not keep_rejected:
            self.stats["refused"] += 1
            return reason
        after = before
        if reason is None and key is not None:
            after = self.groups.derive(before, {key: event.id})
        self.groups.record_event(event.id, EventState(before, after, reason))
        self.stats["processed"] += 1
        return reason

    def _after(self, event_id: bytes) -> int:
        record = self.groups.event_state(event_id)
        if record is None:
            self._catch_up(event_id)
            record = self.groups.event_state(event_id)
            assert record is not None
        return record.after

    def _catch_up(self, event_id: bytes) -> None:
        """Process `event_id` and every ancestor of it that has no record, parents first."""
        missing: list[bytes] = []
        stack, seen = [event_id], set()
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            if self.groups.event_state(current) is not None:
                continue
            parents = self.graph.parents_of(current)
            if parents is None:  # an applied event names a parent the store lacks
                raise DamagedTopicError(f"event {current.hex()[:16]} is not in the graph",
                                        getattr(self.graph, "topic_id", None))
            missing.append(current)
            stack.extend(parents)
        missing.sort(key=lambda i: (self.graph.depth(i) or 0, i))  # parents are shallower
        self.stats["caught_up"] += len(missing)
        for current in missing:
            event = self.graph.get(current)
            assert event is not None
            self._process(event)
            self._caught_up.add(current)
