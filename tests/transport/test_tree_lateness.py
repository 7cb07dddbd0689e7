"""The tree's timers stretch to the measured lateness of its copies (transport.tree_lateness).

Unit tests of `Lateness` (an author's clock ahead of ours cancels, the median of
the recent copies is what counts, a bound holds whatever the clocks say) and of `TopicTree`'s
timers (their fixed values stay the floor; a late tree stretches the graft
timeout, the exchanges' hold and the parent's silence; `adaptive=False` keeps
them fixed), and the engine: a push's first copies feed the measure, a repair
passed on along the tree does not.
"""

from __future__ import annotations

from transport.dissemination_config import DisseminationConfig
from transport.eager_lazy import (
    GRAFT_TIMEOUT_MS,
    GRAFT_TIMEOUTS_PER_LATENESS,
    PARENT_SILENCES_PER_LATENESS,
    PARENT_SILENT_MS,
    SYNC_HOLD_MS,
    SYNC_HOLDS_PER_LATENESS,
    TopicTree,
)
from transport.tree_lateness import (
    BASELINE_COPIES,
    LATENESS_RECOMPUTE_EVERY,
    LATENESS_SAMPLES,
    MAX_AUTHORS,
    MAX_LATENESS_MS,
    Lateness,
)
from transport.dissemination import Disseminator
from transport.messages import Push, decode, encode
from transport.sim import Cluster, Scenario

A = b"a" * 32
B = b"b" * 32
NOW = 1_000_000


def feed(lateness: Lateness, author: bytes, ages: list[int]) -> None:
    for age in ages:
        lateness.arrived(author, age)


