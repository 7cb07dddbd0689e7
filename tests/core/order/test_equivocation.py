"""An equivocating indexer: two nodes with one (writer, seq).

The rule (see `consensus`): from its lowest forked seq on, an indexer's
nodes neither vote nor anchor; its earlier nodes still do; all its nodes are
ordered, siblings by id. Replicas that know of the fork apply it alike, so
the fork's siblings are delivered together (`extend`).
"""

from node.core.order import Linearizer

from .dag import feed, keys, names, node

ABC = keys("a", "b", "c")


def test_votes_from_a_forked_seq_do_not_count():
    # b0 and b0' are both b's node 0. b0 references a0, b0' does not.
    unaware = Linearizer(ABC)
    feed(unaware, node("a0"))
    assert names(unaware.add(node("b0", "a0")).confirmed_appended) == ["a0"]  # b's vote counted

    aware = Linearizer(ABC)
    feed(aware, node("a0"))
    update = aware.extend([node("b0", "a0"), node("b0'")])
    assert update.confirmed_appended == ()  # b's vote is void: a alone is no quorum
    assert names(aware.add(node("c0", "a0")).confirmed_appended) == ["a0"]  # honest quorum {a, c}


def test_a_forked_leader_anchors_nothing_and_both_siblings_are_ordered_by_id():
    # a0 and a0' fork a at seq 0: round 0 (a's turn) has no anchor, round 2
    # (b's) confirms everything, siblings in id order.
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
