"""The LMDB data dir: who may open it, how its environment opens, what format it holds.

`storage.lmdb_store.LmdbStore` reads and writes; this module is everything
about the directory around it, kept apart because each piece guards against
a different way of losing or corrupting a store before a single key is read:

- One process at a time: an flock on `<dir>/LOCK`, which also records the
  holder's pid so the error says who has it (`lock_data_dir`). flock, unlike
  the POSIX fcntl locks LMDB takes internally, belongs to the open file, so
  it also refuses a second open from this very process, which LMDB forbids.
- The environment opens with one named database per table and a key size
  limit at least `MAX_KEY_BYTES` (`open_env`), the map rounded to whole OS
  pages.
- A fresh data dir's file entries are made durable (`fsync_dir`).
- Everything in it is private to the node's user whatever the umask: the
  directory 0700 (`DIR_MODE`), the LMDB files and the lock 0600 (`FILE_MODE`).
- Before the environment maps `data.mdb`, the file is checked against its own
  meta pages (`storage.lmdb_meta`), so a truncated file is an error, not a
  SIGBUS; `lmdb_error` names what an LMDB failure means for the user.
- The format record in TABLE_META is checked on open (`check_format`), so a
  build never reads (or scribbles on) a data dir written in a format it does
  not understand; a fresh store gets the record.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from pathlib import Path

import lmdb

from node.core.store import MAX_KEY_BYTES, STORE_FORMAT, TABLE_META, TABLES, StoreError
from storage.lmdb_meta import StoreCorruptError, check_data_file
from storage.memory import STORE_FORMAT_KEY, encode_store_format

LOCK_FILE_NAME = "LOCK"
DIR_MODE = 0o700  # the data dir: the node's user only
FILE_MODE = 0o600  # every file in it
# A failed write with less free space than this on the store's filesystem is
# reported as "disk full" (LMDB turns a short write into EIO).
DISK_FULL_BELOW_BYTES = 1 << 20
# What LMDB says about a file it cannot make sense of: damage, not a bug.
_DAMAGE_ERRORS: tuple[type[lmdb.Error], ...] = (
    lmdb.CorruptedError, lmdb.InvalidError, lmdb.PageNotFoundError, lmdb.IncompatibleError,
    lmdb.VersionMismatchError, lmdb.BadTxnError, lmdb.PanicError)
PID_RECORD_BYTES = 21  # a right-aligned decimal pid (up to 20 digits) and a newline


class StoreLockedError(StoreError):
    """The data dir is already open (in another process, or in this one)."""


class StoreFormatError(StoreError):
    """The data dir was written in a store format this build does not read."""


class StoreDiskFullError(StoreError):
    """A commit found no space left on the disk; the batch was not stored."""


def _nearly_full(path: Path) -> bool:
    """Whether the filesystem holding `path` has (almost) no space left.

    LMDB reports a page write cut short by a full disk as EIO, not ENOSPC, so
    a failed write is called "disk full" when the disk is in fact full.
    """
    try:
        info = os.statvfs(path)
    except OSError:
        return False
    return info.f_bavail * info.f_frsize < DISK_FULL_BELOW_BYTES


def lmdb_error(exc: lmdb.Error | OSError, path: Path, action: str) -> StoreError:
    """The StoreError subclass (and one-line message) for an LMDB failure while `action`."""
    text = str(exc)
    if (isinstance(exc, lmdb.DiskError) or getattr(exc, "errno", None) == errno.ENOSPC
            or "No space left" in text or _nearly_full(path)):
        return StoreDiskFullError(
            f"disk full: no space left on {path}; the last batch was not stored; "
            "reads still work")
    if isinstance(exc, _DAMAGE_ERRORS):
        return StoreCorruptError(
            f"the store at {path} is damaged (LMDB: {text}); restore it from a backup")
    return StoreError(f"{action} {path} failed: {text}")


# --- the lock ---------------------------------------------------------------


def lock_data_dir(path: Path) -> int:
    """Take an exclusive flock on `<path>/LOCK`, record our pid in it; the lock's fd.

    The kernel drops the flock when the process dies: no stale locks.
    """
    lock_path = path / LOCK_FILE_NAME
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
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


def unlock_data_dir(fd: int) -> None:
    """Release the lock taken by `lock_data_dir`."""
    # Leave the file in place: unlinking a lock file races with the next opener.
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (the files LMDB just created) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- the environment --------------------------------------------------------


def open_env(path: Path, map_size_bytes: int, sync: bool) -> lmdb.Environment:
    """The LMDB environment in `path`, with room for one named database per table.

    `data.mdb` is checked against its meta pages first (`check_data_file`):
    a truncated file must never be mapped.
    """
    check_data_file(path)
    try:
        env = lmdb.open(
            str(path),
            map_size=round_to_pages(map_size_bytes),
            subdir=True,
            max_dbs=len(TABLES),
            sync=sync,
            metasync=sync,
            mode=FILE_MODE,
        )
    except lmdb.Error as exc:
        raise lmdb_error(exc, path, "opening the LMDB environment in") from None
    if env.max_key_size() < MAX_KEY_BYTES:
        # The protocol promises MAX_KEY_BYTES keys; a liblmdb built with a
        # smaller limit would fail on valid batches, so refuse up front.
        env.close()
        raise StoreError(
            f"liblmdb max key size {env.max_key_size()} < MAX_KEY_BYTES={MAX_KEY_BYTES}"
        )
    return env


def round_to_pages(size_bytes: int) -> int:
    """LMDB wants the map size to be a whole number of OS pages."""
    pages = -(-size_bytes // mmap.PAGESIZE)
    return pages * mmap.PAGESIZE


# --- the format record ------------------------------------------------------


def check_format(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database], path: Path) -> None:
    """Raise StoreFormatError unless the store is in STORE_FORMAT; record it in a fresh one.

    `txn` is a write transaction: an empty store gets the format record in it.
    """
    expected = encode_store_format(STORE_FORMAT)
    found = txn.get(STORE_FORMAT_KEY, db=dbs[TABLE_META])
    if found == expected:
        return
    if found is not None:
        raise StoreFormatError(
            f"data dir {path} has store format {found!r}; this build reads "
            f"format {expected!r} only{_format_hint(found)}"
        )
    if any(txn.stat(db)["entries"] for db in dbs.values()):
        raise StoreFormatError(f"data dir {path} holds data but no store format record")
    txn.put(STORE_FORMAT_KEY, expected, db=dbs[TABLE_META])


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


# --- the table set ----------------------------------------------------------


def existing_tables(txn: lmdb.Transaction) -> set[bytes]:
    """The names of the named databases the store holds (the main database's keys)."""
    with txn.cursor() as cursor:
        return {bytes(key) for key in cursor.iternext(keys=True, values=False)}


def check_tables(existing: set[bytes], path: Path) -> None:
    """Raise unless the store was fresh (no tables) or had every table before this open.

    A store with some tables but not all lost them to damage (or was written
    by something else): creating the missing ones empty would hide that.
    """
    missing = [name for name in TABLES if name.encode("ascii") not in existing]
    if existing and missing:
        raise StoreCorruptError(
            f"store {path} is damaged: it lacks the table(s) {', '.join(missing)}")
