"""The tentative order: Kahn's algorithm, smallest (writer, seq) first, kept incrementally."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.core.order import topolist
from node.core.order.topolist import TopoList, kahn
from node.core.order.values import OrderNode, sort_key

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


def _reference_insert(ids: list[bytes], keys: dict[bytes, tuple], new: bytes,
                      deps: tuple[bytes, ...]) -> int:
    """The scan as first written (a Python loop): the fast path must place nodes the same."""
    position = max((ids.index(dep) + 1 for dep in set(deps)), default=0)
    while position < len(ids) and not keys[new] < keys[ids[position]]:
        position += 1
    return position


def _write(by_id: dict[bytes, OrderNode], tips: dict[bytes, bytes], writer: bytes,
           deps: set[bytes], step: int) -> OrderNode:
    """`writer`'s next node on `deps` and its own previous node (a writer's nodes are a
    chain), recorded in `by_id` and `tips`."""
    if writer in tips:
        deps.add(tips[writer])
    seq = by_id[tips[writer]].seq + 1 if writer in tips else 0
    new = OrderNode(b"%s-%d-%d" % (writer, seq, step), writer, seq, tuple(sorted(deps)))
    by_id[new.id] = new
    tips[writer] = new.id
    return new


@pytest.mark.parametrize("block", [1, 3, topolist.TOPO_BLOCK])
def test_insertion_matches_the_reference_scan_on_wide_seeded_dags(block, monkeypatch):
    # A join storm in miniature: many writers, most nodes referencing a few old ones,
    # so new nodes land anywhere in a long tail (what the blocks were built for); small
    # blocks split often.
    import random

    monkeypatch.setattr(topolist, "TOPO_BLOCK", block)
    for seed in range(20):
        rng = random.Random(seed)
        by_id: dict[bytes, OrderNode] = {}
        tips: dict[bytes, bytes] = {}
        topo = TopoList(lambda i: sort_key(by_id[i]))
        reference: list[bytes] = []
        reference_keys: dict[bytes, tuple] = {}
        for step in range(250):
            writer = b"w%02d" % rng.randrange(40)
            deps = set(rng.sample(sorted(by_id), min(len(by_id), rng.randrange(4))))
            new = _write(by_id, tips, writer, deps, step)
            reference_keys[new.id] = sort_key(new)
            expected = _reference_insert(reference, reference_keys, new.id, new.deps)
            reference.insert(expected, new.id)
            assert topo.insert(new.id, new.deps) == expected, (seed, step)
            if step % 50 == 49:  # a rebuild (as after a confirmation) keeps the same list
                topo.rebuild(list(topo), lambda i: by_id[i].deps)
        assert list(topo) == reference and topo.snapshot() == tuple(reference)
        assert len(topo) == len(reference)
        assert reference == kahn(by_id, lambda i: by_id[i].deps, lambda i: sort_key(by_id[i]))


def _past(by_id: dict[bytes, OrderNode], anchor: bytes, listed: set[bytes]) -> set[bytes]:
    """The anchor and its listed ancestors: a set closed under dependencies (a batch)."""
    past, stack = {anchor}, [anchor]
    while stack:
        for dep in by_id[stack.pop()].deps:
            if dep in listed and dep not in past:
                past.add(dep)
                stack.append(dep)
    return past


def _arrive(rng, topo: TopoList, by_id: dict[bytes, OrderNode], tips: dict[bytes, bytes],
            children: dict[bytes, list[bytes]], writer: bytes, step: int) -> None:
    """One node of `writer` arrives in a seeded tail: 1-3 dependencies, nine times in ten
    among the listed (unconfirmed) nodes, and goes in with its listed ones."""
    listed = set(topo)
    pool = sorted(listed) if listed and rng.random() < 0.9 else sorted(by_id)
    deps = set(rng.sample(pool, min(len(pool), rng.randrange(1, 4)))) if pool else set()
    new = _write(by_id, tips, writer, deps, step)
    open_deps = [d for d in new.deps if d in listed]
    for dep in open_deps:
        children[dep].append(new.id)
    children[new.id] = []
    topo.insert(new.id, open_deps)


@pytest.mark.parametrize("block", [1, 3, topolist.TOPO_BLOCK])
def test_removing_a_confirmed_batch_gives_kahn_over_the_rest(block, monkeypatch):
    # Seeded wide DAGs, as a tail under confirmations: nodes arrive, and now and then
    # the past of a random listed node leaves (confirmed); `remove` must leave exactly
    # the list `kahn` builds from scratch over what remains.
    import random

    monkeypatch.setattr(topolist, "TOPO_BLOCK", block)
    for seed in range(30):
        rng = random.Random(seed)
        by_id: dict[bytes, OrderNode] = {}
        tips: dict[bytes, bytes] = {}
        children: dict[bytes, list[bytes]] = {}
        topo = TopoList(lambda i: sort_key(by_id[i]))
        writers = rng.choice([3, 10, 40])
        for step in range(300):
            _arrive(rng, topo, by_id, tips, children, b"w%02d" % rng.randrange(writers), step)
            if rng.random() < 0.08 and len(topo) > 1:
                listed = set(topo)
                gone: set[bytes] = set()
                for anchor in rng.sample(sorted(listed), rng.randint(1, 2)):
                    gone |= _past(by_id, anchor, listed)
                rest = listed - gone
                topo.remove(gone, lambda i: by_id[i].deps, children.__getitem__)
                expected = kahn(rest, lambda i: by_id[i].deps, lambda i: sort_key(by_id[i]))
                assert list(topo) == expected and topo.snapshot() == tuple(expected), (seed, step)
                assert len(topo) == len(expected)
                for node_id in gone:
                    del children[node_id]
        # Insertion after removals still agrees with the reference.
        listed = set(topo)
        assert list(topo) == kahn(listed, lambda i: by_id[i].deps, lambda i: sort_key(by_id[i]))


@settings(max_examples=150, deadline=None)
@given(dags(), st.data())
def test_remove_is_kahn_over_the_rest_on_random_dags(dag, data):
    by_id = {n.id: n for n in dag}
    topo = TopoList(lambda i: sort_key(by_id[i]))
    children: dict[bytes, list[bytes]] = {n.id: [] for n in dag}
    for n in dag:
        topo.insert(n.id, n.deps)
        for dep in n.deps:
            children[dep].append(n.id)
    anchor = data.draw(st.sampled_from([n.id for n in dag]))
    listed = set(by_id)
    gone = _past(by_id, anchor, listed)
    topo.remove(gone, lambda i: by_id[i].deps, children.__getitem__)
    rest = listed - gone
    assert list(topo) == kahn(rest, lambda i: by_id[i].deps, lambda i: sort_key(by_id[i]))


@pytest.mark.parametrize("block", [1, 3, topolist.TOPO_BLOCK])
def test_snapshots_never_change_and_answer_as_tuples(block, monkeypatch):
    # A snapshot shares the list's blocks (copy on write: `TailView`): every snapshot
    # taken must still equal the tuple it was, after insertions, block splits and
    # removals (which rebuild the blocks), and answer indexing, slices, `index`, `in` and `+` as
    # that tuple does.
    import random

    monkeypatch.setattr(topolist, "TOPO_BLOCK", block)
    for seed in range(12):
        rng = random.Random(seed)
        by_id: dict[bytes, OrderNode] = {}
        tips: dict[bytes, bytes] = {}
        children: dict[bytes, list[bytes]] = {}
        topo = TopoList(lambda i: sort_key(by_id[i]))
        taken: list[tuple[topolist.TailView, tuple[bytes, ...]]] = []
        for step in range(200):
            _arrive(rng, topo, by_id, tips, children, b"w%02d" % rng.randrange(8), step)
            if rng.random() < 0.05 and len(topo) > 1:
                listed = set(topo)
                gone = _past(by_id, rng.choice(sorted(listed)), listed)
                topo.remove(gone, lambda i: by_id[i].deps, children.__getitem__)
            if rng.random() < 0.3:
                view = topo.snapshot()
                taken.append((view, tuple(topo)))
        for view, was in taken:
            assert view == was and len(view) == len(was) and tuple(view) == was, seed
            if not was:
                continue
            at = rng.randrange(len(was))
            assert view[at] == was[at] and view[-1] == was[-1]
            start, stop = sorted(rng.sample(range(len(was) + 1), 2))
            assert view[start:stop] == was[start:stop] and view[start:] == was[start:]
            assert view.index(was[at]) == at and was[at] in view
            assert view.index(was[at], at, len(was)) == at
            with pytest.raises(ValueError):
                view.index(was[at], at + 1, len(was))
            assert view + (b"x",) == was + (b"x",) and (b"x",) + view == (b"x",) + was
            assert tuple(reversed(view)) == tuple(reversed(was))
