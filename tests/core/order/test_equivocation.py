"""An equivocating indexer: two nodes with one (writer, seq).

The rule (see `consensus`, "Forks"): whether a node votes or anchors is a
fact of its own past, never of which siblings this replica has received.
A vote for an anchor does not count when the voting node has seen a fork of
the anchor's writer at or below the anchor's seq (so an honest indexer votes
for one candidate of a round at most); a candidate anchor is a leader node
whose past shows no fork of the leader. A replica that holds one sibling and
a replica that holds both therefore count the same votes.
"""

from node.core.order import Linearizer

from .dag import feed, keys, names, node

ABC = keys("a", "b", "c")
ABCD = keys("a", "b", "c", "d")


def test_a_vote_counts_alike_whether_or_not_the_replica_has_the_voters_sibling():
    # b0 and b0' are both b's node 0. b0 references a0, b0' does not.
    unaware = Linearizer(ABC)
    feed(unaware, node("a0"))
    assert names(unaware.add(node("b0", "a0")).confirmed_appended) == ["a0"]  # b's vote counted

    aware = Linearizer(ABC)
    feed(aware, node("a0"))
    update = aware.extend([node("b0", "a0"), node("b0'")])
    assert names(update.confirmed_appended) == ["a0"]  # b0's past shows no fork of a: same vote


def test_a_forked_leader_committed_where_one_sibling_is_known_is_committed_alike_where_both_are():
    # Four indexers, quorum 3. The leader a forks at seq 0; b and c vote for
    # a0', d saw a0. One replica never receives a0 nor d0, another has all.
    dag = {n.id.decode(): n for n in (
        node("a0"), node("a0'"), node("b0", "a0'"), node("c0", "a0'"), node("d0", "a0"))}
    one_sibling = Linearizer(ABCD)
    feed(one_sibling, dag["a0'"], dag["b0"])
    assert names(one_sibling.add(dag["c0"]).confirmed_appended) == ["a0'"]

    both = Linearizer(ABCD)
    feed(both, dag["a0"], dag["d0"], dag["a0'"], dag["b0"])
    # a0 has the votes of a and d only; a0' reaches a quorum with c0. The
    # former rule voided both (the fork is known here) and later confirmed
    # a0 first: this replica would have disagreed with the other at position 0.
    assert names(both.add(dag["c0"]).confirmed_appended) == ["a0'"]


def test_a_node_that_has_seen_both_siblings_votes_for_neither():
    # c0 sees a0 and a0': it cannot vote; with b0 for a0 that leaves a0 with
    # a and b, one short of quorum 3 of 4 (d never voted).
    linearizer = Linearizer(ABCD)
    linearizer.extend([node("a0"), node("a0'")])
    feed(linearizer, node("b0", "a0"))
    assert linearizer.add(node("c0", "a0", "a0'")).confirmed_appended == ()
    assert names(linearizer.add(node("d0", "a0")).confirmed_appended) == ["a0"]


def test_a_forked_leader_anchors_nothing_and_both_siblings_are_ordered_by_id():
    # a0 and a0' fork a at seq 0 and b, c saw both: their votes do not count,
    # round 0 (a's turn) commits nothing; round 2 (b's) confirms everything,
    # siblings in id order.
    linearizer = Linearizer(ABC)
    linearizer.extend([node("a0"), node("a0'")])
    feed(linearizer, node("b0", "a0", "a0'"), node("c0", "a0", "a0'"))
    feed(linearizer, node("b1", "b0", "c0"), node("c1", "b0", "c0"))
    feed(linearizer, node("b2", "b1", "c1"), node("c2", "b1", "c1"))
    assert linearizer.confirmed == ()
    update = linearizer.add(node("c3", "b2", "c2"))
    assert names(update.confirmed_appended) == ["a0", "a0'", "b0", "c0", "b1", "c1", "b2"]


FORKED_DAG = [
    # a forks at seq 1: a1 has seen b0, a1' has not. b follows a1, c follows a1'.
    node("a0"), node("b0"), node("c0"),
    node("a1", "a0", "b0"), node("a1'", "a0"),
    node("b1", "b0", "a1"), node("c1", "c0", "a1'"),
    node("b2", "b1", "c1"), node("c2", "b1", "c1"),
    node("b3", "b2", "c2"), node("c3", "b2", "c2"),
    node("b4", "b3", "c3"), node("c4", "b3", "c3"),
]  # fmt: skip


