"""`megnode check` walks every table: damage in the buffer, the rejections, the authors
index, the state groups, the order records and the topic records is named by table and key.

The store is a real LMDB data dir holding two authorized topics written through
Replicas, each with every table in use: state groups and event states, a
confirmed prefix, node positions, a proxy (an unauthorized event), a buffered
event (its parent unknown) and a remembered rejection (parents not an
antichain). Each test damages one table of one topic with py-lmdb, as a disk
or a bug would, and requires the check to name that table in that topic and
leave the other topic clean.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest

import node.check
import node.check.tables as tables
import node.core.buffer
import node.core.rejections
import node.replica.order_records
import node.replica.ordering
import node.state.store
from node.check import CheckError, Damage, check_data_dir, unwalked_tables
from node.core.event import KIND_MESSAGE
from node.core.identity import sign_event
from node.core.store import (
    TABLE_AUTHORS,
    TABLE_BUFFER,
    TABLE_BUFFER_INDEX,
    TABLE_META,
    TABLE_ORDER,
    TABLE_STATE,
    TABLES,
)
from node.topic_records import TOPIC_META_PREFIX
from storage.lmdb_store import LmdbStore
from tests.helpers import authorized_topic, identity

MESSAGES = 20


def build_store(store_dir: Path) -> tuple[bytes, bytes]:
    """Two authorized topics with every table in use (module docstring); their ids."""
    topics = []
    rng = random.Random(7)
    with LmdbStore(store_dir) as store:
        for name in ("alice", "bob"):
            replica = authorized_topic(store, author=name)
            topic = replica.topic_id
            for i in range(MESSAGES):
                replica.publish(b"m%d" % i, 2_000 + i, rng)
            heads = replica.graph.extremities()
            stranger = sign_event(identity("carol"), topic=topic, seq=1, parents=heads,
                                  timestamp_ms=3_000, kind=KIND_MESSAGE, payload=b"c",
                                  auth=(topic,))
            orphan = sign_event(identity(name), topic=topic, seq=50, parents=[bytes(32)],
                                timestamp_ms=3_000, kind=KIND_MESSAGE, payload=b"o",
                                auth=(topic,))
            ancestor = replica.graph.deliveries(3, 1)[0][1].id
            not_antichain = sign_event(identity(name), topic=topic, seq=51,
                                       parents=sorted([heads[0], ancestor]), timestamp_ms=3_000,
                                       kind=KIND_MESSAGE, payload=b"x", auth=(topic,))
            # The stranger's event as a store from before the replica's gate holds it: a
            # rejected vertex (judged after the fact), which the order stands a proxy for.
            replica.graph.set_gate(None)
            replica.receive(stranger.raw, 10_000)
            replica.graph.set_gate(replica._gate)
            for event in (orphan, not_antichain):
                replica.receive(event.raw, 10_000)
            replica.commit()
            topics.append(topic)
    return topics[0], topics[1]


def edit(store_dir: Path, work: Callable) -> None:
    env = lmdb.open(str(store_dir), subdir=True, max_dbs=len(TABLES))
    try:
        dbs = {name: env.open_db(name.encode(), create=False) for name in TABLES}
        with env.begin(write=True) as txn:
            work(txn, dbs)
    finally:
        env.close()


def keys(txn, db, prefix: bytes) -> list[bytes]:
    with txn.cursor(db=db) as cursor:
        if not cursor.set_range(prefix):
            return []
        return [k for k in cursor.iternext(values=False) if k.startswith(prefix)]


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, bytes, bytes]:
    store_dir = tmp_path / "d" / "store"
    a, b = build_store(store_dir)
    return store_dir, a, b


def test_every_table_is_in_use_and_a_clean_store_passes(store) -> None:
    store_dir, a, b = store
    seen: set[str] = set()
    edit(store_dir, lambda txn, dbs: seen.update(n for n in TABLES if keys(txn, dbs[n], a)))
    assert seen == set(TABLES)
    report = check_data_dir(store_dir)
    assert report.ok, [f.as_json() for t in report.topics for f in t.findings]
    assert [t.topic for t in report.topics] == sorted([a, b])


def test_the_key_prefixes_are_the_owning_modules(store) -> None:
    """The check repeats private key prefixes; they must not drift from the writers'."""
    buffer, rejections = node.core.buffer, node.core.rejections
    state, order, records = node.state.store, node.replica.ordering, node.replica.order_records
    assert (tables.BUF_WAIT, tables.BUF_BY_AUTHOR, tables.BUF_BY_AGE) == (
        buffer._WAIT, buffer._BY_AUTHOR, buffer._BY_AGE)
    assert (tables.META_BUFFER_TOTAL, tables.META_BUFFER_AUTHOR, tables.META_ARRIVALS) == (
        buffer._META_BUFFER_TOTAL, buffer._META_BUFFER_AUTHOR, buffer._META_ARRIVALS)
    assert (tables.BUF_REJECTED, tables.META_REJECTIONS) == (
        rejections._REJECTED, rejections._META_REJECTIONS)
    assert (tables.ST_EVENT, tables.ST_GROUP, tables.ST_CHUNK, tables.ST_MEMO,
            tables.ST_REJECTED, tables.ST_NEXT) == (
        state._EVENT, state._GROUP, state._CHUNK, state._MEMO, state._REJECTED, state._NEXT)
    assert (tables.OR_CONFIRMED, tables.OR_COUNT, tables.OR_BATCH, tables.OR_PROXY) == (
        order._CONFIRMED, order._COUNT, order._BATCH, order._PROXY)
    assert tables.OR_EXCLUDED == order._EXCLUDED
    assert (tables.OR_WHERE, tables.OR_AT, tables.OR_RECORDED) == (
        records._WHERE, records._AT, records._RECORDED)


