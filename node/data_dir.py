"""Opening a node's data dir: private, with its key and store, never silently empty.

`Node.open` calls `open_data_dir` before anything else. What it guards
against, each a refusal with one line for the user (a `NodeError`):

- Other users: the dir is created 0700 (`DATA_DIR_MODE`) whatever the umask,
  and a dir that group or others may write is refused (they could swap the
  key or the store). Files in it are created 0600 by their owners (the key
  file, the store, the marker); the daemon also runs with umask 0077
  (`megnode run`) for the control socket and the logs.
- A silently empty store: the first start writes `node.started`
  (`STARTED_MARKER`) once the key and the store exist. A later start that
  finds the marker but a missing or empty store refuses, since opening it
  would begin an empty store and the node would carry on as if it had never
  held anything; `reinit=True` (`megnode run --reinit`) accepts that.
- A lost key: a node that has run before (marker, or a non-empty store) with
  no `node.key` is refused rather than given a new identity, because a new key
  makes it a different node that cannot continue what the old one authored.
  To start afresh as a new node, use a new data dir.
- A damaged store: every `StoreError` of the open (truncated or overwritten
  file, format, lock) becomes a `NodeError` with the store's own message.
"""

from __future__ import annotations

import os
import stat
from datetime import datetime, timezone
from pathlib import Path

from node.core.identity import Identity
from node.core.store import StoreError
from node.errors import NodeError
from node.keyfile import load_or_create_identity
from storage.lmdb_meta import data_file_is_empty
from storage.lmdb_store import LmdbStore

KEY_FILE = "node.key"
STORE_DIR = "store"
STARTED_MARKER = "node.started"  # written at first start: this node has run here
DATA_DIR_MODE = 0o700
MARKER_MODE = 0o600
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def open_data_dir(data_dir: Path, *, reinit: bool = False) -> tuple[Identity, LmdbStore]:
    """The node's identity and its open store in `data_dir` (created on first start)."""
    _make_private_dir(data_dir)
    store_dir = data_dir / STORE_DIR
    key_path = data_dir / KEY_FILE
    marker = data_dir / STARTED_MARKER
    has_run = marker.exists()
    store_empty = data_file_is_empty(store_dir)
    if not key_path.exists() and (has_run or not store_empty):
        raise NodeError(
            f"the key {key_path} is missing but this node has run before (its store is at "
            f"{store_dir}); restore the key from a backup (a new key would make it another "
            "node), or use a new data dir to start a new node")
    if has_run and store_empty and not reinit:
        raise NodeError(
            f"the store at {store_dir} is missing or empty but this node has run before; "
            "restore it from a backup, or start with `--reinit` to begin empty")
    try:
        store = LmdbStore(store_dir)
    except StoreError as exc:
        raise NodeError(str(exc)) from None
    try:
        identity = load_or_create_identity(key_path)
        if not has_run:
            _write_marker(marker)
    except BaseException:
        store.close()
        raise
    return identity, store


def _make_private_dir(data_dir: Path) -> None:
    """Create `data_dir` 0700 (whatever the umask); refuse one that others may write."""
    try:
        data_dir.mkdir(mode=DATA_DIR_MODE, parents=True, exist_ok=True)
        mode = data_dir.stat().st_mode
    except OSError as exc:
        raise NodeError(f"cannot create data dir {data_dir}: {exc.strerror or exc}") from None
    if mode & _OTHERS_WRITE:
        raise NodeError(
            f"data dir {data_dir} is writable by other users (mode {oct(mode & 0o777)}); "
            f"run: chmod 700 {data_dir}")


def _write_marker(marker: Path) -> None:
    """Record (durably) that this node has started here once."""
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, MARKER_MODE)
        try:
            started = datetime.now(timezone.utc).isoformat(timespec="seconds")
            os.write(fd, f"first started {started}\n".encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        dir_fd = os.open(marker.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise NodeError(f"cannot write {marker}: {exc.strerror or exc}") from None
