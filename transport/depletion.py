"""When a wide topic emits a dummy: coordinated depletion.

A dummy event exists only to merge forward extremities (node.core.parents).
If every replica that sees a wide graph writes one, n replicas write n
dummies for the same extremities, and each dummy is itself a new extremity
for the others: in the 1000-node simulation the old uncoordinated timers
(a random wait in [0, 5 s), SRM-style, doubling after each dummy) still
wrote 3.3 dummies per written event. Two rules make the replicas agree on
who writes them instead:

* **Who: the authors of the extremities, in an order all of them compute
  alike.** The candidates are the authors of the current extremities — they
  are known to every replica that holds those extremities, and they were
  alive recently (they just wrote). Each candidate's place is the rank of
  `H(its key || H(the extremity set))` among the candidates': replicas that
  hold the same extremities compute the same order, and a new extremity set
  draws a new order, so the duty rotates. One dummy merges up to
  `merge` = `DepletionPolicy.dummy_parents(d_max)` extremities, so a width
  w over the threshold t needs `wanted` = ceil((w − t) / (merge − 1))
  dummies at once (a join storm of 1000 members needs 16 dummies of 64
  parents; the common case needs one): the first `wanted` ranks write one
  each, all at the end of the quiet period (not spread over `SPREAD_MS`:
  the wave's first dummies would postpone the rest) — rank r merging run r
  of the sorted extremities, so the storm's dummies do not name the same
  ones (`node.core.parents.select_share`) — the next rank one
  `SLOT_MS` later — the fallback when a chosen replica is dead, partitioned
  away or its dummy was lost — and so on, up to `MAX_SLOTS`. A replica that
  authored none of the extremities writes one only as the last fallback,
  `FALLBACK_MS` plus a random share of `FALLBACK_SPREAD_MS` later.
* **When: only after the width stayed over the threshold for `QUIET_MS`
  with no dummy arriving.** A burst of concurrent writes widens the graph
  for a moment and the next writes (which name up to d_max parents) merge it
  again; a dummy is for a width that stays. A width that one dummy cannot
  bring back (`wanted` > 1: a join storm, a long partition healed) is no
  such burst, and waits only `STORM_QUIET_MS`. A dummy that arrives (someone
  else's, or our own going out) restarts the quiet period, so a wave of
  dummies in flight is waited for before the next one is decided on — on
  the extremity set it left behind. So that a stream of dummies (one that
  merges little, or a misbehaving peer's) cannot postpone ours forever,
  arrivals stop restarting the wait once the width has been over the
  threshold for `MAX_POSTPONE_MS`: whatever happens, a replica whose width
  stays over the threshold writes a dummy within
  `MAX_POSTPONE_MS + QUIET_MS + FALLBACK_MS + FALLBACK_SPREAD_MS`.

The engine's tick calls `DepletionTimer.due` per topic while the width is
over the threshold and, when it says so, has the replica make the dummy
(`Replica.maybe_deplete`, which keeps its own rate limit). Sans-IO and pure:
the time, the random stream and the facts about each extremity (its author,
whether it is a dummy) are passed in.

The old timers stay selectable (`DepletionMode.BACKOFF`,
`DepletionTimer.due_backoff`): every replica over the threshold waits a
random time in [0, backoff) and stands down if the width drops meanwhile,
the backoff doubling after each dummy up to `MAX_DEPLETION_BACKOFF_MS` and
resetting once the width is at most half the threshold. The simulator runs
both in one process for the before/after figures (`--depletion backoff`).
"""

from __future__ import annotations

import enum
import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

