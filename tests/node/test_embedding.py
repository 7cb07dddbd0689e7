"""The embedding API: `join` then `publish` at once never fails on a race; typed errors.

The race (issue 13): a topic this node holds but is not yet a member of (its
events synced here, a restart before its join) joins by the membership pursuit,
which writes the join on a later tick. `publish` right after `join` used to
raise "not a joined member". Now `join(wait=True)` returns once the join is in
the resolved state, and `publish` after `join(wait=False)` waits for it itself
(bounded). 100 seeded runs of a real node (LMDB in a tmp dir, libp2p on
127.0.0.1), each with the topic in its store and no membership yet. (Before,
`join` of such a topic did not even pursue the membership: `publish` failed
every time.)
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio

import node as megnode
from node.committer import commit_writes, writes_of
from node.core.event import MAX_PAYLOAD_BYTES
from node.core.identity import Identity
from node.core.store import TABLE_STATE, Delete
from node.data_dir import open_data_dir
from node.replica.delivery_count import HANDED_KEY
from node.replica.replica import Replica, ReplicaConfig
from node.state.types import RULE_INVITE, RULE_PUBLIC
from node.topic_records import topic_record
from storage.memory import MemoryStore

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
RUNS = 100
WAIT_S = 30.0


def offline_topic(seed: int, rule: str = RULE_PUBLIC) -> tuple[bytes, list[bytes]]:
    """A topic another node authored (a few messages): its id and its events' raws."""
    replica = Replica.create_topic(MemoryStore(), Identity.from_seed(bytes([seed % 256]) * 32),
                                   1_000, name=f"t{seed}", config=ReplicaConfig(),
                                   authorization=True, join_rule=rule,
                                   members_write=rule == RULE_PUBLIC)
    rng = random.Random(seed)
    for n in range(3):
        replica.publish(b"m %d" % n, 1_000 + n, rng)
    replica.commit()
    return replica.topic_id, [e.raw for _, e in replica.graph.deliveries(0, limit=100)]


def hold_topic(data_dir: Path, topic_id: bytes, raws: list[bytes]) -> None:
    """Put the topic's events and the record that this node replicates it into the store,
    as sync would have before this node became a member (then the node stops)."""
    identity, store = open_data_dir(data_dir)
    try:
        replica = Replica(store, topic_id, identity, ReplicaConfig())
        for raw in raws:
            replica.receive(raw, 2_000)
        replica.commit()
        commit_writes(store, writes_of(topic_record(topic_id)))
    finally:
        store.close()


async def test_join_then_publish_at_once_never_raises(tmp_path: Path) -> None:
    with trio.fail_after(WAIT_S * 4):
        for seed in range(RUNS):
            topic_id, raws = offline_topic(seed)
            data_dir = tmp_path / f"n{seed}"
            hold_topic(data_dir, topic_id, raws)
            async with megnode.Node.open(data_dir, listen=LOOPBACK, seed=seed) as node:
                wait = seed % 2 == 0
                topic = await node.join(topic_id, wait=wait)
                if wait:
                    assert topic.membership() == "join"
                await topic.publish(b"right away %d" % seed)
                assert topic.membership() == "join"


async def test_typed_errors_are_exported_from_the_package(tmp_path: Path) -> None:
    assert issubclass(megnode.NotAMember, megnode.NodeError)
    assert issubclass(megnode.JoinRefusedError, megnode.TopicNotFound)
    async with megnode.Node.open(tmp_path / "a", listen=LOOPBACK, seed=1) as node:
        topic = await node.create_topic("typed")
        with pytest.raises(megnode.PayloadTooLarge, match=str(MAX_PAYLOAD_BYTES)):
            await topic.publish(b"x" * (MAX_PAYLOAD_BYTES + 1))
        with pytest.raises(megnode.PayloadTooLarge):  # all or nothing: nothing stored
            await topic.publish_many([b"fine", b"x" * (MAX_PAYLOAD_BYTES + 1)])
        assert not [e for _, e in topic.replica.deliveries(0, limit=100)
                    if e.payload == b"fine"]
        assert len(await topic.publish_many([b"a", b"b"])) == 2
        with pytest.raises(megnode.TopicNotFound):
            node.topic(bytes(32))
        with pytest.raises(megnode.JoinRefusedError):  # nobody to ask
            await node.join(bytes(range(32)), timeout_s=0.2)
        kinds = []
        async for delivered in topic.subscribe(since=0, kinds=["message"]):
            kinds.append(delivered.event.payload)
            if len(kinds) == 2:
                break
        assert kinds == [b"a", b"b"]
        first = (await topic.publish_many([b"c", b"d"]))[0]
        async for delivered in topic.subscribe(since=first, kinds=["message"]):
            assert delivered.event.payload == b"d"  # resumed just after `first`
            break


