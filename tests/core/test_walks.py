"""`Graph.not_below` continuations: always the full walk's answer, at the cost of one page.

The memo (node.core.walks) may only change what a query costs. So every
answer here is held against a brute-force one — the `limit` shallowest events
not below the heads, in (depth, id) order — over random DAGs, random page
sizes, and peers that also learn events elsewhere, lose heads or lag while
the graph grows.
"""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.core import delivery_pages, graph_walks
from node.core.event import KIND_MESSAGE
from node.core.graph import Graph
from node.core.identity import sign_event
from node.core.outcomes import AddStatus
from node.replica.replica import Replica
from node.core.walks import MAX_MEMO_EXTRA
from storage.memory import MemoryStore
from tests.core.test_graph import make_world
from tests.helpers import identity

NOW_MS = 10_000


def brute_not_below(graph: Graph, heads, limit: int) -> list[bytes]:
    everything = {e.id for _, e in graph.deliveries(limit=100_000)}
    below, stack = set(), [h for h in heads if graph.has(h)]
    while stack:
        current = stack.pop()
        if current not in below:
            below.add(current)
            stack.extend(graph.parents_of(current))
    missing = sorted((graph.depth(i), i) for i in everything - below)
    return [i for _, i in missing[:limit]]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), page=st.integers(1, 12), start=st.integers(1, 60),
       chaos=st.integers(0, 10_000))
def test_continuations_always_give_the_full_walks_answer(seed, page, start, chaos):
    topic_id, events = make_world(seed, count=80)
    rng = random.Random(chaos)
    full = Replica(MemoryStore(), topic_id, identity("full"))
    known = min(len(events), start + 20)
    for event in events[:known]:
        full.receive(event.raw, NOW_MS)
    peer = Replica(MemoryStore(), topic_id, identity("peer"))
    for event in events[: rng.randint(1, start)]:
        peer.receive(event.raw, NOW_MS)
    since: list[bytes] = []
    for _ in range(60):
        heads = peer.graph.extremities()
        roll = rng.random()
        if roll < 0.1 and len(heads) > 1:
            heads = heads[: rng.randint(1, len(heads) - 1)]  # a wide peer offers a subset
        elif roll < 0.2:
            since = [rng.choice(heads)]  # Algorithm 2's common heads ride along
        query = heads + since
        answer = full.graph.not_below(query, limit=page)
        assert answer == brute_not_below(full.graph, query, page)
        for event_id in answer:  # parents first: nothing waits (a subset of heads gets extra)
            status = peer.receive(full.graph.get(event_id).raw, NOW_MS).status
            assert status in {AddStatus.APPLIED, AddStatus.DUPLICATE}
        roll = rng.random()
        if roll < 0.2 and known < len(events):  # the graph grows meanwhile
            for event in events[known: known + rng.randint(1, 5)]:
                full.receive(event.raw, NOW_MS)
            known = min(len(events), known + 5)
        elif roll < 0.3:  # the peer learns something from someone else
            extra = rng.choice(events[:known])
            for event in events[:known]:
                if event.id == extra.id or rng.random() < 0.1:
                    peer.receive(event.raw, NOW_MS)
        elif roll < 0.35:
            full.graph.discard_pending() if rng.random() < 0.5 else full.commit()
    assert full.graph._memo.hits + full.graph._memo.misses > 0


def chain(length: int):
    """A topic with one writer appending `length` events, each on the previous."""
    origin = Replica.create_topic(MemoryStore(), identity("alice"), 1_000)
    graph = origin.graph
    writer = identity("bob")
    parent = origin.topic_id
    for seq in range(1, length + 1):
        event = sign_event(writer, topic=origin.topic_id, seq=seq, parents=[parent],
                           timestamp_ms=2_000, kind=KIND_MESSAGE, auth=(origin.topic_id,))
        assert graph.add(event).status is AddStatus.APPLIED
        parent = event.id
    return origin


def counting_lookups(graph: Graph) -> list[int]:
    calls = [0]
    node = graph._node

    def counted(event_id):
        calls[0] += 1
        return node(event_id)

    graph._node = counted  # type: ignore[method-assign]
    return calls


