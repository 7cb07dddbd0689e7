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

Operational rules this module enforces or relies on:

- The map grows instead of failing: when a batch does not fit, the write is
  aborted, the map is doubled (up to MAX_MAP_SIZE_BYTES) and the batch retried.
- A data dir is used by one process at a time: an flock on `<dir>/LOCK`, which
  also names the holder's pid so the error says who has it.
- The format record in TABLE_META is checked on open, so a build never reads
  (or scribbles on) a data dir written in a format it does not understand.
- A store has one writer: in a node, the committer (node.committer) on the
  trio thread makes every write, one transaction per group commit, and
  returns only once it is durable. py-lmdb binds a write transaction to the
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

import fcntl
import mmap
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import lmdb

from storage.memory import (
    STORE_FORMAT_KEY,
    check_batch,
    check_key,
    check_scan_args,
    check_writes,
    encode_store_format,
)
from node.core.store import (
    MAX_KEY_BYTES,
    STORE_FORMAT,
    TABLE_META,
    TABLES,
    Op,
    Put,
    StoreClosedError,
    StoreError,
    prefix_upper_bound,
)

# A virtual-address reservation, not disk use: the data file only grows as
# pages are written, so starting large just means fewer growth steps.
DEFAULT_MAP_SIZE_BYTES = 1 << 30  # 1 GiB
# Growth stops here; a store that needs more is a deployment decision, not an
# automatic one (and 1 TiB of address space is still cheap on 64-bit).
MAX_MAP_SIZE_BYTES = 1 << 40  # 1 TiB
MAP_GROWTH_FACTOR = 2  # doubling keeps the number of resizes logarithmic
LOCK_FILE_NAME = "LOCK"
PID_RECORD_BYTES = 21  # a right-aligned decimal pid (up to 20 digits) and a newline


class StoreLockedError(StoreError):
    """The data dir is already open (in another process, or in this one)."""