async def test_a_held_invite_topic_without_an_invite_times_out_with_the_reason(
        tmp_path: Path) -> None:
    topic_id, raws = offline_topic(7, rule=RULE_INVITE)
    hold_topic(tmp_path / "n", topic_id, raws)
    async with megnode.Node.open(tmp_path / "n", listen=LOOPBACK, seed=7) as node:
        with pytest.raises(megnode.JoinTimeout, match="not a joined member"):
            await node.join(topic_id, timeout_s=1.5)
        topic = node.topic(topic_id)
        topic.wants_membership = False  # no join under way: publish is refused at once
        with pytest.raises(megnode.NotAMember, match="not a joined member"):
            await topic.publish(b"x")


async def test_oversized_state_content_is_a_plain_refusal(tmp_path: Path) -> None:
    async with megnode.Node.open(tmp_path / "a", listen=LOOPBACK, seed=3) as node:
        topic = await node.create_topic("state")
        with pytest.raises(megnode.PayloadTooLarge, match="too large"):
            await topic.set_state("app.config", "", {"blob": "x" * (MAX_PAYLOAD_BYTES * 2)})
        await topic.set_state("app.config", "", {"unit": "C"})  # the topic carries on


async def test_a_history_stored_without_its_count_is_counted_without_holding_up_the_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic stored by a build that kept no delivered count (`Replica.handed_count`) is
    counted once by reading its history back (~14 s per million events). Counted in
    one go, that held the event loop, and every peer with it, as long.
    `count_deliveries` (which the control socket runs before answering) counts in
    slices, other tasks running between them, gives the count a full count gives, and
    hands it to the replica, which keeps it: after the next restart nothing is read."""
    data_dir = tmp_path / "n"
    async with megnode.Node.open(data_dir, listen=LOOPBACK, seed=11) as node:
        topic = await node.create_topic("history")
        for chunk in range(6):
            await topic.publish_many([b"reading %d %d" % (chunk, n) for n in range(500)])
        topic_id = topic.topic_id
    _, store = open_data_dir(data_dir)  # as an older build left it: no count
    try:
        commit_writes(store, writes_of([Delete(TABLE_STATE, topic_id + HANDED_KEY)]))
    finally:
        store.close()
    monkeypatch.setattr("node.runtime.COUNT_SLICE_EVENTS", 100)
    async with megnode.Node.open(data_dir, listen=LOOPBACK, seed=11) as node:
        handle = node.topic(topic_id)
        assert handle.replica.handed_count is None and handle._counted_to == 0
        rounds = 0
        counting = True

        async def other_task() -> None:
            nonlocal rounds
            while counting:
                rounds += 1
                await trio.sleep(0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other_task)
            await trio.sleep(0)
            await node.count_deliveries()
            counting = False
        # 3,000 messages and the topic's own events, 100 a slice: ~30 slices.
        assert rounds >= 25
        (counted,) = [t for t in node.status()["topics"] if t["topic"] == handle.id_hex]
        kept = handle.replica.handed_count  # adopted in a step
        assert kept is not None and kept.end == handle.replica.graph.delivered_count
        full = handle.replica.deliveries(0, limit=10_000)  # what subscribers are handed
        assert counted["delivered"] == kept.delivered == len(full) >= 3_000
        assert counted["acks"] == kept.acks == sum(e.kind == "ack" for _, e in full)
    async with megnode.Node.open(data_dir, listen=LOOPBACK, seed=11) as node:
        handle = node.topic(topic_id)
        assert handle.count_delivered(limit=1)  # up to date, nothing read back
        (again,) = [t for t in node.status()["topics"] if t["topic"] == handle.id_hex]
        assert (again["delivered"], again["acks"]) == (counted["delivered"], counted["acks"])


async def test_a_status_call_reads_the_kept_count_even_after_a_restart(tmp_path: Path) -> None:
    """The replica keeps the count as it applies events and stores it with them
    (node.replica.delivery_count): a status call reads nothing back, on a busy node
    or one just restarted over a long history."""
    data_dir = tmp_path / "n"
    async with megnode.Node.open(data_dir, listen=LOOPBACK, seed=12) as node:
        topic = await node.create_topic("live")
        await topic.publish_many([b"reading %d" % n for n in range(2_000)])
        handle = node.topic(topic.topic_id)
        assert handle.count_delivered(limit=1)  # up to date after reading back nothing
        (status,) = [t for t in node.status()["topics"] if t["topic"] == handle.id_hex]
        assert status["delivered"] == handle.replica.graph.delivered_count >= 2_000
    async with megnode.Node.open(data_dir, listen=LOOPBACK, seed=12) as node:
        handle = node.topic(topic.topic_id)
        assert handle.count_delivered(limit=1)
        (after,) = [t for t in node.status()["topics"] if t["topic"] == handle.id_hex]
        assert after["delivered"] == status["delivered"]