def test_a_long_catch_up_costs_one_walk_not_one_per_page():
    length, page = 3_000, 100
    origin = chain(length)
    graph = origin.graph
    lookups = counting_lookups(graph)
    heads, received = [origin.topic_id], 0
    while True:
        answer = graph.not_below(heads, limit=page)
        if not answer:
            break
        received += len(answer)
        heads = [answer[-1]]  # the peer applied the page: its head is the last event
    assert received == length
    # One full walk (about two lookups per event) plus a page's worth per
    # continuation; without the memo each page re-walked the remaining gap
    # (about length^2 / page = 90,000 lookups here).
    assert lookups[0] < 4 * length
    assert graph._memo.hits == length // page  # every query after the first (and the last, empty)


def test_a_growing_graph_keeps_the_memo_useful():
    origin = chain(500)
    graph = origin.graph
    heads = [origin.topic_id]
    answer = graph.not_below(heads, limit=50)
    writer = identity("carol")
    newest = graph.extremities()[0]
    extra = sign_event(writer, topic=origin.topic_id, seq=1, parents=[newest],
                       timestamp_ms=2_000, kind=KIND_MESSAGE, auth=(origin.topic_id,))
    graph.add(extra)
    head = answer[-1]
    answer = graph.not_below([head], limit=1_000)
    assert graph._memo.hits == 1  # the new event joined the memo: no fresh walk
    assert answer == brute_not_below(graph, [head], 1_000)
    assert len(answer) == 450 + 1 and answer[-1] == extra.id


def test_memos_stay_bounded():
    origin = chain(200)
    graph = origin.graph
    graph.not_below([origin.topic_id], limit=10)
    assert graph._memo.memos
    writer = identity("carol")
    parent = graph.extremities()[0]
    for seq in range(1, MAX_MEMO_EXTRA + 2):  # more new events than a memo tracks
        event = sign_event(writer, topic=origin.topic_id, seq=seq, parents=[parent],
                           timestamp_ms=2_000, kind=KIND_MESSAGE, auth=(origin.topic_id,))
        graph.add(event)
        parent = event.id
    assert not graph._memo.memos  # dropped: the next query walks afresh
    assert len(graph.not_below([origin.topic_id], limit=5)) == 5


def test_recent_keeps_whole_levels_and_raises_the_floor():
    topic_id, events = make_world(5, count=60)
    replica = Replica(MemoryStore(), topic_id, identity("x"))
    for event in events:
        replica.receive(event.raw, NOW_MS)
    graph = replica.graph
    ids, covered = graph.recent((), 0, 10)
    depths = {graph.depth(i) for i in ids}
    assert len(ids) <= 10 and min(depths) == covered
    everything_above = {e.id for e in events if graph.depth(e.id) >= covered}
    assert set(ids) == everything_above


WALK_TEST_BOUND = 50  # graph_walks.MAX_WALK, scaled down from 100,000


def catch_up(source: Replica, target: Replica, page: int, rounds: int = 300) -> list[str]:
    """`target` asks `source` for what it lacks, page by page, applying each; the statuses."""
    statuses: list[str] = []
    for _ in range(rounds):
        answer = source.graph.not_below(target.graph.extremities(), limit=page)
        if not answer:
            return statuses
        assert len(answer) <= page
        for event_id in answer:
            statuses.append(target.receive(source.graph.get(event_id).raw, NOW_MS).status)
    raise AssertionError("the catch-up did not end")


def test_a_peer_lagging_beyond_the_walk_bound_gets_pages_it_can_apply(monkeypatch):
    # Regression: a walk stopped at MAX_WALK holds the *deepest* missing
    # events, and its "shallowest ten" were all buffered by the peer.
    monkeypatch.setattr(graph_walks, "MAX_WALK", WALK_TEST_BOUND)
    origin = chain(120)
    peer = Replica(MemoryStore(), origin.topic_id, identity("peer"))
    peer.receive(origin.graph.get(origin.topic_id).raw, NOW_MS)
    statuses = catch_up(origin, peer, page=10)
    assert statuses == [AddStatus.APPLIED] * 120
    assert peer.graph.extremities() == origin.graph.extremities()
    assert origin.graph._memo.paged > 0  # the delivery-order pages were used ...
    assert origin.graph._memo.misses >= 1  # ... until the lag fit a walk again


def test_a_peer_that_knows_nothing_is_paged_from_the_root(monkeypatch):
    monkeypatch.setattr(graph_walks, "MAX_WALK", WALK_TEST_BOUND)
    origin = chain(120)
    answer = origin.graph.not_below([], limit=10)
    assert answer == [e.id for _, e in origin.graph.deliveries(limit=10)]