def test_an_author_clock_ahead_of_ours_cancels_and_one_behind_is_outvoted():
    """An author whose clock is 2 s ahead of ours gives ages below zero: raised by its
    least, only the delay counts. One an hour behind makes its copies look late (at most
    MAX_LATENESS_MS), which the median ignores while they are a minority."""
    ahead = Lateness()
    feed(ahead, A, [-2_000] + [-2_000 + 300] * (LATENESS_SAMPLES - 1))
    assert ahead.ms == 300
    mixed = Lateness()
    for _ in range(LATENESS_SAMPLES // 3):
        feed(mixed, A, [300, 300])
        feed(mixed, B, [3_600_000 + 300])
    assert mixed.ms == 300


def test_the_measure_is_the_median_of_the_recent_copies():
    """Most copies 300 ms late and a few 4 s late (pushed on by a node that got them by
    an exchange): the median says 300, not the few; copies beyond LATENESS_SAMPLES ago
    are forgotten."""
    lateness = Lateness()
    feed(lateness, A, [0])
    feed(lateness, A, ([300] * 8 + [4_000, 4_000]) * (LATENESS_SAMPLES // 10 + 1))
    assert lateness.ms == 300
    feed(lateness, A, [0] * LATENESS_SAMPLES)
    assert lateness.ms == 0


def test_the_measure_is_bounded_whatever_the_clocks_say():
    """An author's clock stepped back an hour: its copies look an hour late, and the
    measure says MAX_LATENESS_MS at most."""
    lateness = Lateness()
    feed(lateness, A, [0, 0])
    feed(lateness, A, [3_600_000] * LATENESS_SAMPLES)
    assert lateness.ms == MAX_LATENESS_MS


def test_a_stepped_clock_is_the_new_baseline_after_two_windows():
    """An author's clock 2 s ahead of ours, then set right: its copies look 2 s late
    (bounded) until the copies from before the step have left its windows (2 x
    BASELINE_COPIES) and the samples taken meanwhile are gone (LATENESS_SAMPLES)."""
    lateness = Lateness()
    feed(lateness, A, ([-2_000] + [-2_000 + 100] * 9) * (LATENESS_SAMPLES // 10 + 1))
    assert lateness.ms == 100
    feed(lateness, A, ([0] + [100] * 9) * (BASELINE_COPIES // 10))
    assert lateness.ms == MAX_LATENESS_MS  # the least age is from before the step still
    feed(lateness, A, ([0] + [100] * 9) * ((BASELINE_COPIES + LATENESS_SAMPLES) // 10 + 2))
    assert lateness.ms == 100


def test_the_measure_is_recomputed_every_few_copies_and_authors_are_bounded():
    lateness = Lateness()
    feed(lateness, A, [0] + [500] * (LATENESS_RECOMPUTE_EVERY - 2))
    assert lateness.ms == 0  # not recomputed yet
    feed(lateness, A, [500])
    assert lateness.ms == 500
    for n in range(MAX_AUTHORS + 10):
        lateness.arrived(n.to_bytes(32, "big"), 0)
    assert len(lateness._baselines) == MAX_AUTHORS


def late_tree(delay_ms: int, adaptive: bool = True) -> TopicTree:
    tree = TopicTree(settle_ms=0, adaptive=adaptive)
    feed(tree.lateness, A, [0] + [delay_ms] * LATENESS_SAMPLES)
    return tree


def test_the_fixed_timers_are_the_floor():
    """A tree on time (and a new one) keeps GRAFT_TIMEOUT_MS, SYNC_HOLD_MS and
    PARENT_SILENT_MS: on a quiet machine and in the simulator nothing changes."""
    for tree in (TopicTree(), late_tree(200)):
        assert tree.graft_timeout() == GRAFT_TIMEOUT_MS
        assert tree.sync_hold() == SYNC_HOLD_MS
        assert tree.parent_silence() == PARENT_SILENT_MS


def test_a_late_tree_stretches_every_timer():
    """Copies 600 ms late (2 saturated cores): an announced id is awaited, an exchange
    holds back, and a silent parent stays, each a few times that long."""
    tree = late_tree(600)
    assert tree.graft_timeout() == GRAFT_TIMEOUTS_PER_LATENESS * 600 > GRAFT_TIMEOUT_MS
    assert tree.sync_hold() == SYNC_HOLDS_PER_LATENESS * 600 > SYNC_HOLD_MS
    assert tree.parent_silence() == PARENT_SILENCES_PER_LATENESS * 600 > PARENT_SILENT_MS
    fixed = late_tree(600, adaptive=False)
    assert (fixed.graft_timeout(), fixed.sync_hold(), fixed.parent_silence()) \
        == (GRAFT_TIMEOUT_MS, SYNC_HOLD_MS, PARENT_SILENT_MS)


def test_a_tree_that_brings_no_news_for_a_hold_falls_back_to_its_floors():
    """A busy spell (or the copies a healed partition pushed on, seconds old) stretched
    the timers; once no push has brought news for SYNC_HOLD_MS, the tree carries nothing
    towards us and the timers are their fixed values again, until copies come anew."""
    tree = late_tree(600)
    tree.news_from("p", NOW)
    tree.quiet_tick(NOW + SYNC_HOLD_MS - 1)
    assert tree.carrying(NOW + SYNC_HOLD_MS - 1) and tree.sync_hold() > SYNC_HOLD_MS
    tree.quiet_tick(NOW + SYNC_HOLD_MS)
    assert not tree.carrying(NOW + SYNC_HOLD_MS)
    assert (tree.graft_timeout(), tree.sync_hold(), tree.parent_silence()) \
        == (GRAFT_TIMEOUT_MS, SYNC_HOLD_MS, PARENT_SILENT_MS)
    feed(tree.lateness, A, [600] * LATENESS_RECOMPUTE_EVERY)  # late copies again
    assert tree.graft_timeout() == GRAFT_TIMEOUTS_PER_LATENESS * 600
    assert not TopicTree().carrying(NOW)  # nothing ever came


def test_an_announced_id_is_fetched_after_the_stretched_timeout():
    tree = late_tree(600)
    tree.announced("p", [b"x" * 32], NOW, lambda _: False)
    timeout = GRAFT_TIMEOUTS_PER_LATENESS * 600
    assert tree.due(NOW + timeout - 1, lambda _: False) == {}
    assert tree.due(NOW + timeout, lambda _: False) == {"p": [b"x" * 32]}


def test_a_late_parent_is_not_silent_until_the_stretched_silence():
    tree = late_tree(600)
    tree.saw(A, NOW)
    tree.first_copy_from("p", [A], NOW)
    tree.news_from("p", NOW)
    silence = PARENT_SILENCES_PER_LATENESS * 600
    assert not tree.broken(NOW + PARENT_SILENT_MS + 1)
    assert not tree.broken(NOW + silence)
    assert tree.broken(NOW + silence + 1)


# ------------------------------------------------------------------ the engine, seeded


def test_a_push_s_first_copies_feed_the_measure_and_fast_links_keep_the_floors():
    """A 10-node tree world on 20 ms links: every node measures its copies' age (a few
    hops), well below what would stretch a timer, so the seeded worlds behave as with
    fixed timers."""
    config = DisseminationConfig(tree=True)
    cluster = Cluster(1, 10, neighbours=4, config=config, depletion=False, latency_ms=(20, 20))
    cluster.write(rounds=40, writers=5, round_ms=25)
    cluster.run_until(cluster.fault_phase_end() + 200)
    trees = [node.engine.tree_of(cluster.topic) for node in cluster.members]
    assert all(0 < tree.lateness.ms <= 4 * 20 + 100 for tree in trees), \
        [tree.lateness.ms for tree in trees]  # hops of 20 ms, ticks of 100 ms
    assert all((tree.graft_timeout(), tree.sync_hold(), tree.parent_silence())
               == (GRAFT_TIMEOUT_MS, SYNC_HOLD_MS, PARENT_SILENT_MS) for tree in trees)
    cluster.run_until(cluster.fault_phase_end() + 2_000)  # quiet since: measured afresh
    assert all(tree.lateness.ms == 0 for tree in trees)


def test_on_slow_links_the_timers_stretch_and_fetch_fewer_late_copies():
    """Links of 100-900 ms (a starved machine's hops, in the simulator): the copies'
    median age is hundreds of ms, the timers stretch, and fewer announced ids are
    fetched before their tree copy comes than with fixed timers."""
    measured = {}
    for adaptive in (False, True):
        config = DisseminationConfig(tree=True, adaptive_timers=adaptive)
        cluster = Cluster(1, 10, neighbours=4, config=config, depletion=False,
                          latency_ms=(100, 900))
        cluster.write(rounds=80, writers=5, round_ms=25)
        cluster.run_until(cluster.fault_phase_end())
        if adaptive:  # stretched while the writers write (back to the floors once quiet)
            trees = [node.engine.tree_of(cluster.topic) for node in cluster.members]
            assert all(tree.graft_timeout() > GRAFT_TIMEOUT_MS for tree in trees)
        cluster.run_until(cluster.fault_phase_end() + 8_000)
        assert cluster.converged()
        totals = cluster.totals()
        per = len(cluster.created) * 10
        measured[adaptive] = {key: totals.get(key, 0) / per
                              for key in ("duplicates", "tree_fetch_ids_sent")}
    assert measured[True]["tree_fetch_ids_sent"] < measured[False]["tree_fetch_ids_sent"], measured
    assert measured[True]["duplicates"] < measured[False]["duplicates"], measured


def test_a_repair_passed_on_along_the_tree_is_not_the_tree_s_lateness(monkeypatch):
    """40 nodes, 10 % loss, a partition from 1 s to 3 s. After the heal, what an exchange
    brought across goes on along the tree marked as a repair (`Push.repair`), and its
    copies, as old as the partition, are not counted: every node's measure stays at a
    few hops. Unmarked (as before), they stretched the timers at some nodes to nearly
    their cap, and the last events waited for the periodic exchange."""
    scenario = Scenario(seed=1, nodes=40, tree=True, loss=0.1, rounds=10, writers=5,
                        partition_at_ms=1_000, heal_at_ms=3_000)

    def after_the_heal() -> tuple[int, int]:
        """The worst lateness measured 1 s after the heal; repair pushes sent by then."""
        cluster = Cluster.from_scenario(scenario)
        cluster.run_until(4_000)
        worst = max(node.engine.tree_of(cluster.topic).lateness.ms for node in cluster.members)
        return worst, cluster.totals().get("tree_repair_pushes", 0)

    worst, repairs = after_the_heal()
    assert repairs > 0 and worst <= 4 * 50 + 100  # hops of 5-50 ms, ticks of 100
    unmarked = Disseminator._push_to
    monkeypatch.setattr(Disseminator, "_push_to", lambda self, topic, raws, chosen, repair=False:
                        unmarked(self, topic, raws, chosen, False))
    worst, repairs = after_the_heal()
    assert repairs == 0 and worst > 1_000


def test_a_repair_push_has_its_own_tag_and_a_plain_push_s_frame_is_unchanged():
    plain, repair = Push(bytes(32), (b"e",)), Push(bytes(32), (b"e",), repair=True)
    assert decode(encode(plain)) == plain and decode(encode(repair)) == repair
    assert encode(plain)[:2] == bytes([0x94, 1]) and encode(repair)[:2] == bytes([0x94, 1])
    assert encode(plain)[2] == 1 and encode(repair)[2] == 14
    assert len(encode(plain)) == len(encode(repair))
