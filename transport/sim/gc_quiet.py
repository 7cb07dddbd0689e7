"""The collector held back while a simulated world runs: the world is frozen, young
collections are rare.

Why. A 1000-node world holds millions of long-lived objects (a thousand
replicas' graphs, indexes and caches) built before the first tick, and
allocates short-lived ones at every delivery. CPython's collector scans the
young generation every GC_THRESHOLD0_DEFAULT allocations and, as the heap
grows, every long-lived object again: at 1000 nodes that was a large share
of the run (disabling it gave a third more progress). So while `quiet_gc`
is held, what exists is frozen (`gc.freeze`: moved out of every generation,
never scanned) and the young generation is collected only every
SIM_GC_THRESHOLD0 allocations; cycles are still found, later. On exit the
frozen objects return and the thresholds are restored, so a test process
that runs worlds one after another is left as it was.

The daemon (`megnode run`, node/cli.py) freezes what exists once its node
is open too, and keeps the collector's thresholds (its heap is one replica,
not a thousand).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

SIM_GC_THRESHOLD0 = 100_000  # allocations between young collections while a world runs


@contextmanager
def quiet_gc() -> Iterator[None]:
    """Freeze what exists now and collect the young generation rarely, until exit."""
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(SIM_GC_THRESHOLD0, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
