"""`apply_writes`: a whole write-set {table: {key: value, or None to delete}} in one commit.

The form the node's one writer (node.committer) hands every step to the
store. The contract on both stores: the write-set is visible (and, on LMDB,
durable) once the call returns; a bad one is refused at the call, whole;
writes land in the order they were made, whatever kind comes next. The LMDB
store adds what only a real environment can get wrong: map growth with a
cached reader, close and reopen, and a cached reader renewed by every commit.

(These properties were first checked against a background writer thread,
`begin_apply_writes`, removed with it; they hold for the one synchronous path.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.lmdb_store import LmdbStore
from node.core.store import TABLE_CHILDREN, TABLE_EVENTS, TABLE_META, Put, Store, StoreError

ROUNDS = 30  # commits per test that loops
BIG_VALUE_BYTES = 4_000  # a few of these overflow a 64 KiB map
TINY_MAP_BYTES = 1 << 16
READS_PER_COMMIT = 5


def test_a_write_set_is_visible_once_applied(store: Store) -> None:
    store.apply([Put(TABLE_EVENTS, b"gone", b"x")])
    store.apply_writes(  # type: ignore[attr-defined]
        {TABLE_EVENTS: {b"gone": None, b"new": b"v"}, TABLE_CHILDREN: {b"c": b""}})
    assert list(store.scan(TABLE_EVENTS, b"")) == [(b"new", b"v")]
    assert store.get(TABLE_CHILDREN, b"c") == b""


def test_a_bad_write_set_is_refused_at_the_call_and_writes_nothing(store: Store) -> None:
    store.apply([Put(TABLE_EVENTS, b"kept", b"1")])
    with pytest.raises(StoreError, match="MAX_KEY_BYTES"):
        store.apply_writes(  # type: ignore[attr-defined]
            {TABLE_EVENTS: {b"would-be": b"2"}, TABLE_META: {b"k" * 600: b"v"}})
    assert list(store.scan(TABLE_EVENTS, b"")) == [(b"kept", b"1")]


def test_writes_land_in_the_order_they_were_made(store: Store) -> None:
    for n in range(ROUNDS):
        store.apply_writes(  # type: ignore[attr-defined]
            {TABLE_EVENTS: {b"v": b"%03d" % n, b"k%03d" % n: b""}})
        if n % 3 == 1:  # an `apply` in between goes after the write-set before it
            store.apply([Put(TABLE_EVENTS, b"v", b"sync %03d" % n)])
            assert store.get(TABLE_EVENTS, b"v") == b"sync %03d" % n
    assert store.get(TABLE_EVENTS, b"v") == b"%03d" % (ROUNDS - 1)
    assert len(list(store.scan(TABLE_EVENTS, b"k"))) == ROUNDS


def test_lmdb_a_write_set_that_outgrows_the_map_is_written(tmp_path: Path) -> None:
    # Growing the map needs every transaction in the process closed, the
    # cached reader included: the store drops it before writing.
    with LmdbStore(tmp_path / "s", map_size_bytes=TINY_MAP_BYTES) as store:
        for n in range(ROUNDS):
            assert store.get(TABLE_EVENTS, b"k%03d" % n) is None  # a reader is cached meanwhile
            store.apply_writes({TABLE_EVENTS: {b"k%03d" % n: bytes([n]) * BIG_VALUE_BYTES}})
            assert store.get(TABLE_EVENTS, b"k%03d" % n) == bytes([n]) * BIG_VALUE_BYTES
        assert store.map_size_bytes > TINY_MAP_BYTES


def test_lmdb_an_applied_write_set_survives_close_and_reopen(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path / "s")
    store.apply_writes({TABLE_EVENTS: {b"k": b"v"}})
    store.close()
    with LmdbStore(tmp_path / "s") as reopened:
        assert reopened.get(TABLE_EVENTS, b"k") == b"v"


def test_lmdb_reads_see_all_of_each_commit_or_none(tmp_path: Path) -> None:
    with LmdbStore(tmp_path / "s") as store:
        for n in range(ROUNDS):
            store.apply_writes(
                {TABLE_META: {b"counter": b"%03d" % n}, TABLE_EVENTS: {b"v": b"%03d" % n}})
            for _ in range(READS_PER_COMMIT):  # the cached reader: renewed, one snapshot
                pair = (store.get(TABLE_META, b"counter"), store.get(TABLE_EVENTS, b"v"))
                assert pair == (b"%03d" % n,) * 2
