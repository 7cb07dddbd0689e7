"""The persistent store: the `Store` protocol on LMDB (py-lmdb).

One data dir holds one LMDB environment with one named database per table in
`node.core.store.TABLES`. `apply` commits a whole batch in one write
transaction, so callers group-commit many events per fsync; with `sync=True`
(the default, and the only setting a node uses) the batch is on disk when
`apply` returns, and LMDB's copy-on-write B-tree means a crash at any moment
leaves either all of a batch or none of it.

`sync=False` never fsyncs (not at commit, not at close). A killed *process*
still loses nothing (the kernel holds the written pages), but an OS crash or
power cut may lose recent batches or even corrupt the store (LMDB's own
warning for MDB_NOSYNC). It exists for simulations and benchmarks only.

Operational rules this module enforces or relies on (the data dir's own
rules, one process per dir and the format record, are in
`storage.lmdb_data_dir`; range reads in `storage.lmdb_cursors`):

- The map grows instead of failing: when a batch does not fit, the write is
  aborted, the map is doubled (up to MAX_MAP_SIZE_BYTES) and the batch retried.
- A store has one writer. In a running node that is the committer
  (`node.committer`), on the trio thread: it makes every write, one
  `apply_writes` per step, and with `sync=True` each call returns only once
  its batch is durable. (Opening a store also writes, once: the format
  record of a fresh data dir.) py-lmdb binds a write transaction to the
  thread that began it, and resizing the map needs every transaction in the
  process closed; each write opens and finishes its own transaction, and an
  internal lock serialises calls, so neither can be violated even if the
  store is misused from several threads.
- Reads share one cached read transaction. Beginning a transaction per `get`
  cost more than the lookup itself (the graph makes a few per event), so the
  first read after a write begins one and later reads reuse it. Every write
  (`apply`, `apply_writes`) and `close` aborts it *before* touching the
  environment, so a read never sees a snapshot older than the last commit
  (this process is the only writer: the data-dir lock), and no read
  transaction is open while the map is resized. py-lmdb always opens the
  environment with MDB_NOTLS, so a read transaction is not tied to the
  thread that began it; the internal lock keeps its use serial.
- An environment never crosses `fork()`: open the store in the process that
  uses it (analytics read exported logs, never the live store).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import lmdb

from node.core.store import MAX_KEY_BYTES, TABLES, Op, Put, StoreClosedError, StoreError
from storage.lmdb_cursors import read_backward, read_forward
from storage.lmdb_data_dir import (
    DIR_MODE,
    check_format,
    check_tables,
    existing_tables,
    fsync_dir,
    lmdb_error,
    lock_data_dir,
    open_env,
    unlock_data_dir,
)
from storage.memory import check_batch, check_key, check_scan_args, check_writes

# A virtual-address reservation, not disk use: the data file only grows as
# pages are written, so starting large just means fewer growth steps.
DEFAULT_MAP_SIZE_BYTES = 1 << 30  # 1 GiB
# Growth stops here; a store that needs more is a deployment decision, not an
# automatic one (and 1 TiB of address space is still cheap on 64-bit).
MAX_MAP_SIZE_BYTES = 1 << 40  # 1 TiB
MAP_GROWTH_FACTOR = 2  # doubling keeps the number of resizes logarithmic


class LmdbStore:
    """The `Store` protocol on one LMDB environment in the data dir `path`."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        map_size_bytes: int = DEFAULT_MAP_SIZE_BYTES,
        sync: bool = True,
    ) -> None:
        if not 0 < map_size_bytes <= MAX_MAP_SIZE_BYTES:
            raise StoreError(
                f"map_size_bytes={map_size_bytes} must be in 1..MAX_MAP_SIZE_BYTES="
                f"{MAX_MAP_SIZE_BYTES}"
            )
        self._path = Path(path)
        self._closed = False
        self._mutex = threading.Lock()
        self._reader: lmdb.Transaction | None = None  # the shared read transaction (module doc)
        # Held while `copy_to` runs in a worker thread: growing the map (or
        # closing) needs every transaction of the process closed, the copy's too.
        self._copying = threading.Lock()
        self.commits = 0  # how many batches were applied (group-commit statistics)
        try:
            self._path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create data dir {self._path}: {exc}") from exc
        self._lock_fd = lock_data_dir(self._path)
        try:
            self._env = open_env(self._path, map_size_bytes, sync)
        except BaseException:
            unlock_data_dir(self._lock_fd)
            raise
        try:
            self._dbs = self._open_tables()
            if sync:
                fsync_dir(self._path)  # make a fresh data dir's file entries durable too
        except BaseException:
            self._env.close()
            unlock_data_dir(self._lock_fd)
            raise

    # --- the Store protocol -------------------------------------------------

    def get(self, table: str, key: bytes) -> bytes | None:
        # The graph's most frequent call (a few per event): checks inlined.
        with self._mutex:
            db = self._dbs.get(table)
            if db is None or self._closed:
                db = self._db(table)  # raises the precise error
            if not (type(key) is bytes and 0 < len(key) <= MAX_KEY_BYTES):
                check_key(key)  # raises with the precise message
            try:
                # buffers=False (the default): the value is a bytes copy,
                # valid after the read transaction ends.
                return (self._reader or self._read_txn()).get(key, None, db)
            except lmdb.Error as exc:
                self._drop_reader()
                raise lmdb_error(exc, self._path, "reading from") from exc

    def scan(
        self,
        table: str,
        prefix: bytes,
        *,
        start: bytes | None = None,
        reverse: bool = False,
        limit: int | None = None,
    ) -> Iterator[tuple[bytes, bytes]]:
        """Read the whole range in one read transaction, then hand out copies.

        Copying out eagerly is what makes the result a snapshot that no later
        `apply` or map resize can disturb, and it means no read transaction
        outlives the call. Callers bound big ranges with `limit`.
        """
        with self._mutex:
            db = self._db(table)
            check_scan_args(prefix, start, limit)
            if limit == 0:
                return iter(())
            try:
                with self._read_txn().cursor(db=db) as cursor:
                    if reverse:
                        pairs = read_backward(cursor, prefix, start, limit)
                    else:
                        pairs = read_forward(cursor, prefix, start, limit)
            except lmdb.Error as exc:
                self._drop_reader()
                raise lmdb_error(exc, self._path, "reading from") from exc
            return iter(pairs)

    def apply(self, ops: Sequence[Op]) -> None:
        with self._mutex:
            self._check_open()
            # Validate everything before the write transaction exists, so a bad
            # batch is rejected without touching the store.
            check_batch(ops)
            self._drop_reader()
            if ops:
                self._write(lambda txn: self._write_ops(txn, ops))
            self.commits += 1

    def apply_writes(self, writes: Mapping[str, Mapping[bytes, bytes | None]]) -> None:
        """Commit a write-set {table: {key: value, or None to delete}} atomically.

        The same contract as `apply` (validated whole before the transaction,
        one commit, one fsync), in the form `node.core.pending.PendingWrites`
        collects: no op objects to build, and each table's puts go to LMDB in
        one `putmulti` call. A write-set has one value per key, so the order
        of its writes cannot matter.
        """
        with self._mutex:
            self._check_open()
            with_deletes = check_writes(writes)
            self._drop_reader()
            if any(writes.values()):
                self._write(lambda txn: self._write_tables(txn, writes, with_deletes))
            self.commits += 1

    def close(self) -> None:
        """Release the environment and the data dir lock; repeat calls do nothing."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            self._drop_reader()
            # No fsync here even with sync=False: that mode never promises
            # durability, and simulations open and close stores by the hundred.
            try:
                with self._copying:  # never close under a running copy_to
                    self._env.close()
            finally:
                unlock_data_dir(self._lock_fd)

    # --- extras (not part of the protocol) ----------------------------------

    def copy_to(self, path: str | os.PathLike[str]) -> None:
        """Write a consistent, compacted copy of the store into the empty directory `path`.

        LMDB's copy reads one snapshot in a read transaction of its own, so it
        may run in a worker thread while the writer commits (a hot backup,
        node.backup); it never blocks the writer, except that growing the map
        waits for it (and closing the store does).
        """
        with self._mutex:
            self._check_open()
            env = self._env
        with self._copying:
            try:
                env.copy(os.fspath(path), compact=True)
            except lmdb.Error as exc:
                raise StoreError(f"cannot copy {self._path} to {path}: {exc}") from exc

    @property
    def path(self) -> Path:
        return self._path

    @property
    def map_size_bytes(self) -> int:
        """The current map size; it grows as the store fills."""
        with self._mutex:
            self._check_open()
            return int(self._env.info()["map_size"])

    @property
    def last_txn_id(self) -> int:
        """LMDB's id of the last committed write transaction.

        It advances by exactly one per commit (aborted attempts do not count),
        so it shows group commit at work: one `apply`, one commit, one fsync.
        """
        with self._mutex:
            self._check_open()
            return int(self._env.info()["last_txnid"])

    def __enter__(self) -> LmdbStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- internals ----------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("store is closed")

    def _read_txn(self) -> lmdb.Transaction:
        """The cached read transaction (begun now if the last write dropped it)."""
        reader = self._reader
        if reader is None:
            reader = self._reader = self._env.begin()
        return reader

    def _drop_reader(self) -> None:
        """End the cached read transaction: a write is coming, or the store closes."""
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.abort()

    def _db(self, table: str) -> lmdb._Database:
        self._check_open()
        try:
            return self._dbs[table]
        except KeyError:
            raise StoreError(f"unknown table {table!r}") from None

    def _open_tables(self) -> dict[str, lmdb._Database]:
        """Open (creating if needed) one named database per table; check the format."""
        dbs: dict[str, lmdb._Database] = {}

        def open_all(txn: lmdb.Transaction) -> None:
            dbs.clear()
            existing = existing_tables(txn)
            for name in TABLES:
                dbs[name] = self._env.open_db(name.encode("ascii"), txn=txn, create=True)
            check_format(txn, dbs, self._path)
            check_tables(existing, self._path)  # after the format: its error says more

        self._write(open_all)
        return dbs

    def _write_ops(self, txn: lmdb.Transaction, ops: Sequence[Op]) -> None:
        for op in ops:
            db = self._dbs[op.table]
            if isinstance(op, Put):
                txn.put(op.key, op.value, db=db)
            else:
                txn.delete(op.key, db=db)

    def _write_tables(
        self,
        txn: lmdb.Transaction,
        writes: Mapping[str, Mapping[bytes, bytes | None]],
        with_deletes: frozenset[str],
    ) -> None:
        for table, pending in writes.items():
            db = self._dbs[table]
            if table not in with_deletes:
                # The usual case: puts only, handed to LMDB without a copy.
                if pending:
                    with txn.cursor(db=db) as cursor:
                        cursor.putmulti(pending.items())
                continue
            puts = [(key, value) for key, value in pending.items() if value is not None]
            if puts:
                with txn.cursor(db=db) as cursor:
                    cursor.putmulti(puts)
            for key, value in pending.items():
                if value is None:
                    txn.delete(key, db=db)

    def _write(self, work: Callable[[lmdb.Transaction], None]) -> None:
        """Run `work` in one write transaction, growing the map until it fits.

        The retry is safe because a failed transaction is aborted whole: `work`
        always starts again from the committed state.
        """
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    work(txn)
                return
            except lmdb.MapFullError:
                self._grow_map()
            except lmdb.Error as exc:
                raise lmdb_error(exc, self._path, "writing to") from exc

    def _grow_map(self) -> None:
        current = int(self._env.info()["map_size"])
        if current >= MAX_MAP_SIZE_BYTES:
            raise StoreError(
                f"store {self._path} is full: the map reached MAX_MAP_SIZE_BYTES="
                f"{MAX_MAP_SIZE_BYTES}"
            )
        grown = min(current * MAP_GROWTH_FACTOR, MAX_MAP_SIZE_BYTES)
        try:
            # No transaction is open here (the failed one was aborted, the
            # mutex keeps other calls out, `_copying` waits for a copy_to),
            # which set_mapsize requires.
            with self._copying:
                self._env.set_mapsize(grown)
        except lmdb.Error as exc:
            raise StoreError(f"cannot grow the map of {self._path} to {grown}: {exc}") from exc
