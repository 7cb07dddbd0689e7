"""Uncommitted writes layered over a store: the core's unit of group commit.

The graph applies many events between commits. Their writes collect here,
reads see them at once (an event applied a moment ago is a parent now), and
`take_ops` hands the whole set to `Store.apply` in one transaction. This is
how a burst of a thousand gossip events costs one fsync instead of a
thousand.
"""

from __future__ import annotations

from sortedcontainers import SortedDict

from storage.memory import prefix_upper_bound
from storage.protocol import (
    TABLE_AUTHORS,
    TABLE_BUFFER_INDEX,
    TABLE_CHILDREN,
    Delete,
    Op,
    Put,
    Store,
)

# Tables the graph reads by prefix while writes are pending.
SCANNED_TABLES = frozenset({TABLE_CHILDREN, TABLE_BUFFER_INDEX, TABLE_AUTHORS})

_TOMBSTONE = None


class PendingWrites:
    """A write-set over `store`: puts and deletes not yet committed, visible to reads."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._tables: dict[str, dict] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def _table(self, table: str) -> dict:
        pending = self._tables.get(table)
        if pending is None:
            # Sorted only where the core scans by prefix; plain dicts elsewhere are
            # several times cheaper per write on the hot path.
            pending = self._tables[table] = SortedDict() if table in SCANNED_TABLES else {}
        return pending

    def get(self, table: str, key: bytes) -> bytes | None:
        pending = self._tables.get(table)
        if pending is not None and key in pending:
            return pending[key]
        return self.store.get(table, key)

    def put(self, table: str, key: bytes, value: bytes) -> None:
        pending = self._table(table)
        if key not in pending:
            self._count += 1
        pending[key] = value

    def delete(self, table: str, key: bytes) -> None:
        pending = self._table(table)
        if key not in pending:
            self._count += 1
        pending[key] = _TOMBSTONE

    def scan(
        self, table: str, prefix: bytes, *, reverse: bool = False, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        """Committed and pending pairs under `prefix`, merged, in key order."""
        pending = self._tables.get(table)
        if not pending:
            return list(self.store.scan(table, prefix, reverse=reverse, limit=limit))
        if isinstance(pending, SortedDict):
            high = prefix_upper_bound(prefix)
            overlay = list(pending.irange(prefix, high, inclusive=(True, False)))
        else:
            overlay = sorted(k for k in pending if k.startswith(prefix))
        if not overlay:
            return list(self.store.scan(table, prefix, reverse=reverse, limit=limit))
        merged: dict[bytes, bytes | None] = {}
        # Read enough committed pairs to fill `limit` even if the overlay deletes some.
        committed_limit = None if limit is None else limit + len(overlay)
        for key, value in self.store.scan(table, prefix, reverse=reverse, limit=committed_limit):
            merged[key] = value
        for key in overlay:
            merged[key] = pending[key]
        keys = sorted((k for k, v in merged.items() if v is not _TOMBSTONE), reverse=reverse)
        if limit is not None:
            keys = keys[:limit]
        return [(k, merged[k]) for k in keys]  # type: ignore[misc]

    def take_ops(self) -> list[Op]:
        """All pending writes as store ops, emptying this write-set."""
        ops: list[Op] = []
        for table, pending in self._tables.items():
            for key, value in pending.items():
                ops.append(Delete(table, key) if value is _TOMBSTONE else Put(table, key, value))
        self._tables = {}
        self._count = 0
        return ops

    def discard(self) -> None:
        self._tables = {}
        self._count = 0
