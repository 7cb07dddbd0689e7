"""Backups of a node's store and putting one back (`megnode backup`, `megnode restore`).

Why: the store is one LMDB environment, and copying its file with `cp`
while a daemon writes can tear it. LMDB's own copy (`mdb_env_copy2` with
compaction) reads one snapshot in a read transaction, so the copy is
consistent and the writer is never blocked. A running daemon holds the
environment, so a hot backup goes through its control socket (the `backup`
op: `Node.backup` runs the copy in a worker thread, the trio loop stays
free); a stopped node's store is copied here directly (`backup_offline`),
holding the data dir's lock so no daemon starts meanwhile.

A backup is a directory holding LMDB's `data.mdb`. It does not hold the
node's key (`node.key`, a secret kept apart): restore a store next to the
key of the node that wrote it. `restore` refuses while a daemon runs on the
data dir, and refuses to replace an existing store unless forced; it
checks that the backup is a store in this build's format before it puts
it in place (a copy, fsynced, then renamed: a crash leaves the old store or
the new one).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import lmdb

from node.core.store import STORE_FORMAT, TABLE_META, TABLES, StoreError
from storage.lmdb_data_dir import fsync_dir, lock_data_dir, unlock_data_dir
from storage.lmdb_meta import check_data_file
from storage.memory import STORE_FORMAT_KEY, encode_store_format

DATA_FILE = "data.mdb"  # LMDB's data file; a backup directory holds just this
LMDB_LOCK_FILE = "lock.mdb"  # LMDB's reader table: stale after a restore, so removed
RESTORE_TEMP_SUFFIX = ".restoring"


class BackupError(Exception):
    """A backup or restore the user asked for cannot be done; the message says why."""


def prepare_target(out: Path) -> Path:
    """Make `out` an empty directory for a backup (refuse one that holds anything)."""
    out = out.absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BackupError(f"{out} exists and is not an empty directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BackupError(f"cannot create {out}: {exc.strerror or exc}") from None
    return out


def finish_backup(out: Path) -> dict[str, object]:
    """Make the copy durable; what the CLI prints about it."""
    data = out / DATA_FILE
    with open(data, "rb") as handle:
        os.fsync(handle.fileno())
    fsync_dir(out)
    return {"backup": str(out), "bytes": data.stat().st_size}


def backup_offline(store_dir: Path, out: Path) -> dict[str, object]:
    """Copy a stopped node's store; StoreLockedError if a daemon holds it."""
    if not (store_dir / DATA_FILE).is_file():
        raise BackupError(f"no store in {store_dir}")
    lock_fd = lock_data_dir(store_dir)
    try:
        out = prepare_target(out)
        env = _open_read_only(store_dir)
        try:
            env.copy(str(out), compact=True)
        except lmdb.Error as exc:
            raise BackupError(f"cannot copy {store_dir} to {out}: {exc}") from None
        finally:
            env.close()
    finally:
        unlock_data_dir(lock_fd)
    return finish_backup(out)


def _open_read_only(path: Path) -> lmdb.Environment:
    try:
        # A truncated file would make LMDB's first read past its end a SIGBUS.
        check_data_file(path, extend=False)
    except StoreError as exc:
        raise BackupError(str(exc)) from None
    try:
        # lock=False: the caller holds the data dir's flock (or owns the copy).
        return lmdb.open(str(path), readonly=True, lock=False, subdir=True, max_dbs=len(TABLES))
    except lmdb.Error as exc:
        raise BackupError(f"cannot open the store in {path}: {exc}") from None


def check_backup(source: Path) -> None:
    """Raise BackupError unless `source` holds a store in this build's format."""
    if not (source / DATA_FILE).is_file():
        raise BackupError(f"{source} is not a backup (no {DATA_FILE} in it)")
    env = _open_read_only(source)
    try:
        with env.begin() as txn:
            try:
                meta = env.open_db(TABLE_META.encode("ascii"), txn=txn, create=False)
            except lmdb.Error:
                raise BackupError(f"{source} is not a megnode store (no meta table)") from None
            found = txn.get(STORE_FORMAT_KEY, db=meta)
    finally:
        env.close()
    if found != encode_store_format(STORE_FORMAT):
        raise BackupError(f"{source} holds store format {found!r}; this build reads "
                          f"format {STORE_FORMAT} only")


def restore(store_dir: Path, source: Path, *, force: bool = False) -> dict[str, object]:
    """Put the backup in `source` in place as the store in `store_dir`.

    Raises StoreLockedError if a daemon runs on it, BackupError if a store
    is there already (unless `force`) or `source` is no usable backup.
    """
    check_backup(source)
    try:
        store_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BackupError(f"cannot create {store_dir}: {exc.strerror or exc}") from None
    lock_fd = lock_data_dir(store_dir)
    try:
        target = store_dir / DATA_FILE
        if target.exists() and not force:
            raise BackupError(f"{store_dir} already holds a store (restore --force replaces it)")
        temp = store_dir / (DATA_FILE + RESTORE_TEMP_SUFFIX)
        try:
            shutil.copyfile(source / DATA_FILE, temp)
            with open(temp, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(temp, target)
            (store_dir / LMDB_LOCK_FILE).unlink(missing_ok=True)
        except OSError as exc:
            temp.unlink(missing_ok=True)
            raise BackupError(f"cannot restore into {store_dir}: {exc.strerror or exc}") from None
        fsync_dir(store_dir)
    finally:
        unlock_data_dir(lock_fd)
    return {"restored": str(store_dir), "from": str(source), "bytes": target.stat().st_size}


__all__ = ["BackupError", "DATA_FILE", "StoreError", "backup_offline", "check_backup",
           "finish_backup", "prepare_target", "restore"]
