"""Group commit in the graph: many events applied, one `commit()` (or `take_writes`).

What must hold: between commits the graph reads every event applied since
as present (the next batch is built on the last), the state after the last
commit equals the state one event at a time gives, it survives a reopen,
`discard_pending` after a commit forgets only what came after it, and the
write-sets of several topics merged into one transaction (what the node's
committer does every step) leave each topic as its own commit would.

(The first three were checked against a pipelined commit in a writer
thread, `begin_commit` / `wait_commit`, removed: they hold for the one
synchronous path.)
"""

import random

from node.core.outcomes import AddStatus
from node.core.pending import commit_writes, merge_writes
from node.replica.replica import Replica
from storage.memory import MemoryStore
from tests.core.test_graph import NOW_MS, graph_state, make_world
from tests.helpers import identity

WORLD_EVENTS = 120
COMMIT_EVERY = 7  # events per batch: several batches, some with buffered events


def test_out_of_order_ingest_with_group_commits_matches_one_at_a_time(store_factory):
    topic_id, events = make_world(11, count=WORLD_EVENTS)
    shuffled = events[:]
    random.Random(5).shuffle(shuffled)  # parents after children: the buffer fills and drains
    reference = Replica(MemoryStore(), topic_id, identity("ref"))
    for event in events:
        reference.receive(event.raw, NOW_MS)
        reference.commit()
    store = store_factory("batched")
    replica = Replica(store, topic_id, identity("x"))
    for n, event in enumerate(shuffled, 1):
        assert replica.receive(event.raw, NOW_MS).status in {AddStatus.APPLIED, AddStatus.BUFFERED}
        assert replica.graph.knows(event.id)  # committed or pending, it reads as present
        if n % COMMIT_EVERY == 0:
            replica.commit()
    replica.commit()
    assert replica.graph.pending_ops == 0
    assert graph_state(replica) == graph_state(reference)
    if store_factory.kind == "lmdb":  # durable: a new store on the same directory agrees
        store.close()
        replica = Replica(store_factory("batched"), topic_id, identity("x"))
        assert graph_state(replica) == graph_state(reference)


def test_publishing_on_top_of_committed_batches(store_factory):
    store = store_factory()
    origin = Replica.create_topic(store, identity("alice"), 1_000)
    rng = random.Random(1)
    published = []
    for batch in range(5):
        for n in range(COMMIT_EVERY):
            event, _ = origin.publish(b"%d" % n, 2_000 + batch * 100 + n, rng)
            published.append(event.id)
            assert origin.graph.parents_of(event.id) is not None
        origin.commit()  # the next batch's first event names this one's last
    assert origin.graph.extremities() == [published[-1]]
    assert [e.id for _, e in origin.graph.deliveries(1, limit=1_000)] == published
    if store_factory.kind == "lmdb":
        store.close()
        reopened = Replica(store_factory(), origin.topic_id, identity("alice"))
        assert reopened.graph.extremities() == [published[-1]]
        assert reopened.graph.author_latest_seq(identity("alice").public_key) == len(published)


def test_discard_after_a_commit_keeps_the_committed_batch(store_factory):
    store = store_factory()
    origin = Replica.create_topic(store, identity("alice"), 1_000)
    rng = random.Random(2)
    kept = [origin.publish(b"kept", 2_000 + n, rng)[0].id for n in range(COMMIT_EVERY)]
    origin.commit()
    dropped = origin.publish(b"dropped", 3_000, rng)[0].id
    origin.graph.discard_pending()  # e.g. a refused all-or-nothing publish rolled back
    assert origin.graph.has(kept[-1]) and not origin.graph.has(dropped)
    assert origin.graph.extremities() == [kept[-1]]
    again = origin.publish(b"again", 4_000, rng)[0]
    assert again.parents == (kept[-1],) and again.seq == len(kept) + 1
    origin.commit()


def test_write_sets_of_several_topics_commit_as_one(store_factory):
    store = store_factory()
    rng = random.Random(3)
    topics = [Replica.create_topic(store, identity(name), 1_000, commit=False)
              for name in ("alice", "bob", "carol")]
    for n, replica in enumerate(topics):
        for k in range(COMMIT_EVERY + n):
            replica.publish(b"%d" % k, 2_000 + k, rng)
    expected = [graph_state(r) for r in topics]
    before = store.commits
    count = commit_writes(store, merge_writes([r.graph.take_writes() for r in topics]))
    assert count > 0 and store.commits == before + 1  # one transaction for all three
    assert all(r.graph.pending_ops == 0 for r in topics)
    reread = [Replica(store, r.topic_id, identity("reader")) for r in topics]
    assert [graph_state(r) for r in reread] == expected
