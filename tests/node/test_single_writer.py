"""One writer: an ack or state event is never durable without the events it cites.

A real `Node` (LMDB with fsync in a temp dir, libp2p on loopback). A commit
is made to die on the way (the store raises: nothing of that transaction
reaches the disk, as in a crash inside it) while the node goes on; right
after it, the node authors something that builds on the lost work — a state
action after a publish, a publish after a state action, and the acks its
ticker makes. The node is closed and the store reopened: every durable
event's parents and auth refs must be durable too (the graph is closed
under what events cite), and the lost events must be absent.

Before the committer was the only writer, a state action and an ack
committed on their own (`Disseminator.on_publish`): a state action whose
commit failed stayed in the graph's memory, the next ack cited it, and the
ack's commit made it durable without its parent. That run fails here.
"""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest
import trio

from node.config import NodeConfig
from node.core.event import Event, decode_event
from node.core.graph import Graph
from node.replica.ordering import KIND_ACK
from node.runtime import Node, Topic
from storage.lmdb_store import LmdbStore
from node.core.store import TABLE_DELIVERY, StoreError

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
TEST_TIMEOUT_S = 60.0
ACK_INTERVAL_MS = 20  # acks come quickly, so one follows the lost commit within the test
MAX_EVENTS = 10_000


class CrashingCommits:
    """Makes the store's next commit die before any of it is written."""

    def __init__(self, store: LmdbStore) -> None:
        self._apply_writes = store.apply_writes
        self.armed = False
        self.crashed = 0
        store.apply_writes = self  # type: ignore[method-assign]  # every commit passes here

    def __call__(self, writes) -> None:
        if self.armed:
            self.armed = False
            self.crashed += 1
            raise StoreError("injected crash: this commit never reached the disk")
        self._apply_writes(writes)


async def lost_publish_then_state_action(topic: Topic, crash: CrashingCommits) -> list[bytes]:
    crash.armed = True
    with pytest.raises(Exception):
        await topic.publish(b"lost")
    await topic.set_state("app.mode", "", {"mode": "after the crash"})
    return []


async def lost_state_action_then_publish(topic: Topic, crash: CrashingCommits) -> list[bytes]:
    crash.armed = True
    with pytest.raises(Exception):
        await topic.set_state("app.mode", "", {"mode": "lost"})
    return [await topic.publish(b"after the crash")]


async def wait_for_ack_after(topic: Topic, position: int) -> None:
    """Until the node's ticker made an ack after `position` (it cites what came before)."""
    with trio.fail_after(TEST_TIMEOUT_S):
        while not any(e.kind == KIND_ACK for _, e in topic.replica.deliveries(since=position)):
            await trio.sleep(ACK_INTERVAL_MS / 1000)


def cited(event: Event) -> set[bytes]:
    return set(event.parents) | set(event.auth)


def durable_events(path: Path, topic_id: bytes) -> list[Event]:
    """Every event in the reopened store's delivery table, in delivery order.

    Read from the table itself, not through the graph's counters, so that a
    store that broke the rule (a hole where a lost event was) is still read.
    """
    with LmdbStore(path) as store:
        events = [decode_event(msgpack.unpackb(record)[1])
                  for _, record in store.scan(TABLE_DELIVERY, topic_id, limit=MAX_EVENTS)]
        graph = Graph(store, topic_id)
        missing = {e.id: sorted(i.hex()[:8] for i in cited(e) if not graph.has(i))
                   for e in events}
    broken = {f"{e.kind} {e.id.hex()[:8]}": missing[e.id] for e in events if missing[e.id]}
    assert broken == {}, "durable events citing events that are not durable"
    return events


@pytest.mark.parametrize("scenario", [lost_publish_then_state_action,
                                      lost_state_action_then_publish])
def test_nothing_durable_cites_a_lost_commit(tmp_path: Path, scenario) -> None:
    config = NodeConfig(ack_interval_ms=ACK_INTERVAL_MS)

    async def main() -> tuple[bytes, list[bytes], int]:
        with trio.fail_after(TEST_TIMEOUT_S):
            async with Node.open(tmp_path / "a", listen=LOOPBACK, config=config) as node:
                topic = await node.create_topic("one-writer")
                await topic.publish(b"before")
                crash = CrashingCommits(node.store)
                position = topic.replica.graph.delivered_count
                kept = await scenario(topic, crash)
                await wait_for_ack_after(topic, position)
                assert crash.crashed == 1
                return topic.topic_id, kept, position

    topic_id, kept, position = trio.run(main)
    events = durable_events(tmp_path / "a" / "store", topic_id)
    payloads = [e.payload for e in events]
    assert b"before" in payloads and b"lost" not in payloads
    assert not any(b"lost" in e.payload for e in events if e.kind == "app.mode")
    assert set(kept) <= {e.id for e in events}
    assert any(e.kind == KIND_ACK for e in events[position:])  # an ack was made, and kept
