"""The examples of the Autobase design document (seeds/autobase-design.md), as tests.

Writers are named a < b < c and all three are indexers unless a test says so.
"""

from node.core.order import Linearizer

from .dag import feed, full, keys, names, node

ABC = keys("a", "b", "c")


def replica(*nodes, indexers=ABC) -> Linearizer:
    linearizer = Linearizer(indexers)
    feed(linearizer, *nodes)
    return linearizer


def test_linearisation_of_a_chain():
    # a0 - b0 - c0 - a1 - b1
    chain = [node("a0"), node("b0", "a0"), node("c0", "b0"), node("a1", "c0"), node("b1", "a1")]
    linearizer = Linearizer(ABC)
    assert names(feed(linearizer, *chain[:2]).confirmed_appended) == ["a0"]  # b0 is a quorum over a0
    feed(linearizer, *chain[2:])
    assert full(linearizer) == ["a0", "b0", "c0", "a1", "b1"]


def test_branching_is_broken_by_key():
    # a0 - c0 - a1
    #    /
    # b0
    linearizer = replica(node("a0"), node("b0"), node("c0", "a0", "b0"), node("a1", "c0"))
    assert full(linearizer) == ["a0", "b0", "c0", "a1"]
    # Same nodes, the other arrival order: same order.
    other = replica(node("b0"), node("a0"), node("c0", "a0", "b0"), node("a1", "c0"))
    assert full(other) == full(linearizer) and other.confirmed == linearizer.confirmed


THREE_WRITER_DAG = [
    # a0   c0
    #  | X |
    # b0   a1
    #  | \ |
    # c1   b1
    #  | /
    # b2
    node("a0"), node("c0"), node("b0", "a0", "c0"), node("a1", "a0", "c0"),
    node("c1", "b0"), node("b1", "b0", "a1"), node("b2", "c1", "b1"),
]  # fmt: skip


def test_three_writer_dag_is_linearised_deterministically():
    assert full(replica(*THREE_WRITER_DAG)) == ["a0", "c0", "a1", "b0", "b1", "c1", "b2"]
    # Every causal arrival order gives the same full order.
    shuffled = [THREE_WRITER_DAG[i] for i in (1, 0, 3, 2, 5, 4, 6)]
    assert full(replica(*shuffled)) == ["a0", "c0", "a1", "b0", "b1", "c1", "b2"]


def test_writer_c_partial_view_of_the_three_writer_dag():
    c_view = replica(node("a0"), node("c0"), node("b0", "a0", "c0"), node("c1", "b0"))
    assert full(c_view) == ["a0", "c0", "b0", "c1"]
    whole = replica(*THREE_WRITER_DAG)
    # Views differ in their tentative tails, never in what they confirmed.
    shared = min(len(c_view.confirmed), len(whole.confirmed))
    assert c_view.confirmed[:shared] == whole.confirmed[:shared]


def test_quorum_degrees():
    #        2' quorum
    #            |
    # a0 - b0 - c0 - a1
    #      |         |
    #   1' quorum  3' quorum
    linearizer = replica(node("a0"), node("b0", "a0"), node("c0", "b0"), node("a1", "c0"), node("z0"))
    degree = linearizer.quorum_degree
    assert degree(b"a0", b"a0") == 0  # seen by a alone
    assert degree(b"a0", b"b0") == 1  # b0 forms a quorum over a0 (a and b referenced it)
    assert degree(b"a0", b"c0") == 2  # c0: b and c referenced the quorum at b0
    assert degree(b"a0", b"a1") == 3  # a1: a triple quorum
    assert degree(b"b0", b"a1") == 2
    assert degree(b"z0", b"a1") == -1  # never seen
    # Rounds are the same idea over the whole DAG: a node of round r+1 has
    # seen a quorum of round-r nodes.
    assert [linearizer.round_of(i) for i in (b"a0", b"b0", b"c0", b"a1")] == [0, 0, 1, 1]


def test_a_single_quorum_does_not_make_views_disagree():
    # writers {a < b < c}:   *a0  *c0        quorums: a0 <= {a, c}, c0 <= {b, c}
    #                          |  / |
    #                         c1    b0
    a_view = replica(node("a0"))
    b_view = replica(node("c0"), node("b0", "c0"))
    c_view = replica(node("a0"), node("c0"), node("c1", "a0", "c0"))
    assert full(b_view) == ["c0", "b0"] and b_view.confirmed == ()
    assert names(c_view.confirmed) == ["a0"] and full(c_view) == ["a0", "c0", "c1"]
    assert a_view.confirmed == ()
    # b's tentative view is rebased once it learns a0 and c1, never its confirmed prefix.
    rebase = b_view.add(node("a0"))
    assert rebase.rewind_to == 0 and names(rebase.tentative) == ["a0", "c0", "b0"]
    feed(b_view, node("c1", "a0", "c0"))
    assert names(b_view.confirmed) == ["a0"]


