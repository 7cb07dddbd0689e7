"""LMDB-only properties: persistence, map growth, format and lock checks, crash safety.

The crash test is the one that matters most: a real writer process is
SIGKILLed while it commits batches, and the reopened store must hold every
batch the writer acknowledged, and every batch whole or not at all. Every
wait on a child process is bounded; nothing sleeps.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb
import pytest

from storage import lmdb_store
from storage.lmdb_data_dir import StoreFormatError, StoreLockedError
from storage.lmdb_store import LmdbStore
from storage.memory import STORE_FORMAT_KEY
from node.core.store import (
    STORE_FORMAT,
    TABLE_AUTHORS,
    TABLE_BUFFER,
    TABLE_DELIVERY,
    TABLE_EVENTS,
    TABLE_META,
    TABLES,
    Delete,
    Put,
    StoreError,
)
from tests.storage import lmdb_child

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_MAP_BYTES = 64 * 1024
CHILD_TIMEOUT_S = 60.0  # every wait on a child process is bounded by this
ACKS_PER_ROUND = 100
CRASH_ROUNDS = 3  # crash, recover and resume this many times per test
READ_CHUNK_BYTES = 64 * 1024


# --- child process plumbing -------------------------------------------------------


@contextmanager
def child(tmp_path: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """Run `python -m tests.storage.lmdb_child ARGS`; always reaped, killed if still alive."""
    stderr = (tmp_path / "child-stderr.txt").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.storage.lmdb_child", *args],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        bufsize=0,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=CHILD_TIMEOUT_S)
        stderr.close()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def child_stderr(tmp_path: Path) -> str:
    return (tmp_path / "child-stderr.txt").read_text(errors="replace")


class LineReader:
    """Reads a child's stdout line by line with a deadline, never blocking past it."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self._fd = proc.stdout.fileno()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._fd, selectors.EVENT_READ)
        self._partial = b""
        self.eof = False

    def read_available(self, deadline: float) -> list[str]:
        """Whole lines that arrive before `deadline` (waits for at least one chunk)."""
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not self._selector.select(remaining):
            raise TimeoutError("child produced no output in time")
        chunk = os.read(self._fd, READ_CHUNK_BYTES)
        if not chunk:
            self.eof = True
            return []
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        return [line.decode() for line in lines]

    def wait_for_lines(self, count: int, timeout_s: float) -> list[str]:
        deadline = time.monotonic() + timeout_s
        lines: list[str] = []
        while len(lines) < count and not self.eof:
            lines.extend(self.read_available(deadline))
        return lines

    def read_to_eof(self, timeout_s: float) -> list[str]:
        deadline = time.monotonic() + timeout_s
        lines: list[str] = []
        while not self.eof:
            lines.extend(self.read_available(deadline))
        return lines


def parse_acks(lines: list[str]) -> list[int]:
    acks = []
    for line in lines:
        word, number = line.split()
        assert word == lmdb_child.ACK, line
        acks.append(int(number))
    return acks


# --- persistence, growth, format ------------------------------------------------------


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "nosync"])
def test_reopen_keeps_every_committed_batch(tmp_path: Path, sync: bool) -> None:
    path = tmp_path / "store"
    with LmdbStore(path, sync=sync) as store:
        writable = [table for table in TABLES if table != TABLE_META]
        store.apply([Put(table, b"key", table.encode()) for table in writable])
        store.apply([Put(TABLE_EVENTS, b"gone", b"x"), Put(TABLE_EVENTS, b"e2", b"y")])
        store.apply([Delete(TABLE_EVENTS, b"gone")])
        before = {table: list(store.scan(table, b"")) for table in TABLES}
    with LmdbStore(path) as reopened:
        assert {table: list(reopened.scan(table, b"")) for table in TABLES} == before
        assert reopened.get(TABLE_EVENTS, b"gone") is None
        assert reopened.get(TABLE_AUTHORS, b"key") == TABLE_AUTHORS.encode()


def test_map_grows_from_a_tiny_map_instead_of_failing(tmp_path: Path) -> None:
    path = tmp_path / "store"
    batches, puts_per_batch, value = 60, 25, b"v" * 1024  # ~1.5 MiB, ~24x the map
    with LmdbStore(path, map_size_bytes=TINY_MAP_BYTES) as store:
        assert store.map_size_bytes == TINY_MAP_BYTES
        for batch in range(batches):
            keys = [b"%04d/%04d" % (batch, i) for i in range(puts_per_batch)]
            store.apply([Put(TABLE_EVENTS, key, value) for key in keys])
        grown = store.map_size_bytes
        assert grown >= batches * puts_per_batch * len(value)
        assert len(list(store.scan(TABLE_EVENTS, b""))) == batches * puts_per_batch
    # Reopening with the tiny size again must not lose or refuse anything:
    # LMDB never maps less than the data already written.
    with LmdbStore(path, map_size_bytes=TINY_MAP_BYTES) as reopened:
        assert reopened.map_size_bytes >= batches * puts_per_batch * len(value)
        pairs = list(reopened.scan(TABLE_EVENTS, b""))
        assert len(pairs) == batches * puts_per_batch
        assert all(stored == value for _, stored in pairs)
        reopened.apply([Put(TABLE_EVENTS, b"after-reopen", value)])
        assert reopened.get(TABLE_EVENTS, b"after-reopen") == value


