"""A node-wide budget for the topics' biggest caches (issue 17: flat memory).

Every open topic has its own graph, state and order caches. At their full
per-topic sizes a node's memory grew with topics x cache sizes (100 topics x
10k events: 68 -> 1,081 MB RssAnon), up to `MAX_TOPICS` topics. The biggest
caches therefore draw on one budget per node: each of the N open topics gets
`min(per-topic size, max(minimum, node total / N))` entries, re-applied to
every open topic (shrinking a cache drops its oldest entries) whenever a topic
is opened or closed. A node with one or two busy topics keeps the full
per-topic sizes; the node's cache entries stay under the node totals, or
`MAX_TOPICS` x the minimums when that is larger.

Equal shares, not one LRU shared by all topics: each topic keeps its own
caches, so invalidation (pending writes discarded, a replay) stays within
one topic, and the hot paths keep their plain `OrderedDict`s.

The budget is a plain value: the runtime asks it for the shares and hands
them to its replicas (`ReplicaConfig.caches`, `Replica.resize_caches`). A
standalone replica (the simulator, tests) keeps the full per-topic sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from node.core.graph import EVENT_CACHE_SIZE, NODE_CACHE_SIZE
from node.core.order.clock import WHERE_CACHE_SIZE
from node.state.store import RECORD_CACHE_SIZE


@dataclass(frozen=True, slots=True)
class CacheSizes:
    """Entries each budgeted cache of one topic may hold."""

    nodes: int = NODE_CACHE_SIZE  # the graph's (depth, parents) cache
    events: int = EVENT_CACHE_SIZE  # the graph's decoded events
    records: int = RECORD_CACHE_SIZE  # the state's per-event records
    where: int = WHERE_CACHE_SIZE  # the order's positions (one generation of two)

    def __post_init__(self) -> None:
        for name in self.__slots__:
            if getattr(self, name) < 1:
                raise ValueError(f"cache size {name} must be >= 1")


# The node-wide totals: twice the per-topic sizes, so a node with one or two
# busy topics keeps today's sizes. About 90 MB of caches at most (a topic's
# caches at full size measured ~45 MB).
NODE_CACHE_TOTALS = CacheSizes(
    nodes=2 * NODE_CACHE_SIZE,
    events=2 * EVENT_CACHE_SIZE,
    records=2 * RECORD_CACHE_SIZE,
    where=2 * WHERE_CACHE_SIZE,
)

# What every topic keeps however many are open (1/256 of the full sizes): the
# parents of what arrives next and the newest positions, so a topic still
# works without a store read per event. At MAX_TOPICS (1,024) topics that is
# 4 x one topic's full caches.
TOPIC_CACHE_MINIMUMS = CacheSizes(
    nodes=NODE_CACHE_SIZE // 256,
    events=EVENT_CACHE_SIZE // 256,
    records=RECORD_CACHE_SIZE // 256,
    where=WHERE_CACHE_SIZE // 256,
)


@dataclass(frozen=True, slots=True)
class CacheBudget:
    """One node's cache budget: the per-topic shares for a number of open topics."""

    totals: CacheSizes = NODE_CACHE_TOTALS
    minimums: CacheSizes = TOPIC_CACHE_MINIMUMS
    per_topic: CacheSizes = CacheSizes()  # the most one topic gets

    def shares(self, topics: int) -> CacheSizes:
        """Each topic's sizes when `topics` topics are open."""
        topics = max(topics, 1)
        return CacheSizes(**{
            name: min(getattr(self.per_topic, name),
                      max(getattr(self.minimums, name), getattr(self.totals, name) // topics))
            for name in CacheSizes.__slots__
        })
