"""PendingWrites (plain, grouped and sorted tables) and the write-set commit path.

Held against a dict model: whatever the layout of a table, reads and scans
see committed and pending writes merged, and a commit through
`Store.apply_writes` leaves the store exactly as `Store.apply(take_ops())` does.
"""

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.core.pending import GROUP_PREFIX_BYTES, PendingWrites
from node.replica.replica import Replica
from storage.lmdb_store import LmdbStore
from storage.memory import STORE_FORMAT_KEY, MemoryStore
from node.core.store import (
    TABLE_BUFFER_INDEX,
    TABLE_CHILDREN,
    TABLE_EVENTS,
    TABLE_EXTREMITIES,
    TABLE_META,
    TABLE_STATE,
    TABLES,
    Put,
    StoreError,
)
from tests.helpers import child, identity, new_topic

TOPIC = b"T" * 32
SECOND = [b"A" * 32, b"B" * 32, b"A" * 31 + b"B"]
TABLES_UNDER_TEST = [TABLE_CHILDREN, TABLE_BUFFER_INDEX, TABLE_EVENTS, TABLE_STATE]

keys = st.builds(lambda second, tail: TOPIC + second + tail,
                 st.sampled_from(SECOND), st.binary(max_size=3).map(lambda b: b.replace(b"\0", b"a")))
ops = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(TABLES_UNDER_TEST), keys, st.binary(max_size=4)),
    st.tuples(st.just("delete"), st.sampled_from(TABLES_UNDER_TEST), keys),
    st.tuples(st.just("commit")),
    st.tuples(st.just("scan"), st.sampled_from(TABLES_UNDER_TEST),
              st.sampled_from([TOPIC, TOPIC + SECOND[0], TOPIC + SECOND[0] + b"a",
                               TOPIC + SECOND[1][:10], TOPIC + SECOND[2]]),
              st.booleans(), st.one_of(st.none(), st.integers(0, 4))),
)


def model_scan(model: dict, table: str, prefix: bytes, reverse: bool, limit):
    pairs = sorted(((k, v) for (t, k), v in model.items() if t == table and k.startswith(prefix)),
                   reverse=reverse)
    return pairs if limit is None else pairs[:limit]


@settings(max_examples=150, deadline=None)
@given(script=st.lists(ops, max_size=60), whole=st.booleans())
def test_reads_and_scans_match_a_dict_model(script, whole):
    store = MemoryStore()
    writes = PendingWrites(store)
    model: dict[tuple[str, bytes], bytes] = {}
    for op in script:
        if op[0] == "put":
            _, table, key, value = op
            writes.put(table, key, value)
            model[(table, key)] = value
        elif op[0] == "delete":
            _, table, key = op
            writes.delete(table, key)
            model.pop((table, key), None)
        elif op[0] == "commit":
            if whole:
                store.apply_writes(writes.take_writes())
            else:
                store.apply(writes.take_ops())
            assert len(writes) == 0
        else:
            _, table, prefix, reverse, limit = op
            assert writes.scan(table, prefix, reverse=reverse, limit=limit) == \
                model_scan(model, table, prefix, reverse, limit)
        for (table, key), value in list(model.items())[:3]:
            assert writes.get(table, key) == value
    store.apply_writes(writes.take_writes())
    for table in TABLES_UNDER_TEST:
        assert list(store.scan(table, TOPIC)) == model_scan(model, table, TOPIC, False, None)


def test_grouped_tables_answer_long_and_short_prefixes():
    writes = PendingWrites(MemoryStore())
    parent = TOPIC + b"p" * 8  # topic + the parent's delivery position
    assert len(parent) == GROUP_PREFIX_BYTES[TABLE_CHILDREN]
    for child in (b"c", b"a", b"b"):
        writes.put(TABLE_CHILDREN, parent + child * 32, b"")
    writes.delete(TABLE_CHILDREN, parent + b"a" * 32)
    assert [k[-1:] for k, _ in writes.scan(TABLE_CHILDREN, parent)] == [b"b", b"c"]
    assert [k[-1:] for k, _ in writes.scan(TABLE_CHILDREN, parent + b"c")] == [b"c"]
    assert len(writes.scan(TABLE_CHILDREN, TOPIC)) == 2  # shorter than a group: every key
    assert len(writes) == 3  # the delete is a pending op too


@pytest.fixture(params=["memory", "lmdb"])
def store(request, tmp_path):
    made = MemoryStore() if request.param == "memory" else LmdbStore(tmp_path / "s")
    yield made
    made.close()