DEFAULT_DEPLETION_BACKOFF_MS: Final = 5_000  # BACKOFF: the first wait is drawn from [0, this)
MAX_DEPLETION_BACKOFF_MS: Final = 300_000  # BACKOFF: Synapse sends its dummies every 5 min at most
SPREAD_MS: Final = 200  # a random spread within one rank's slot (not a storm's wave: `_wait`)
QUIET_MS: Final = 1_000  # over the threshold this long with no dummy arriving before one is due
STORM_QUIET_MS: Final = 200  # ... when one dummy cannot merge the excess (no burst of writes)
SLOT_MS: Final = 1_000  # each rank past the wanted ones waits one slot more (a dummy's spread)
MAX_SLOTS: Final = 8  # ranks further down wait as non-candidates do
FALLBACK_MS: Final = 10_000  # a replica that authored no extremity waits this long at least
FALLBACK_SPREAD_MS: Final = 20_000  # ... plus a random share of this (many such replicas)
MAX_POSTPONE_MS: Final = 30_000  # over the threshold this long: arriving dummies no longer postpone
RANK_HASH_BYTES: Final = 8  # enough to order a few thousand candidates without ties


class DepletionMode(enum.Enum):
    """How the replicas of a wide topic decide who writes the dummy."""

    COORDINATED = "coordinated"  # the authors of the extremities, in hash order, after quiet
    BACKOFF = "backoff"  # everyone, after a random wait that doubles (the old timers)


def extremity_digest(extremities: Sequence[bytes]) -> bytes:
    """The hash every replica holding the same extremities computes alike (sorted ids)."""
    return hashlib.blake2b(b"".join(sorted(extremities)), digest_size=32).digest()


def rank_of(me: bytes, candidates: set[bytes] | frozenset[bytes], digest: bytes) -> int:
    """My place among `candidates` (keys) for the extremity set `digest`: 0 is first.

    By `H(key || digest)`: a uniform order that replicas agree on when they hold
    the same extremities, and that changes with them.
    """
    def key(author: bytes) -> bytes:
        return hashlib.blake2b(author + digest, digest_size=RANK_HASH_BYTES).digest()

    mine = key(me)
    return sum(1 for c in candidates if c != me and key(c) < mine)


