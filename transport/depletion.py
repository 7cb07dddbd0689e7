"""When a wide topic emits a dummy: randomized suppression with exponential backoff.

A replica whose width stays over the depletion threshold waits a random time
in [0, backoff) before emitting a dummy, and stands down if the width drops
meanwhile (someone else's dummy arrived): the randomized suppression timers of
SRM. Without it every node of a wide topic emits dummies at once, and n
concurrent dummies are n new extremities — a dummy storm that never settles.
When a dummy did not bring the width down, the next wait doubles (Ethernet's
binary exponential backoff), so even a slow network (anti-entropy only,
where a dummy needs seconds to reach everyone) ends up with fewer concurrent
dummies than one dummy removes extremities. The wait resets only once the
width is at most half the threshold (hysteresis): a width hovering around the
threshold must not keep re-arming short timers.

The engine's `tick` asks `DepletionTimer.due` per topic and, when it says so,
has the replica make the dummy (`Replica.maybe_deplete`). Pure: the time and
the random stream are passed in.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

DEFAULT_DEPLETION_BACKOFF_MS: Final = 5_000  # the first wait is drawn from [0, this)
MAX_DEPLETION_BACKOFF_MS: Final = 300_000  # Synapse sends its dummy events every 5 minutes at most


@dataclass(slots=True)
class DepletionTimer:
    """One topic's dummy timer: when it fires, and how long the next wait may be."""

    deplete_at_ms: int | None = None  # armed: a dummy is due then unless the width drops
    backoff_ms: int = 0  # the current backoff; 0 = the configured base

    def due(self, ready: bool, width: int, threshold: int, now_ms: int,
            rng: random.Random, base_backoff_ms: int) -> bool:
        """True when this replica should emit a dummy now (the timer is then disarmed)."""
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
