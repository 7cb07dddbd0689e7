"""The Store conformance suite: every test runs against MemoryStore and LmdbStore.

Whatever this suite checks, the simulator (memory) and a node (LMDB) agree on.
Scan semantics are spelled out as exact expected lists, so a test failure
shows which implementation strays and how.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence

import pytest

from storage.memory import STORE_FORMAT_KEY
from node.core.store import (
    MAX_BATCH_OPS,
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    STORE_FORMAT,
    TABLE_BUFFER,
    TABLE_CHILDREN,
    TABLE_EVENTS,
    TABLE_EXTREMITIES,
    TABLE_META,
    TABLES,
    Delete,
    Op,
    Put,
    Store,
    StoreClosedError,
    StoreError,
)

TOPIC_ID_BYTES = 32  # topic ids are BLAKE2b-256 digests


def put_all(store: Store, table: str, keys: Sequence[bytes]) -> None:
    """Store each key with its own bytes as value, in one batch."""
    store.apply([Put(table, key, key) for key in keys])


def keys_of(pairs: Iterator[tuple[bytes, bytes]]) -> list[bytes]:
    return [key for key, _ in pairs]


def everything(store: Store) -> dict[str, list[tuple[bytes, bytes]]]:
    return {table: list(store.scan(table, b"")) for table in TABLES}


PROTOCOL_METHODS = ("get", "scan", "apply", "close")


def test_both_stores_satisfy_the_protocol(store: Store) -> None:
    # isinstance on a runtime-checkable Protocol only sees method names; a caller
    # also relies on the parameters (names, keyword-only flags, defaults).
    assert isinstance(store, Store)
    for name in PROTOCOL_METHODS:
        expected = inspect.signature(getattr(Store, name)).parameters
        actual = inspect.signature(getattr(type(store), name)).parameters
        assert [(p.name, p.kind, p.default) for p in actual.values()] == [
            (p.name, p.kind, p.default) for p in expected.values()
        ], name
    # A fresh store: every table exists and is empty but for the format record.
    assert everything(store) == {
        table: [(STORE_FORMAT_KEY, str(STORE_FORMAT).encode())] if table == TABLE_META else []
        for table in TABLES
    }
    assert store.apply([Put(TABLE_EVENTS, b"k", b"v")]) is None
    assert isinstance(store.scan(TABLE_EVENTS, b""), Iterator)  # lazy, not a list
    # bytes, not buffers into the store (a memoryview compares equal but is not hashable
    # and dies with its transaction).
    [(key, value)] = store.scan(TABLE_EVENTS, b"")
    assert (type(key), type(value), type(store.get(TABLE_EVENTS, b"k"))) == (bytes, bytes, bytes)
    assert (key, value) == (b"k", b"v")


# --- get / put / delete -------------------------------------------------------


def test_get_missing_key_is_none(store: Store) -> None:
    assert store.get(TABLE_EVENTS, b"absent") is None


def test_put_get_overwrite_delete(store: Store) -> None:
    store.apply([Put(TABLE_EVENTS, b"k", b"v1")])
    assert store.get(TABLE_EVENTS, b"k") == b"v1"
    store.apply([Put(TABLE_EVENTS, b"k", b"v2")])
    assert store.get(TABLE_EVENTS, b"k") == b"v2"
    store.apply([Delete(TABLE_EVENTS, b"k")])
    assert store.get(TABLE_EVENTS, b"k") is None


def test_empty_value_is_a_value(store: Store) -> None:
    store.apply([Put(TABLE_EXTREMITIES, b"head", b"")])
    assert store.get(TABLE_EXTREMITIES, b"head") == b""
    assert list(store.scan(TABLE_EXTREMITIES, b"")) == [(b"head", b"")]


def test_deleting_a_missing_key_is_not_an_error(store: Store) -> None:
    before = everything(store)
    store.apply([Delete(TABLE_EVENTS, b"never-written")])
    assert everything(store) == before


def test_tables_are_separate_namespaces(store: Store) -> None:
    writable = [table for table in TABLES if table != TABLE_META]
    store.apply([Put(table, b"same-key", table.encode()) for table in writable])
    for table in writable:
        assert store.get(table, b"same-key") == table.encode()
    store.apply([Delete(TABLE_EVENTS, b"same-key")])
    assert store.get(TABLE_EVENTS, b"same-key") is None
    assert store.get(TABLE_CHILDREN, b"same-key") == TABLE_CHILDREN.encode()


@pytest.mark.parametrize(
    ("ops", "expected"),
    [
        ([Put(TABLE_EVENTS, b"k", b"1"), Put(TABLE_EVENTS, b"k", b"2")], b"2"),
        ([Put(TABLE_EVENTS, b"k", b"1"), Delete(TABLE_EVENTS, b"k")], None),
        ([Delete(TABLE_EVENTS, b"k"), Put(TABLE_EVENTS, b"k", b"3")], b"3"),
        (
            [
                Put(TABLE_EVENTS, b"k", b"1"),
                Delete(TABLE_EVENTS, b"k"),
                Put(TABLE_EVENTS, b"k", b"4"),
            ],
            b"4",
        ),
    ],
    ids=["put-put", "put-delete", "delete-put", "put-delete-put"],
)
def test_later_ops_in_a_batch_win(store: Store, ops: list[Op], expected: bytes | None) -> None:
    store.apply(ops)
    assert store.get(TABLE_EVENTS, b"k") == expected


def test_empty_batch_changes_nothing(store: Store) -> None:
    put_all(store, TABLE_EVENTS, [b"a"])
    before = everything(store)
    store.apply([])
    assert everything(store) == before


# --- atomicity and limits -----------------------------------------------------

BAD_OPS: dict[str, object] = {
    "unknown-table": Put("no-such-table", b"k", b"v"),
    "empty-key": Put(TABLE_EVENTS, b"", b"v"),
    "key-too-long": Put(TABLE_EVENTS, b"k" * (MAX_KEY_BYTES + 1), b"v"),
    "value-too-long": Put(TABLE_EVENTS, b"k", b"v" * (MAX_VALUE_BYTES + 1)),
    "str-key": Put(TABLE_EVENTS, "k", b"v"),  # type: ignore[arg-type]
    "str-value": Put(TABLE_EVENTS, b"k", "v"),  # type: ignore[arg-type]
    "delete-empty-key": Delete(TABLE_EVENTS, b""),
    "reserved-format-key": Put(TABLE_META, STORE_FORMAT_KEY, b"999"),
    "delete-format-key": Delete(TABLE_META, STORE_FORMAT_KEY),
    "not-an-op": (TABLE_EVENTS, b"k", b"v"),
}


@pytest.mark.parametrize("bad", list(BAD_OPS.values()), ids=list(BAD_OPS))
def test_a_batch_with_one_bad_op_changes_nothing(store: Store, bad: Op) -> None:
    put_all(store, TABLE_EVENTS, [b"keep", b"doomed"])
    before = everything(store)
    batch = [
        Put(TABLE_EVENTS, b"new-before", b"x"),
        Delete(TABLE_EVENTS, b"doomed"),
        bad,
        Put(TABLE_BUFFER, b"new-after", b"y"),
    ]
    with pytest.raises(StoreError):
        store.apply(batch)
    assert everything(store) == before


def test_key_and_value_at_their_limits_round_trip(store: Store) -> None:
    longest_key = b"k" * MAX_KEY_BYTES
    largest_value = bytes(range(256)) * (MAX_VALUE_BYTES // 256)
    assert len(largest_value) == MAX_VALUE_BYTES
    store.apply([Put(TABLE_EVENTS, longest_key, largest_value)])
    assert store.get(TABLE_EVENTS, longest_key) == largest_value
    assert list(store.scan(TABLE_EVENTS, longest_key)) == [(longest_key, largest_value)]


class _OversizedBatch(Sequence[Op]):
    """Claims MAX_BATCH_OPS + 1 ops without allocating them: the length check must come first."""

    def __len__(self) -> int:
        return MAX_BATCH_OPS + 1

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        if isinstance(index, slice):
            raise NotImplementedError
        if not 0 <= index < len(self):
            raise IndexError(index)
        return Put(TABLE_EVENTS, b"op-%d" % index, b"")


def test_a_batch_over_the_op_limit_is_rejected_whole(store: Store) -> None:
    before = everything(store)
    with pytest.raises(StoreError, match="MAX_BATCH_OPS"):
        store.apply(_OversizedBatch())
    assert everything(store) == before


@pytest.mark.parametrize(
    "key", [b"", b"k" * (MAX_KEY_BYTES + 1), "k"], ids=["empty", "too-long", "str"]
)
def test_get_rejects_a_key_no_store_can_hold(store: Store, key: bytes) -> None:
    with pytest.raises(StoreError):
        store.get(TABLE_EVENTS, key)


def test_unknown_table_is_an_error_everywhere(store: Store) -> None:
    with pytest.raises(StoreError, match="unknown table"):
        store.get("nope", b"k")
    with pytest.raises(StoreError, match="unknown table"):
        store.scan("nope", b"")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prefix": "a"},
        {"prefix": b"p" * (MAX_KEY_BYTES + 1)},
        {"prefix": b"", "start": "a"},
        {"prefix": b"", "limit": -1},
        {"prefix": b"", "limit": True},
    ],
    ids=["str-prefix", "prefix-too-long", "str-start", "negative-limit", "bool-limit"],
)
def test_scan_rejects_bad_arguments(store: Store, kwargs: dict[str, object]) -> None:
    with pytest.raises(StoreError):
        store.scan(TABLE_EVENTS, **kwargs)  # type: ignore[arg-type]


def test_the_format_record_is_visible_and_reserved(store: Store) -> None:
    # Both stores hold the same record, so contents compare equal across them.
    assert store.get(TABLE_META, STORE_FORMAT_KEY) == str(STORE_FORMAT).encode()


# --- scans ----------------------------------------------------------------------

# Keys around the prefix b"a\xff": its neighbours on both sides must never leak in.
FF_KEYS = [
    b"a\xfe\xff",
    b"a\xff",
    b"a\xff\x00",
    b"a\xff\x01",
    b"a\xff\xff",
    b"a\xff\xff\xff",
    b"b",
    b"b\x00",
]


def test_prefix_scan_yields_exactly_the_prefixed_keys_in_order(store: Store) -> None:
    put_all(store, TABLE_EVENTS, [b"a", b"ab", b"abc", b"ac", b"b", b"aa"])
    assert list(store.scan(TABLE_EVENTS, b"ab")) == [(b"ab", b"ab"), (b"abc", b"abc")]
    assert keys_of(store.scan(TABLE_EVENTS, b"a")) == [b"a", b"aa", b"ab", b"abc", b"ac"]
    assert keys_of(store.scan(TABLE_EVENTS, b"")) == [b"a", b"aa", b"ab", b"abc", b"ac", b"b"]
    assert keys_of(store.scan(TABLE_EVENTS, b"zz")) == []


def test_prefix_ending_in_ff(store: Store) -> None:
    put_all(store, TABLE_EVENTS, FF_KEYS)
    expected = [b"a\xff", b"a\xff\x00", b"a\xff\x01", b"a\xff\xff", b"a\xff\xff\xff"]
    assert keys_of(store.scan(TABLE_EVENTS, b"a\xff")) == expected
    assert keys_of(store.scan(TABLE_EVENTS, b"a\xff\xff")) == [b"a\xff\xff", b"a\xff\xff\xff"]
    assert keys_of(store.scan(TABLE_EVENTS, b"a\xff", reverse=True)) == expected[::-1]
    assert keys_of(store.scan(TABLE_EVENTS, b"a\xff", reverse=True, limit=2)) == [
        b"a\xff\xff\xff",
        b"a\xff\xff",
    ]


def test_all_ff_prefix_runs_to_the_end_of_the_table(store: Store) -> None:
    put_all(store, TABLE_EVENTS, [b"\xfe\xff", b"\xff", b"\xff\xff", b"\xff\xff\x00", b"\xff" * 3])
    all_ff = [b"\xff\xff", b"\xff\xff\x00", b"\xff\xff\xff"]
    assert keys_of(store.scan(TABLE_EVENTS, b"\xff\xff")) == all_ff
    assert keys_of(store.scan(TABLE_EVENTS, b"\xff\xff", reverse=True, limit=1)) == all_ff[-1:]
    assert keys_of(store.scan(TABLE_EVENTS, b"\xff", start=b"\xff\xff\x00", reverse=True)) == [
        b"\xff\xff\x00",
        b"\xff\xff",
        b"\xff",
    ]


SCAN_KEYS = [b"p0", b"p2", b"p4", b"p6", b"q0"]


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        (b"p2", [b"p2", b"p4", b"p6"]),  # start is a key: included
        (b"p3", [b"p4", b"p6"]),  # start between keys
        (b"a", [b"p0", b"p2", b"p4", b"p6"]),  # start before the prefix: no effect
        (b"p", [b"p0", b"p2", b"p4", b"p6"]),
        (b"p7", []),  # start past the last prefixed key
        (b"r", []),  # start past the prefix range
    ],
)
def test_forward_scan_from_start(store: Store, start: bytes, expected: list[bytes]) -> None:
    put_all(store, TABLE_EVENTS, SCAN_KEYS)
    assert keys_of(store.scan(TABLE_EVENTS, b"p", start=start)) == expected


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        (None, [b"p6", b"p4", b"p2", b"p0"]),
        (b"p4", [b"p4", b"p2", b"p0"]),  # start is a key: included
        (b"p3", [b"p2", b"p0"]),  # start between keys
        (b"p0", [b"p0"]),
        (b"p", []),  # start below every prefixed key
        (b"a", []),  # start below the prefix range
        (b"p9", [b"p6", b"p4", b"p2", b"p0"]),
        (b"z", [b"p6", b"p4", b"p2", b"p0"]),  # start above the range: no effect
    ],
)
def test_reverse_scan_from_start(store: Store, start: bytes | None, expected: list[bytes]) -> None:
    put_all(store, TABLE_EVENTS, SCAN_KEYS)
    assert keys_of(store.scan(TABLE_EVENTS, b"p", start=start, reverse=True)) == expected


@pytest.mark.parametrize(
    ("reverse", "start", "limit", "expected"),
    [
        (False, None, 0, []),
        (False, None, 1, [b"p0"]),
        (False, None, 3, [b"p0", b"p2", b"p4"]),
        (False, None, 99, [b"p0", b"p2", b"p4", b"p6"]),
        (False, b"p3", 1, [b"p4"]),
        (True, None, 1, [b"p6"]),
        (True, b"p3", 1, [b"p2"]),
        # Keys outside the prefix must not use up the limit.
        (True, b"z", 2, [b"p6", b"p4"]),
        (False, b"a", 2, [b"p0", b"p2"]),
    ],
)
def test_limit_counts_only_matching_keys(
    store: Store, reverse: bool, start: bytes | None, limit: int, expected: list[bytes]
) -> None:
    put_all(store, TABLE_EVENTS, [b"a", b"o", *SCAN_KEYS, b"z"])
    scanned = store.scan(TABLE_EVENTS, b"p", start=start, reverse=reverse, limit=limit)
    assert keys_of(scanned) == expected


def test_scan_on_an_empty_table(store: Store) -> None:
    assert list(store.scan(TABLE_CHILDREN, b"")) == []
    assert list(store.scan(TABLE_CHILDREN, b"", reverse=True)) == []
    assert list(store.scan(TABLE_CHILDREN, b"x", start=b"x1", reverse=True)) == []


def test_scan_is_a_snapshot_unaffected_by_later_applies(store: Store) -> None:
    put_all(store, TABLE_EVENTS, [b"k1", b"k2", b"k3"])
    untouched = store.scan(TABLE_EVENTS, b"k")
    half_read = store.scan(TABLE_EVENTS, b"k")
    assert next(half_read) == (b"k1", b"k1")
    store.apply(
        [
            Put(TABLE_EVENTS, b"k0", b"new"),
            Put(TABLE_EVENTS, b"k2", b"changed"),
            Delete(TABLE_EVENTS, b"k3"),
            Put(TABLE_EVENTS, b"k4", b"new"),
        ]
    )
    snapshot = [(b"k1", b"k1"), (b"k2", b"k2"), (b"k3", b"k3")]
    assert list(untouched) == snapshot
    assert list(half_read) == snapshot[1:]
    assert list(store.scan(TABLE_EVENTS, b"k")) == [
        (b"k0", b"new"),
        (b"k1", b"k1"),
        (b"k2", b"changed"),
        (b"k4", b"new"),
    ]


def _topic_ids() -> list[bytes]:
    """Topic ids that sit right next to each other in key order, plus spread ones."""
    edge = [
        b"\x00" * TOPIC_ID_BYTES,
        b"\x01" + b"\xff" * (TOPIC_ID_BYTES - 1),
        b"\x02" + b"\x00" * (TOPIC_ID_BYTES - 1),
        b"\xff" * (TOPIC_ID_BYTES - 1) + b"\xfe",
        b"\xff" * TOPIC_ID_BYTES,
    ]
    spread = [bytes([n * 7 % 256]) * TOPIC_ID_BYTES for n in range(1, 36)]
    return sorted(set(edge + spread))


def test_many_topics_stay_isolated_under_prefix_scans(store: Store) -> None:
    topics = _topic_ids()
    events_per_topic = 12
    event_ids = [bytes([0xFF - n]) * 4 for n in range(events_per_topic)]  # high bytes on purpose
    store.apply(
        [
            Put(TABLE_EVENTS, topic + event, topic[:1] + event)
            for topic in topics
            for event in event_ids
        ]
    )
    for topic in topics:
        expected = sorted(topic + event for event in event_ids)
        assert keys_of(store.scan(TABLE_EVENTS, topic)) == expected
        assert keys_of(store.scan(TABLE_EVENTS, topic, reverse=True)) == expected[::-1]
        assert keys_of(store.scan(TABLE_EVENTS, topic, reverse=True, limit=1)) == [expected[-1]]
        from_sixth = store.scan(TABLE_EVENTS, topic, start=expected[5], limit=2)
        assert keys_of(from_sixth) == expected[5:7]
    assert len(list(store.scan(TABLE_EVENTS, b""))) == len(topics) * events_per_topic


# --- closing ------------------------------------------------------------------


def test_a_closed_store_refuses_every_call(store: Store) -> None:
    put_all(store, TABLE_EVENTS, [b"k"])
    store.close()
    with pytest.raises(StoreClosedError):
        store.get(TABLE_EVENTS, b"k")
    with pytest.raises(StoreClosedError):
        store.scan(TABLE_EVENTS, b"")
    with pytest.raises(StoreClosedError):
        store.apply([Put(TABLE_EVENTS, b"k2", b"v")])
    assert issubclass(StoreClosedError, StoreError)


def test_close_twice_is_harmless(store: Store) -> None:
    store.close()
    store.close()
    with pytest.raises(StoreClosedError):
        store.get(TABLE_EVENTS, b"k")
