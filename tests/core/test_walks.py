"""`Graph.not_below` continuations: always the full walk's answer, at the cost of one page.

The memo (node.core.walks) may only change what a query costs. So every
answer here is held against a brute-force one — the `limit` shallowest events
not below the heads, in (depth, id) order — over random DAGs, random page
sizes, and peers that also learn events elsewhere, lose heads or lag while
the graph grows.
"""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from node.core.event import KIND_MESSAGE
from node.core.graph import Graph
from node.core.identity import sign_event
from node.core.replica import Replica
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
            assert status in {"applied", "duplicate"}
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
        assert graph.add(event).status == "applied"
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
