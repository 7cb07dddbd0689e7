"""The rules of `consensus`, one small DAG each, built so that the rule decides.

Each DAG gives two replicas different partial views; without the rule under
test their confirmed orders would contradict each other (mutation testing
confirmed each test fails when its rule is removed).
"""

from node.core.order import Linearizer

from .dag import feed, keys, names, node

ABC = keys("a", "b", "c")  # leaders: round 0 -> a, round 2 -> b, round 4 -> c


def replica(*nodes) -> Linearizer:
    linearizer = Linearizer(ABC)
    feed(linearizer, *nodes)
    return linearizer


def consistent(x: Linearizer, y: Linearizer) -> bool:
    shared = min(len(x.confirmed), len(y.confirmed))
    return x.confirmed[:shared] == y.confirmed[:shared]


# z is a non-indexer with the largest key: a single Kahn pass over a later
# anchor's past would put b0, c0, b1 before z0 and a0.
Z0, A0, C0, B0 = node("z0"), node("a0", "z0"), node("c0"), node("b0")
C1 = node("c1", "c0", "a0")  # c's vote for a0 (c was still in round 0)
B1 = node("b1", "b0", "c0")  # round 1 without having seen a0: b cannot vote for a0
A1 = node("a1", "a0", "b1")
B2 = node("b2", "b1", "a1")  # round 2, b's turn: the anchor of round 2
A2 = node("a2", "a1", "b2")  # a's vote for b2


def test_a_committed_anchor_is_ordered_before_a_later_one_that_skipped_it():
    #  z0 ─ a0 ──────── c1            one replica sees a0 committed by {a, c} at c1;
    #         \\                       the other never sees c1, so a0 has a's vote only,
    #  c0 ─── b1 ─ a1 ─ b2 ─ a2       and commits b2 (round 2) at a2 first. The walk
    #  b0 ──/                         down from b2 must still order a0's past first.
    first = replica(Z0, A0, C0, C1)
    assert names(first.confirmed) == ["z0", "a0"]
    second = replica(Z0, A0, C0, B0, B1, A1, B2)
    assert second.confirmed == ()
    update = second.add(A2)
    assert names(update.confirmed_appended) == ["z0", "a0", "b0", "c0", "b1", "a1", "b2"]
    assert consistent(first, second)


def test_a_vote_cast_after_moving_to_the_next_round_does_not_count():
    #  a0 ──────────── c2    c2: c's first node seeing a0, but c1 had made c round 1
    #  c0 ─ c1 ──────/
    #  b0 ─/ \\── b1 ─ b2 ─ a1    b2 (round 2, b's turn) never saw a0 and commits
    #                            with {b, a}; had c2 counted, a0 would be committed
    #                            too, and b2's replica would order without it.
    a0, b0, c0 = node("a0"), node("b0"), node("c0")
    c1 = node("c1", "c0", "b0")
    c_view = replica(a0, b0, c0, c1, node("c2", "c1", "a0"))
    assert c_view.confirmed == ()  # a0 has a's vote only
    b1 = node("b1", "b0", "c1")
    b2 = node("b2", "b1")
    b_view = replica(a0, b0, c0, c1, b1, b2, node("a1", "a0", "b2"))
    assert names(b_view.confirmed) == ["b0", "c0", "c1", "b1", "b2"]
    feed(c_view, b1, b2, node("a1", "a0", "b2"))
    assert consistent(c_view, b_view)


def test_rounds_count_the_strict_past():
    # A node's own vote does not lift its round: b0 alone over a0 is round 0
    # for two indexers, so a0 (round 0) and b0 (round 0) are both anchors'
    # candidates of round 0 and b0's reference is a vote.
    linearizer = Linearizer(keys("a", "b"))
    feed(linearizer, node("a0"), node("b0", "a0"))
    assert [linearizer.round_of(b"a0"), linearizer.round_of(b"b0")] == [0, 0]
    assert names(linearizer.confirmed) == ["a0"]