def test_consistent_ordering_b_and_c_order_a0_before_b0():
    # a0  b0       With a1, a sees a double quorum over a0 and may lock it in;
    # |   |        b and c, not knowing a1, must order a0 before b0 too.
    # c0  |
    # | \ |
    # a1  c1
    #     |
    #     b1
    a0, b0, c0 = node("a0"), node("b0"), node("c0", "a0")
    a_view = replica(a0, c0, node("a1", "c0"))
    bc_view = replica(a0, b0, c0, node("c1", "c0", "b0"), node("b1", "c1"))
    assert names(a_view.confirmed) == ["a0"]
    assert names(bc_view.confirmed) == ["a0"]
    # b and c keep cooperating without a: they confirm the rest, after a0.
    feed(bc_view, node("c2", "b1"), node("b2", "c2"), node("c3", "b2"))
    assert names(bc_view.confirmed) == ["a0", "b0", "c0", "c1", "b1", "c2", "b2"]
    # a learns everything: one confirmed order.
    rest = [node("c1", "c0", "b0"), node("b1", "c1"), node("c2", "b1"), node("b2", "c2"), node("c3", "b2")]
    feed(a_view, b0, *rest)
    shared = min(len(a_view.confirmed), len(bc_view.confirmed))
    assert a_view.confirmed[:shared] == bc_view.confirmed[:shared]


# The design's confirmation rule against the one implemented (docs/ordering.md,
# "The double-quorum rule"): same guarantees, rounds instead of degrees.


def test_higher_quorums_example_confirms_once_the_double_quorum_is_an_anchors_vote():
    # c0 - b0 - c1 (a silent). The design: b0 is a quorum over c0, c1 a double
    # quorum, so c0 and b0 may be ordered at c1. Rounds: c0, b0 = 0, c1 = 1:
    # the same degrees. Round 0's leader a is silent, so nothing is anchored
    # there; b and c carry on and b's round 2 anchor, once c votes, confirms
    # the same prefix, in the design's order.
    linearizer = Linearizer(ABC)
    feed(linearizer, node("c0"), node("b0", "c0"), node("c1", "b0"))
    assert linearizer.quorum_degree(b"c0", b"b0") == 1
    assert linearizer.quorum_degree(b"c0", b"c1") == 2
    assert [linearizer.round_of(i) for i in (b"c0", b"b0", b"c1")] == [0, 0, 1]
    assert linearizer.confirmed == ()
    feed(linearizer, node("b1", "c1"), node("c2", "b1"), node("b2", "c2"))
    assert linearizer.round_of(b"b2") == 2 and linearizer.confirmed == ()
    update = linearizer.add(node("c3", "b2"))  # c's vote for the anchor b2
    assert names(update.confirmed_appended) == ["c0", "b0", "c1", "b1", "c2", "b2"]


def test_a_node_every_indexer_has_moved_past_is_confirmed_by_the_next_anchor():
    # x (non-indexer) x0; a0, b0, c0 each reference x0 only: every indexer has
    # moved past x0 (the design's second condition), but none has seen another
    # indexer's node, so no anchor has a quorum of votes yet. One more round of
    # acknowledgements (each referencing all heads) commits a0 and with it x0.
    linearizer = Linearizer(ABC)
    feed(linearizer, node("x0"), node("a0", "x0"), node("b0", "x0"), node("c0", "x0"))
    assert linearizer.confirmed == ()
    feed(linearizer, node("a1", "a0", "b0", "c0"))
    update = linearizer.add(node("b1", "a0", "b0", "c0"))
    assert names(update.confirmed_appended) == ["x0", "a0"]


def test_caveat_competing_double_quorums_cannot_make_replicas_disagree():
    # The design's caveat: a double quorum is not enough when a competing
    # quorum exists that may have reached a double quorum unseen. Here one
    # replica sees a double quorum over b0 (c0 references b0, b1 references
    # c0) and none over a0; another sees a0's quorum {a, c} (c1) and a1 on it.
    # Rounds make the competition impossible: only round 0's leader (a) can be
    # anchored at round 0, and b's turn (round 2) comes after a0's votes, so
    # any anchor of b's that commits has seen a0.
    a0, b0, c0 = node("a0"), node("b0"), node("c0", "b0")
    b1, c1, a1 = node("b1", "b0", "c0"), node("c1", "c0", "a0"), node("a1", "a0", "c1")
    b_side = replica(b0, c0, b1)
    assert b_side.quorum_degree(b"b0", b"b1") == 2 and b_side.confirmed == ()
    a_side = replica(a0, b0, c0, c1, a1)
    assert a_side.quorum_degree(b"a0", b"a1") == 2
    assert names(a_side.confirmed) == ["a0"]  # a's vote and c's (c1, still round 0)
    # b learns everything and b, c carry on: a0 stays first.
    feed(b_side, a0, c1, a1, node("b2", "b1", "c1", "a1"), node("c2", "c1", "b2"))
    assert names(b_side.confirmed)[:1] == ["a0"]
    feed(a_side, b1, node("b2", "b1", "c1", "a1"), node("c2", "c1", "b2"))
    assert a_side.confirmed == b_side.confirmed