def test_a_table_without_a_walk_stops_the_check(store, monkeypatch) -> None:
    assert unwalked_tables() == []
    monkeypatch.setattr(node.check, "TABLES", (*TABLES, "future"))
    with pytest.raises(CheckError, match="does not walk table.*future"):
        check_data_dir(store[0])


def test_an_unknown_table_in_the_store_is_reported(store) -> None:
    store_dir = store[0]

    env = lmdb.open(str(store_dir), subdir=True, max_dbs=len(TABLES) + 1)
    try:
        with env.begin(write=True) as txn:
            txn.put(b"k", b"v", db=env.open_db(b"stray", txn=txn))  # a table this build lacks
    finally:
        env.close()
    report = check_data_dir(store_dir)
    assert [(f.damage, f.detail) for f in report.store_findings] == [
        (Damage.UNKNOWN_TABLE, "stray")]


def test_a_malformed_topic_record_is_reported(store) -> None:
    store_dir = store[0]
    edit(store_dir, lambda txn, dbs: txn.put(TOPIC_META_PREFIX + b"short", b"",
                                             db=dbs[TABLE_META]))
    report = check_data_dir(store_dir)
    assert [f.damage for f in report.store_findings] == [Damage.BAD_TOPIC_RECORD]


def _first(txn, dbs, table: str, prefix: bytes) -> bytes:
    found = keys(txn, dbs[table], prefix)
    assert found, (table, prefix)
    return found[0]


def _garble(table: str, sub: bytes, value: bytes):
    return lambda txn, dbs, t: txn.put(_first(txn, dbs, table, t + sub), value, db=dbs[table])


def _delete(table: str, sub: bytes, index: int = 0):
    return lambda txn, dbs, t: txn.delete(keys(txn, dbs[table], t + sub)[index], db=dbs[table])


def _confirmed_names_a_stranger(txn, dbs, t):
    txn.put(t + b"c" + (3).to_bytes(8, "big"), bytes(32), db=dbs[TABLE_ORDER])


# name -> (damage made to one topic, what the check must say, in which table)
DAMAGES = {
    "buffer record garbled": (_garble(TABLE_BUFFER, b"", b"\xc1"),
                              Damage.BAD_RECORD, TABLE_BUFFER),
    "buffer age index lost": (_delete(TABLE_BUFFER_INDEX, b"o"),
                              Damage.UNINDEXED, TABLE_BUFFER_INDEX),
    "buffer counter wrong": (lambda txn, dbs, t: txn.put(t + b"buffer_total", (5).to_bytes(8, "big"),
                                                         db=dbs[TABLE_META]),
                             Damage.COUNTER_MISMATCH, TABLE_META),
    "rejection record cut": (_garble(TABLE_BUFFER_INDEX, b"r", b"\x00"),
                             Damage.BAD_RECORD, TABLE_BUFFER_INDEX),
    "authors entry lost": (_delete(TABLE_AUTHORS, b""), Damage.UNINDEXED, TABLE_AUTHORS),
    "state group deleted": (_delete(TABLE_STATE, b"g", 1), Damage.GROUP_MISSING, TABLE_STATE),
    "state group garbled": (_garble(TABLE_STATE, b"g", b"\x93\x01"),
                            Damage.BAD_RECORD, TABLE_STATE),
    "confirmed position deleted": (_delete(TABLE_ORDER, b"c", 5),
                                   Damage.CONFIRMED_HOLE, TABLE_ORDER),
    "confirmed names a stranger": (_confirmed_names_a_stranger,
                                   Damage.EVENT_MISSING, TABLE_ORDER),
    "node position record lost": (_delete(TABLE_ORDER, b"l", 2),
                                  Damage.ORDER_MISMATCH, TABLE_ORDER),
    "proxy garbled": (_garble(TABLE_ORDER, b"p", b"abc"), Damage.BAD_RECORD, TABLE_ORDER),
    "delivered count garbled": (_garble(TABLE_STATE, b"H", b"abc"),
                                Damage.BAD_RECORD, TABLE_STATE),
    "delivered count beyond the events": (
        _garble(TABLE_STATE, b"H", b"".join(n.to_bytes(8, "big") for n in (10**6, 5, 1))),
        Damage.COUNTER_MISMATCH, TABLE_STATE),
}


@pytest.mark.parametrize("name", DAMAGES)
def test_damage_in_each_table_is_named(store, name: str) -> None:
    store_dir, a, b = store
    damage, expected, table = DAMAGES[name]
    edit(store_dir, lambda txn, dbs: damage(txn, dbs, b))
    report = {t.topic: t for t in check_data_dir(store_dir).topics}
    assert report[a].ok
    found = [f for f in report[b].findings if f.damage is expected]
    assert found, [f.as_json() for f in report[b].findings]
    assert all(f.table == table and f.key and f.detail for f in found), [
        f.as_json() for f in found]


def test_a_missing_state_group_is_named_by_the_start_check(store) -> None:
    """node.check.quick_check_topic: the newest group, the extremities' groups."""
    store_dir, a, b = store
    newest: list[int] = []

    def drop_newest(txn, dbs):
        found = keys(txn, dbs[TABLE_STATE], b + b"g")
        newest.append(int.from_bytes(found[-1][-8:], "big"))
        txn.delete(found[-1], db=dbs[TABLE_STATE])

    edit(store_dir, drop_newest)
    with LmdbStore(store_dir) as lmdb_store:
        assert node.check.quick_check_topic(lmdb_store, a) is None
        assert node.check.quick_check_topic(lmdb_store, b) == \
            f"state group {newest[0]} missing"