class StoreFormatError(StoreError):
    """The data dir was written in a store format this build does not read."""


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
        self.commits = 0  # how many batches were applied (group-commit statistics)
        try:
            self._path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create data dir {self._path}: {exc}") from exc
        self._lock_fd = _lock_data_dir(self._path)
        try:
            self._env = _open_env(self._path, _round_to_pages(map_size_bytes), sync)
        except BaseException:
            _unlock_data_dir(self._lock_fd)
            raise
        try:
            self._dbs = self._open_tables()
            if sync:
                _fsync_dir(self._path)  # make a fresh data dir's file entries durable too
        except BaseException:
            self._env.close()
            _unlock_data_dir(self._lock_fd)
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
                raise StoreError(f"read from {self._path} failed: {exc}") from exc

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
                        pairs = _read_backward(cursor, prefix, start, limit)
                    else:
                        pairs = _read_forward(cursor, prefix, start, limit)
            except lmdb.Error as exc:
                self._drop_reader()
                raise StoreError(f"read from {self._path} failed: {exc}") from exc
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
                self._env.close()
            finally:
                _unlock_data_dir(self._lock_fd)

    # --- extras (not part of the protocol) ----------------------------------

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
            for name in TABLES:
                dbs[name] = self._env.open_db(name.encode("ascii"), txn=txn, create=True)
            self._check_format(txn, dbs)

        self._write(open_all)
        return dbs

    def _check_format(self, txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> None:
        expected = encode_store_format(STORE_FORMAT)
        found = txn.get(STORE_FORMAT_KEY, db=dbs[TABLE_META])
        if found == expected:
            return
        if found is not None:
            raise StoreFormatError(
                f"data dir {self._path} has store format {found!r}; this build reads "
                f"format {expected!r} only{_format_hint(found)}"
            )
        if any(txn.stat(db)["entries"] for db in dbs.values()):
            raise StoreFormatError(
                f"data dir {self._path} holds data but no store format record"
            )
        txn.put(STORE_FORMAT_KEY, expected, db=dbs[TABLE_META])

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
                raise StoreError(f"write to {self._path} failed: {exc}") from exc

    def _grow_map(self) -> None:
        current = int(self._env.info()["map_size"])
        if current >= MAX_MAP_SIZE_BYTES:
            raise StoreError(
                f"store {self._path} is full: the map reached MAX_MAP_SIZE_BYTES="
                f"{MAX_MAP_SIZE_BYTES}"
            )
        grown = min(current * MAP_GROWTH_FACTOR, MAX_MAP_SIZE_BYTES)
        try:
            # No transaction is open here (the failed one was aborted and the
            # mutex keeps other calls out), which set_mapsize requires.
            self._env.set_mapsize(grown)
        except lmdb.Error as exc:
            raise StoreError(f"cannot grow the map of {self._path} to {grown}: {exc}") from exc


def _format_hint(found: bytes) -> str:
    """What to do about a data dir in another format (no build converts one in place)."""
    try:
        version = int(found)
    except ValueError:
        return " (the format record is garbled)"
    if version < STORE_FORMAT:
        return (": it was written by an older megnode. Keep the old build to read it, or "
                "move it aside and start with an empty data dir (the node fetches its topics "
                "again from peers; events only it held are in the old dir)")
    return ": it was written by a newer megnode; run that build"


def _read_forward(
    cursor: lmdb.Cursor, prefix: bytes, start: bytes | None, limit: int | None
) -> list[tuple[bytes, bytes]]:
    low = prefix if start is None else max(prefix, start)
    # LMDB rejects an empty key, and b"" sorts before every key anyway.
    positioned = cursor.set_range(low) if low else cursor.first()
    if not positioned:
        return []
    pairs: list[tuple[bytes, bytes]] = []
    for key, value in cursor.iternext():
        if not key.startswith(prefix) or len(pairs) == limit:
            break
        pairs.append((key, value))
    return pairs


def _read_backward(
    cursor: lmdb.Cursor, prefix: bytes, start: bytes | None, limit: int | None
) -> list[tuple[bytes, bytes]]:
    if not _position_at_last_candidate(cursor, prefix, start):
        return []
    pairs: list[tuple[bytes, bytes]] = []
    for key, value in cursor.iterprev():
        # Walking down from the top of [prefix, bound), the first key without
        # the prefix is below the range: nothing further can match.
        if not key.startswith(prefix) or len(pairs) == limit:
            break
        pairs.append((key, value))
    return pairs


def _position_at_last_candidate(
    cursor: lmdb.Cursor, prefix: bytes, start: bytes | None
) -> bool:
    """Put the cursor on the greatest key <= start (inclusive) and < the prefix bound."""
    bound = prefix_upper_bound(prefix)
    if start is not None and (bound is None or start < bound):
        if not start:
            return False  # no key is <= b""
        if not cursor.set_range(start):
            return cursor.last()
        return cursor.key() == start or cursor.prev()
    if bound is None:
        return cursor.last()
    if not cursor.set_range(bound):
        return cursor.last()
    return cursor.prev()


def _open_env(path: Path, map_size_bytes: int, sync: bool) -> lmdb.Environment:
    try:
        env = lmdb.open(
            str(path),
            map_size=map_size_bytes,
            subdir=True,
            max_dbs=len(TABLES),
            sync=sync,
            metasync=sync,
        )
    except lmdb.Error as exc:
        raise StoreError(f"cannot open LMDB environment in {path}: {exc}") from exc
    if env.max_key_size() < MAX_KEY_BYTES:
        # The protocol promises MAX_KEY_BYTES keys; a liblmdb built with a
        # smaller limit would fail on valid batches, so refuse up front.
        env.close()
        raise StoreError(
            f"liblmdb max key size {env.max_key_size()} < MAX_KEY_BYTES={MAX_KEY_BYTES}"
        )
    return env


def _round_to_pages(size_bytes: int) -> int:
    """LMDB wants the map size to be a whole number of OS pages."""
    pages = -(-size_bytes // mmap.PAGESIZE)
    return pages * mmap.PAGESIZE


def _lock_data_dir(path: Path) -> int:
    """Take an exclusive flock on `<path>/LOCK` and record our pid in it.

    flock (unlike the POSIX fcntl locks LMDB uses internally) belongs to the
    open file, so it also stops a second open from this very process, which
    LMDB forbids. The kernel drops it when the process dies: no stale locks.
    """
    lock_path = path / LOCK_FILE_NAME
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StoreError(f"cannot open lock file {lock_path}: {exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_pid(fd)
        os.close(fd)
        if holder == str(os.getpid()):
            raise StoreLockedError(
                f"data dir {path} is already open in this process (pid {holder})"
            ) from None
        raise StoreLockedError(
            f"data dir {path} is in use by another process (pid {holder})"
        ) from None
    except OSError as exc:
        os.close(fd)
        raise StoreError(f"cannot lock {lock_path}: {exc}") from exc
    # Informational only (the flock is the lock), so no fsync. Every record
    # has the same width, so overwriting needs no (slow) truncate.
    record = str(os.getpid()).rjust(PID_RECORD_BYTES - 1) + "\n"
    os.pwrite(fd, record.encode("ascii"), 0)
    return fd


def _read_pid(fd: int) -> str:
    """The pid recorded by the lock holder, or "unknown" if not written yet."""
    record = os.pread(fd, PID_RECORD_BYTES, 0).decode("ascii", "replace").strip()
    return record if record.isdigit() else "unknown"


def _unlock_data_dir(fd: int) -> None:
    # Leave the file in place: unlinking a lock file races with the next opener.
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
