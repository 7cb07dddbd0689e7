"""The simulated network: a virtual clock, a heap of timed deliveries, and its faults.

Everything that happens in a simulated world is an entry on one heap,
ordered by (virtual time, insertion sequence): a message delivery, a node's
tick, a write round, a crash, a restart, a redial. The sequence number makes
the order total, so a run never depends on how Python compares payloads.

Faults, drawn per message from the world's one `random.Random`: loss,
duplication (a second copy with its own latency), reordering (extra delay up
to REORDER_EXTRA_FACTOR times the latency bound), and partitions - a
schedule of `(groups, at_ms, heal_at_ms)` during which messages between
groups are dropped at delivery time. The order of the random draws is part
of a seed's meaning: change it and every recorded seed replays another run.

Each message draws its own latency, so on a plain `Network` two messages on
one link may arrive in either order. A libp2p stream (the node's one stream
per peer, `transport.libp2p_messages`) keeps order, so every world asks for
**FIFO links** (`fifo=True`; `Scenario.fifo_links`, on by default since
2026-11-27, `--reordering-links` off): a message is then delivered no
earlier than the one sent before it on the same link (head-of-line waiting,
as on a stream). It draws nothing more, so a seed's draws are the same
either way. The tree fast path's declarations depend on it: a `Graft`
overtaking an earlier `Prune` to the same peer left the two disagreeing
about their link for seconds (docs/anti-entropy.md, "FIFO links").
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

REORDER_EXTRA_FACTOR = 4  # a reordered message is delayed up to this many latency bounds more
TOPOLOGY_ATTEMPTS_PER_NODE = 10  # random chord draws per node before its degree is left short


class Due(IntEnum):
    """What a heap entry does when its time comes (an int: compared on the hot path)."""

    DELIVER = 0
    TICK = 1
    ROUND = 2
    CRASH = 3
    RESTART = 4
    REDIAL = 5


@dataclass
class Partition:
    """Messages between `groups` are dropped from `at_ms` until `heal_at_ms`."""

    groups: list[frozenset[int]]
    at_ms: int
    heal_at_ms: int

    def separates(self, a: int, b: int, now_ms: int) -> bool:
        if not self.at_ms <= now_ms < self.heal_at_ms:
            return False
        return self._group(a) != self._group(b)

    def _group(self, node: int) -> int:
        for index, group in enumerate(self.groups):
            if node in group:
                return index
        return -1  # unlisted nodes form one more group


class Network:
    """The clock, the heap, the fault draws and the traffic counters of one world."""

    def __init__(self, rng: random.Random, *, loss: float = 0.0, duplicate: float = 0.0,
                 reorder: float = 0.0, latency_ms: tuple[int, int] = (5, 50),
                 fifo: bool = False) -> None:
        if not (0 <= latency_ms[0] <= latency_ms[1]):
            raise ValueError("latency_ms must be (lo, hi) with 0 <= lo <= hi")
        for name, p in (("loss", loss), ("duplicate", duplicate), ("reorder", reorder)):
            if not 0.0 <= p < 1.0:
                raise ValueError(f"{name} must be in [0, 1)")
        self.rng = rng
        self.loss, self.duplicate, self.reorder = loss, duplicate, reorder
        self.latency_ms = latency_ms
        self.fifo = fifo
        # With fifo: per (src, dst) link, when its last message is delivered.
        self._link_due: dict[tuple[int, int], int] = {}
        self.now_ms = 0
        self._heap: list[tuple[int, int, int, int, int, Any]] = []
        self._seq = 0
        self.partitions: list[Partition] = []
        self.messages = 0
        self.bytes = 0
        self.dropped = 0

    # ------------------------------------------------------------- the heap

    def schedule(self, at_ms: int, kind: Due, a: int, b: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at_ms, self._seq, kind, a, b, payload))

    def due(self, end_ms: int) -> Iterator[tuple[int, int, int, int, Any]]:
        """Pop every entry due by `end_ms` in order, advancing the clock to each; entries
        scheduled meanwhile are popped too if due. The clock ends at `end_ms` at least."""
        heap = self._heap
        while heap and heap[0][0] <= end_ms:
            at, _, kind, a, b, payload = heapq.heappop(heap)
            self.now_ms = at
            yield at, kind, a, b, payload
        self.now_ms = max(self.now_ms, end_ms)

    def last(self, kind: Due) -> list[int]:
        """The times of the pending entries of `kind`."""
        return [at for at, _, k, *_ in self._heap if k == kind]

    # ------------------------------------------------------------- messages and faults

    def transmit(self, src: int, dst: int, data: bytes) -> None:
        """Count a message and schedule its delivery: lost, delayed, perhaps doubled."""
        self.messages += 1
        self.bytes += len(data)
        if self.loss and self.rng.random() < self.loss:
            self.dropped += 1
            return
        self.schedule(self._arrival(src, dst), Due.DELIVER, src, dst, data)
        if self.duplicate and self.rng.random() < self.duplicate:
            self.schedule(self._arrival(src, dst), Due.DELIVER, src, dst, data)

    def _arrival(self, src: int, dst: int) -> int:
        """When a message sent now on src -> dst arrives: after its own latency, and on
        FIFO links not before the message sent before it (equal times keep the heap's
        insertion order, so the earlier one still comes first)."""
        at = self.now_ms + self.latency()
        if self.fifo:
            link = (src, dst)
            at = max(at, self._link_due.get(link, 0))
            self._link_due[link] = at
        return at

    def latency(self) -> int:
        lo, hi = self.latency_ms
        delay = self.rng.randint(lo, hi)
        if self.reorder and self.rng.random() < self.reorder:
            delay += self.rng.randint(0, REORDER_EXTRA_FACTOR * hi)
        return delay

    def separated(self, a: int, b: int) -> bool:
        """A partition in force now drops messages between a and b."""
        return any(p.separates(a, b, self.now_ms) for p in self.partitions)

    def partition(self, groups: Iterable[Iterable[int]], at_ms: int, heal_at_ms: int) -> None:
        if heal_at_ms < at_ms:
            raise ValueError("heal_at_ms must not precede at_ms")
        self.partitions.append(Partition([frozenset(g) for g in groups], at_ms, heal_at_ms))

    def heal(self, clean: bool) -> None:
        """No partitions from now on; with `clean`, no loss/duplication/reordering either."""
        for p in self.partitions:
            p.heal_at_ms = min(p.heal_at_ms, self.now_ms)
        if clean:
            self.loss = self.duplicate = self.reorder = 0.0


def ring_with_chords(n: int, degree: int, rng: random.Random) -> list[tuple[int, int]]:
    """A ring (so the graph is connected) plus random chords up to `degree` per node."""
    edges: set[tuple[int, int]] = set()
    for i in range(n):
        edges.add((min(i, (i + 1) % n), max(i, (i + 1) % n)))
    count = [0] * n
    for a, b in edges:
        count[a] += 1
        count[b] += 1
    target = min(degree, n - 1)
    for i in range(n):
        attempts = 0
        while count[i] < target and attempts < TOPOLOGY_ATTEMPTS_PER_NODE * n:
            attempts += 1
            j = rng.randrange(n)
            edge = (min(i, j), max(i, j))
            if j == i or edge in edges:
                continue
            edges.add(edge)
            count[i] += 1
            count[j] += 1
    return sorted(edges)