def wanted_dummies(width: int, threshold: int, merge: int) -> int:
    """Dummies needed at once to bring `width` to the threshold, each merging `merge`."""
    if width <= threshold:
        return 0
    return -(-(width - threshold) // max(1, merge - 1))


@dataclass(slots=True)
class DepletionTimer:
    """One topic's dummy timer: when this replica's dummy is due, if the width stays wide."""

    deplete_at_ms: int | None = None  # armed: a dummy is due then, unless a dummy arrives first
    backoff_ms: int = 0  # BACKOFF only: the current backoff; 0 = the configured base
    over_since_ms: int | None = None  # when the width went over the threshold (None: it is not)
    quiet_from_ms: int = 0  # the last dummy seen (ours or another's), or the episode's start
    rank: int | None = None  # our place when armed (None: not a candidate); for logs and tests
    # This quiet period's random share, drawn once: a wait ranked again on every
    # change of the set must not be drawn again (many draws, an earlier first one).
    draw: float = 0.0
    # What we know of each current extremity: (author, is a dummy). Only new
    # extremities are looked up, once; the rest is pruned to the current set.
    facts: dict[bytes, tuple[bytes, bool]] = field(default_factory=dict)

    def due(self, *, ready: bool, extremities: Sequence[bytes], threshold: int, merge: int,
            me: bytes, now_ms: int, rng: random.Random,
            describe: Callable[[bytes], tuple[bytes, bool] | None],
            spread_ms: int = SPREAD_MS) -> bool:
        """True when this replica should write a dummy now (the timer then waits for it).

        `extremities`: the topic's forward extremities; `describe(id)`: that
        extremity's (author key, is a dummy), None if unknown; `me`: our key;
        `merge`: extremities one dummy names at most.
        """
        width = len(extremities)
        if not ready or width <= threshold:
            self.deplete_at_ms = self.over_since_ms = self.rank = None
            self.facts.clear()
            return False
        if self.over_since_ms is None:
            self.over_since_ms = self.quiet_from_ms = now_ms
            self.draw = rng.random()
        changed, arrived = self._learn(extremities, me, describe)
        if arrived and now_ms - self.over_since_ms < MAX_POSTPONE_MS:
            self.quiet_from_ms = now_ms  # a dummy is in flight: wait for its wave, then re-decide
            self.draw = rng.random()
            self.deplete_at_ms = None
        if self.deplete_at_ms is None or changed:
            # Ranked again whenever the set changes (a view still filling in agrees with
            # the others only once complete), always from the same quiet period's start:
            # ordinary events re-order the turns but never postpone them.
            quiet = QUIET_MS if wanted_dummies(width, threshold, merge) <= 1 else STORM_QUIET_MS
            self.deplete_at_ms = self.quiet_from_ms + quiet + self._wait(
                extremities, threshold, merge, me, spread_ms)
        if now_ms < self.deplete_at_ms:
            return False
        # Ours goes out now: it restarts the quiet period like anyone's.
        self.deplete_at_ms = None
        self.quiet_from_ms = now_ms
        self.draw = rng.random()
        return True

    def share(self, width: int, threshold: int, merge: int) -> int | None:
        """Which run of the extremities our dummy merges, when several go out at once.

        Rank r of the `wanted` writers takes run r (a fallback rank the run of
        the rank it stands in for), so the storm's dummies merge different
        extremities (`node.core.parents.select_share`); None when one dummy
        suffices or we are no candidate: the parent policy's pick.
        """
        wanted = wanted_dummies(width, threshold, merge)
        if self.rank is None or wanted <= 1:
            return None
        return self.rank % wanted

    def _learn(self, extremities: Sequence[bytes], me: bytes,
               describe: Callable[[bytes], tuple[bytes, bool] | None]) -> tuple[bool, bool]:
        """Note the extremities: (the set changed, one of the new is someone else's dummy)."""
        arrived = False
        current = set(extremities)
        gone = [i for i in self.facts if i not in current]
        for event_id in gone:
            del self.facts[event_id]
        changed = bool(gone)
        for event_id in extremities:
            if event_id in self.facts:
                continue
            fact = describe(event_id)
            if fact is None:
                continue
            self.facts[event_id] = fact
            changed = True
            if fact[1] and fact[0] != me:
                arrived = True
        return changed, arrived

    def _wait(self, extremities: Sequence[bytes], threshold: int, merge: int, me: bytes,
              spread_ms: int) -> int:
        """How long after the quiet period our dummy is due: by our rank among the authors."""
        candidates = {author for author, _ in self.facts.values()}
        if me not in candidates:
            self.rank = None
            return FALLBACK_MS + int(self.draw * FALLBACK_SPREAD_MS)
        self.rank = rank_of(me, candidates, extremity_digest(extremities))
        wanted = wanted_dummies(len(extremities), threshold, merge)
        late = self.rank - wanted + 1
        if late > MAX_SLOTS:
            return FALLBACK_MS + int(self.draw * FALLBACK_SPREAD_MS)
        if wanted > 1 and late <= 0:
            # A storm's wave goes out at once (each at its next tick): spread over
            # SPREAD_MS, the first of the wave arrived at the others before most had
            # written, restarted their quiet period and re-ranked them (600 nodes, 32
            # wanted: 5 dummies by 500 ms and the width 395 at 750 ms; at once, 35
            # and 104).
            return 0
        return max(0, late) * SLOT_MS + int(self.draw * spread_ms)

    def due_backoff(self, ready: bool, width: int, threshold: int, now_ms: int,
                    rng: random.Random, base_backoff_ms: int) -> bool:
        """BACKOFF mode (the old timers): True when this replica should emit a dummy now."""
        if not ready or width <= threshold:
            self.deplete_at_ms = None  # someone's dummy (or ours) did the job
            if width <= threshold // 2:
                self.backoff_ms = 0
            return False
        if self.deplete_at_ms is None:
            backoff = self.backoff_ms or base_backoff_ms
            self.deplete_at_ms = now_ms + rng.randrange(backoff)
            self.backoff_ms = min(2 * backoff, MAX_DEPLETION_BACKOFF_MS)
            return False
        if now_ms < self.deplete_at_ms:
            return False
        self.deplete_at_ms = None
        return True
