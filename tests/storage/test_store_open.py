"""Opening a store and a node's data dir safely, in-process (the processes: tests/e2e/test_store_faults.py).

Every damaged file must become a `StoreCorruptError` naming the file before
LMDB maps it (a truncated file mapped is a SIGBUS, which would kill pytest
itself); a node that has run before refuses a missing store or key; a data
dir is private; a full disk is a `StoreDiskFullError` after which reads and
smaller writes still work.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.core.store import TABLE_EVENTS, TABLES, StoreError
from node.data_dir import KEY_FILE, STARTED_MARKER, STORE_DIR, open_data_dir
from node.errors import NodeError
from storage.lmdb_data_dir import StoreDiskFullError
from storage.lmdb_meta import DATA_FILE_NAME, StoreCorruptError, check_data_file
from storage.lmdb_store import LmdbStore
from tests.helpers import mounted_tmpfs

BATCHES = 40
ENTRIES_PER_BATCH = 50
VALUE_BYTES = 500
TMPFS_SIZE = "4m"


def filled_store(path: Path) -> Path:
    with LmdbStore(path) as store:
        for batch in range(BATCHES):
            store.apply_writes({TABLE_EVENTS: {
                f"{batch:04}-{i:04}".encode(): os.urandom(VALUE_BYTES)
                for i in range(ENTRIES_PER_BATCH)}})
    return path / DATA_FILE_NAME


@pytest.mark.parametrize("cut", ["half", "8k", "one page", "4097 bytes", "100 bytes"])
def test_a_truncated_data_file_is_refused_before_it_is_mapped(cut: str, tmp_path: Path) -> None:
    data = filled_store(tmp_path / "store")
    size = data.stat().st_size
    new_size = {"half": size // 2 // 4096 * 4096, "8k": 8192, "one page": 4096,
                "4097 bytes": 4097, "100 bytes": 100}[cut]
    os.truncate(data, new_size)
    with pytest.raises(StoreCorruptError, match=f"{data}.*truncated"):
        LmdbStore(tmp_path / "store")


BIG_VALUE_BYTES = 100_000  # an overflow run of 25 pages


def short_store(path: Path) -> tuple[Path, int]:
    """A healthy store whose file ends before its last page, made by LMDB itself.

    The last commit reads the free list (so LMDB holds it in memory), stores
    a big value that stays (an overflow run at the end of the file, since the
    free list holds no run that long), then a second big value and deletes it
    again: LMDB hands that second run back to the free list unwritten, but the
    meta's last page already counts it. Returns the file and the bytes up to
    that last page.
    """
    import lmdb

    data = filled_store(path)
    env = lmdb.open(str(path), max_dbs=len(TABLES))
    events = env.open_db(TABLE_EVENTS.encode())
    with env.begin(write=True) as txn:  # copies pages: the free list is not empty
        txn.put(b"0000-0000", b"rewritten", db=events)
    with env.begin(write=True) as txn:
        txn.put(b"0000-0001", b"rewritten", db=events)  # takes a page from the free list
        txn.put(b"kept", os.urandom(BIG_VALUE_BYTES), db=events)
        txn.put(b"transient", os.urandom(BIG_VALUE_BYTES), db=events)
        txn.delete(b"transient", db=events)
    last_page = env.info()["last_pgno"]
    env.close()
    return data, (last_page + 1) * env_page_size(path)


def env_page_size(path: Path) -> int:
    import lmdb

    env = lmdb.open(str(path), max_dbs=len(TABLES), readonly=True, lock=False)
    try:
        return int(env.stat()["psize"])
    finally:
        env.close()


def lmdb_last_page(path: Path) -> int:
    import lmdb

    env = lmdb.open(str(path), max_dbs=8, readonly=True, lock=False)
    try:
        return int(env.info()["last_pgno"])
    finally:
        env.close()


def test_a_store_short_by_free_pages_opens_and_reads_back_everything(tmp_path: Path) -> None:
    data, needed = short_store(tmp_path / "store")
    assert data.stat().st_size < needed  # the case: pages counted but never written
    with LmdbStore(tmp_path / "store") as store:
        assert store.get(TABLE_EVENTS, b"0000-0000") == b"rewritten"
        assert store.get(TABLE_EVENTS, b"transient") is None
        assert len(store.get(TABLE_EVENTS, b"kept") or b"") == BIG_VALUE_BYTES
        for batch in range(BATCHES):
            for i in range(ENTRIES_PER_BATCH):
                assert store.get(TABLE_EVENTS, f"{batch:04}-{i:04}".encode()) is not None
        store.apply_writes({TABLE_EVENTS: {b"after": os.urandom(BIG_VALUE_BYTES)}})
    assert data.stat().st_size >= needed  # extended over the free pages: the quick path
    with LmdbStore(tmp_path / "store") as store:
        assert store.get(TABLE_EVENTS, b"after") is not None


@pytest.mark.parametrize("cut_pages", [1, 3, 12])
def test_a_short_store_cut_inside_a_referenced_overflow_run_is_refused(
        cut_pages: int, tmp_path: Path) -> None:
    """The walk follows F_BIGDATA runs: the kept run ends the written file, so any
    cut takes pages of it."""
    data, _ = short_store(tmp_path / "store")
    page_size = env_page_size(tmp_path / "store")
    size = data.stat().st_size - cut_pages * page_size
    os.truncate(data, size)
    with pytest.raises(StoreCorruptError,
                       match=f"{data}.*truncated.*references page {size // page_size},"):
        LmdbStore(tmp_path / "store")


# Every kind of page reference the walk follows: branch pages, overflow runs
# (F_BIGDATA), named DBs and DUPSORT sub-trees (F_SUBDATA), DUPFIXED leaves.
SWEEP_DBS = {b"plain": {}, b"dups": {"dupsort": True},
             b"fixed": {"dupsort": True, "dupfixed": True}}
SWEEP_ENTRIES = 100  # per table and round: a few branch levels, ~100 pages in all
SWEEP_READER = """
import sys, lmdb
env = lmdb.open(sys.argv[1], readonly=True, lock=False, max_dbs=8)
with env.begin() as txn:
    for name, flags in {dbs!r}.items():
        db = env.open_db(name, txn=txn, **flags)
        for key, value in txn.cursor(db=db):
            sum(value)
