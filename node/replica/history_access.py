"""What history a reader may read: the `history` setting of a private topic (issue 15).

`node.replica.read_access` says *who* reads a private topic (its joined
members). This says *which payloads* each of them may read, by the topic's
history setting (Matrix's `m.room.history_visibility`, state key ""):

- `shared` (the default, also when no history event exists): a reader reads
  every event, from before its join too.
- `joined`: a reader reads the payload of a non-state event only if it was
  joined in the state *before* that event (the state resolved at the event's
  parents, which every node computes alike). So a late member reads from its
  join on; a member who left and came back reads its membership periods.

A reader still needs every vertex of the graph to validate and order what it
may read, so an event it may not read is sent in its *withheld form*
(`Event.withheld_form`): every field but the payload, which is replaced by its
digest. The id and the signature still verify (`node.core.event`), so a member
cannot forge or alter the history it cannot read; it learns that events
exist, their authors, times, kinds and parents, never their content. State
events are never withheld: they are the topic state every reader resolves.
The history setting itself is read in the state before each event, so a change
of setting applies from the change on, the same on every node.

A node that holds an event only in its withheld form never serves it as if it
were full: to a peer that may read it, it omits the event (the peer gets it
from a node that holds it; anti-entropy asks every peer), and to a peer that
may not, it sends the withheld form it has.

An open topic has no history setting in effect: anyone may join and read it,
so `joined` there would promise what it cannot keep (`Node.create_topic`
refuses it).

Cost: nothing for a topic that never had a history event (one cached check per
access epoch); for a `joined` topic, one group lookup per event sent and a
cached set of readers per state group (`HISTORY_READERS_CACHE_SIZE`).
`Replica` mixes this in.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from node.core.event import Event, EventFormatError, decode_event, event_id_of
from node.state.types import HISTORY_JOINED, HISTORY_KEY
from node.state.view import StateView

if TYPE_CHECKING:
    from node.core.graph import Graph
    from node.core.identity import Identity
    from node.state.tracker import StateTracker

HISTORY_READERS_CACHE_SIZE = 256  # state groups whose `joined` readers are kept

_EVERYONE = None  # a group whose history is shared: every reader reads its events


class HistoryAccess:
    """The history half of `Replica`'s read access (see the module docstring)."""

    if TYPE_CHECKING:
        graph: Graph
        identity: Identity
        _access_epochs: tuple[int, int]
        _history_epoch: tuple[int, bool] | None
        _history_readers_cache: OrderedDict[int, frozenset[bytes] | None]

        @property
        def authorizing(self) -> bool: ...
        @property
        def tracker(self) -> StateTracker: ...
        def readers(self) -> frozenset[bytes] | None: ...
        def group_before(self, event: Event) -> int | None: ...

    def limits_history(self) -> bool:
        """True if some payload of this topic may be withheld from one of its readers.

        A private topic whose state has a history event: state keys are never
        removed, so a topic that never had one reads as `shared` throughout.
        """
        if self.readers() is None:  # open, not ready, or no topic state
            return False
        epoch = self._access_epochs[0]
        cached = self._history_epoch
        if cached is not None and cached[0] == epoch:
            return cached[1]
        tracker = self.tracker
        limited = HISTORY_KEY in tracker.state(tracker.current_group())
        self._history_epoch = (epoch, limited)
        return limited

    def may_read_payload(self, key: bytes | None, event: Event) -> bool:
        """May the reader with author key `key` read `event`'s payload? (module docstring)"""
        if event.is_state or not self.limits_history():
            return True
        if key is None:
            return False
        readers = self._history_readers(event)
        return readers is _EVERYONE or key in readers

    def takes_withheld(self, event: Event) -> bool:
        """Do we keep the withheld form `event` from a peer? Only if this topic limits
        history and we may not read the payload ourselves, so that no peer can hold back
        content we may read (in an open topic, say) by sending its withheld form first.
        With part of its past missing we cannot judge yet: it is kept (and buffered)."""
        if not self.limits_history():
            return False
        if not all(map(self.graph.has, event.parents)):
            return True
        return not self.may_read_payload(self.identity.public_key, event)

    def served_to(self, key: bytes | None,
                  raws: Sequence[bytes]) -> tuple[bytes, ...] | None:
        """`raws` as the reader `key` may receive them, or None if that is all of them as
        they are: payloads it may not read withheld, withheld events it may read left out."""
        if not self.limits_history():
            return None
        graph = self.graph
        out: list[bytes] = []
        changed = False
        for raw in raws:
            event = graph.get(event_id_of(raw))
            if event is None:
                # Buffered (its past is not all here): no state to judge it by yet. Left
                # out; the peer gets it by anti-entropy once a node that holds its past
                # can judge it.
                if _is_state(raw):
                    out.append(raw)
                else:
                    changed = True
            elif event.is_state:
                out.append(raw)
            elif self.may_read_payload(key, event):
                if event.withheld:
                    changed = True  # never pass a withheld copy off to someone who may read it
                else:
                    # Our full copy, whatever bytes the caller holds (a forward passes on
                    # the bytes it received, which may be a withheld form).
                    changed = changed or event.raw != raw
                    out.append(event.raw)
            else:
                withheld = event.withheld_form()
                changed = changed or withheld != raw
                out.append(withheld)
        return tuple(out) if changed else None

    def _history_readers(self, event: Event) -> frozenset[bytes] | None:
        """Keys joined in the state before `event` if its history is `joined`, else _EVERYONE."""
        group = self.group_before(event)
        if group is None:
            return frozenset()  # no node can say who reads it: nobody does
        tracker = self.tracker
        cache = self._history_readers_cache
        if group in cache:
            cache.move_to_end(group)
            return cache[group]
        view = StateView(tracker.state(group), self.graph)
        readers = view.joined_keys() if view.history() == HISTORY_JOINED else _EVERYONE
        cache[group] = readers
        if len(cache) > HISTORY_READERS_CACHE_SIZE:
            cache.popitem(last=False)
        return readers


def _is_state(raw: bytes) -> bool:
    """Is `raw` a state event (never withheld)? Bytes that decode to none count as not."""
    try:
        return decode_event(raw).is_state
    except EventFormatError:
        return False