@pytest.mark.parametrize("bad, message", [
    ({"no_such_table": {b"k": b"v"}}, "unknown table"),
    ({TABLE_EVENTS: {b"": b"v"}}, "non-empty"),
    ({TABLE_EVENTS: {b"k" * 600: b"v"}}, "MAX_KEY_BYTES"),
    ({TABLE_EVENTS: {b"k": "text"}}, "bytes"),
    ({TABLE_EVENTS: {b"k": b"v" * ((1 << 20) + 1)}}, "MAX_VALUE_BYTES"),
    ({TABLE_META: {STORE_FORMAT_KEY: b"9"}}, "reserved"),
])
def test_a_bad_write_set_is_refused_whole(store, bad, message):
    store.apply([Put(TABLE_EVENTS, b"kept", b"1")])
    writes = {TABLE_EVENTS: {b"would-be": b"2"}, **{t: dict(v) for t, v in bad.items()}}
    if TABLE_EVENTS in bad:
        writes[TABLE_EVENTS] = {b"would-be": b"2", **bad[TABLE_EVENTS]}
    with pytest.raises(StoreError, match=message):
        store.apply_writes(writes)
    assert list(store.scan(TABLE_EVENTS, b"")) == [(b"kept", b"1")]


def test_apply_writes_is_one_commit_and_deletes(store):
    store.apply([Put(TABLE_EVENTS, b"gone", b"x"), Put(TABLE_EVENTS, b"stays", b"y")])
    before = store.commits
    store.apply_writes({TABLE_EVENTS: {b"gone": None, b"new": b"z", b"never": None},
                        TABLE_CHILDREN: {b"c": b""}})
    assert store.commits == before + 1
    assert list(store.scan(TABLE_EVENTS, b"")) == [(b"new", b"z"), (b"stays", b"y")]
    assert store.get(TABLE_CHILDREN, b"c") == b""


def test_lmdb_reads_never_see_a_stale_snapshot(tmp_path):
    store = LmdbStore(tmp_path / "s", map_size_bytes=1 << 16)  # tiny: forces map growth
    try:
        for round_ in range(40):
            key = b"k%03d" % round_
            assert store.get(TABLE_EVENTS, key) is None  # the cached reader now holds a snapshot
            big = {key: bytes([round_]) * 4_000}
            if round_ % 2:
                store.apply_writes({TABLE_EVENTS: big})
            else:
                store.apply([Put(TABLE_EVENTS, key, big[key])])
            assert store.get(TABLE_EVENTS, key) == big[key]
            assert len(list(store.scan(TABLE_EVENTS, b"k"))) == round_ + 1
        assert store.map_size_bytes > 1 << 16  # it grew with a reader cached in between
    finally:
        store.close()


def test_lmdb_store_stays_consistent_across_threads(tmp_path):
    store = LmdbStore(tmp_path / "s")
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader():
        try:
            while not stop.is_set():
                counter = store.get(TABLE_META, b"counter")
                value = store.get(TABLE_EVENTS, b"v")
                if counter is not None:
                    # one batch writes both: never one without the other
                    assert value is not None and int(value) >= int(counter) - 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        for n in range(200):
            store.apply_writes({TABLE_META: {b"counter": b"%d" % n}, TABLE_EVENTS: {b"v": b"%d" % n}})
            assert store.get(TABLE_EVENTS, b"v") == b"%d" % n
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        store.close()
    assert not errors


def test_every_table_accepts_write_sets(store):
    writable = {t: {b"key": t.encode()} for t in TABLES}
    store.apply_writes(writable)
    assert all(store.get(t, b"key") == t.encode() for t in TABLES)


def test_a_chain_writes_one_extremity_per_commit_not_one_per_event():
    origin = new_topic()
    bob = identity("bob")
    parent, events = origin.topic_id, []
    for seq in range(1, 101):
        events.append(child(bob, origin.topic_id, [parent], seq=seq))
        parent = events[-1].id
    store = MemoryStore()
    replica = Replica(store, origin.topic_id, identity("x"))
    replica.receive(origin.graph.get(origin.topic_id).raw, 1)
    replica.commit()
    for event in events:
        replica.receive(event.raw, 1)
    # the table is written at commit, from the difference: none of it per event
    assert TABLE_EXTREMITIES not in replica.graph._w._tables
    before = store.commits
    # the committed root leaves (a delete), the last event stays (a put): nothing else
    ops = replica.commit()
    assert store.commits == before + 1
    # per event: record, id, child, author; +2; the delivered counter; the handed-out count
    assert ops == len(events) * 4 + 2 + 1 + 1
    assert [k for k, _ in store.scan(TABLE_EXTREMITIES, origin.topic_id)] == \
        [origin.topic_id + events[-1].id]
    assert replica.graph.extremities() == [events[-1].id]
