"""Uncommitted writes layered over a store: the core's unit of group commit.

The graph applies many events between commits. Their writes collect here,
reads see them at once (an event applied a moment ago is a parent now), and
`take_ops` (or `take_writes`, for stores that take a write-set whole) hands
the whole set to the store in one transaction. This is how a burst of a
thousand gossip events costs one fsync instead of a thousand.

Why three table layouts
-----------------------
A write here is on the hot path of every event (about six per event), a
prefix scan is not, so each table gets the cheapest structure that still
answers the scans made of it:

* plain dicts for tables only read by key (events, delivery, meta, ...):
  one hash insert per write;
* *grouped* dicts for the children and per-author indexes: every scan of
  them names at least the first GROUP_PREFIX_BYTES[table] bytes of a key
  (topic + parent position, topic + author), so the keys are listed per
  such group and a scan sorts one small group instead of keeping the whole
  table sorted. The lists are built by the first such scan of a write-set
  and kept up to date after it: applying events in order never scans these
  tables, so it never pays;
* a SortedDict for the buffer index, which is scanned by short prefixes
  (global age order) in eviction loops, where re-sorting would be quadratic.
  It is written only when events are buffered, off the hot path.

Scans of the plain tables (the extension tables' own prefixes) filter and
sort the pending keys: rare, and over the few keys of one batch.

Write-sets of several topics (each graph has its own) and the node's own
records are merged into one transaction by `merge_writes` and handed to the
store by `commit_writes`: the node's committer (node.committer) makes one
commit per step that way, whatever the step touched.
"""

from __future__ import annotations

from collections.abc import Sequence

from sortedcontainers import SortedDict

from node.core.event import ID_BYTES, KEY_BYTES
from node.core.store import (
    TABLE_AUTHORS,
    TABLE_BUFFER_INDEX,
    TABLE_CHILDREN,
    Delete,
    Op,
    Put,
    Store,
    prefix_upper_bound,
)

# Tables kept sorted while writes are pending (scanned by short prefixes).
SORTED_TABLES = frozenset({TABLE_BUFFER_INDEX})
# Tables whose pending keys are listed per prefix, and that prefix's length:
# topic id + parent's delivery position (children) or topic id + author key
# (authors), the shortest prefix the graph scans those tables by.
POSITION_BYTES = 8  # the graph's delivery positions: 8-byte big-endian
GROUP_PREFIX_BYTES: dict[str, int] = {
    TABLE_CHILDREN: ID_BYTES + POSITION_BYTES,
    TABLE_AUTHORS: ID_BYTES + KEY_BYTES,
}
GROUPED_TABLES = frozenset(GROUP_PREFIX_BYTES)

_TOMBSTONE = None
_ABSENT = object()  # "no pending write" (None is a pending delete)

# {table: {key: value, or None for a delete}}: a write-set, handed whole to
# stores that implement `apply_writes`.
Writes = dict[str, dict[bytes, bytes | None]]