print("read")
"""


def sweep_store(path: Path) -> None:
    import lmdb

    env = lmdb.open(str(path), max_dbs=8, map_size=1 << 26)
    dbs = {name: env.open_db(name, **flags) for name, flags in SWEEP_DBS.items()}
    for round in range(4):
        with env.begin(write=True) as txn:
            for i in range(SWEEP_ENTRIES):
                txn.put(b"%03d-%d" % (i, round), os.urandom(300), db=dbs[b"plain"])
                txn.put(b"%02d" % (i % 2), b"%04d" % (round * 1000 + i), db=dbs[b"dups"])
                txn.put(b"f", (round * 1000 + i).to_bytes(8, "big"),
                        db=dbs[b"fixed"])
            txn.put(b"big-%d" % round, os.urandom(BIG_VALUE_BYTES), db=dbs[b"plain"])
    with env.begin(write=True) as txn:  # leaves an unwritten run past the end (short_store)
        txn.put(b"000-0", b"rewritten", db=dbs[b"plain"])
        txn.put(b"transient", os.urandom(BIG_VALUE_BYTES), db=dbs[b"plain"])
        txn.delete(b"transient", db=dbs[b"plain"])
    env.close()


def test_every_cut_the_check_lets_through_reads_back_in_full(tmp_path: Path) -> None:
    """Soundness against LMDB itself: a cut store the check passes is read whole
    (every table, every value) by a child process, which a missing page would
    kill with SIGBUS; and the uncut short store passes."""
    import shutil
    import subprocess
    import sys

    store = tmp_path / "store"
    sweep_store(store)
    original = tmp_path / "original.mdb"
    shutil.copy(store / DATA_FILE_NAME, original)
    page_size = env_page_size(store)
    pages = original.stat().st_size // page_size
    last_page = lmdb_last_page(store)
    assert pages <= last_page  # short: the run of the last commit was never written
    passed = []
    for cut in range(pages, 1, -1):
        os.truncate(store / DATA_FILE_NAME, cut * page_size)  # only ever shorter...
        try:
            check_data_file(store)
        except StoreCorruptError as refused:
            assert "truncated" in str(refused) or "damaged" in str(refused)
            continue
        passed.append(cut)
        shutil.copy(original, store / DATA_FILE_NAME)  # ...but a pass extends it
        child = subprocess.run(
            [sys.executable, "-c", SWEEP_READER.format(dbs=SWEEP_DBS), str(store)],
            capture_output=True, text=True, timeout=60)
        assert (child.returncode, child.stdout) == (0, "read\n"), (cut, child.stderr)
    assert passed and passed[0] == pages


def test_zeroed_meta_pages_are_refused(tmp_path: Path) -> None:
    data = filled_store(tmp_path / "store")
    with open(data, "r+b") as handle:
        handle.write(bytes(8192))
    with pytest.raises(StoreCorruptError, match="no LMDB magic"):
        check_data_file(tmp_path / "store")


def test_a_healthy_store_passes_and_reopens(tmp_path: Path) -> None:
    filled_store(tmp_path / "store")
    check_data_file(tmp_path / "store")
    with LmdbStore(tmp_path / "store") as store:
        assert store.get(TABLE_EVENTS, b"0000-0000") is not None


def test_a_store_missing_tables_is_refused(tmp_path: Path) -> None:
    import lmdb

    path = tmp_path / "store"
    LmdbStore(path).close()
    env = lmdb.open(str(path), max_dbs=len(TABLES))
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(TABLES[-1].encode(), txn=txn), delete=True)
    env.close()
    with pytest.raises(StoreCorruptError, match=f"lacks the table.*{TABLES[-1]}"):
        LmdbStore(path)


def test_store_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        LmdbStore(tmp_path / "store").close()
    finally:
        os.umask(old)
    assert (tmp_path / "store").stat().st_mode & 0o777 == 0o700
    for entry in (tmp_path / "store").iterdir():
        assert entry.stat().st_mode & 0o077 == 0, entry


# --- the node's data dir ---------------------------------------------------------


def test_first_start_is_automatic_and_writes_the_marker(tmp_path: Path) -> None:
    _, store = open_data_dir(tmp_path / "node")
    store.close()
    assert (tmp_path / "node" / STARTED_MARKER).exists()
    assert (tmp_path / "node").stat().st_mode & 0o777 == 0o700


def test_a_deleted_store_is_refused_unless_reinit(tmp_path: Path) -> None:
    data_dir = tmp_path / "node"
    open_data_dir(data_dir)[1].close()
    (data_dir / STORE_DIR / DATA_FILE_NAME).unlink()
    with pytest.raises(NodeError, match="missing or empty but this node has run before.*--reinit"):
        open_data_dir(data_dir)
    open_data_dir(data_dir, reinit=True)[1].close()


def test_a_lost_key_with_a_store_is_refused(tmp_path: Path) -> None:
    data_dir = tmp_path / "node"
    _, store = open_data_dir(data_dir)
    store.apply_writes({TABLE_EVENTS: {b"k": b"v"}})
    store.close()
    (data_dir / KEY_FILE).unlink()
    (data_dir / STARTED_MARKER).unlink()  # the store alone is enough to know
    with pytest.raises(NodeError, match="missing but this node has run before"):
        open_data_dir(data_dir)
    assert not (data_dir / KEY_FILE).exists()


@pytest.mark.parametrize("mode", [0o770, 0o707])
def test_a_data_dir_others_can_write_is_refused(mode: int, tmp_path: Path) -> None:
    data_dir = tmp_path / "node"
    data_dir.mkdir()
    data_dir.chmod(mode)
    with pytest.raises(NodeError, match="writable by other users"):
        open_data_dir(data_dir)


# --- a full disk -------------------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "tmpfs", TMPFS_SIZE) as mount_point:
        yield mount_point


def test_disk_full_is_named_and_the_store_carries_on(small_tmpfs: Path) -> None:
    with LmdbStore(small_tmpfs / "store") as store:
        with pytest.raises(StoreDiskFullError) as full:
            for batch in range(10_000):  # far more than 4 MiB
                store.apply_writes({TABLE_EVENTS: {
                    f"{batch:05}-{i:03}".encode(): os.urandom(VALUE_BYTES) for i in range(100)}})
        assert str(full.value) == (f"disk full: no space left on {small_tmpfs / 'store'}; "
                                   "the last batch was not stored; reads still work")
        assert isinstance(full.value, StoreError)
        assert store.get(TABLE_EVENTS, b"00000-000") is not None  # reads still work
        store.apply_writes({TABLE_EVENTS: {b"small": b"fits"}})  # a small write still fits
        assert store.get(TABLE_EVENTS, b"small") == b"fits"


# --- damage the graph meets ----------------------------------------------------------


def test_a_hole_in_the_delivery_table_is_a_typed_store_error(tmp_path: Path) -> None:
    """A store claiming delivered events it lacks: DamagedTopicError, not an AssertionError."""
    from node.core.graph import DamagedTopicError, Graph
    from node.core.graph_commit import META_DELIVERED
    from node.core.store import TABLE_META

    topic = bytes(range(32))
    with LmdbStore(tmp_path / "store") as store:
        store.apply_writes({TABLE_META: {topic + META_DELIVERED: (3).to_bytes(8, "big")}})
        with pytest.raises(DamagedTopicError, match="hole at position 0") as damaged:
            Graph(store, topic).deliveries()
        assert isinstance(damaged.value, StoreError)  # what the control socket reports
