"""Checking an LMDB data file against its own meta pages before it is mapped.

LMDB maps `data.mdb` into memory and trusts it: a file truncated below the
pages its meta page names makes the first read past the end of the file a
SIGBUS, which kills the process with no message at all. So before the store
opens the environment, `check_data_file` reads the two meta pages with plain
file reads and checks what LMDB would otherwise take on faith:

- the file is at least two pages long and a whole number of the page size
  the meta page records;
- both meta pages carry LMDB's magic (0xBEEFC0DE) and data version (1);
- the newer meta page (the higher txnid) names a last page that the file
  holds and that the map size it records covers.

Past this check LMDB itself refuses a page number beyond the newest meta's
last page (MDB_PAGE_NOTFOUND), so no later read can run off the end of the
file. Damage inside the file (a garbled B-tree page) is LMDB's to find, as
`lmdb.CorruptedError` on the read that meets it; the store turns that into a
`StoreCorruptError` too.

The layout (lmdb's mdb.c, 64-bit builds; x86-64 and arm64 are little-endian):
a page header of PAGEHDRSZ bytes (mp_pgno, mp_pad, mp_flags, mp_lower,
mp_upper), then MDB_meta: mm_magic u32, mm_version u32, mm_address ptr,
mm_mapsize size_t, mm_dbs[2] (MDB_db: md_pad u32 -- the page size, in the
free DB's record --, md_flags u16, md_depth u16, md_branch_pages,
md_leaf_pages, md_overflow_pages, md_entries, md_root), mm_last_pg, mm_txnid.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from node.core.store import StoreError

DATA_FILE_NAME = "data.mdb"
MDB_MAGIC = 0xBEEFC0DE
MDB_DATA_VERSION = 1
NUM_METAS = 2
PAGE_HEADER_BYTES = 16  # PAGEHDRSZ: mp_pgno 8, mp_pad 2, mp_flags 2, mp_lower 2, mp_upper 2
MIN_PAGE_BYTES = 512  # LMDB's smallest page (MIN_PAGESIZE)
MAX_PAGE_BYTES = 0x10000  # LMDB's largest page (MAX_PAGESIZE)
# mm_magic, mm_version, mm_address, mm_mapsize, two MDB_db, mm_last_pg, mm_txnid
_MDB_DB = "IHHQQQQQ"
_META = struct.Struct("<IIQQ" + _MDB_DB + _MDB_DB + "QQ")
_META_BYTES = PAGE_HEADER_BYTES + _META.size


class StoreCorruptError(StoreError):
    """The store's files are damaged: truncated, overwritten, or not an LMDB store."""


@dataclass(frozen=True, slots=True)
class MetaPage:
    """What one of LMDB's two meta pages records."""

    magic: int
    version: int
    map_size: int
    page_size: int
    last_page: int
    txn_id: int


def _parse_meta(raw: bytes) -> MetaPage:
    fields = _META.unpack_from(raw, PAGE_HEADER_BYTES)
    magic, version, _address, map_size = fields[:4]
    page_size = fields[4]  # md_pad of the free DB's record
    last_page, txn_id = fields[-2:]
    return MetaPage(magic, version, map_size, page_size, last_page, txn_id)


def check_data_file(store_dir: Path) -> None:
    """Raise StoreCorruptError unless `<store_dir>/data.mdb` is safe to map.

    A missing or empty (0-byte) file passes: LMDB makes a fresh store of it,
    and whether a fresh store is welcome is the caller's decision (the node
    refuses one where it has run before).
    """
    path = store_dir / DATA_FILE_NAME
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size == 0:
                return
            head = handle.read(_META_BYTES)
            if len(head) < _META_BYTES:
                raise StoreCorruptError(
                    f"store file {path} is truncated: {size} bytes, less than one meta page")
            first = _parse_meta(head)
            _check_magic(path, first, 0)
            page_size = first.page_size
            if not (MIN_PAGE_BYTES <= page_size <= MAX_PAGE_BYTES
                    and page_size & (page_size - 1) == 0):
                raise StoreCorruptError(
                    f"store file {path} is damaged: its meta page records page size {page_size}")
            if size < NUM_METAS * page_size:
                raise StoreCorruptError(
                    f"store file {path} is truncated: {size} bytes, less than its two "
                    f"{page_size}-byte meta pages")
            if size % page_size:
                raise StoreCorruptError(
                    f"store file {path} is truncated: {size} bytes is not a whole number of "
                    f"{page_size}-byte pages")
            handle.seek(page_size)
            second = _parse_meta(handle.read(_META_BYTES))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreCorruptError(f"cannot read store file {path}: {exc.strerror or exc}") from None
    _check_magic(path, second, 1)
    newest = max(first, second, key=lambda meta: meta.txn_id)
    needed = (newest.last_page + 1) * page_size
    if needed > size:
        raise StoreCorruptError(
            f"store file {path} is truncated: {size} bytes, but its last commit "
            f"(transaction {newest.txn_id}) wrote pages up to {needed} bytes")
    if newest.map_size < needed:
        raise StoreCorruptError(
            f"store file {path} is damaged: its meta page records a map of "
            f"{newest.map_size} bytes, smaller than the {needed} bytes it uses")


def _check_magic(path: Path, meta: MetaPage, index: int) -> None:
    if meta.magic != MDB_MAGIC:
        raise StoreCorruptError(
            f"store file {path} is damaged or not an LMDB store: meta page {index} has no "
            f"LMDB magic")
    if meta.version != MDB_DATA_VERSION:
        raise StoreCorruptError(
            f"store file {path} has LMDB data version {meta.version} in meta page {index}; "
            f"this build reads version {MDB_DATA_VERSION}")


def data_file_is_empty(store_dir: Path) -> bool:
    """True if `<store_dir>/data.mdb` is missing or 0 bytes: opening it makes an empty store."""
    try:
        return (store_dir / DATA_FILE_NAME).stat().st_size == 0
    except FileNotFoundError:
        return True
