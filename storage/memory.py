"""An in-memory store with the same behaviour as the LMDB store.

Used by the deterministic simulator, where hundreds of replicas live in one
process and durability is simulated. It passes the same conformance suite as
`storage.lmdb_store.LmdbStore`; anything the suite cannot tell apart is
interchangeable.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from itertools import islice

from sortedcontainers import SortedDict

from node.core.store import (
    MAX_BATCH_OPS,
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    STORE_FORMAT,
    TABLE_META,
    TABLES,
    Delete,
    Op,
    Put,
    StoreClosedError,
    StoreError,
    prefix_upper_bound,
)

# Every store records its format in TABLE_META under this key (the LMDB store
# checks it on open). The key is reserved: a batch that writes or deletes it is
# rejected, so a caller can never make a data dir unreadable by accident.
STORE_FORMAT_KEY = b"store_format"


def encode_store_format(version: int) -> bytes:
    """The format record's value: ASCII decimal, readable in `mdb_dump` output."""
    return str(version).encode("ascii")


def check_key(key: bytes) -> None:
    """Reject a key that no store can hold (used for puts, deletes and gets alike)."""
    if not isinstance(key, bytes) or not key:
        raise StoreError("keys must be non-empty bytes")
    if len(key) > MAX_KEY_BYTES:
        raise StoreError(f"key of {len(key)} bytes exceeds MAX_KEY_BYTES={MAX_KEY_BYTES}")


def check_scan_args(prefix: bytes, start: bytes | None, limit: int | None) -> None:
    """Reject scan arguments that would make implementations disagree or fail."""
    if not isinstance(prefix, bytes) or len(prefix) > MAX_KEY_BYTES:
        raise StoreError(f"prefix must be bytes of at most MAX_KEY_BYTES={MAX_KEY_BYTES}")
    if start is not None and (not isinstance(start, bytes) or len(start) > MAX_KEY_BYTES):
        raise StoreError(f"start must be bytes of at most MAX_KEY_BYTES={MAX_KEY_BYTES}")
    # bool is an int; a True/False limit is a caller bug, not "1" or "0".
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise StoreError(f"limit must be None or a non-negative int, not {limit!r}")


def check_op(op: Op) -> None:
    """Reject an op that no store may accept (shared by every implementation)."""
    if not isinstance(op, (Put, Delete)):
        raise StoreError(f"ops must be Put or Delete, not {type(op).__name__}")
    if op.table not in TABLES:
        raise StoreError(f"unknown table {op.table!r}")
    check_key(op.key)
    if op.table == TABLE_META and op.key == STORE_FORMAT_KEY:
        raise StoreError(f"meta key {STORE_FORMAT_KEY!r} is reserved for the store itself")
    if isinstance(op, Put):
        if not isinstance(op.value, bytes):
            raise StoreError("values must be bytes")
        if len(op.value) > MAX_VALUE_BYTES:
            raise StoreError(
                f"value of {len(op.value)} bytes exceeds MAX_VALUE_BYTES={MAX_VALUE_BYTES}"
            )


def check_batch(ops: Sequence[Op]) -> None:
    """Reject the whole batch if any op is bad, before anything is written."""
    if len(ops) > MAX_BATCH_OPS:
        raise StoreError(f"batch of {len(ops)} ops exceeds MAX_BATCH_OPS={MAX_BATCH_OPS}")
    for op in ops:
        check_op(op)


def check_writes(writes: Mapping[str, Mapping[bytes, bytes | None]]) -> frozenset[str]:
    """`check_batch` for a write-set {table: {key: value, or None to delete}}.

    The same rules op by op. It runs over every key of every group commit (a
    few per event), so the common case is tested a table at a time by
    builtins that loop in C (the types present, the shortest and longest
    key, the longest value); only a table that fails goes through the
    per-key loop, which names the problem. Returns the tables that hold
    deletes (a store can hand the others to its engine as they are).
    """
    count = 0
    with_deletes: set[str] = set()
    for table, pending in writes.items():
        if table not in TABLES:
            raise StoreError(f"unknown table {table!r}")
        count += len(pending)
        if count > MAX_BATCH_OPS:
            raise StoreError(f"batch of more than MAX_BATCH_OPS={MAX_BATCH_OPS} ops")
        if table == TABLE_META and STORE_FORMAT_KEY in pending:
            raise StoreError(f"meta key {STORE_FORMAT_KEY!r} is reserved for the store itself")
        if not pending:
            continue
        value_types = set(map(type, pending.values()))
        if _NONE_TYPE in value_types:
            with_deletes.add(table)
        if not (
            set(map(type, pending)) == _BYTES_ONLY
            and min(map(len, pending)) > 0
            and max(map(len, pending)) <= MAX_KEY_BYTES
            and value_types <= _VALUE_TYPES
            and max(map(len, filter(None, pending.values())), default=0) <= MAX_VALUE_BYTES
        ):
            _check_each_write(pending)
    return frozenset(with_deletes)


