"""`megnode check` finds damage made by editing a real store; `repair` lets the node refetch.

Stores are real LMDB data dirs written through a Replica (or real Nodes);
the damage is made with py-lmdb directly, as a disk or a bug would: a
flipped byte in an event, an event whose parent is missing, a hole in the
delivery table. The check must name the damaged topic and leave the other
clean one alone. The repair test damages one node's copy of a topic, repairs
it and restarts the node next to a peer that holds the topic: the events
come back. Every wait is bounded and waits on a condition.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import lmdb
import msgpack
import pytest
import trio

from node.check import Damage, check_data_dir, repair_topic
from node.control import serve_control
from node.control_client import ControlError, control_call
from node.core.event import KIND_MESSAGE
from node.core.identity import sign_event
from node.core.store import (
    TABLE_AUTHORS,
    TABLE_DELIVERY,
    TABLE_EVENTS,
    TABLE_META,
    TABLE_ORDER,
    TABLE_STATE,
    TABLES,
    Delete,
)
from node.replica.ordering import KIND_ACK
from node.core.graph_commit import META_DELIVERED
from node.runtime import Node, NodeError
from storage.lmdb_data_dir import StoreLockedError
from storage.lmdb_store import LmdbStore
from tests.helpers import identity, new_topic, random_dag

EVENTS = 30
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
WAIT_S = 30.0
CLI_TIMEOUT_S = 60.0


def build_store(store_dir: Path) -> tuple[bytes, bytes]:
    """Two topics of EVENTS events each (several writers, forks); their ids."""
    topics = []
    with LmdbStore(store_dir) as store:
        for name in ("alice", "bob"):
            replica = new_topic(store, author=name)
            for event in random_dag(replica, [identity(name), identity("carol")], EVENTS,
                                    random.Random(name)):
                replica.receive(event.raw, now_ms=10_000)
            replica.commit()
            topics.append(replica.topic_id)
    return topics[0], topics[1]


def edit(store_dir: Path, work) -> None:
    """Run `work(txn, dbs)` in one py-lmdb write transaction on the closed store."""
    env = lmdb.open(str(store_dir), subdir=True, max_dbs=len(TABLES))
    try:
        dbs = {name: env.open_db(name.encode(), create=False) for name in TABLES}
        with env.begin(write=True) as txn:
            work(txn, dbs)
    finally:
        env.close()


def pos(n: int) -> bytes:
    return n.to_bytes(8, "big")


def damages(store_dir: Path) -> dict[bytes, set[Damage]]:
    report = check_data_dir(store_dir)
    assert not report.store_findings
    return {t.topic: {f.damage for f in t.findings} for t in report.topics}


def megnode(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node.cli", *args], capture_output=True,
                          text=True, timeout=CLI_TIMEOUT_S)


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "d" / "store"


def test_a_clean_store_passes(store_dir: Path) -> None:
    a, b = build_store(store_dir)
    report = check_data_dir(store_dir)
    assert report.ok
    assert {t.topic: t.events for t in report.topics} == {a: EVENTS + 1, b: EVENTS + 1}


def test_a_flipped_byte_in_an_event_is_found_and_the_cli_exits_1(store_dir: Path) -> None:
    a, b = build_store(store_dir)

    def flip(txn, dbs):
        depth, raw = msgpack.unpackb(txn.get(a + pos(7), db=dbs[TABLE_DELIVERY]))
        damaged = raw[:-10] + bytes([raw[-10] ^ 0x01]) + raw[-9:]  # inside the signature
        txn.put(a + pos(7), msgpack.packb([depth, damaged]), db=dbs[TABLE_DELIVERY])

    edit(store_dir, flip)
    found = damages(store_dir)
    assert found[b] == set()
    assert found[a] & {Damage.BAD_SIGNATURE, Damage.UNDECODABLE, Damage.ID_MISMATCH}
    assert Damage.INDEX_DANGLING in found[a]  # the old id points at bytes of another id
    result = megnode("check", "--data-dir", str(store_dir.parent))
    assert result.returncode == 1, result.stderr
    assert a.hex() in result.stdout.splitlines()[-1]  # the summary names the damaged topic
    assert b.hex() not in result.stdout.splitlines()[-1]


def test_a_missing_parent_is_found(store_dir: Path) -> None:
    a, b = build_store(store_dir)
    orphan = sign_event(identity("alice"), topic=a, seq=99, parents=[bytes(32)],
                        timestamp_ms=5_000, kind=KIND_MESSAGE, payload=b"orphan", auth=(a,))

    def append_orphan(txn, dbs):  # a well-formed, signed, indexed event whose parent is absent
        txn.put(a + pos(EVENTS + 1), msgpack.packb([1, orphan.raw]), db=dbs[TABLE_DELIVERY])
        txn.put(a + orphan.id, pos(EVENTS + 1), db=dbs[TABLE_EVENTS])
        txn.put(a + META_DELIVERED, pos(EVENTS + 2), db=dbs[TABLE_META])
        txn.put(a + orphan.author + pos(99) + orphan.id, b"", db=dbs[TABLE_AUTHORS])

    edit(store_dir, append_orphan)
    found = damages(store_dir)
    assert found == {a: {Damage.MISSING_PARENT}, b: set()}


def test_a_hole_in_the_delivery_table_is_found(store_dir: Path) -> None:
    a, b = build_store(store_dir)
    edit(store_dir, lambda txn, dbs: txn.delete(b + pos(12), db=dbs[TABLE_DELIVERY]))
    found = damages(store_dir)
    assert found[a] == set()
    assert {Damage.DELIVERY_HOLE, Damage.COUNTER_MISMATCH} <= found[b]
    tables = {f.damage: f.table for t in check_data_dir(store_dir).topics for f in t.findings}
    assert tables[Damage.DELIVERY_HOLE] == TABLE_DELIVERY  # every finding names its table
    assert tables[Damage.COUNTER_MISMATCH] == TABLE_META


def test_check_refuses_a_store_a_daemon_holds_in_one_line_exit_2(store_dir: Path) -> None:
    build_store(store_dir)
    with LmdbStore(store_dir):
        with pytest.raises(StoreLockedError):
            check_data_dir(store_dir)
        result = megnode("check", "--data-dir", str(store_dir.parent))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "in use" in result.stderr
    clean = megnode("check", "--data-dir", str(store_dir.parent))
    assert clean.returncode == 0, clean.stdout + clean.stderr


def _flip_event_byte(txn, dbs, topic: bytes) -> None:
    depth, raw = msgpack.unpackb(txn.get(topic + pos(5), db=dbs[TABLE_DELIVERY]))
    txn.put(topic + pos(5), msgpack.packb([depth, raw[:-3] + b"\x00\x00\x00"]),
            db=dbs[TABLE_DELIVERY])


def state_group_keys(txn, dbs, topic: bytes) -> list[bytes]:
    with txn.cursor(db=dbs[TABLE_STATE]) as cursor:
        cursor.set_range(topic + b"g")
        return [k for k in cursor.iternext(values=False) if k.startswith(topic + b"g")]


def _delete_first_state_group(txn, dbs, topic: bytes) -> None:
    assert txn.delete(state_group_keys(txn, dbs, topic)[0], db=dbs[TABLE_STATE])


@pytest.mark.parametrize("damage", [_flip_event_byte, _delete_first_state_group],
                         ids=["flipped event byte", "deleted state group"])
def test_repair_drops_a_damaged_topic_and_the_node_refetches_it(tmp_path: Path,
                                                                damage) -> None:
    published = 20

    async def replicate_to_b() -> tuple[bytes, set[bytes]]:
        with trio.fail_after(WAIT_S):
            async with Node.open(tmp_path / "a", listen=LOOPBACK, seed=1) as a:
                topic_a = await a.create_topic("repair")
                await topic_a.publish_many([b"event %d" % i for i in range(published)])
                total = topic_a.replica.graph.delivered_count
                async with Node.open(tmp_path / "b", listen=LOOPBACK, seed=2) as b:
                    await b.connect(a.addresses[0])
                    topic_b = await b.join(topic_a.topic_id)
                    await topic_b.wait_delivered(total, WAIT_S)
                ids = {key[32:] for key, _ in a.store.scan(TABLE_EVENTS, topic_a.topic_id)}
                return topic_a.topic_id, ids

    topic, ids = trio.run(replicate_to_b)
    store_b = tmp_path / "b" / "store"
    edit(store_b, lambda txn, dbs: damage(txn, dbs, topic))
    assert damages(store_b)[topic]
    result = repair_topic(store_b, topic)
    assert result.recorded and result.deleted > len(ids)
    emptied = check_data_dir(store_b)  # nothing of it is left but the node's record of it
    assert emptied.ok and [(t.topic, t.recorded, t.events) for t in emptied.topics] == [
        (topic, True, 0)]

    async def restart_b() -> set[bytes]:
        with trio.fail_after(WAIT_S):
            async with Node.open(tmp_path / "a", listen=LOOPBACK, seed=1) as a:
                async with Node.open(tmp_path / "b", listen=LOOPBACK, seed=2) as b:
                    assert topic in b.topics  # the record was kept: the node reopens it
                    await b.connect(a.addresses[0])
                    await b.topics[topic].wait_delivered(len(ids), WAIT_S)
                    held = {key[32:] for key, _ in b.store.scan(TABLE_EVENTS, topic)}
                    # A may have acknowledged b's join after `ids` was read (its ticker
                    # runs on): b refetches everything A has, not less, nothing else.
                    assert held <= {key[32:] for key, _ in a.store.scan(TABLE_EVENTS, topic)}
                    kinds = {b.topics[topic].replica.graph.get(i).kind for i in held - ids}
                    assert kinds <= {KIND_ACK}, kinds
                    return held

    held = trio.run(restart_b)
    assert ids <= held
    report = check_data_dir(store_b)
    assert report.ok and [t.events for t in report.topics] == [len(held)]


def test_a_node_refuses_to_serve_a_topic_the_start_check_finds_damaged(tmp_path: Path) -> None:
    async def two_topics() -> tuple[bytes, bytes]:
        async with Node.open(tmp_path / "n", listen=LOOPBACK) as node:
            damaged = await node.create_topic("damaged")
            await damaged.publish_many([b"x%d" % i for i in range(5)])
            healthy = await node.create_topic("healthy")
            return damaged.topic_id, healthy.topic_id

    damaged, healthy = trio.run(two_topics)
    store_dir = tmp_path / "n" / "store"

    def truncate(txn, dbs):  # the last event gone, the counter still counting it
        counter = int.from_bytes(txn.get(damaged + META_DELIVERED, db=dbs[TABLE_META]), "big")
        assert txn.delete(damaged + pos(counter - 1), db=dbs[TABLE_DELIVERY])

    edit(store_dir, truncate)

    async def reopen() -> None:
        with trio.fail_after(WAIT_S):
            async with Node.open(tmp_path / "n", listen=LOOPBACK) as node:
                assert healthy in node.topics and damaged not in node.topics
                assert damaged.hex() in node.status()["damaged_topics"]
                with pytest.raises(NodeError, match="damaged"):
                    await node.join(damaged)

    trio.run(reopen)


async def call(socket: Path, **request):
    return await trio.to_thread.run_sync(control_call, socket, request)


@pytest.mark.parametrize("which", ["oldest", "newest", "while running", "confirmed position"])
def test_a_missing_state_or_order_record_costs_its_topic_one_line_and_no_other(
        tmp_path: Path, which: str) -> None:
    """Not "internal error: KeyError": status lists it, publish names the damage and the cure.

    The newest group is caught by the start check, the oldest (the snapshot
    every later group builds on) when the topic is opened and its state read;
    "while running": the group is lost under a running node (cold caches),
    and the first status that reads it marks the topic damaged. "confirmed
    position": an order record (the confirmed position 1) is lost; the order's
    replay (the first status, or the node's ack duty) meets it.
    """
    data_dir = tmp_path / "n"

    async def two_topics() -> tuple[bytes, bytes]:
        async with Node.open(data_dir, listen=LOOPBACK) as node:
            damaged = await node.create_topic("damaged")
            await damaged.publish_many([b"x%d" % i for i in range(5)])
            healthy = await node.create_topic("healthy")
            return damaged.topic_id, healthy.topic_id

    damaged, healthy = trio.run(two_topics)
    lost: list[bytes] = []

    def drop_record(txn, dbs):
        if which == "confirmed position":
            lost.append(damaged + b"c" + pos(1))
            assert txn.delete(lost[0], db=dbs[TABLE_ORDER])
            return
        groups = state_group_keys(txn, dbs, damaged)
        lost.append(groups[-1] if which == "newest" else groups[0])
        if which != "while running":
            assert txn.delete(lost[0], db=dbs[TABLE_STATE])

    edit(data_dir / "store", drop_record)
    what = "confirmed position 1 missing" if which == "confirmed position" else \
        f"state group {int.from_bytes(lost[0][-8:], 'big')} missing"

    async def serve() -> None:
        with trio.fail_after(WAIT_S):
            async with Node.open(data_dir, listen=LOOPBACK) as node:
                if which == "while running":
                    assert damaged in node.topics
                    node.store.apply([Delete(TABLE_STATE, lost[0])])  # the disk loses it
                    node.topics[damaged].replica.tracker.clear_caches()
                socket = data_dir / "control.sock"
                async with trio.open_nursery() as nursery:
                    await nursery.start(serve_control, node, socket)
                    status = (await call(socket, op="status"))["status"]
                    assert [t["topic"] for t in status["topics"]] == [healthy.hex()]
                    assert status["damaged_topics"] == {damaged.hex(): what}
                    with pytest.raises(ControlError) as refused:
                        await call(socket, op="publish", topic=damaged.hex(), payload="p")
                    message = str(refused.value)
                    assert len(message.splitlines()) == 1
                    assert f"topic {damaged.hex()} is damaged" in message
                    assert what in message
                    assert f"megnode repair {damaged.hex()}" in message
                    assert "internal error" not in message
                    assert (await call(socket, op="publish", topic=healthy.hex(),
                                       payload="still served"))["ok"]
                    nursery.cancel_scope.cancel()

    trio.run(serve)


def test_check_and_backup_refuse_a_truncated_store_instead_of_mapping_it(tmp_path: Path) -> None:
    """A file cut inside its pages is a clear error for `check` and offline backups, never a
    SIGBUS (they open LMDB themselves, read-only, and must not extend the file either)."""
    from node.backup import BackupError, backup_offline
    from node.check import CheckError

    store_dir = tmp_path / "store"
    build_store(store_dir)
    data = store_dir / "data.mdb"
    page = 4096
    os.truncate(data, max(2 * page, (data.stat().st_size // 2) // page * page))
    size = data.stat().st_size
    with pytest.raises(CheckError, match="truncated"):
        check_data_dir(store_dir)
    with pytest.raises(BackupError, match="truncated"):
        backup_offline(store_dir, tmp_path / "copy")
    assert data.stat().st_size == size  # read-only: nothing extended
