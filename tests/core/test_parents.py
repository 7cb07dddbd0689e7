"""Parent selection policies and extremity depletion."""

import random

import pytest

from node.core.event import KIND_DUMMY
from node.core.parents import DepletionPolicy, ParentPolicy, select_parents
from node.core.replica import Replica, ReplicaConfig
from storage.memory import MemoryStore
from tests.helpers import child, identity, new_topic

IDS = [bytes([i]) * 32 for i in range(12)]
DEPTH = {event_id: i % 5 for i, event_id in enumerate(IDS)}


@pytest.mark.parametrize("policy", list(ParentPolicy))
def test_all_extremities_when_at_most_d_max(policy):
    assert select_parents(IDS[:4], 4, policy, random.Random(0), DEPTH.get) == sorted(IDS[:4])


def test_random_is_a_seeded_uniform_sample():
    picks = [tuple(select_parents(IDS, 3, ParentPolicy.RANDOM, random.Random(s), DEPTH.get))
             for s in range(300)]
    assert all(len(set(p)) == 3 and list(p) == sorted(p) for p in picks)
    assert select_parents(IDS, 3, ParentPolicy.RANDOM, random.Random(5), DEPTH.get) == list(picks[5])
    counts = {i: sum(i in p for p in picks) for i in IDS}
    # each id expected 300 * 3/12 = 75 times; all of them get picked a fair share
    assert min(counts.values()) > 40 and max(counts.values()) < 115


def test_newest_takes_the_deepest_with_id_tie_break():
    chosen = select_parents(IDS, 3, ParentPolicy.NEWEST, random.Random(0), DEPTH.get)
    deepest = sorted(IDS, key=lambda i: (-DEPTH[i], i))[:3]
    assert chosen == sorted(deepest)


def test_mixed_is_half_newest_half_random():
    chosen = select_parents(IDS, 4, ParentPolicy.MIXED, random.Random(1), DEPTH.get)
    deepest = sorted(IDS, key=lambda i: (-DEPTH[i], i))[:2]
    assert set(deepest) <= set(chosen) and len(set(chosen)) == 4


def test_d_max_out_of_range_is_a_clear_error():
    with pytest.raises(ValueError, match="d_max"):
        select_parents(IDS, 0, ParentPolicy.RANDOM, random.Random(0), DEPTH.get)


def test_depletion_policy_threshold_and_rate_limit():
    policy = DepletionPolicy(threshold=3, interval_ms=1_000)
    assert not policy.due(3, 0, None)
    assert policy.due(4, 0, None)
    assert not policy.due(4, 999, 0)
    assert policy.due(4, 1_000, 0)
    assert not DepletionPolicy(enabled=False).due(100, 0, None)


def test_dummy_events_bring_a_wide_graph_down():
    origin = new_topic(d_max=3)
    writers = [identity(f"w{i}") for i in range(12)]
    for writer in writers:
        origin.receive(child(writer, origin.topic_id, [origin.topic_id], seq=1).raw, 5_000)
    config = ReplicaConfig(depletion=DepletionPolicy(threshold=2, interval_ms=100))
    replica = Replica(MemoryStore(), origin.topic_id, identity("gateway"), config)
    for _, event in origin.graph.deliveries():
        replica.receive(event.raw, 5_000)
    assert replica.graph.width == 12
    rng = random.Random(7)
    assert replica.maybe_deplete(5_000, rng) is not None
    assert replica.maybe_deplete(5_050, rng) is None  # rate-limited
    now, dummies = 5_000, 1
    while replica.graph.width > 2 and dummies < 20:
        now += 100
        made = replica.maybe_deplete(now, rng)
        assert made is not None and made[0].kind == KIND_DUMMY and len(made[0].parents) <= 3
        dummies += 1
    # each dummy merges up to d_max=3 extremities into one: 12 -> 10 -> 8 -> ... -> 2
    assert replica.graph.width <= 2 and dummies == 5
    assert replica.counters["dummies"] == dummies
