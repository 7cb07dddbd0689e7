"""The storage protocol every megnode store implements.

The MEG core never talks to LMDB directly: it sees a small ordered key-value
store with a fixed set of named tables, read with `get` and `scan`, and one
write primitive in the protocol, `apply`, that commits a whole batch of puts
and deletes atomically and durably. Both stores also offer `apply_writes`, the
same contract for a write-set ``{table: {key: value, or None to delete}}``;
`node.core.pending.commit_writes` uses it when a store has it (no op object
per write) and `apply` otherwise. In a running node only the committer
(`node.committer`) calls either: the core collects writes, the committer
commits them. Keeping the protocol this narrow is what lets the same core run
on LMDB in a node and on plain dictionaries in the simulator, and lets one
conformance suite (`tests/storage/test_conformance.py`, with
`test_apply_writes.py` for the write-set form) hold both implementations to
the same behaviour.

Keys and values are bytes. Keys within a table are ordered bytewise, so
composite keys (`topic || parent's position || child`) support prefix scans.
A store may hold many topics: the core prefixes every key with the topic id.

Durability contract: when `apply` (or `apply_writes`) returns, the batch is
committed (on LMDB opened with `sync=True`, as a node opens it: fsynced);
after a crash the store holds either all of a batch or none of it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

# The named tables. Adding one, or changing what a table holds (the key layout
# of node.core.graph included), is a storage format change: bump STORE_FORMAT.
TABLE_EVENTS = "events"  # topic|id -> delivery position (the id index)
TABLE_CHILDREN = "children"  # topic|parent's delivery position|child -> b""
TABLE_EXTREMITIES = "extremities"  # topic|id -> b""
TABLE_BUFFER = "buffer"  # topic|id -> buffered raw event (parents missing)
TABLE_BUFFER_INDEX = "buffer_index"  # topic|missing parent|id, topic|author|arrival|id, ...
TABLE_AUTHORS = "authors"  # topic|author|seq|id -> b"" (per-author sequence index)
TABLE_DELIVERY = "delivery"  # topic|position(8 bytes BE) -> event record (depth + raw event)
TABLE_META = "meta"  # anything small: counters, cursors, format version
TABLE_STATE = "state"  # reserved for topic state (state groups)
TABLE_ORDER = "order"  # reserved for the linearizer's persisted output

TABLES: tuple[str, ...] = (
    TABLE_EVENTS,
    TABLE_CHILDREN,
    TABLE_EXTREMITIES,
    TABLE_BUFFER,
    TABLE_BUFFER_INDEX,
    TABLE_AUTHORS,
    TABLE_DELIVERY,
    TABLE_META,
    TABLE_STATE,
    TABLE_ORDER,
)

# 1: events keyed by id. 2: events keyed by delivery position, with an id
# index, and children under the parent's position (sequential keys: a group
# commit writes a few pages instead of one per event; node.core.graph). 3: events
# in encoding v2 (payload signed and hashed by digest, withheld forms; node.core.event),
# so every id differs from format 2's.
STORE_FORMAT = 3

# Limits that every implementation enforces alike, so the conformance suite
# can check them and callers get the same error everywhere.
MAX_KEY_BYTES = 511  # LMDB's default maximum key size
MAX_VALUE_BYTES = 1 << 20  # 1 MiB; events are <= 64 KiB, records stay far below
MAX_BATCH_OPS = 1_000_000  # one apply() never carries more than this


class StoreError(Exception):
    """A store operation failed (bad arguments, closed store, I/O error)."""


class StoreClosedError(StoreError):
    """The store was used after `close()`."""


class DamagedTopicError(StoreError):
    """One topic's stored records are missing or contradict each other: that topic is damaged.

    Raised by the lowest layer that finds it (the graph's tables, the state
    groups, the order records) instead of a KeyError or an assertion, so a
    request answers one line naming the topic and the cure, `python -O`
    cannot skip the check, and the node can stop serving that topic alone
    while it serves the others (`Node.mark_damaged`). `what` says what is
    wrong; `topic_id` is None only where the layer cannot know it (a bare
    table in a test).
    """

    def __init__(self, what: str, topic_id: bytes | None = None) -> None:
        self.what = what
        self.topic_id = topic_id
        super().__init__(damaged_topic_message(topic_id, what))


def damaged_topic_message(topic_id: bytes | None, what: str) -> str:
    """The one line a user reads for a damaged topic: what, and the commands that cure it."""
    name = "a topic" if topic_id is None else f"topic {topic_id.hex()}"
    target = "TOPIC" if topic_id is None else topic_id.hex()
    return (f"{name} is damaged in the store: {what}; stop the node and run `megnode check`, "
            f"then `megnode repair {target}` (docs/store.md)")


@dataclass(frozen=True, slots=True)
class Put:
    """Write `value` under `key` in `table`."""

    table: str
    key: bytes
    value: bytes


@dataclass(frozen=True, slots=True)
class Delete:
    """Remove `key` from `table`; deleting a missing key is not an error."""

    table: str
    key: bytes


Op = Put | Delete


@runtime_checkable
class Store(Protocol):
    """An ordered, transactional key-value store with named tables."""

    def get(self, table: str, key: bytes) -> bytes | None:
        """The committed value under `key`, or None."""
        ...

    def scan(
        self,
        table: str,
        prefix: bytes,
        *,
        start: bytes | None = None,
        reverse: bool = False,
        limit: int | None = None,
    ) -> Iterator[tuple[bytes, bytes]]:
        """Committed (key, value) pairs whose key starts with `prefix`, in key order.

        `start` (a full key, >= prefix) skips keys before it (or, with
        `reverse`, after it). `limit` caps how many pairs are yielded. The
        iterator reads a consistent snapshot taken when it starts.
        """
        ...

    def apply(self, ops: Sequence[Op]) -> None:
        """Commit all `ops` atomically and durably, in order; later ops win."""
        ...

    def close(self) -> None:
        """Release the store; further calls raise StoreClosedError."""
        ...


def prefix_upper_bound(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with `prefix` (None: no bound)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])
