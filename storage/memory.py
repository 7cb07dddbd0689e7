"""An in-memory store with the same behaviour as the LMDB store.

Used by the deterministic simulator, where hundreds of replicas live in one
process and durability is simulated. It passes the same conformance suite as
`storage.lmdb_store.LmdbStore`; anything the suite cannot tell apart is
interchangeable.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from sortedcontainers import SortedDict

from storage.protocol import (
    MAX_BATCH_OPS,
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    TABLES,
    Delete,
    Op,
    Put,
    StoreClosedError,
    StoreError,
)


def check_op(op: Op) -> None:
    """Reject an op that no store may accept (shared by every implementation)."""
    if op.table not in TABLES:
        raise StoreError(f"unknown table {op.table!r}")
    if not isinstance(op.key, bytes) or not op.key:
        raise StoreError("keys must be non-empty bytes")
    if len(op.key) > MAX_KEY_BYTES:
        raise StoreError(f"key of {len(op.key)} bytes exceeds MAX_KEY_BYTES={MAX_KEY_BYTES}")
    if isinstance(op, Put):
        if not isinstance(op.value, bytes):
            raise StoreError("values must be bytes")
        if len(op.value) > MAX_VALUE_BYTES:
            raise StoreError(
                f"value of {len(op.value)} bytes exceeds MAX_VALUE_BYTES={MAX_VALUE_BYTES}"
            )


def check_batch(ops: Sequence[Op]) -> None:
    if len(ops) > MAX_BATCH_OPS:
        raise StoreError(f"batch of {len(ops)} ops exceeds MAX_BATCH_OPS={MAX_BATCH_OPS}")
    for op in ops:
        check_op(op)


def prefix_upper_bound(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with `prefix` (None: no bound)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


class MemoryStore:
    """Named sorted dictionaries; `apply` validates the whole batch before any write."""

    def __init__(self) -> None:
        self._tables: dict[str, SortedDict] = {name: SortedDict() for name in TABLES}
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
        return self._table(table).get(key)

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
        low: bytes = prefix
        high = prefix_upper_bound(prefix)
        if start is not None:
            if reverse:
                high = start
            else:
                low = max(low, start)
        inclusive_high = reverse and start is not None
        keys = list(
            data.irange(low, high, inclusive=(True, inclusive_high), reverse=reverse)
        )
        if limit is not None:
            keys = keys[:limit]
        # A snapshot: later writes do not disturb an iterator already handed out.
        pairs = [(k, data[k]) for k in keys if k.startswith(prefix)]
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

    def close(self) -> None:
        self._closed = True