def test_a_batch_beyond_the_map_ceiling_fails_whole_and_the_store_survives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ceiling = 512 * 1024
    monkeypatch.setattr(lmdb_store, "MAX_MAP_SIZE_BYTES", ceiling)
    with LmdbStore(tmp_path / "store", map_size_bytes=TINY_MAP_BYTES) as store:
        store.apply([Put(TABLE_EVENTS, b"small", b"s")])
        page_sized, count = b"b" * 4096, 2 * ceiling // 4096
        too_big = [Put(TABLE_EVENTS, b"big%03d" % i, page_sized) for i in range(count)]
        with pytest.raises(StoreError, match="MAX_MAP_SIZE_BYTES"):
            store.apply(too_big)
        assert list(store.scan(TABLE_EVENTS, b"")) == [(b"small", b"s")]
        store.apply([Put(TABLE_EVENTS, b"still-works", b"w")])
        assert store.get(TABLE_EVENTS, b"still-works") == b"w"


def test_one_apply_is_one_commit_even_when_the_map_grows(tmp_path: Path) -> None:
    """Group commit: a batch costs one write transaction (one fsync), however
    many ops it holds; a retry after growth replaces the aborted attempt."""
    with LmdbStore(tmp_path / "store", map_size_bytes=TINY_MAP_BYTES) as store:
        before = store.last_txn_id
        store.apply([Put(TABLE_EVENTS, b"%05d" % i, b"x" * 100) for i in range(1000)])
        assert store.map_size_bytes > TINY_MAP_BYTES  # the batch forced growth...
        assert store.last_txn_id == before + 1  # ...yet committed exactly once
        store.apply([Put(TABLE_EVENTS, b"one", b"")])
        assert store.last_txn_id == before + 2
        store.apply([])  # nothing to make durable: no commit at all
        assert store.last_txn_id == before + 2


def test_scan_results_survive_map_growth_and_close(tmp_path: Path) -> None:
    """Resizing the map invalidates every LMDB cursor and buffer; scan results
    are copies, so iterators handed out earlier are untouched."""
    store = LmdbStore(tmp_path / "store", map_size_bytes=TINY_MAP_BYTES)
    store.apply([Put(TABLE_EVENTS, b"k%d" % i, b"v%d" % i) for i in range(10)])
    expected = list(store.scan(TABLE_EVENTS, b"k"))
    pending = store.scan(TABLE_EVENTS, b"k")
    assert next(pending) == expected[0]
    map_before = store.map_size_bytes
    store.apply([Put(TABLE_EVENTS, b"k%d" % i, b"z" * 1000) for i in range(200)])
    assert store.map_size_bytes > map_before
    store.close()
    assert list(pending) == expected[1:]


@pytest.mark.parametrize("size", [0, -1, lmdb_store.MAX_MAP_SIZE_BYTES + 1])
def test_map_size_out_of_range_is_refused(tmp_path: Path, size: int) -> None:
    with pytest.raises(StoreError, match="map_size_bytes"):
        LmdbStore(tmp_path / "store", map_size_bytes=size)


def _write_raw(path: Path, table: str, key: bytes, value: bytes) -> None:
    """Write behind the store's back, as another build of megnode might have."""
    env = lmdb.open(str(path), max_dbs=len(TABLES))
    try:
        db = env.open_db(table.encode())
        with env.begin(write=True) as txn:
            txn.put(key, value, db=db)
    finally:
        env.close()


def test_a_different_store_format_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "store"
    LmdbStore(path).close()
    _write_raw(path, TABLE_META, STORE_FORMAT_KEY, b"999")
    expected = re.escape(f"this build reads format {str(STORE_FORMAT).encode()!r} only")
    for _ in range(2):  # a refused open must release the lock: the retry sees the same error
        with pytest.raises(StoreFormatError, match=rf"store format b'999'; {expected}.*newer"):
            LmdbStore(path)


def test_a_data_dir_of_an_older_format_is_refused_not_misread(tmp_path: Path) -> None:
    # Format 1 kept events under their ids: read as format 2, its id index
    # would hold whole event records where positions belong.
    path = tmp_path / "store"
    LmdbStore(path).close()
    _write_raw(path, TABLE_META, STORE_FORMAT_KEY, b"1")
    with pytest.raises(StoreFormatError, match=r"store format b'1'.*older megnode.*empty data dir"):
        LmdbStore(path)
    _write_raw(path, TABLE_META, STORE_FORMAT_KEY, str(STORE_FORMAT).encode())
    LmdbStore(path).close()  # the record alone decides: the same dir opens in its own format


