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
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

DEFAULT_D_MAX = 10
MIN_D_MAX = 1
MAX_D_MAX = 20  # the event format's MAX_PARENTS

DEFAULT_DEPLETION_THRESHOLD = 10
DEFAULT_DEPLETION_INTERVAL_MS = 1_000


class ParentPolicy(enum.Enum):
    RANDOM = "random"
    NEWEST = "newest"
    MIXED = "mixed"


def select_parents(
    extremities: Sequence[bytes],
    d_max: int,
    policy: ParentPolicy,
    rng: random.Random,
    depth_of: Callable[[bytes], int],
) -> list[bytes]:
    """Pick at most `d_max` of `extremities` by `policy`; the result is sorted."""
    if not MIN_D_MAX <= d_max <= MAX_D_MAX:
        raise ValueError(f"d_max must be in [{MIN_D_MAX}, {MAX_D_MAX}], got {d_max}")
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


@dataclass(frozen=True, slots=True)
class DepletionPolicy:
    """Emit a dummy event when width > `threshold`, at most once per `interval_ms`."""

    threshold: int = DEFAULT_DEPLETION_THRESHOLD
    interval_ms: int = DEFAULT_DEPLETION_INTERVAL_MS
    enabled: bool = True

    def due(self, width: int, now_ms: int, last_dummy_ms: int | None) -> bool:
        if not self.enabled or width <= self.threshold:
            return False
        return last_dummy_ms is None or now_ms - last_dummy_ms >= self.interval_ms
