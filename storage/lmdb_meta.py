"""Checking an LMDB data file against its own meta pages before it is mapped.

LMDB maps `data.mdb` into memory and trusts it: a file truncated below the
pages its meta page names makes the first read past the end of the file a
SIGBUS, which kills the process with no message at all. So before the store
opens the environment, `check_data_file` reads the two meta pages with plain
file reads and checks what LMDB would otherwise take on faith:

- the file is at least two pages long and a whole number of the page size
  the meta page records;
- both meta pages carry LMDB's magic (0xBEEFC0DE) and data version (1);
- the newer meta page (the higher txnid) names a last page that the map size
  it records covers, and every page that meta's trees reference is in the
  file.

The last check has a fast path: a file that holds every page up to the
newest meta's last page (mm_last_pg) passes at once. A file shorter than that
is not necessarily damaged: a page that a write transaction allocates and then
frees again (LMDB's "loose" pages, and overflow pages freed in the txn that
made them) advances the next page number, and so mm_last_pg, but is never
written; it goes to the free list, and LMDB writes a free page whole before it
next reads it. A healthy, cleanly closed file can so end before its last page.
So a short file is walked (`_check_referenced_pages`): from the newest meta's
two roots (the free DB and the main DB), with plain reads (never a mapping),
through branch pages, leaf nodes' overflow runs (F_BIGDATA) and sub-database
roots (F_SUBDATA: named DBs, and DUPSORT sub-trees); the file is refused only
if a page the walk reaches lies at or past its end. After a walk that finds
nothing missing the file is extended to its last page
(`posix_fallocate`, which never shortens a file; the pages it adds are free,
so nothing reads their zeros), so the next open takes the fast path again.

Past this check LMDB itself refuses a page number beyond the newest meta's
last page (MDB_PAGE_NOTFOUND), and every page a reader can reach is in the
file, so no later read can run off the end of the file. Damage inside the
file (a garbled B-tree page) is LMDB's to find, as `lmdb.CorruptedError` on
the read that meets it; the store turns that into a `StoreCorruptError` too.
The walk only refuses what it cannot follow (a page that is neither branch
nor leaf, a node past its page), since a short file must not be mapped unread.

The layout (lmdb's mdb.c, 64-bit builds; x86-64 and arm64 are little-endian):
a page header of PAGEHDRSZ bytes (mp_pgno, mp_pad, mp_flags, mp_lower,
mp_upper), then MDB_meta: mm_magic u32, mm_version u32, mm_address ptr,
mm_mapsize size_t, mm_dbs[2] (MDB_db: md_pad u32 -- the page size, in the
free DB's record --, md_flags u16, md_depth u16, md_branch_pages,
md_leaf_pages, md_overflow_pages, md_entries, md_root), mm_last_pg, mm_txnid.
The walk reads, besides: the page header's mp_flags (u16 at byte 10) and
mp_lower (u16 at byte 12; for an overflow page the u32 there is mp_pages, the
run's length in pages); a branch or leaf page's node offsets (u16 each, from
byte PAGEHDRSZ, (mp_lower - PAGEHDRSZ) / 2 of them); each MDB_node: mn_lo u16,
mn_hi u16, mn_flags u16, mn_ksize u16, then the key, then the data. A branch
node's child page is mn_lo | mn_hi << 16 | mn_flags << 32; a leaf node's data
is, with F_BIGDATA, the first overflow page (u64), with F_SUBDATA an MDB_db
(md_root last); with F_DUPDATA alone it is an inline sub-page that references
no page. An empty tree's root is P_INVALID (all ones).
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
_DB_RECORD = struct.Struct("<" + _MDB_DB)
_FREE_DB_ROOT = 4 + 7  # index of the free DB's md_root in _META's fields
_MAIN_DB_ROOT = 4 + 8 + 7  # index of the main DB's md_root
P_INVALID = (1 << 64) - 1  # md_root of an empty tree
# mp_flags bits (mdb.c)
P_BRANCH = 0x01
P_LEAF = 0x02
P_OVERFLOW = 0x04
P_LEAF2 = 0x20  # a DUPFIXED leaf: keys only, no nodes, no page references
# mn_flags bits of a leaf node (mdb.c)
F_BIGDATA = 0x01
F_SUBDATA = 0x02
F_DUPDATA = 0x04
_FLAGS_AT = 10  # mp_flags (after mp_pgno 8, mp_pad 2), then mp_lower or mp_pages
_NODE = struct.Struct("<HHHH")  # mn_lo, mn_hi, mn_flags, mn_ksize (NODESIZE 8)
_PGNO = struct.Struct("<Q")
# The walk of a short file reads each page at most once and never one past
# the end of the file, so the file's own length bounds it; this caps it
# besides (16 GiB of 4 KiB pages, 16 times the default map; the walk reads
# about 150,000 pages a second): a short file with more pages to walk is
# refused rather than read for minutes.
MAX_TAIL_WALK_PAGES = 1 << 22


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
    free_root: int  # the free DB's md_root (P_INVALID if empty)
    main_root: int  # the main DB's md_root: named DBs are its sub-databases


def _parse_meta(raw: bytes) -> MetaPage:
    fields = _META.unpack_from(raw, PAGE_HEADER_BYTES)
    magic, version, _address, map_size = fields[:4]
    page_size = fields[4]  # md_pad of the free DB's record
    last_page, txn_id = fields[-2:]
    return MetaPage(magic, version, map_size, page_size, last_page, txn_id,
                    free_root=fields[_FREE_DB_ROOT], main_root=fields[_MAIN_DB_ROOT])


def check_data_file(store_dir: Path, *, extend: bool = True) -> None:
    """Raise StoreCorruptError unless `<store_dir>/data.mdb` is safe to map.

    `extend=False` for readers that must not write (`megnode check`, backups): a
    healthy file short by free pages is then left as it is.

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
    if newest.map_size < needed:
        raise StoreCorruptError(
            f"store file {path} is damaged: its meta page records a map of "
            f"{newest.map_size} bytes, smaller than the {needed} bytes it uses")
    if needed > size:
        _check_short_file(path, newest, size, extend)


