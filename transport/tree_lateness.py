"""How late the tree's copies come here: what its timers are scaled by.

The tree's timers (`transport.eager_lazy`: the graft timeout, the exchanges'
hold, the parent's silence) were fixed, sized for a loaded but not starved
machine. Where the hops take longer than they allow (10 daemons on 2 saturated
cores: p50 ~450 ms and p90 ~1.4 s for a copy over the tree), every timer fires
on copies that are late, not lost: announced ids are fetched, exchanges send what
the tree is still carrying, silent parents are replaced, and each of these makes
duplicates, which cost the CPU the hops were waiting for (measured: 1.2
duplicates per node and event, 2.9x the event's bytes on the wire).

So each topic measures how late the tree's first copies come, and the timers
stretch to it (never below their fixed values, which stay the floor: on a quiet
machine and in the simulator's usual worlds nothing changes; on slow links with
idle CPUs they trade latency for bytes, docs/anti-entropy.md "Timers that
stretch").

A copy's lateness is its age when it arrives here: our clock less its author's
`timestamp_ms`. The whole age, not its excess over the author's fastest copy:
on saturated cores every copy waits, the fastest too (measured in the 10-node
bench: the median copy came only 50-190 ms after its author's fastest, yet 500
ms after it was written), and the excess left the timers at their floors there.

The author's clock may be off from ours (a device without a real-time clock).
One ahead of ours would give ages below zero, which no copy has: so an author
whose least recent age (over its last one or two windows of `BASELINE_COPIES`
copies) is below zero has its ages raised by that much. One behind ours makes
its copies look late, which the median ignores unless most copies are that
author's, and `MAX_LATENESS_MS` bounds what it, or anything else, can stretch.

The engine hands it the ages of the tree's own flow only: not a repair going
on along the tree (what an exchange or a want brought to some node, marked
`Push.repair` from there on), whose copies are as old as the loss or
partition they repair, not as the hops (`Disseminator._tree_received`).

`Lateness` is pure state (no clock, no IO): the engine hands it each age.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Final

# The recent first copies the measure is taken over: a few seconds at a busy
# topic's rate (200 events/s), a long while at a quiet one's, where it matters little.
LATENESS_SAMPLES: Final = 256
# The quantile of those copies' lateness the timers follow: the median, not the
# tail. A copy pushed on by a node that got it late (by an exchange or a fetch,
# after its parent fell silent) is late here however fast the hop was, and the
# timers stretched by the tail (0.9) delayed those repairs in turn: one run of the
# 10-node bench had its exchanges' copies 4 s late at the median, the tree's 5.3 s
# at p90. Such copies are a minority (0.12 of the deliveries there), so the median
# is the hops' own lateness, and the timers are a few medians (`transport.eager_lazy`).
LATENESS_QUANTILE: Final = 0.5
# The measure is recomputed (a sort of LATENESS_SAMPLES) after this many copies.
LATENESS_RECOMPUTE_EVERY: Final = 32
# What the measure may say at most, whatever the clocks do: timers stretch at most
# to a few times this (`transport.eager_lazy`).
MAX_LATENESS_MS: Final = 2_000
# Authors whose least age is remembered (the least recent forgotten past this).
MAX_AUTHORS: Final = 1_024
# An author's least age is taken over its last one or two windows of this many
# copies (module docstring): a clock stepped since counts once the copies from
# before the step have left them (at 40 events/s, within 50 s).
BASELINE_COPIES: Final = 1_024


@dataclass
class _Baseline:
    """An author's least age over its previous window of copies and the current one."""

    previous: int
    current: int
    copies: int = 0

    def least(self, age_ms: int) -> int:
        self.current = min(self.current, age_ms)
        self.copies += 1
        if self.copies >= BASELINE_COPIES:
            self.previous, self.current, self.copies = self.current, age_ms, 0
        return min(self.previous, self.current)


@dataclass
class Lateness:
    """One topic's measure of how late the tree's first copies come (module docstring)."""

    _baselines: OrderedDict[bytes, _Baseline] = field(default_factory=OrderedDict)  # by author
    _samples: deque[int] = field(default_factory=lambda: deque(maxlen=LATENESS_SAMPLES))
    _since_recompute: int = 0
    _value_ms: int = 0

    def arrived(self, author: bytes, age_ms: int) -> None:
        """A first copy by the tree of one of `author`'s events, `age_ms` old here."""
        baseline = self._baselines.pop(author, None)
        if baseline is None:
            baseline = _Baseline(age_ms, age_ms)
        self._baselines[author] = baseline  # (re-inserted: the dict's order is the recency)
        if len(self._baselines) > MAX_AUTHORS:
            self._baselines.popitem(last=False)
        ahead = min(0, baseline.least(age_ms))  # the author's clock is ahead of ours
        self._samples.append(min(age_ms - ahead, MAX_LATENESS_MS))
        self._since_recompute += 1
        if self._since_recompute >= LATENESS_RECOMPUTE_EVERY:
            self._recompute()

    def _recompute(self) -> None:
        self._since_recompute = 0
        ordered = sorted(self._samples)
        self._value_ms = ordered[min(len(ordered) - 1, int(len(ordered) * LATENESS_QUANTILE))]

    def forget_samples(self) -> None:
        """Start the measure afresh (0 until enough copies come), keeping what is known of
        the authors' clocks: the copies measured are of a busy spell that is over."""
        self._samples.clear()
        self._since_recompute = 0
        self._value_ms = 0

    @property
    def ms(self) -> int:
        """The LATENESS_QUANTILE of the recent copies' lateness (0 before enough copies)."""
        return self._value_ms
