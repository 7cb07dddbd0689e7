"""A node's topics share one cache budget (node.replica.cache_budget; issue 17: flat memory).

Per-topic caches at full size made a node's memory grow with topics x cache
sizes. The shares: one or two topics keep today's sizes, many split the node
totals, never below the per-topic minimums; a shrunk cache drops its oldest
entries and the topic still reads everything from the store.
"""

from __future__ import annotations

import random

import pytest

from node.core.graph import EVENT_CACHE_SIZE, NODE_CACHE_SIZE
from node.core.order.clock import WHERE_CACHE_SIZE
from node.replica.cache_budget import (
    NODE_CACHE_TOTALS, TOPIC_CACHE_MINIMUMS, CacheBudget, CacheSizes,
)
from node.replica.replica import Replica
from node.runtime import MAX_TOPICS, Node
from node.state.store import RECORD_CACHE_SIZE

SMALL = CacheBudget(
    totals=CacheSizes(nodes=400, events=200, records=300, where=200,
                      latest_seq=16, memo=16, verdicts=16, roles=16),
    minimums=CacheSizes(nodes=8, events=4, records=6, where=4,
                        latest_seq=1, memo=1, verdicts=1, roles=1),
    per_topic=CacheSizes(nodes=100, events=50, records=80, where=50,
                         latest_seq=4, memo=4, verdicts=4, roles=4))


def _entries(replica) -> dict[str, int]:
    """What a replica's budgeted caches hold now (the where cache: both generations)."""
    index = replica.ordering._lin._index if replica.ordering is not None else None
    return {
        "nodes": len(replica.graph._nodes),
        "events": len(replica.graph._events),
        "records": len(replica.tracker.groups._records),
        "where": 0 if index is None else len(index._where) + len(index._old_where),
        "latest_seq": len(replica.graph._latest_seq),
        "memo": len(replica.tracker.groups._memo),
        "verdicts": len(replica.tracker._verdicts),
        "roles": 0 if index is None else len(replica.ordering._roles),
    }


def test_one_or_two_topics_keep_the_full_sizes():
    full = CacheSizes()
    assert (full.nodes, full.events, full.records, full.where) == (
        NODE_CACHE_SIZE, EVENT_CACHE_SIZE, RECORD_CACHE_SIZE, WHERE_CACHE_SIZE)
    budget = CacheBudget()
    assert budget.shares(0) == budget.shares(1) == budget.shares(2) == full


def test_many_topics_split_the_totals_down_to_the_minimums():
    budget = CacheBudget()
    shares = budget.shares(100)
    assert shares.nodes == NODE_CACHE_TOTALS.nodes // 100
    assert shares.records == NODE_CACHE_TOTALS.records // 100
    for topics in (3, 10, 100, 500, MAX_TOPICS):
        shares = budget.shares(topics)
        for name in CacheSizes.__slots__:
            total = getattr(NODE_CACHE_TOTALS, name)
            floor = getattr(TOPIC_CACHE_MINIMUMS, name)
            assert getattr(shares, name) * topics <= max(total, floor * topics)
            assert getattr(shares, name) >= floor
    assert budget.shares(MAX_TOPICS) == TOPIC_CACHE_MINIMUMS


def test_a_cache_size_below_one_is_refused():
    with pytest.raises(ValueError, match="nodes"):
        CacheSizes(nodes=0)


async def test_many_topics_on_one_node_stay_under_the_budget(tmp_path):
    topics = 8
    async with Node.open(tmp_path / "n") as node:
        node._cache_budget = SMALL
        node._cache_shares = SMALL.shares(1)
        opened = [await node.create_topic(f"t{i}") for i in range(topics)]
        for topic in opened:
            await topic.publish_many([b"x%d" % i for i in range(120)])
        shares = SMALL.shares(topics)
        assert shares.nodes == 50  # 400 / 8: below the per-topic 100
        totals = dict.fromkeys(CacheSizes.__slots__, 0)
        for topic in opened:
            held = _entries(topic.replica)
            for name, count in held.items():
                limit = getattr(shares, name) * (2 if name == "where" else 1)
                assert count <= limit, (name, count, limit)
                totals[name] += count
            assert topic.replica.graph.delivered_count >= 120  # all still readable
        for name, count in totals.items():
            factor = 2 if name == "where" else 1  # two generations
            assert count <= factor * getattr(SMALL.totals, name), (name, count)
        assert all(totals[name] > 0 for name in ("nodes", "events", "records", "where")), totals

        # Closing topics gives the others a bigger share; reading old events still works.
        for topic in opened[2:]:
            await node.leave(topic.topic_id)
        assert SMALL.shares(2) == SMALL.per_topic
        for topic in opened[:2]:
            replica = topic.replica
            assert replica._caches == SMALL.per_topic
            await topic.publish_many([b"y%d" % i for i in range(120)])
            assert len(replica.graph._nodes) == SMALL.per_topic.nodes
            first = [event.id for _, event in replica.graph.deliveries(0, limit=200)]
            assert all(replica.graph.get(eid) is not None for eid in first)


def _filled(caches: CacheSizes):
    """A topic, its creator writing 300 events (a commit every 50), with caches of `caches`."""
    from node.replica.replica import ReplicaConfig
    from storage.memory import MemoryStore
    from tests.helpers import identity

    replica = Replica.create_topic(MemoryStore(), identity("alice"), 1_000, authorization=True,
                                   config=ReplicaConfig(caches=caches), members_write=True,
                                   join_rule="public")
    rng = random.Random(7)
    for i in range(300):
        replica.publish(b"m%d" % i, 2_000 + i, rng)
        if i % 50 == 49:
            replica.commit()
    replica.commit()
    return replica


def test_tiny_caches_give_the_same_topic():
    """Caches only cache: a replica whose caches hold one entry each ends where a full one does."""
    tiny = _filled(CacheSizes(**dict.fromkeys(CacheSizes.__slots__, 1)))
    full = _filled(CacheSizes())
    assert len(tiny.graph._nodes) == 1 and len(tiny.tracker.groups._records) <= 1
    assert tiny.graph.delivered_count == full.graph.delivered_count
    assert ([e.id for _, e in tiny.graph.deliveries(0, limit=400)]
            == [e.id for _, e in full.graph.deliveries(0, limit=400)])
    assert tiny.state().keys() == full.state().keys()
    assert tiny.ordering.tentative == full.ordering.tentative
    assert tiny.ordering.confirmed == full.ordering.confirmed
    full.resize_caches(CacheSizes(**dict.fromkeys(CacheSizes.__slots__, 2)))
    assert len(full.graph._nodes) == 2 and len(full.graph._events) == 2
