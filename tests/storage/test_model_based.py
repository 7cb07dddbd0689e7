"""Model-based test: random op sequences give identical results in every store.

A Hypothesis state machine drives three stores in lockstep: MemoryStore,
LmdbStore, and a plain dict model whose scan is the protocol's definition
written as directly as possible (filter by prefix, filter by start, sort,
truncate). Keys come from a tiny alphabet rich in 0x00 and 0xff bytes, so
prefixes collide, share boundaries and end in 0xff all the time. The LMDB
store starts from a tiny map, so growth happens mid-sequence, and it is
reopened at random points, so persistence is part of every comparison.

Runs are derandomized: the same examples every time, as the project's tests
must be deterministic.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from storage.lmdb_store import LmdbStore
from storage.memory import (
    STORE_FORMAT_KEY,
    MemoryStore,
    encode_store_format,
)
from node.core.store import (
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    STORE_FORMAT,
    TABLE_BUFFER,
    TABLE_EVENTS,
    TABLE_META,
    TABLES,
    Delete,
    Op,
    Put,
    StoreError,
    prefix_upper_bound,
)

# Small on purpose: a few big values overflow it, so map growth is exercised.
TINY_MAP_BYTES = 64 * 1024
BIG_VALUE_BYTES = 6 * 1024
MAX_OPS_PER_BATCH = 12
MAX_KEY_PIECES = 4
SCAN_LIMITS = (None, 0, 1, 2, 5)
TOP_KEY = b"\xff" * (MAX_KEY_PIECES + 1)  # above every key the test writes
MAX_EXAMPLES = 60
STEPS_PER_EXAMPLE = 30

Model = dict[str, dict[bytes, bytes]]

# Few tables, so ops collide on the same keys often.
tables = st.sampled_from([TABLE_EVENTS, TABLE_BUFFER, TABLE_META])
key_pieces = st.sampled_from([b"\x00", b"\x01", b"a", b"\xfe", b"\xff"])
keys = st.lists(key_pieces, min_size=1, max_size=MAX_KEY_PIECES).map(b"".join)
prefixes = st.lists(key_pieces, min_size=0, max_size=MAX_KEY_PIECES - 1).map(b"".join)
values = st.binary(max_size=8) | st.just(b"\xab" * BIG_VALUE_BYTES)
ops = st.one_of(
    st.builds(Put, tables, keys, values),
    st.builds(Delete, tables, keys),
)
bad_ops = st.sampled_from(
    [
        Put("no-such-table", b"a", b""),
        Put(TABLE_EVENTS, b"", b""),
        Put(TABLE_EVENTS, b"a" * (MAX_KEY_BYTES + 1), b""),
        Put(TABLE_EVENTS, b"a", b"v" * (MAX_VALUE_BYTES + 1)),
        Put(TABLE_META, STORE_FORMAT_KEY, b"0"),
        Delete(TABLE_META, STORE_FORMAT_KEY),
    ]
)


def starts_near(prefix: bytes, present: list[bytes]) -> st.SearchStrategy[bytes | None]:
    """Scan starts anywhere, but mostly where the edge cases are: on keys that
    exist, inside the prefix range, just past its upper bound, and above every
    key (where a limit applied before the prefix filter would go wrong)."""
    near = [keys, keys.map(lambda suffix: prefix + suffix), st.just(TOP_KEY)]
    bound = prefix_upper_bound(prefix)
    if bound is not None:
        near.append(prefixes.map(lambda suffix: bound + suffix))
    if present:
        near.append(st.sampled_from(present))
    return st.none() | st.one_of(near)


def model_scan(
    data: dict[bytes, bytes],
    prefix: bytes,
    start: bytes | None,
    reverse: bool,
    limit: int | None,
) -> list[tuple[bytes, bytes]]:
    """The protocol's scan, by definition."""
    matching = [key for key in data if key.startswith(prefix)]
    if start is not None:
        matching = [key for key in matching if (key <= start if reverse else key >= start)]
    matching.sort(reverse=reverse)
    if limit is not None:
        matching = matching[:limit]
    return [(key, data[key]) for key in matching]


class StoresAgreeWithModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._dir = tempfile.TemporaryDirectory(prefix="megnode-model-")
        self._lmdb_path = Path(self._dir.name) / "store"
        self.memory = MemoryStore()
        # sync=False: this test is about semantics; durability has its own tests.
        self.lmdb = LmdbStore(self._lmdb_path, map_size_bytes=TINY_MAP_BYTES, sync=False)
        self.model: Model = {table: {} for table in TABLES}
        self.model[TABLE_META][STORE_FORMAT_KEY] = encode_store_format(STORE_FORMAT)

    @rule(batch=st.lists(ops, max_size=MAX_OPS_PER_BATCH))
    def apply_batch(self, batch: list[Op]) -> None:
        self.memory.apply(batch)
        self.lmdb.apply(batch)
        for op in batch:
            if isinstance(op, Put):
                self.model[op.table][op.key] = op.value
            else:
                self.model[op.table].pop(op.key, None)

    @rule(batch=st.lists(ops, max_size=MAX_OPS_PER_BATCH), bad=bad_ops, data=st.data())
    def apply_batch_with_a_bad_op(self, batch: list[Op], bad: Op, data: st.DataObject) -> None:
        position = data.draw(st.integers(0, len(batch)), label="bad op position")
        poisoned = [*batch[:position], bad, *batch[position:]]
        for store in (self.memory, self.lmdb):
            try:
                store.apply(poisoned)
            except StoreError:
                pass
            else:
                raise AssertionError(f"{type(store).__name__} accepted {bad!r}")
        # The model is unchanged; the invariant checks that both stores are too.

    @rule(table=tables, prefix=prefixes, data=st.data())
    def scans_agree(self, table: str, prefix: bytes, data: st.DataObject) -> None:
        start = data.draw(starts_near(prefix, sorted(self.model[table])), label="start")
        # Direction and limit are tiny dimensions: check them all, every time.
        for reverse in (False, True):
            for limit in SCAN_LIMITS:
                expected = model_scan(self.model[table], prefix, start, reverse, limit)
                args = {"start": start, "reverse": reverse, "limit": limit}
                assert list(self.memory.scan(table, prefix, **args)) == expected, args
                assert list(self.lmdb.scan(table, prefix, **args)) == expected, args

    @rule(table=tables, key=keys)
    def gets_agree(self, table: str, key: bytes) -> None:
        expected = self.model[table].get(key)
        assert self.memory.get(table, key) == expected
        assert self.lmdb.get(table, key) == expected

    @rule()
    def reopen_lmdb(self) -> None:
        self.lmdb.close()
        self.lmdb = LmdbStore(self._lmdb_path, map_size_bytes=TINY_MAP_BYTES, sync=False)

    @invariant()
    def contents_agree(self) -> None:
        for table in TABLES:
            expected = model_scan(self.model[table], b"", None, False, None)
            assert list(self.memory.scan(table, b"")) == expected
            assert list(self.lmdb.scan(table, b"")) == expected

    def teardown(self) -> None:
        self.memory.close()
        self.lmdb.close()
        self._dir.cleanup()


TestStoresAgreeWithModel = StoresAgreeWithModel.TestCase
TestStoresAgreeWithModel.settings = settings(
    max_examples=MAX_EXAMPLES,
    stateful_step_count=STEPS_PER_EXAMPLE,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
