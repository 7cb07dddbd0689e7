"""Parent selection policies and extremity depletion."""

import random

import pytest

from node.core.event import KIND_DUMMY, MAX_PARENTS
from node.core.parents import (MAX_DUMMY_PARENTS, DepletionPolicy, ParentPolicy, select_parents,
                               select_share)
from node.replica.replica import Replica, ReplicaConfig
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


def test_a_share_is_one_run_of_the_sorted_extremities_wrapping_round():
    assert select_share(IDS[:4], 4, 3) == sorted(IDS[:4])  # at most d_max: all of them
    runs = [select_share(list(reversed(IDS)), 4, share) for share in range(3)]
    assert runs == [IDS[0:4], IDS[4:8], IDS[8:12]]  # disjoint, whatever order they come in
    assert select_share(IDS, 5, 2) == sorted(IDS[10:12] + IDS[0:3])  # the last run wraps
    with pytest.raises(ValueError, match="share"):
        select_share(IDS, 4, -1)


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


@pytest.mark.parametrize("max_parents, per_dummy, dummies_needed", [
    (None, 3, 5),  # the old rule: held to d_max=3, 12 -> 10 -> 8 -> 6 -> 4 -> 2
    (6, 6, 2),  # 12 -> 7 -> 2
    (MAX_DUMMY_PARENTS, 12, 1),  # the default: one dummy merges all twelve
])
def test_dummy_events_bring_a_wide_graph_down(max_parents, per_dummy, dummies_needed):
    origin = new_topic(d_max=3)
    writers = [identity(f"w{i}") for i in range(12)]
    for writer in writers:
        origin.receive(child(writer, origin.topic_id, [origin.topic_id], seq=1).raw, 5_000)
    policy = DepletionPolicy(threshold=2, interval_ms=100, max_parents=max_parents)
    replica = Replica(MemoryStore(), origin.topic_id, identity("gateway"),
                      ReplicaConfig(depletion=policy))
    for _, event in origin.graph.deliveries():
        replica.receive(event.raw, 5_000)
    assert replica.graph.width == 12
    rng = random.Random(7)
    now, dummies = 5_000, 0
    while replica.graph.width > 2 and dummies < 20:
        width = replica.graph.width
        made = replica.maybe_deplete(now, rng)
        assert made is not None and made[0].kind == KIND_DUMMY
        assert len(made[0].parents) == min(width, per_dummy)
        assert replica.graph.width == policy.width_after_dummy(width, 3)
        assert replica.maybe_deplete(now + 50, rng) is None  # rate-limited
        dummies += 1
        now += 100
    assert replica.graph.width <= 2 and dummies == dummies_needed
    assert replica.counters["dummies"] == dummies


def test_ordinary_events_stay_held_to_d_max_while_dummies_merge_more():
    origin = new_topic(d_max=3)
    for i in range(8):
        origin.receive(child(identity(f"w{i}"), origin.topic_id, [origin.topic_id], seq=1).raw,
                       5_000)
    event, _ = origin.publish(b"ordinary", 5_000, random.Random(1))
    assert len(event.parents) == 3
    dummy, _ = origin.publish(b"", 5_000, random.Random(1), kind=KIND_DUMMY)
    assert len(dummy.parents) == 6  # everything left: 8 - 3 + 1


def test_depletion_policy_exposes_what_the_engine_schedules_by():
    policy = DepletionPolicy(threshold=10)
    assert not policy.over(10) and policy.over(11)
    assert not DepletionPolicy(threshold=10, enabled=False).over(100)
    assert policy.settled(5) and not policy.settled(6)  # hysteresis at half the threshold
    # A dummy names more than an ordinary event may (node.core.event, MAX_DUMMY_PARENTS).
    assert policy.dummy_parents(4) == MAX_DUMMY_PARENTS == 64 > MAX_PARENTS
    assert DepletionPolicy(max_parents=None).dummy_parents(4) == 4
    assert DepletionPolicy(max_parents=MAX_PARENTS).dummy_parents(4) == MAX_PARENTS
    assert policy.width_after_dummy(100, 10) == 37 and policy.width_after_dummy(7, 10) == 1
    # backward compatible: positional fields keep their meaning, defaults unchanged
    assert DepletionPolicy(3, 1_000, True).threshold == 3
    with pytest.raises(ValueError, match="max_parents"):
        DepletionPolicy(max_parents=1)
    with pytest.raises(ValueError, match="max_parents"):
        DepletionPolicy(max_parents=MAX_DUMMY_PARENTS + 1)
