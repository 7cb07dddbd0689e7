"""State resolutions remembered by their exact inputs, across replicas and topics.

Why. The state tracker already remembers a resolution per set of its own
state groups (`StateGroups.memo`), but group ids are local to one store: two
replicas (or the thousand replicas of a simulated world, which run in one
process) that meet the same merge resolve it once each. A resolution is not
cheap - the auth chain of the unconflicted state is walked and every
conflicted state event is checked - and at a thousand members each replica
resolved the same merges of the join storm again: 41 % of the CPU of the
1000-node simulated world (docs/architecture.md, limits).

Why it is safe. `resolve` is a pure function of the *set* of input state
maps and of the events they reach (its docstring: never of the order of the
inputs, of set iteration order, or of anything but the events). Event ids
are digests of the events, so an id names the same event in every graph
that holds it. The key here is the inputs themselves, compared exactly: the
set of the state maps, each as a frozenset of its (key, event id) items - no
digest that could collide. Two equal maps among the inputs count once: `resolve`
gives the same answer with repeats (each key is unconflicted when it is in every
input with one value, and the auth difference is a union minus an intersection,
both blind to a repeat; `tests/state/test_resolution_properties.py` pins it),
and distinct groups often hold equal maps. A refused resolution
(`AuthChainTooLarge`) is not memoised here either (the tracker remembers
refusals itself). The result is copied out, so no caller can change what
another one gets.

Bound. Entries hold whole maps (a thousand-member topic has thousands of
keys), so the bound is on the number of items held - the key's items plus
the result's - not on the entry count: `RESOLUTION_MEMO_ITEMS`, the oldest
entries dropped first. One process-wide memo (`SHARED`) is what the tracker
uses unless it is given another one; it holds no clock, randomness or I/O,
only pure results, so the core stays sans-IO and replay stays bit for bit.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from node.state.resolution import resolve
from node.state.types import EventSource, StateKey, StateMap

# Items (state keys of the input maps plus those of the result) held by one
# memo: about 100 bytes each, so some 5 MB at most in a node. A thousand-member
# merge of two forks is about 3,000 items; the oldest entries go first. A node
# holds one replica per topic, and its tracker remembers its own merges
# (`StateGroups.memo`), so a node gains little from more; the simulator, whose
# thousand replicas meet the same merges, raises the bound for its process
# (`transport.sim.world.SIM_RESOLUTION_MEMO_ITEMS`).
RESOLUTION_MEMO_ITEMS = 50_000

Key = frozenset[frozenset[tuple[StateKey, bytes]]]
Resolver = Callable[[Sequence[StateMap], EventSource], dict[StateKey, bytes]]


class ResolutionMemo:
    """A bounded memo of `resolve` keyed by its exact inputs (see the module docstring)."""

    def __init__(self, max_items: int = RESOLUTION_MEMO_ITEMS) -> None:
        self.max_items = max_items
        self._entries: OrderedDict[Key, tuple[dict[StateKey, bytes], int]] = OrderedDict()
        self._items = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def items(self) -> int:
        """Items held now (at most `max_items`)."""
        return self._items

    def clear(self) -> None:
        self._entries.clear()
        self._items = 0

    def resolve(self, state_sets: Sequence[StateMap], source: EventSource,
                resolver: Resolver = resolve) -> dict[StateKey, bytes]:
        """`resolver(state_sets, source)`, from the memo when these exact inputs were seen.

        `resolver` is `node.state.resolve` (another one only in tests); it must be
        the same function for every call on one memo.
        """
        key: Key = frozenset(frozenset(state.items()) for state in state_sets)
        found = self._entries.get(key)
        if found is not None:
            self.hits += 1
            self._entries.move_to_end(key)
            return dict(found[0])
        self.misses += 1
        resolved = resolver(state_sets, source)
        size = sum(map(len, key)) + len(resolved)
        if size <= self.max_items:
            self._entries[key] = (dict(resolved), size)
            self._items += size
            while self._items > self.max_items:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._items -= dropped
        return resolved


# The memo every tracker shares unless given its own: one per process.
SHARED = ResolutionMemo()