def deliver(order: list[str]) -> Linearizer:
    by_name = {n.id.decode(): n for n in FORKED_DAG}
    linearizer = Linearizer(ABC)
    for name in order:
        if name == "a1":  # the siblings travel together, in either order
            linearizer.extend([by_name["a1"], by_name["a1'"]])
        elif name == "a1'":
            linearizer.extend([by_name["a1'"], by_name["a1"]])
        else:
            linearizer.add(by_name[name])
    return linearizer


def test_replicas_agree_on_a_forked_dag_whatever_the_arrival_order():
    first = deliver(["a0", "b0", "c0", "a1", "b1", "c1", "b2", "c2", "b3", "c3", "b4", "c4"])
    second = deliver(["c0", "b0", "a0", "a1'", "c1", "b1", "c2", "b2", "c3", "b3", "c4", "b4"])
    assert first.confirmed == second.confirmed and first.tentative == second.tentative
    confirmed = names(first.confirmed)
    assert {"a1", "a1'"} <= set(confirmed)
    assert confirmed.index("a0") < min(confirmed.index("a1"), confirmed.index("a1'"))


def test_a_forked_leader_round_waits_until_it_can_be_decided():
    # Four indexers, quorum 3; one equivocator tolerated (two quorums share
    # two indexers). Leader a forks: a0' is voted for by a, b and c and
    # committed where {a0', b0, c0} is known. Another replica sees both
    # siblings (d voted a0) and b's round 2 anchor b2, committed by a and d,
    # without c0: in b2's past a0' and a0 have two votes each and c may still
    # vote. Picking either would be a guess (a tie by id once chose a0 and
    # split the replicas), so b2 waits; once c0 arrives a0' has its quorum.
    a0, a0p = node("a0"), node("a0'")
    b0, c0, d0 = node("b0", "a0'"), node("c0", "a0'"), node("d0", "a0")
    first = Linearizer(ABCD)
    first.extend([a0p])
    feed(first, b0)
    assert names(first.add(c0).confirmed_appended) == ["a0'"]

    second = Linearizer(ABCD)
    second.extend([a0, a0p])
    feed(second, b0, d0, node("a1'", "a0'", "b0", "d0", writer="a"),
         node("b1", "b0", "d0", "a0'"), node("d1", "d0", "b0", "a0'"))
    feed(second, node("b2", "b1", "d1", "a1'"), node("d2", "d1", "b2"), node("a2", "a1'", "b2"))
    assert second.round_of(b"b2") == 2 and second.confirmed == ()  # undecided: waits
    second.add(c0)
    feed(second, node("c1", "c0", "b1", "d1", "a1'"), node("c2", "c1", "b2"))
    assert second.confirmed[:1] == first.confirmed


def test_the_limit_one_equivocator_among_three_indexers_can_split_replicas():
    """The documented limit (docs/ordering.md, "The limit"), pinned.

    With n = 3 indexers the quorum is 2, and two quorums share 2q - n = 1
    indexer; if that one equivocates, nothing ties them together. c signs c0
    on a0 for one replica and c0' without it for another: the first must
    confirm a0 (b may have crashed), the second must confirm what b and c'
    build (a may have crashed). No rule with majority quorums avoids this in
    an asynchronous network; with n = 4 the quorums share 2 indexers and one
    equivocator is tolerated (the simulation sweeps run there).
    """
    x = Linearizer(ABC)
    feed(x, node("a0"))
    assert names(x.add(node("c0", "a0")).confirmed_appended) == ["a0"]

    y = Linearizer(ABC)  # b and c' build rounds without a
    feed(y, node("c0'"), node("b0", "c0'"), node("b1", "b0"), node("c1'", "b0", "c0'"),
         node("b2", "b1", "c1'"), node("c2'", "b1", "c1'"), node("b3", "b2", "c2'"),
         node("c3'", "b2", "c2'"), node("b4", "b3", "c3'"), node("c4'", "b3", "c3'"))
    assert names(y.confirmed)[:2] == ["c0'", "b0"]  # x put a0 first: the replicas disagree
