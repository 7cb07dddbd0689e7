"""The fixed-writers world (transport.sim.latency_world): why the tree's p99 trails push's.

The tree carries every source's events along one tree, the root's: a write
climbs towards the common ancestor and down again. These tests pin that down
in the seeded world, so that a change to the tree's shape is measured against
it (docs/anti-entropy.md, "Why the tree's p99 trails push's").
"""

from __future__ import annotations

from transport.sim.latency_world import LatencyWorld, main, measure


def test_one_tree_for_all_sources_is_longer_than_the_links_and_no_root_fixes_that():
    """Seed 1: 2.31 hops from a writer along the tree against 1.51 on the shortest path; a
    tree of fewest hops from the same root 2.38, from the best root 2.18. Reshaping the
    one tree (Plumtree's optimisation, a central root) would not reach the links' paths."""
    result = measure(LatencyWorld(seed=1, path="tree"))
    hops = result["hops"]
    assert hops["tree"] >= hops["shortest"] + 0.5, hops
    assert hops["breadth_first_best_root"] >= hops["shortest"] + 0.5, hops
    assert hops["breadth_first_from_root"] >= hops["breadth_first_best_root"], hops
    assert result["deliveries"] == 5_445 and result["convergence_ms"] is not None, result
    assert result["per_node_write"]["duplicates"] <= 0.5, result


def test_the_command_refuses_an_unknown_fast_path_in_one_line(capsys):
    assert main(["--seeds", "1", "--paths", "flood"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("latency_world: unknown fast path 'flood'") and err.count("\n") == 1


def test_after_a_partition_the_tree_s_timers_do_not_stretch_to_the_backlog():
    """30 nodes, 10 % loss, split in two for 1.5 s while five writers write. The copies the
    heal pushes on along the tree are as old as the partition; measured as the tree's
    lateness they stretched every timer to its most, and the exchanges held everything
    back for 8 s: seed 2 converged 16.8 s after the last write (fixed timers 3.4 s, push
    2.4 s). Bulk pushes no longer feed the measure, and a tree that brings no news falls
    back to its floors: 5.7 s."""
    result = measure(LatencyWorld(seed=2, path="tree", nodes=30, loss=0.1,
                                  partition_ms=(1_500, 3_000)))
    assert result["convergence_ms"] is not None and result["convergence_ms"] <= 8_000, result
