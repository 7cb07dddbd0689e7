"""A node-wide budget for the topics' caches (issue 17: flat memory).

Every open topic has its own graph, state and order caches. At their full
per-topic sizes a node's memory grew with topics x cache sizes (100 topics x
10k events: 68 -> 1,081 MB RssAnon), up to `MAX_TOPICS` topics. The caches
(`CacheSizes`: all but three small ones) therefore draw on one budget per
node: each of the N open topics gets `min(per-topic size, max(minimum, node
total / N))` entries, re-applied to every open topic (shrinking a cache
drops its oldest entries) whenever a topic is opened or closed. A node with one or two busy topics keeps the full
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

from node.core.graph import EVENT_CACHE_SIZE, LATEST_SEQ_CACHE_SIZE, NODE_CACHE_SIZE
from node.core.order.clock import WHERE_CACHE_SIZE
from node.replica.ordering import ROLE_CACHE_SIZE
from node.state.store import MEMO_CACHE_SIZE, RECORD_CACHE_SIZE
from node.state.tracker import VERDICT_CACHE_SIZE


@dataclass(frozen=True, slots=True)
class CacheSizes:
    """Entries each budgeted cache of one topic may hold."""

    nodes: int = NODE_CACHE_SIZE  # the graph's (depth, parents) cache
    events: int = EVENT_CACHE_SIZE  # the graph's decoded events
    records: int = RECORD_CACHE_SIZE  # the state's per-event records
    where: int = WHERE_CACHE_SIZE  # the order's positions (one generation of two)
    # Per author or per state: small while a topic has few writers, ~1-2 MB
    # each at full size with many (verdicts ~520 bytes an entry).
    latest_seq: int = LATEST_SEQ_CACHE_SIZE  # the graph's authors' latest seqs
    memo: int = MEMO_CACHE_SIZE  # the state's resolution memo
    verdicts: int = VERDICT_CACHE_SIZE  # the state's auth verdicts
    roles: int = ROLE_CACHE_SIZE  # the order's (state group, author) roles

    def __post_init__(self) -> None:
        for name in self.__slots__:
            if getattr(self, name) < 1:
                raise ValueError(f"cache size {name} must be >= 1")


# The node-wide totals: twice the per-topic sizes, so a node with one or two
# busy topics keeps today's sizes. About 80 MB of caches at most (a topic's
# caches at full size held ~40 MB of Python objects (tracemalloc): nodes 19.5,
# positions and ids (two generations) 11.6, events 4.4, records 3.3; and with
# many writers up to ~4 more in the per-author ones).
NODE_CACHE_TOTALS = CacheSizes(**{name: 2 * getattr(CacheSizes(), name)
                                   for name in CacheSizes.__slots__})

# What every topic keeps however many are open (1/256 of the full sizes): the
# parents of what arrives next and the newest positions, so a topic still
# works without a store read per event. At MAX_TOPICS (1,024) topics that is
# 4 x one topic's full caches.
TOPIC_CACHE_MINIMUMS = CacheSizes(**{name: getattr(CacheSizes(), name) // 256
                                      for name in CacheSizes.__slots__})


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