def _check_short_file(path: Path, newest: MetaPage, size: int, extend: bool) -> None:
    """A file that ends before the newest meta's last page: refuse it only if a page
    the newest meta's trees reference is missing; else extend it to that page."""
    needed = (newest.last_page + 1) * newest.page_size
    try:
        with open(path, "rb") as handle:
            _check_referenced_pages(path, handle.fileno(), newest, size)
    except OSError as exc:
        raise StoreCorruptError(f"cannot read store file {path}: {exc.strerror or exc}") from None
    if not extend:
        return
    # Every page past the end is free: extend the file over them so the next
    # open passes the quick check. posix_fallocate only ever grows a file, so
    # a writer that got further meanwhile loses nothing; failing (read-only
    # file, full disk) only means the next open walks again.
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.posix_fallocate(fd, size, needed - size)
    except OSError:
        pass
    finally:
        os.close(fd)


def _check_referenced_pages(path: Path, fd: int, newest: MetaPage, size: int) -> None:
    """Raise StoreCorruptError naming the first page past the end of the file that
    the newest meta's trees reference (or a page too damaged to follow)."""
    page_size = newest.page_size
    file_pages = size // page_size

    def in_file(pgno: int, pages: int = 1) -> None:
        if pgno + pages > file_pages:
            missing = max(pgno, file_pages)
            raise StoreCorruptError(
                f"store file {path} is truncated: {size} bytes, but its last commit "
                f"(transaction {newest.txn_id}) references page {missing}, which ends at "
                f"byte {(missing + 1) * page_size}")

    def damaged(pgno: int, what: str) -> StoreCorruptError:
        return StoreCorruptError(
            f"store file {path} is damaged: {size} bytes, shorter than its last commit "
            f"(transaction {newest.txn_id}) names, and its page {pgno} {what}")

    stack = [root for root in (newest.free_root, newest.main_root) if root != P_INVALID]
    seen = bytearray(file_pages)  # a byte a page: the file's length bounds the walk
    walked = 0
    while stack:
        pgno = stack.pop()
        in_file(pgno)
        if seen[pgno]:
            continue  # a healthy tree shares no page; a damaged one must not loop
        seen[pgno] = 1
        walked += 1
        if walked > MAX_TAIL_WALK_PAGES:
            raise StoreCorruptError(
                f"store file {path} is shorter ({size} bytes) than its last commit "
                f"(transaction {newest.txn_id}) names, and has more than "
                f"MAX_TAIL_WALK_PAGES={MAX_TAIL_WALK_PAGES} pages to check for a missing one")
        page = os.pread(fd, page_size, pgno * page_size)
        flags, lower = struct.unpack_from("<HH", page, _FLAGS_AT)
        if flags & P_LEAF and flags & P_LEAF2:
            continue  # a DUPFIXED leaf: keys only
        if not flags & (P_BRANCH | P_LEAF):
            raise damaged(pgno, f"is neither a branch nor a leaf page (flags {flags:#x})")
        if not PAGE_HEADER_BYTES <= lower <= page_size:
            raise damaged(pgno, f"has a damaged header (mp_lower {lower})")
        for index in range((lower - PAGE_HEADER_BYTES) // 2):
            (offset,) = struct.unpack_from("<H", page, PAGE_HEADER_BYTES + 2 * index)
            if offset + _NODE.size > page_size:
                raise damaged(pgno, f"has node {index} past its end")
            low, high, node_flags, key_size = _NODE.unpack_from(page, offset)
            if flags & P_BRANCH:
                stack.append(low | high << 16 | node_flags << 32)
            elif node_flags & F_BIGDATA:
                data_at = offset + _NODE.size + key_size
                if data_at + _PGNO.size > page_size:
                    raise damaged(pgno, f"has node {index} past its end")
                (first,) = _PGNO.unpack_from(page, data_at)
                in_file(first)
                header = os.pread(fd, PAGE_HEADER_BYTES, first * page_size)
                overflow_flags, run_pages = struct.unpack_from("<HI", header, _FLAGS_AT)
                if not overflow_flags & P_OVERFLOW:
                    raise damaged(first, "should be an overflow page and is not")
                in_file(first, run_pages)
            elif node_flags & F_SUBDATA:  # a named DB, or a DUPSORT key's sub-tree
                data_at = offset + _NODE.size + key_size
                if data_at + _DB_RECORD.size > page_size:
                    raise damaged(pgno, f"has node {index} past its end")
                root = _DB_RECORD.unpack_from(page, data_at)[-1]
                if root != P_INVALID:
                    stack.append(root)
            # F_DUPDATA alone: an inline sub-page, which references no page.


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