def down_closed_subset(events, rng: random.Random, keep: float) -> list:
    """Events (in causal order) each kept with probability `keep` if its parents were."""
    kept, ids = [], set()
    for event in events:
        if (not event.parents or all(p in ids for p in event.parents)) and rng.random() < keep:
            kept.append(event)
            ids.add(event.id)
    return kept


def test_a_peer_back_from_a_partition_catches_up_in_pages(monkeypatch):
    # The peer wrote on an old head while cut off, and its events reached the
    # origin last: at the end of the origin's delivery order, above the 115
    # events the peer lacks.
    monkeypatch.setattr(graph_walks, "MAX_WALK", WALK_TEST_BOUND)
    origin = chain(120)
    peer = Replica(MemoryStore(), origin.topic_id, identity("peer"))
    for _, event in origin.graph.deliveries(limit=6):  # the root and bob's first five
        peer.receive(event.raw, NOW_MS)
    parent = peer.graph.extremities()[0]
    for seq in range(1, 9):
        own = sign_event(identity("peer"), topic=origin.topic_id, seq=seq, parents=[parent],
                         timestamp_ms=2_000, kind=KIND_MESSAGE, auth=(origin.topic_id,))
        assert peer.graph.add(own).status is AddStatus.APPLIED
        assert origin.receive(own.raw, NOW_MS).status is AddStatus.APPLIED
        parent = own.id
    statuses = catch_up(origin, peer, page=10)
    assert statuses == [AddStatus.APPLIED] * 115
    assert peer.graph.extremities() == origin.graph.extremities()
    assert origin.graph._memo.paged > 0


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), bound=st.integers(1, 60), page=st.integers(1, 12),
       keep=st.floats(0.0, 1.0), pick=st.integers(0, 10_000))
def test_every_page_applies_in_order_whatever_the_walk_bound(seed, bound, page, keep, pick):
    with pytest.MonkeyPatch.context() as patch:  # one patch per example
        patch.setattr(graph_walks, "MAX_WALK", bound)
        check_pages_apply(seed, page, keep, pick)


def check_pages_apply(seed: int, page: int, keep: float, pick: int) -> None:
    """Every page applies in order. (Bounded work per query may leave a page
    short, or empty, on these small graphs with forks from anywhere: then
    the catch-up stops early, and only what was sent is checked.)"""
    topic_id, events = make_world(seed, count=80)
    full = Replica(MemoryStore(), topic_id, identity("full"))
    for event in events:
        full.receive(event.raw, NOW_MS)
    peer = Replica(MemoryStore(), topic_id, identity("peer"))
    for event in down_closed_subset(events, random.Random(pick), keep):
        assert peer.receive(event.raw, NOW_MS).status is AddStatus.APPLIED
    statuses = catch_up(full, peer, page)
    # Only what it lacked, each applicable when it came: nothing waits, nothing twice.
    assert statuses == [AddStatus.APPLIED] * len(statuses)


def test_delivery_order_pages_are_valid_for_any_heads():
    # `page_by_position` itself, with heads that are not a peer's extremities
    # (a subset, or ancestors of one another): every event is missing, and its
    # parents are below the heads or earlier in the page.
    topic_id, events = make_world(3, count=80)
    full = Replica(MemoryStore(), topic_id, identity("full"))
    for event in events:
        full.receive(event.raw, NOW_MS)
    graph = full.graph
    log = delivery_pages.DeliveryLog(graph._locate, graph._at, graph.delivered_count)
    rng = random.Random(9)
    for _ in range(200):
        heads = {e.id for e in rng.sample(events, rng.randint(0, 4))}
        budget, limit = rng.choice([1, 5, 20, 1_000]), rng.randint(1, 30)
        page = delivery_pages.page_by_position(log, heads, limit, budget)
        below = brute_below(graph, heads)
        sent: set[bytes] = set()
        for event_id in page:
            assert event_id not in below and event_id not in sent
            assert all(p in below or p in sent for p in graph.parents_of(event_id))
            sent.add(event_id)
        if budget == 1_000:  # enough to see everything: a full page if that many are missing
            assert len(page) == min(limit, len(events) - len(below))


def brute_below(graph: Graph, heads) -> set[bytes]:
    below, stack = set(), list(heads)
    while stack:
        current = stack.pop()
        if current not in below:
            below.add(current)
            stack.extend(graph.parents_of(current))
    return below
