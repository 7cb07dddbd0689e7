"""The pipelined group commit: `begin_commit` / `wait_commit` on both stores.

What must hold: while a batch is being written the graph reads it as if it
were committed (the next batch is built on it), the state after the last
wait equals the state synchronous commits give, it survives a reopen, and
`discard_pending` during a commit forgets only what came after it.
"""

import random

from node.replica.replica import Replica
from storage.memory import MemoryStore
from tests.core.test_graph import NOW_MS, graph_state, make_world
from tests.helpers import identity

WORLD_EVENTS = 120
COMMIT_EVERY = 7  # events per pipelined batch: several batches, some with buffered events


def test_out_of_order_ingest_with_pipelined_commits_matches_sync_commits(store_factory):
    topic_id, events = make_world(11, count=WORLD_EVENTS)
    shuffled = events[:]
    random.Random(5).shuffle(shuffled)  # parents after children: the buffer fills and drains
    reference = Replica(MemoryStore(), topic_id, identity("ref"))
    for event in events:
        reference.receive(event.raw, NOW_MS)
    store = store_factory("pipelined")
    replica = Replica(store, topic_id, identity("x"))
    for n, event in enumerate(shuffled, 1):
        assert replica.receive(event.raw, NOW_MS).status in {"applied", "buffered"}
        assert replica.graph.knows(event.id)  # earlier batches, in flight or not, read as present
        if n % COMMIT_EVERY == 0:
            replica.begin_commit()
    replica.begin_commit()
    replica.wait_commit()
    assert replica.graph.pending_ops == 0
    assert graph_state(replica) == graph_state(reference)
    if store_factory.kind == "lmdb":  # durable: a new store on the same directory agrees
        store.close()
        replica = Replica(store_factory("pipelined"), topic_id, identity("x"))
        assert graph_state(replica) == graph_state(reference)


def test_publishing_on_top_of_a_batch_in_flight(store_factory):
    store = store_factory()
    origin = Replica.create_topic(store, identity("alice"), 1_000)
    rng = random.Random(1)
    published = []
    for batch in range(5):
        for n in range(COMMIT_EVERY):
            event, _ = origin.publish(b"%d" % n, 2_000 + batch * 100 + n, rng)
            published.append(event.id)
            assert origin.graph.parents_of(event.id) is not None
        origin.begin_commit()  # the next batch's first event names this one's last
    origin.wait_commit()
    assert origin.graph.extremities() == [published[-1]]
    assert [e.id for _, e in origin.graph.deliveries(1, limit=1_000)] == published
    if store_factory.kind == "lmdb":
        store.close()
        reopened = Replica(store_factory(), origin.topic_id, identity("alice"))
        assert reopened.graph.extremities() == [published[-1]]
        assert reopened.graph.author_latest_seq(identity("alice").public_key) == len(published)


def test_discard_during_a_commit_keeps_the_batch_in_flight(store_factory):
    store = store_factory()
    origin = Replica.create_topic(store, identity("alice"), 1_000)
    rng = random.Random(2)
    kept = [origin.publish(b"kept", 2_000 + n, rng)[0].id for n in range(COMMIT_EVERY)]
    origin.begin_commit()
    dropped = origin.publish(b"dropped", 3_000, rng)[0].id
    origin.graph.discard_pending()  # e.g. a refused all-or-nothing publish rolled back
    assert origin.graph.has(kept[-1]) and not origin.graph.has(dropped)
    assert origin.graph.extremities() == [kept[-1]]
    origin.wait_commit()  # nothing left in flight: returns at once
    again = origin.publish(b"again", 4_000, rng)[0]
    assert again.parents == (kept[-1],) and again.seq == len(kept) + 1
    origin.commit()
