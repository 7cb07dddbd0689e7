"""Causal clocks: ancestry by lookup, per writer, exact even for forked writers."""

import pytest

from node.core.order.clock import CausalIndex
from node.core.order.values import OrderError

from .dag import node


def index_of(*nodes):
    index = CausalIndex()
    for n in nodes:
        index.add(n)
    return index


def test_a_node_sees_its_ancestors_of_every_writer_and_nothing_else():
    #  a0 ── a1 ─────── a2
    #          \\       /
    #  b0 ───── b1 ────        x0 (a non-indexer) ── b1
    index = index_of(
        node("a0"), node("b0"), node("x0"),
        node("a1", "a0"), node("b1", "b0", "a1", "x0"), node("a2", "a1", "b1"),
    )  # fmt: skip
    assert index.sees(b"a2", b"b1") and index.sees(b"a2", b"b0") and index.sees(b"a2", b"x0")
    assert index.sees(b"b1", b"a1") and index.sees(b"b1", b"b1")
    assert not index.sees(b"b1", b"a2")
    assert not index.sees(b"a1", b"b0")
    assert not index.sees(b"a0", b"x0")


def test_an_honest_writer_is_one_lane_and_its_clock_is_its_chain():
    index = index_of(node("a0"), node("a1", "a0"), node("b0", "a1"), node("a2", "b0"))
    assert len(index.lanes_of(b"a")) == 1
    lane = index.lanes_of(b"a")[0]
    assert index.latest(b"b0", lane) == 1
    assert [index.node_at(lane, s) for s in range(3)] == [b"a0", b"a1", b"a2"]
    assert not index.forks


def test_a_node_must_have_its_writers_previous_node_in_its_past():
    index = index_of(node("a0"), node("b0"))
    with pytest.raises(OrderError, match="seq 1 without seq 0"):
        index.add(node("a1", "b0"))
    with pytest.raises(OrderError, match="unknown"):
        index.add(node("a1", "zz"))
    # The previous node may be an ancestor through another writer.
    index.add(node("b1", "b0", "a0"))
    index.add(node("a1", "b1"))
    assert index.sees(b"a1", b"a0")


def test_a_fork_opens_a_lane_and_answers_stay_exact_for_both_branches():
    #        ┌ a1  ── b0        a1 and a1' have one seq: a is forked at 1.
    #  a0 ───┤                  b0 has seen a1 but not a1'; c0 the opposite.
    #        └ a1' ── c0
    index = index_of(node("a0"), node("a1", "a0"), node("a1'", "a0"), node("b0", "a1"))
    index.add(node("c0", "a1'"))
    assert index.forks == {b"a": 1}
    assert len(index.lanes_of(b"a")) == 2
    assert index.sees(b"b0", b"a1") and not index.sees(b"b0", b"a1'")
    assert index.sees(b"c0", b"a1'") and not index.sees(b"c0", b"a1")
    assert index.sees(b"b0", b"a0") and index.sees(b"c0", b"a0")
    # The forked writer continues on one branch, then merges both.
    index.add(node("a2", "a1'"))
    index.add(node("a3", "a2", "a1"))
    assert index.sees(b"a3", b"a1") and index.sees(b"a3", b"a1'")
    assert not index.sees(b"a2", b"a1")


def test_first_where_finds_the_first_node_of_a_chain_passing_a_monotone_test():
    index = index_of(node("x0"), node("a0"), node("a1", "a0"), node("a2", "a1", "x0"), node("a3", "a2"))
    lane = index.lanes_of(b"a")[0]
    assert index.first_where(lane, 0, 4, lambda seq: index.sees(index.node_at(lane, seq), b"x0")) == 2
    assert index.first_where(lane, 0, 2, lambda seq: index.sees(index.node_at(lane, seq), b"x0")) is None
