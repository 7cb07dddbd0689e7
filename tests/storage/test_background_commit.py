"""`begin_apply_writes`: a write-set committed in the store's writer thread.

The contract on both stores: a begun write-set is durable and visible once
its handle's `wait()` returns; a bad one is refused at the call, whole;
commits land in the order they were begun, whatever kind of write comes
next. The LMDB store adds what only a real writer thread can get wrong:
map growth, close with a commit in flight, reads while it is written.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.lmdb_store import LmdbStore
from node.core.store import TABLE_CHILDREN, TABLE_EVENTS, TABLE_META, Put, Store, StoreError

ROUNDS = 30  # background commits per test that loops
BIG_VALUE_BYTES = 4_000  # a few of these overflow a 64 KiB map
TINY_MAP_BYTES = 1 << 16
READS_PER_COMMIT = 50


def test_a_begun_commit_is_visible_once_waited_for(store: Store) -> None:
    store.apply([Put(TABLE_EVENTS, b"gone", b"x")])
    handle = store.begin_apply_writes(  # type: ignore[attr-defined]
        {TABLE_EVENTS: {b"gone": None, b"new": b"v"}, TABLE_CHILDREN: {b"c": b""}})
    handle.wait()
    assert handle.done
    assert list(store.scan(TABLE_EVENTS, b"")) == [(b"new", b"v")]
    assert store.get(TABLE_CHILDREN, b"c") == b""
    handle.wait()  # a second wait returns at once


def test_a_bad_write_set_is_refused_at_the_call_and_writes_nothing(store: Store) -> None:
    store.apply([Put(TABLE_EVENTS, b"kept", b"1")])
    with pytest.raises(StoreError, match="MAX_KEY_BYTES"):
        store.begin_apply_writes(  # type: ignore[attr-defined]
            {TABLE_EVENTS: {b"would-be": b"2"}, TABLE_META: {b"k" * 600: b"v"}})
    assert list(store.scan(TABLE_EVENTS, b"")) == [(b"kept", b"1")]


def test_commits_land_in_the_order_they_were_begun(store: Store) -> None:
    handles = []
    for n in range(ROUNDS):
        handles.append(store.begin_apply_writes(  # type: ignore[attr-defined]
            {TABLE_EVENTS: {b"v": b"%03d" % n, b"k%03d" % n: b""}}))
        if n % 3 == 1:  # a synchronous write in between goes after the one in flight
            sync_write = {TABLE_EVENTS: {b"v": b"sync %03d" % n}}
            store.apply_writes(sync_write)  # type: ignore[attr-defined]
    for handle in handles:
        handle.wait()
    assert store.get(TABLE_EVENTS, b"v") == b"%03d" % (ROUNDS - 1)
    assert len(list(store.scan(TABLE_EVENTS, b"k"))) == ROUNDS


def test_lmdb_a_write_set_that_outgrows_the_map_is_written_when_settled(tmp_path: Path) -> None:
    # The writer thread cannot grow the map (every transaction in the process
    # must be closed for that); the settling thread does, then writes the batch.
    with LmdbStore(tmp_path / "s", map_size_bytes=TINY_MAP_BYTES) as store:
        for n in range(ROUNDS):
            assert store.get(TABLE_EVENTS, b"k%03d" % n) is None  # a reader is cached meanwhile
            store.begin_apply_writes(
                {TABLE_EVENTS: {b"k%03d" % n: bytes([n]) * BIG_VALUE_BYTES}}).wait()
            assert store.get(TABLE_EVENTS, b"k%03d" % n) == bytes([n]) * BIG_VALUE_BYTES
        assert store.map_size_bytes > TINY_MAP_BYTES


def test_lmdb_close_settles_the_commit_in_flight(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path / "s")
    store.begin_apply_writes({TABLE_EVENTS: {b"k": b"v"}})
    store.close()  # never waited for: close must not drop it
    with LmdbStore(tmp_path / "s") as reopened:
        assert reopened.get(TABLE_EVENTS, b"k") == b"v"


def test_lmdb_reads_during_a_commit_see_all_of_it_or_none(tmp_path: Path) -> None:
    with LmdbStore(tmp_path / "s") as store:
        for n in range(ROUNDS):
            handle = store.begin_apply_writes(
                {TABLE_META: {b"counter": b"%03d" % n}, TABLE_EVENTS: {b"v": b"%03d" % n}})
            for _ in range(READS_PER_COMMIT):  # while the writer works: one snapshot per read pair
                pair = (store.get(TABLE_META, b"counter"), store.get(TABLE_EVENTS, b"v"))
                assert pair in ((b"%03d" % n,) * 2, (b"%03d" % (n - 1),) * 2, (None, None))
            handle.wait()
            assert store.get(TABLE_EVENTS, b"v") == b"%03d" % n  # the reader was renewed
