"""The ticker's ack duty (node.topic_writes.TopicWrites.acknowledge) catches nothing.

It used to wrap `Replica.maybe_ack` in a catch-all "no power to ack, ordering
off: nothing to do". Neither raises: on a ready, authorizing replica (the duty
checks that first) `maybe_ack` answers None itself when the node is no indexer,
when the topic keeps no order, or when the auth rules refuse the ack. These
tests pin that, so the duty can let anything else surface: a bug fails the
committer's step, which logs it, instead of vanishing at debug level.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from node.topic_writes import TopicWrites
from node.replica.ordering import OrderConfig
from node.replica.replica import Replica, ReplicaConfig
from node.topic_handle import Topic
from storage.memory import MemoryStore
from tests.ordering.world import ACK_INTERVAL_MS, Net

SEED = 11


class _NoAuthor:
    """The topic handles here never publish; the duty does not go through them."""

    async def publish_many(self, topic: Topic, payloads: Any, kind: str) -> list[bytes]:
        raise AssertionError("not used")

    async def state_action(self, topic: Topic, action: Any) -> list[bytes]:
        raise AssertionError("not used")


def _duty(replicas: list[Replica]) -> TopicWrites:
    topics = {r.topic_id: Topic(r.identity.public_key.hex(), r, _NoAuthor()) for r in replicas}
    return TopicWrites(committer=None, topics=topics, rng=random.Random(SEED))  # type: ignore[arg-type]


def test_only_an_indexer_acks_and_a_writer_without_the_power_gets_nothing() -> None:
    net = Net(SEED, creator="carol", indexers=["alice"], writers=["xavier"])
    net.publish("xavier", b"unconfirmed")
    net.sync_all()
    net.now_ms += ACK_INTERVAL_MS
    assert _duty([net.replicas["xavier"]]).acknowledge(net.now_ms) == []  # no vote, no raise
    acks = _duty([net.replicas["alice"]]).acknowledge(net.now_ms)
    assert [(topic, event.kind) for topic, event in acks] == [
        (net.replicas["alice"].topic_id, "ack")]


def test_a_topic_that_keeps_no_order_gets_no_ack() -> None:
    store = MemoryStore()
    net = Net(SEED, creator="carol", indexers=["alice"], writers=["xavier"],
              stores={"alice": store})
    net.publish("xavier", b"unconfirmed")
    net.sync_all()
    net.commit_all()
    alice = net.replicas["alice"]
    assert _duty([alice]).acknowledge(net.now_ms + ACK_INTERVAL_MS)  # with its order: due
    unordered = Replica(store, alice.topic_id, alice.identity,
                        ReplicaConfig(ordering=OrderConfig(enabled=False,
                                                           ack_interval_ms=ACK_INTERVAL_MS)))
    assert unordered.ready and unordered.authorizing and unordered.ordering is None
    assert _duty([unordered]).acknowledge(net.now_ms + ACK_INTERVAL_MS) == []


def test_anything_else_maybe_ack_raises_surfaces() -> None:
    net = Net(SEED, creator="carol", indexers=["alice"])
    alice = net.replicas["alice"]

    def broken(now_ms: int, rng: random.Random) -> None:
        raise RuntimeError("a bug in the order")

    alice.maybe_ack = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="a bug in the order"):
        _duty([alice]).acknowledge(net.now_ms + ACK_INTERVAL_MS)
