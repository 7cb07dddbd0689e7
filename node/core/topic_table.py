"""A topic's view of one extension table: how layers above the graph persist their records.

Why: topic state (node.state) and the linearizer (node.core.order) keep
records that describe the events they were derived from. Written through the
graph's own write-set (`Graph.table(name)`), they commit in the same store
transaction as those events, so after a crash the two can never disagree.
The graph owns every other table; these (`EXTENSION_TABLES`) it never writes.
"""

from __future__ import annotations

from node.core.pending import PendingWrites
from node.core.store import TABLE_ORDER, TABLE_STATE

# Tables the graph itself never writes: layers above it own them (`Graph.table`).
EXTENSION_TABLES = frozenset({TABLE_STATE, TABLE_ORDER})


class TopicTable:
    """One extension table of one topic, read and written through the graph's write-set.

    Keys are given without the topic prefix; writes are pending until
    `Graph.commit()`, reads see them at once (as for the graph's own tables).
    """

    def __init__(self, writes: PendingWrites, table: str, topic_id: bytes) -> None:
        if table not in EXTENSION_TABLES:
            raise ValueError(f"{table!r} is not an extension table ({sorted(EXTENSION_TABLES)})")
        self._w = writes
        self._table = table
        self._t = topic_id

    @property
    def topic_id(self) -> bytes:
        """The topic this view reads (so a layer above can name it in a DamagedTopicError)."""
        return self._t

    def get(self, key: bytes) -> bytes | None:
        return self._w.get(self._table, self._t + key)

    def put(self, key: bytes, value: bytes) -> None:
        self._w.put(self._table, self._t + key, value)

    def delete(self, key: bytes) -> None:
        self._w.delete(self._table, self._t + key)

    def scan(self, prefix: bytes, *, reverse: bool = False,
             limit: int | None = None) -> list[tuple[bytes, bytes]]:
        """(key without the topic prefix, value) pairs under `prefix`, in key order."""
        cut = len(self._t)
        pairs = self._w.scan(self._table, self._t + prefix, reverse=reverse, limit=limit)
        return [(key[cut:], value) for key, value in pairs]