def test_data_without_a_format_record_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store"
    path.mkdir()
    _write_raw(path, TABLE_EVENTS, b"orphan", b"x")
    with pytest.raises(StoreFormatError, match="no store format record"):
        LmdbStore(path)


# --- the data dir lock ------------------------------------------------------------


def test_a_second_process_gets_store_locked_error_naming_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with child(tmp_path, "hold", str(path)) as holder:
        lines = LineReader(holder).wait_for_lines(1, CHILD_TIMEOUT_S)
        assert lines == [lmdb_child.READY], child_stderr(tmp_path)
        expected = f"data dir {path} is in use by another process (pid {holder.pid})"
        with pytest.raises(StoreLockedError) as refused:
            LmdbStore(path)
        assert str(refused.value) == expected
        assert holder.stdin is not None
        holder.stdin.close()  # lets the holder close the store and exit
        assert holder.wait(timeout=CHILD_TIMEOUT_S) == 0, child_stderr(tmp_path)
    with LmdbStore(path) as store:  # released by the holder's exit
        assert store.get(TABLE_EVENTS, b"k") is None


def test_a_second_open_in_this_process_is_refused_until_close(tmp_path: Path) -> None:
    path = tmp_path / "store"
    first = LmdbStore(path)
    expected = f"already open in this process (pid {os.getpid()})"
    with pytest.raises(StoreLockedError, match=re.escape(expected)):
        LmdbStore(path)
    first.apply([Put(TABLE_EVENTS, b"k", b"v")])
    first.close()
    with LmdbStore(path) as second:
        assert second.get(TABLE_EVENTS, b"k") == b"v"


# --- crash safety -------------------------------------------------------------------


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "nosync"])
def test_sigkill_mid_write_loses_no_acknowledged_batch_and_tears_none(
    tmp_path: Path, sync: bool
) -> None:
    """Crash, recover, resume, crash again: each round must keep every ack.

    sync=False is included because a process crash (unlike an OS crash) must
    not lose committed batches even without fsync.
    """
    path = tmp_path / "store"
    acked: list[int] = []
    for _ in range(CRASH_ROUNDS):
        acked += kill_writer_after_acks(tmp_path, path, sync, ACKS_PER_ROUND)
        assert acked == list(range(len(acked))), "acks must be consecutive across rounds"
        with LmdbStore(path) as store:  # also proves the dead writer left no stale lock
            committed = _committed_batches(store)
            assert committed == list(range(len(committed))), "batches must commit in order"
            assert len(committed) >= len(acked), "an acknowledged batch was lost"
            _assert_every_batch_is_whole(store, committed)
        # A batch committed but killed before its ack is resumed after, not redone.
        acked = committed


def kill_writer_after_acks(tmp_path: Path, path: Path, sync: bool, acks: int) -> list[int]:
    """Start a writer, SIGKILL it once `acks` batches are acknowledged; every ack it printed."""
    with child(tmp_path, "write", str(path), "1" if sync else "0") as writer:
        reader = LineReader(writer)
        lines = reader.wait_for_lines(acks, CHILD_TIMEOUT_S)
        assert len(lines) >= acks, child_stderr(tmp_path)
        os.kill(writer.pid, signal.SIGKILL)  # the writer is already inside its next apply
        assert writer.wait(timeout=CHILD_TIMEOUT_S) == -signal.SIGKILL
        # Acks already in the pipe were printed after apply returned: they count too.
        return parse_acks(lines + reader.read_to_eof(CHILD_TIMEOUT_S))


def _committed_batches(store: LmdbStore) -> list[int]:
    counts = list(store.scan(TABLE_DELIVERY, b"batch/"))
    batches = [int(key.split(b"/")[1]) for key, _ in counts]
    assert [value for _, value in counts] == [b"%d" % lmdb_child.keys_in_batch(b) for b in batches]
    return batches


def _assert_every_batch_is_whole(store: LmdbStore, committed: list[int]) -> None:
    """Every event record belongs to a committed batch, and each batch has all of its records."""
    expected_events = [
        (lmdb_child.event_key(batch, i), lmdb_child.value_for(batch, i))
        for batch in committed
        for i in range(lmdb_child.keys_in_batch(batch))
    ]
    assert list(store.scan(TABLE_EVENTS, b"")) == expected_events
    # The marker moved with every batch: only the last committed one remains.
    assert [key for key, _ in store.scan(TABLE_BUFFER, b"")] == [
        lmdb_child.marker_key(committed[-1])
    ]
