"""Who may read a topic, from the replica's current resolved state (issue 15).

The read rule of this round ("shared" history): for an authorizing topic
whose join rule is not public, a key may read the topic iff it is *joined*
in the state resolved at this replica's forward extremities. Everyone may
read an open topic (public join rule), a pure MEG (no topic state) and a
replica that is not ready yet (no create event: an invitee waiting for its
topic holds nothing to leak, and only ever asks).

The dissemination engine asks this before every message it sends about a
topic and of every message it receives about one, so the answer is cheap:
`readers()` is computed once per current state group (the tracker caches
the group per set of extremities) and is then a frozenset lookup; message
events do not change the group, only state events and merges of heads do.
Resolving the current group costs a resolution whenever the heads changed,
so the answer is also kept per *access epoch* (`Replica._access_epochs`: how
many join-rules or power-levels events, and how many member events, were
applied): an event of another kind adds no state event that could change
who is joined, so the answer stays; an open topic stays open until a
join-rules or power-levels event arrives, so a node of an open topic never
resolves anything for this, however many members join.

`Replica` (node.replica.replica) mixes this in; it owns the cache slot
`_readers_cache` and clears it with its other state caches when pending
writes are discarded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from node.state.types import (
    RULE_PUBLIC,
    TYPE_MEMBER,
    Membership,
    content_of,
    user_id,
)
from node.state.tracker import StateResolutionError
from node.state.view import StateView

if TYPE_CHECKING:
    from collections.abc import Mapping

    from node.core.event import Event
    from node.core.graph import Graph
    from node.state.tracker import StateTracker
    from node.state.types import StateKey

_MEMBERSHIPS = {m.value: m for m in Membership}


class ReadAccess:
    """The read-access half of `Replica` (see the module docstring)."""

    if TYPE_CHECKING:
        graph: Graph
        _readers_cache: tuple[int, int, int, frozenset[bytes] | None] | None
        _access_epochs: tuple[int, int]

        @property
        def ready(self) -> bool: ...
        @property
        def authorizing(self) -> bool: ...
        @property
        def tracker(self) -> StateTracker: ...

    def readers(self) -> frozenset[bytes] | None:
        """Keys that may read this topic now; None: anyone may (module docstring)."""
        if not self.authorizing:  # not ready, or no topic state: nothing to restrict
            return None
        rules, members = self._access_epochs
        cached = self._readers_cache
        if cached is not None and cached[0] == rules and (cached[3] is None
                                                          or cached[1] == members):
            return cached[3]  # an open topic stays open until its join rule may have changed
        tracker = self.tracker
        group = tracker.current_group()
        if cached is not None and cached[2] == group:
            readers = cached[3]
        else:
            readers = _readers_of(tracker.state(group), self.graph)
        self._readers_cache = (rules, members, group, readers)
        return readers

    def may_read(self, key: bytes) -> bool:
        """True if the peer with author key `key` may be sent this topic's events and ids."""
        readers = self.readers()
        return readers is None or key in readers

    def is_private(self) -> bool:
        """True if reading is restricted to joined members (an authorizing, non-public topic)."""
        return self.readers() is not None

    def membership_of(self, key: bytes) -> Membership | None:
        """`key`'s membership in the current state; None without a member event or topic state."""
        event = self.membership_event(key)
        if event is None:
            return None
        return _MEMBERSHIPS.get(content_of(event).get("membership"))  # type: ignore[arg-type]

    def joined_before(self, key: bytes, event: Event) -> bool:
        """Was `key` joined in the state before `event` (an event applied here)? What a
        removed member's claim to read its removal's past rests on."""
        if not self.authorizing:
            return False
        group = self.group_before(event)
        if group is None:
            return False  # no node can say: nothing is served on it
        view = StateView(self.tracker.state(group), self.graph)
        member = view.event((TYPE_MEMBER, user_id(key)))
        return member is not None and _MEMBERSHIPS.get(
            content_of(member).get("membership")) is Membership.JOIN  # type: ignore[arg-type]

    def group_before(self, event: Event) -> int | None:
        """The state group before `event` (applied here, or its parents' merge); None if
        its parents' states cannot be resolved. What each read rule that looks at an
        event's own time asks (`joined_before`, `HistoryAccess._history_readers`)."""
        tracker = self.tracker
        record = tracker.event_state(event.id)
        try:
            return record.before if record is not None else tracker.group_before(event.parents)
        except StateResolutionError:
            return None

    def membership_event(self, key: bytes) -> Event | None:
        """`key`'s member event in the current state (its join, invite, ban, ...); None
        without one or without topic state. What a member resubmits of its own join."""
        if not self.authorizing:
            return None
        tracker = self.tracker
        view = StateView(tracker.state(tracker.current_group()), self.graph)
        return view.event((TYPE_MEMBER, user_id(key)))


def _readers_of(state: Mapping[StateKey, bytes], graph: Graph) -> frozenset[bytes] | None:
    """The joined keys of a state map, or None if its join rule is public."""
    view = StateView(state, graph)
    return None if view.join_rule() == RULE_PUBLIC else view.joined_keys()