_NONE_TYPE = type(None)
_BYTES_ONLY = {bytes}
_VALUE_TYPES = {bytes, _NONE_TYPE}


def _check_each_write(pending: Mapping[bytes, bytes | None]) -> None:
    """The per-key checks of `check_writes`: raises naming the first bad write."""
    for key, value in pending.items():
        if not (isinstance(key, bytes) and 0 < len(key) <= MAX_KEY_BYTES):
            check_key(key)  # raises with the precise message
        if value is not None and not (isinstance(value, bytes) and len(value) <= MAX_VALUE_BYTES):
            if not isinstance(value, bytes):
                raise StoreError("values must be bytes")
            raise StoreError(
                f"value of {len(value)} bytes exceeds MAX_VALUE_BYTES={MAX_VALUE_BYTES}"
            )


class MemoryStore:
    """Named sorted dictionaries; `apply` validates the whole batch before any write."""

    def __init__(self) -> None:
        self._tables: dict[str, SortedDict] = {name: SortedDict() for name in TABLES}
        # Hold the same format record a fresh LMDB store holds, so the two stay
        # indistinguishable through get and scan.
        self._tables[TABLE_META][STORE_FORMAT_KEY] = encode_store_format(STORE_FORMAT)
        self._closed = False
        self.commits = 0  # how many batches were applied (group-commit statistics)

    def _table(self, table: str) -> SortedDict:
        if self._closed:
            raise StoreClosedError("store is closed")
        try:
            return self._tables[table]
        except KeyError:
            raise StoreError(f"unknown table {table!r}") from None

    def get(self, table: str, key: bytes) -> bytes | None:
        data = self._table(table)
        check_key(key)
        return data.get(key)

    def scan(
        self,
        table: str,
        prefix: bytes,
        *,
        start: bytes | None = None,
        reverse: bool = False,
        limit: int | None = None,
    ) -> Iterator[tuple[bytes, bytes]]:
        data = self._table(table)
        check_scan_args(prefix, start, limit)
        # Every key in [prefix, prefix_upper_bound(prefix)) starts with prefix,
        # so bounding the range is the whole filter and `limit` counts only
        # matching keys. `start` narrows that range; it never widens it.
        low: bytes = prefix
        high = prefix_upper_bound(prefix)
        high_inclusive = False
        if start is not None:
            if not reverse:
                low = max(low, start)
            elif high is None or start < high:
                high, high_inclusive = start, True
        if high is not None and (low > high or (low == high and not high_inclusive)):
            return iter(())
        keys = data.irange(low, high, inclusive=(True, high_inclusive), reverse=reverse)
        # A snapshot: later writes do not disturb an iterator already handed out.
        pairs = [(k, data[k]) for k in islice(keys, limit)]
        return iter(pairs)

    def apply(self, ops: Sequence[Op]) -> None:
        if self._closed:
            raise StoreClosedError("store is closed")
        check_batch(ops)
        for op in ops:
            table = self._tables[op.table]
            if isinstance(op, Put):
                table[op.key] = op.value
            else:
                table.pop(op.key, None)
        self.commits += 1

    def apply_writes(self, writes: Mapping[str, Mapping[bytes, bytes | None]]) -> None:
        """Commit a write-set {table: {key: value, or None to delete}} atomically.

        The same contract as `apply` (validated whole first, one commit), in
        the form `node.core.pending.PendingWrites` collects: no op objects.
        """
        if self._closed:
            raise StoreClosedError("store is closed")
        check_writes(writes)
        for name, pending in writes.items():
            table = self._tables[name]
            for key, value in pending.items():
                if value is None:
                    table.pop(key, None)
                else:
                    table[key] = value
        self.commits += 1

    def close(self) -> None:
        self._closed = True
