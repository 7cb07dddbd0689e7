"""The tentative order: Kahn's algorithm, smallest (writer, seq) first, kept incrementally."""

from hypothesis import given, settings
from hypothesis import strategies as st

from node.core.order.topolist import TopoList, kahn
from node.core.order.values import sort_key

from .dag import names, node


def order_of(*nodes):
    by_id = {n.id: n for n in nodes}
    return names(tuple(kahn(by_id, lambda i: by_id[i].deps, lambda i: sort_key(by_id[i]))))


def test_kahn_takes_the_smallest_available_writer_key():
    # The design document's 3-writer DAG.
    dag = [
        node("a0"), node("c0"), node("b0", "a0", "c0"), node("a1", "a0", "c0"),
        node("c1", "b0"), node("b1", "b0", "a1"), node("b2", "c1", "b1"),
    ]  # fmt: skip
    assert order_of(*dag) == ["a0", "c0", "a1", "b0", "b1", "c1", "b2"]
    branching = [node("a0"), node("b0"), node("c0", "a0", "b0"), node("a1", "c0")]
    assert order_of(*branching) == ["a0", "b0", "c0", "a1"]


@st.composite
def dags(draw):
    """Random DAGs over 4 writers, in causal order, each writer a chain."""
    count = draw(st.integers(1, 18))
    made, tips = [], {}
    for _ in range(count):
        writer = draw(st.sampled_from("abcd"))
        earlier = [n.id.decode() for n in made]
        deps = set(draw(st.lists(st.sampled_from(earlier), max_size=3))) if made else set()
        if writer in tips:
            deps.add(tips[writer])
        seq = int(tips[writer][1:]) + 1 if writer in tips else 0
        made.append(node(f"{writer}{seq}", *sorted(deps)))
        tips[writer] = f"{writer}{seq}"
    return made


@settings(max_examples=150, deadline=None)
@given(dags())
def test_incremental_insertion_is_kahn_and_reports_the_shared_prefix(dag):
    by_id = {n.id: n for n in dag}
    topo = TopoList(lambda i: sort_key(by_id[i]))
    seen = []
    for n in dag:
        before = topo.snapshot()
        position = topo.insert(n.id, n.deps)
        seen.append(n)
        assert names(topo.snapshot()) == order_of(*seen)
        after = topo.snapshot()
        assert before[:position] == after[:position] and after[position] == n.id