class PendingWrites:
    """A write-set over `store`: puts and deletes not yet committed, visible to reads."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._tables: Writes = {}
        # The tables among `_tables` whose writes need no index: a put is one
        # dict store. A grouped table stays here until a scan builds its groups.
        self._plain: Writes = {}
        self._groups: dict[str, dict[bytes, list[bytes]]] = {}  # built group lists

    def __len__(self) -> int:
        return sum(len(pending) for pending in self._tables.values())

    def _new_table(self, table: str) -> dict:
        if table in SORTED_TABLES:
            pending: dict = SortedDict()
        else:
            pending = self._plain[table] = {}
        self._tables[table] = pending
        return pending

    def get(self, table: str, key: bytes) -> bytes | None:
        pending = self._tables.get(table)
        if pending is not None:
            value = pending.get(key, _ABSENT)
            if value is not _ABSENT:
                return value
        return self.store.get(table, key)

    def put(self, table: str, key: bytes, value: bytes) -> None:
        pending = self._plain.get(table)
        if pending is not None:  # the common case: one dict store
            pending[key] = value
            return
        self._write(table, key, value)

    def delete(self, table: str, key: bytes) -> None:
        pending = self._plain.get(table)
        if pending is not None:
            pending[key] = _TOMBSTONE
            return
        self._write(table, key, _TOMBSTONE)

    def _write(self, table: str, key: bytes, value: bytes | None) -> None:
        pending = self._tables.get(table)
        if pending is None:
            pending = self._new_table(table)
            if table in self._plain:
                pending[key] = value
                return
        groups = self._groups.get(table)
        if groups is not None and key not in pending:
            _group_add(groups, key, GROUP_PREFIX_BYTES[table])
        pending[key] = value

    def scan(
        self, table: str, prefix: bytes, *, reverse: bool = False, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        """Committed and pending pairs under `prefix`, merged, in key order."""
        pending = self._tables.get(table)
        if not pending:
            return list(self.store.scan(table, prefix, reverse=reverse, limit=limit))
        overlay = self._overlay(table, pending, prefix)
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

    def _overlay(self, table: str, pending: dict, prefix: bytes) -> list[bytes]:
        """The pending keys under `prefix` (sorted or not: the caller sorts the merge)."""
        if isinstance(pending, SortedDict):
            high = prefix_upper_bound(prefix)
            return list(pending.irange(prefix, high, inclusive=(True, False)))
        cut = GROUP_PREFIX_BYTES.get(table)
        if cut is not None and len(prefix) >= cut:
            groups = self._groups.get(table)
            if groups is None:
                groups = self._build_groups(table, pending)
            group = groups.get(prefix[:cut], ())
            if len(prefix) == cut:
                return list(group)
            return [k for k in group if k.startswith(prefix)]
        return [k for k in pending if k.startswith(prefix)]

    def _build_groups(self, table: str, pending: dict) -> dict[bytes, list[bytes]]:
        """List `table`'s pending keys per group, once; writes keep the lists from now on."""
        groups: dict[bytes, list[bytes]] = {}
        cut = GROUP_PREFIX_BYTES[table]
        for key in pending:
            _group_add(groups, key, cut)
        self._groups[table] = groups
        del self._plain[table]
        return groups

    def take_ops(self) -> list[Op]:
        """All pending writes as store ops, emptying this write-set."""
        return ops_of(self.take_writes())

    def take_writes(self) -> Writes:
        """All pending writes as {table: {key: value or None}}, emptying this write-set.

        The form `Store.apply_writes` takes: no per-op objects to build, and
        the store can hand each table's puts to its engine in one call.
        """
        writes = {table: pending for table, pending in self._tables.items() if pending}
        self.discard()
        return writes

    def discard(self) -> None:
        self._tables = {}
        self._plain = {}
        self._groups = {}


def ops_of(writes: Writes) -> list[Op]:
    """A write-set as store ops (a None value is a Delete)."""
    return [Delete(table, key) if value is _TOMBSTONE else Put(table, key, value)
            for table, pending in writes.items() for key, value in pending.items()]


def writes_of(ops: Sequence[Op]) -> Writes:
    """Store ops as a write-set (a Delete is None); a later op on a key wins."""
    writes: Writes = {}
    for op in ops:
        writes.setdefault(op.table, {})[op.key] = op.value if isinstance(op, Put) else _TOMBSTONE
    return writes


def merge_writes(write_sets: list[Writes]) -> Writes:
    """One write-set holding all of `write_sets`, whose keys must not overlap.

    The graphs' keys start with their topic id, so different topics' write-sets
    never share a key. One write-set alone is returned as it is (no copy: the
    usual step touches one topic).
    """
    sets = [w for w in write_sets if w]
    if len(sets) == 1:
        return sets[0]
    merged: Writes = {}
    for writes in sets:
        for table, pending in writes.items():
            into = merged.get(table)
            if into is None:
                merged[table] = dict(pending)
            else:
                into.update(pending)
    return merged


def commit_writes(store: Store, writes: Writes) -> int:
    """Hand `writes` to `store` in one transaction; the number of writes.

    Stores that take a write-set whole (`apply_writes`: the LMDB and memory
    stores) get it as collected, which saves building an op object per
    write; any other Store gets `apply(ops)`. Nothing is written for an
    empty write-set.
    """
    count = sum(len(pending) for pending in writes.values())
    if not count:
        return 0
    apply_writes = getattr(store, "apply_writes", None)
    if apply_writes is not None:
        apply_writes(writes)
    else:
        store.apply(ops_of(writes))
    return count


def _group_add(groups: dict[bytes, list[bytes]], key: bytes, cut: int) -> None:
    group_key = key[:cut]
    group = groups.get(group_key)
    if group is None:
        groups[group_key] = [key]
    else:
        group.append(key)
