"""Parent selection and extremity depletion: how a new event joins the graph.

A new event names the forward extremities its author knows. With at most
`d_max` of them it names all; beyond that a policy picks `d_max`:

* RANDOM — a uniform sample without replacement, the model of the MEG
  paper's section VIII (the urn with k drawers of d balls);
* NEWEST — the deepest extremities first (ties by id), as Synapse picks
  its prev_events;
* MIXED — half newest, half random among the rest, Synapse's choice for
  its dummy events.

When the width (number of extremities) exceeds a threshold a replica emits
`dummy` events, which exist only to merge extremities (Synapse's dummy
events); `DepletionPolicy` rate-limits them so a replica that keeps seeing
a wide graph does not flood it. Randomness comes in as a `random.Random`
the caller seeds: the core has no global random.

Why a dummy may name more parents than `d_max`
----------------------------------------------
`d_max` bounds what an ordinary event carries: it is the paper's d, the
knob of the width model, and keeps messages and antichain checks small on
the hot path. A dummy has no payload and no other purpose than merging: one
with d parents removes d - 1 extremities. Held to `d_max` a replica needs
(width - threshold) / (d_max - 1) dummies in a row — and every replica over
the threshold is emitting its own at the same time, each dummy itself a new
extremity for the others: the dummy storm. So a dummy takes up to
`DepletionPolicy.max_parents` (default MAX_DUMMY_PARENTS, the event format's
limit for dummies: 64, where other events may name 20) and one usually
suffices. `max_parents=None` restores the old rule (dummies held to `d_max`).

What the dissemination engine needs to schedule dummies (it adds the
randomized backoff that keeps n replicas from answering one wide graph with
n dummies) is on the policy: `over(width)` (a dummy is wanted),
`settled(width)` (the width is back to at most half the threshold: reset the
backoff), `dummy_parents(d_max)` and `width_after_dummy(width, d_max)`.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from node.core.event import MAX_DUMMY_PARENTS, MAX_PARENTS

DEFAULT_D_MAX = 10
MIN_D_MAX = 1
MAX_D_MAX = MAX_PARENTS  # an ordinary event names at most what the format allows

DEFAULT_DEPLETION_THRESHOLD = 10
DEFAULT_DEPLETION_INTERVAL_MS = 1_000


class ParentPolicy(enum.Enum):
    RANDOM = "random"
    NEWEST = "newest"
    MIXED = "mixed"


def _check_pick(d_max: int) -> None:
    """A pick names 1 to MAX_DUMMY_PARENTS parents (a topic's d_max for ordinary events,
    at most MAX_D_MAX; a dummy's up to MAX_DUMMY_PARENTS)."""
    if not MIN_D_MAX <= d_max <= MAX_DUMMY_PARENTS:
        raise ValueError(f"d_max must be in [{MIN_D_MAX}, {MAX_DUMMY_PARENTS}], got {d_max}")


def select_parents(
    extremities: Sequence[bytes],
    d_max: int,
    policy: ParentPolicy,
    rng: random.Random,
    depth_of: Callable[[bytes], int],
) -> list[bytes]:
    """Pick at most `d_max` of `extremities` by `policy`; the result is sorted."""
    _check_pick(d_max)
    pool = sorted(extremities)  # sorted first: the same rng gives the same pick everywhere
    if len(pool) <= d_max:
        return pool
    if policy is ParentPolicy.RANDOM:
        return sorted(rng.sample(pool, d_max))
    by_newest = sorted(pool, key=lambda i: (-depth_of(i), i))
    if policy is ParentPolicy.NEWEST:
        return sorted(by_newest[:d_max])
    newest = by_newest[: d_max // 2]
    rest = [i for i in pool if i not in set(newest)]
    return sorted(newest + rng.sample(rest, d_max - len(newest)))


def select_share(extremities: Sequence[bytes], d_max: int, share: int) -> list[bytes]:
    """Share `share` of `extremities` for one of several dummies written at once: sorted.

    When a width needs k dummies at once (a join storm), k replicas each
    write one (transport.depletion), and a random pick each would overlap: k
    dummies drawing 20 of 1000 extremities name some twice and leave others
    unmerged. Instead the extremities, sorted by id, are cut into runs of
    `d_max` and dummy `share` takes run `share` (wrapping round when the
    runs are spent): replicas that hold the same extremities cut them alike,
    so k such dummies merge k * d_max different extremities. No randomness.
    """
    _check_pick(d_max)
    if share < 0:
        raise ValueError(f"share must be >= 0, got {share}")
    pool = sorted(extremities)
    if len(pool) <= d_max:
        return pool
    start = share * d_max
    return sorted(pool[(start + offset) % len(pool)] for offset in range(d_max))


@dataclass(frozen=True, slots=True)
class DepletionPolicy:
    """Emit a dummy event when width > `threshold`, at most once per `interval_ms`.

    A dummy names up to `max_parents` extremities (None: `d_max`, the rule
    before dummies could merge more; see the module docstring for why).
    """

    threshold: int = DEFAULT_DEPLETION_THRESHOLD
    interval_ms: int = DEFAULT_DEPLETION_INTERVAL_MS
    enabled: bool = True
    max_parents: int | None = MAX_DUMMY_PARENTS

    def __post_init__(self) -> None:
        if (self.max_parents is not None
                and not MIN_D_MAX < self.max_parents <= MAX_DUMMY_PARENTS):
            # One parent merges nothing: a dummy must be able to name two.
            raise ValueError(
                f"max_parents must be None or in ({MIN_D_MAX}, {MAX_DUMMY_PARENTS}]")

    def due(self, width: int, now_ms: int, last_dummy_ms: int | None) -> bool:
        if not self.over(width):
            return False
        return last_dummy_ms is None or now_ms - last_dummy_ms >= self.interval_ms

    def over(self, width: int) -> bool:
        """True when the width calls for a dummy (rate limits aside)."""
        return self.enabled and width > self.threshold

    def settled(self, width: int) -> bool:
        """True once the width is at most half the threshold.

        The hysteresis level for backoffs: a width hovering just around the
        threshold must not keep re-arming short timers.
        """
        return width <= self.threshold // 2

    def dummy_parents(self, d_max: int) -> int:
        """How many extremities one dummy may name in a topic whose ordinary limit is `d_max`."""
        if self.max_parents is None:
            return d_max
        return max(d_max, self.max_parents)

    def width_after_dummy(self, width: int, d_max: int) -> int:
        """The width right after one dummy, if nothing else arrives meanwhile."""
        merged = min(width, self.dummy_parents(d_max))
        return width - merged + 1
