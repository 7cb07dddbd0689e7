"""The engine side of group commit (`Disseminator.on_batch`) and bounded push forwarding.

Engines wired by hand over memory stores (whose `commits` counter counts
transactions). `on_batch` must commit each touched topic once, after all of
its frames, and return no effect before that; a relay forwards an event it
first received by push once, to `forward_fanout` peers, never back.
"""

from __future__ import annotations

import random

from node.core.event import Event
from node.replica.replica import Replica, ReplicaConfig
from storage.memory import MemoryStore
from tests.transport.pair import PAIR_NOW_MS, identity
from transport.dissemination import Disseminator
from transport.dissemination_config import DisseminationConfig
from transport.effects import Effect, Log, Send
from transport.messages import Push, decode, encode

PURE_MEG = ReplicaConfig(authorization=False)
EVENTS = 25
PEERS = tuple(f"p{i}" for i in range(8))


def author(count: int) -> tuple[bytes, list[Event]]:
    """A topic authored elsewhere: its create event and `count` events, causal order."""
    source = Replica.create_topic(MemoryStore(), identity("author"), PAIR_NOW_MS, config=PURE_MEG)
    rng = random.Random(4)
    for _ in range(count):
        source.publish(b"x" * 50, PAIR_NOW_MS, rng)
    source.commit()
    return source.topic_id, [e for _, e in source.graph.deliveries(0, limit=count + 1)]


def receiver(topic: bytes,
             config: DisseminationConfig) -> tuple[Disseminator, Replica, MemoryStore]:
    store = MemoryStore()
    replica = Replica(store, topic, identity("relay"), PURE_MEG)
    engine = Disseminator("00", random.Random(1), config)
    engine.add_topic(replica)
    for peer in PEERS:
        engine.on_peer_up(peer, PAIR_NOW_MS)
    return engine, replica, store


def sends(effects: list[Effect]) -> list[Send]:
    return [e for e in effects if isinstance(e, Send)]


def test_a_batch_of_frames_commits_once_and_returns_effects_after() -> None:
    topic, events = author(EVENTS)
    engine, replica, store = receiver(topic, DisseminationConfig(sync_on_connect=False))
    frames = [("p0", encode(Push(topic, (e.raw,)))) for e in events]
    before = store.commits
    effects = engine.on_batch(frames, PAIR_NOW_MS)
    assert store.commits - before == 1
    assert replica.graph.pending_ops == 0
    assert replica.graph.delivered_count == len(events)
    delivered = [e for e in effects if isinstance(e, Log) and e.record["type"] == "delivered"]
    assert len(delivered) == len(events)
    assert engine.stats["batch_commits"] == 1


def test_single_messages_still_commit_each() -> None:
    topic, events = author(3)
    engine, replica, store = receiver(topic, DisseminationConfig(sync_on_connect=False, log=False))
    before = store.commits
    for event in events:
        engine.on_message("p0", encode(Push(topic, (event.raw,))), PAIR_NOW_MS)
        assert replica.graph.pending_ops == 0
    assert store.commits - before == len(events)


def test_published_events_are_committed_with_the_frames_and_pushed_together() -> None:
    topic, events = author(5)
    engine, replica, store = receiver(topic, DisseminationConfig(sync_on_connect=False,
                                                                 log=False, push_fanout=3))
    engine.on_batch([("p0", encode(Push(topic, (events[0].raw,))))], PAIR_NOW_MS)
    rng = random.Random(9)
    mine = [replica.publish(b"local %d" % i, PAIR_NOW_MS, rng)[0] for i in range(4)]
    frames = [("p0", encode(Push(topic, (e.raw,)))) for e in events[1:]]
    before = store.commits
    effects = engine.on_batch(frames, PAIR_NOW_MS, published=[(topic, mine)])
    assert store.commits - before == 1
    own = [s for s in sends(effects)
           if set(decode(s.data).events) == {e.raw for e in mine}]
    assert len(own) == 3  # one Push of all four to each of push_fanout peers


def test_a_relay_forwards_a_new_event_once_to_forward_fanout_peers_never_back() -> None:
    topic, events = author(1)
    engine, replica, _ = receiver(topic, DisseminationConfig(sync_on_connect=False, log=False,
                                                             forward_fanout=2))
    engine.on_message("p0", encode(Push(topic, (events[0].raw,))), PAIR_NOW_MS)
    data = encode(Push(topic, (events[1].raw,)))
    forwarded = sends(engine.on_message("p5", data, PAIR_NOW_MS))
    assert len(forwarded) == 2
    assert "p5" not in {s.peer for s in forwarded}
    assert sends(engine.on_message("p6", data, PAIR_NOW_MS)) == []  # known: not again


def test_an_author_pushes_to_push_fanout_peers() -> None:
    topic, events = author(1)
    engine, replica, _ = receiver(topic, DisseminationConfig(sync_on_connect=False, log=False,
                                                             push_fanout=5, forward_fanout=1))
    engine.on_message("p0", encode(Push(topic, (events[0].raw,))), PAIR_NOW_MS)
    event, _ = replica.publish(b"mine", PAIR_NOW_MS, random.Random(1))
    assert len(sends(engine.on_publish(topic, event, PAIR_NOW_MS))) == 5


def test_a_removed_topic_is_forgotten() -> None:
    topic, events = author(1)
    engine, replica, _ = receiver(topic, DisseminationConfig(sync_on_connect=False, log=False))
    engine.remove_topic(topic)
    assert engine.topics == ()
    assert engine.on_message("p0", encode(Push(topic, (events[0].raw,))), PAIR_NOW_MS) == []
    assert engine.stats["unknown_topic"] == 1
    assert engine.tick(PAIR_NOW_MS) == []


def test_a_relay_never_forwards_to_the_events_author() -> None:
    topic, events = author(1)
    engine, replica, _ = receiver(topic, DisseminationConfig(sync_on_connect=False, log=False,
                                                             forward_fanout=len(PEERS) + 1))
    author_peer = identity("author").public_key.hex()
    engine.on_peer_up(author_peer, PAIR_NOW_MS)
    engine.on_message("p0", encode(Push(topic, (events[0].raw,))), PAIR_NOW_MS)
    forwarded = sends(engine.on_message("p5", encode(Push(topic, (events[1].raw,))),
                                        PAIR_NOW_MS))
    assert {s.peer for s in forwarded} == set(PEERS) - {"p5"}  # not the sender, not the author
