"""Group commit in a real node: publishes and received events are durable before anyone hears.

Real `Node`s (LMDB with fsync, libp2p on loopback, push fast path). A
subscriber checks every event it is handed against the node's store itself
(`store.get` reads committed data only, never the graph's pending writes);
publish calls are concurrent, so they share commits; after the node is
closed the store is reopened and must hold every id a publish returned.
Every wait is bounded and waits on a condition.
"""

from __future__ import annotations

from pathlib import Path

import trio

from node.runtime import Node, Topic
from storage.lmdb_store import LmdbStore
from node.core.store import TABLE_EVENTS

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
TEST_TIMEOUT_S = 60.0
PUBLISHERS = 8
PER_PUBLISHER = 6
BATCH = 10
BOOTSTRAP_EVENTS = 4  # create, the creator's join, power levels, join rule


async def check_deliveries(node: Node, topic: Topic, expected: int) -> None:
    """Subscribe and require each delivered event to be committed already."""
    got = 0
    async for delivered in topic.subscribe(since=0):
        key = topic.topic_id + delivered.event.id
        assert node.store.get(TABLE_EVENTS, key) is not None, "delivered before durable"
        got += 1
        if got >= expected:
            return


async def publish_concurrently(topic: Topic) -> list[bytes]:
    ids: list[bytes] = []

    async def publisher(n: int) -> None:
        for i in range(PER_PUBLISHER):
            ids.append(await topic.publish(b"%d/%d" % (n, i)))

    async with trio.open_nursery() as nursery:
        for n in range(PUBLISHERS):
            nursery.start_soon(publisher, n)
    ids += await topic.publish_many([b"batch %d" % i for i in range(BATCH)])
    return ids


def test_published_ids_survive_a_reopen_and_subscribers_see_only_durable_events(
        tmp_path: Path) -> None:
    total = PUBLISHERS * PER_PUBLISHER + BATCH

    async def main() -> tuple[bytes, list[bytes], int]:
        with trio.fail_after(TEST_TIMEOUT_S):
            async with Node.open(tmp_path / "a", listen=LOOPBACK) as node:
                topic = await node.create_topic("group-commit")
                commits_before = node.store.commits
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(check_deliveries, node, topic, BOOTSTRAP_EVENTS + total)
                    ids = await publish_concurrently(topic)
                return topic.topic_id, ids, node.store.commits - commits_before

    topic_id, ids, commits = trio.run(main)
    assert len(set(ids)) == total
    assert commits < total  # concurrent publishes shared commits
    with LmdbStore(tmp_path / "a" / "store") as store:
        missing = [i for i in ids if store.get(TABLE_EVENTS, topic_id + i) is None]
    assert missing == []


def test_pushed_events_are_durable_at_the_receiver_before_it_delivers_them(
        tmp_path: Path) -> None:
    total = PUBLISHERS * PER_PUBLISHER + BATCH

    async def main() -> None:
        with trio.fail_after(TEST_TIMEOUT_S):
            async with Node.open(tmp_path / "a", listen=LOOPBACK) as a:
                topic_a = await a.create_topic("pushed")
                async with Node.open(tmp_path / "b", listen=LOOPBACK,
                                     bootstrap=[a.addresses[0]]) as b:
                    topic_b = await b.join(topic_a.topic_id)
                    await topic_b.wait_ready(TEST_TIMEOUT_S)
                    async with trio.open_nursery() as nursery:
                        # b's own join event is delivered there too.
                        nursery.start_soon(check_deliveries, b, topic_b,
                                           BOOTSTRAP_EVENTS + total)
                        await publish_concurrently(topic_a)
                    assert b.committer.stats["batches"] >= 1

    trio.run(main)
