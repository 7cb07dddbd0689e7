"""The check's walks of the tables beside the event graph: buffer, rejections, authors,
state, order, and the node's topic records.

Why: the graph walk (`node.check.check_topic`) proves the events, their index,
children and extremities; but a node also relies on records the layers above
the graph keep, and a damaged one of those surfaced at run time as "internal
error: KeyError: state group N ..." in a request handler. Each walk here
checks, in one pass over one topic's keys (linear in the table's size), the
invariants the code that reads the table relies on:

- buffer (node.core.buffer): each record is msgpack [arrival, raw]; raw
  decodes, has the key's id, belongs to the topic, its signature verifies;
  the event is not applied; its age and per-author index entries exist;
  buffer_index: every age/author entry names a buffered event; the meta
  counters `buffer_total` and `buffer_author|a` count the buffered events;
- rejections (node.core.rejections, `buffer_index` T|r|id): each record is
  ordinal (8) + UTF-8 reason, below the `rejections` counter, and the id is
  not applied (a rejected event never becomes a vertex);
- authors: each entry names an applied event (and the graph walk looks up
  each applied event's entry);
- state (node.state.store): groups decode, their base group and chunks exist,
  gids are below the `n` counter; every event record names an applied event
  and existing groups (the KeyError above); memo entries name existing
  groups; the rejected index names rejected event records;
- order (node.replica.ordering, node.replica.order_records): the confirmed
  prefix `c|position` runs 0..n-1 (n the stored count) and names applied
  events; every `w|id` and `l|lane|seq` record matches the other and names an
  applied event, and `k` counts them; a proxy `p|id` names an applied event
  and applied deps; a recorded batch lies inside the delivery log;
- meta: the topic's counters are 8 bytes; the node's topic records
  (node.topic_records) have a 32-byte topic id and a known value.

The key prefixes below are the owning modules' private constants, repeated
here so the check reads a store without building replicas;
tests/node/test_check_tables.py holds them equal. `TABLE_WALKS` names, for
every table of node.core.store.TABLES, the walk that covers it: the check
refuses to run if a table has none (a new table cannot be forgotten).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import lmdb
import msgpack

from node.check.report import Damage, Finding, TopicReport
from node.core.event import ID_BYTES, EventFormatError, decode_event
from node.core.graph_commit import META_DELIVERED
from node.replica.delivery_count import HANDED_KEY
from node.core.identity import verify_signature
from node.core.order.clock import LANE_STRIDE
from node.core.store import (
    TABLE_AUTHORS,
    TABLE_BUFFER,
    TABLE_BUFFER_INDEX,
    TABLE_CHILDREN,
    TABLE_DELIVERY,
    TABLE_EVENTS,
    TABLE_EXTREMITIES,
    TABLE_META,
    TABLE_ORDER,
    TABLE_STATE,
    Store,
)
from node.topic_records import TOPIC_META_PREFIX, WANTS_MEMBERSHIP

U64 = 8
LANE_BYTES = 4
# How many forward extremities the start check follows to their state groups.
QUICK_CHECK_EXTREMITIES = 16

# node.core.buffer / node.core.rejections (buffer_index and meta under T)
BUF_WAIT, BUF_BY_AUTHOR, BUF_BY_AGE, BUF_REJECTED = b"w", b"a", b"o", b"r"
META_BUFFER_TOTAL, META_BUFFER_AUTHOR = b"buffer_total", b"buffer_author"
META_ARRIVALS, META_REJECTIONS, META_EQUIVOCATIONS = b"arrivals", b"rejections", b"equivocations"
# node.state.store (state under T)
ST_EVENT, ST_GROUP, ST_CHUNK, ST_MEMO, ST_REJECTED, ST_NEXT = b"e", b"g", b"G", b"c", b"r", b"n"
ST_CHUNK_INDEX_BYTES = 4
EMPTY_GROUP = 0
# node.replica.ordering / node.replica.order_records (order under T)
OR_CONFIRMED, OR_COUNT, OR_BATCH, OR_PROXY = b"c", b"n", b"b", b"p"
OR_WHERE, OR_AT, OR_RECORDED, OR_EXCLUDED = b"w", b"l", b"k", b"x"

_COUNTERS = (META_DELIVERED, META_EQUIVOCATIONS, META_ARRIVALS, META_BUFFER_TOTAL,
             META_REJECTIONS)

Dbs = dict[str, Any]


def _u64(raw: bytes | None) -> int:
    return 0 if raw is None else int.from_bytes(raw, "big")


def _scan(txn: lmdb.Transaction, db: Any, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) under `prefix` in key order."""
    with txn.cursor(db=db) as cursor:
        if not cursor.set_range(prefix):
            return
        for key, value in cursor.iternext():
            if not key.startswith(prefix):
                return
            yield key, value


class _Topic:
    """One topic's walk context: its prefix, the open tables, the report."""

    def __init__(self, txn: lmdb.Transaction, dbs: Dbs, topic: bytes,
                 report: TopicReport) -> None:
        self.txn, self.dbs, self.t, self.report = txn, dbs, topic, report

    def applied(self, event_id: bytes) -> bool:
        return self.txn.get(self.t + event_id, db=self.dbs[TABLE_EVENTS]) is not None

    def get(self, table: str, rest: bytes) -> bytes | None:
        return self.txn.get(self.t + rest, db=self.dbs[table])

    def scan(self, table: str, rest: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """(key without the topic prefix, value) under `rest`."""
        cut = len(self.t)
        for key, value in _scan(self.txn, self.dbs[table], self.t + rest):
            yield key[cut:], value

    def add(self, damage: Damage, table: str, key: bytes, detail: str = "") -> None:
        self.report.add(damage, detail=detail, table=table, key=key)


# ------------------------------------------------------------------ buffer, rejections


def walk_buffer(topic: _Topic) -> None:
    """Buffered events, their indexes and counters (node.core.buffer), and the rejections."""
    per_author: Counter[bytes] = Counter()
    total = 0
    for rest, value in topic.scan(TABLE_BUFFER):
        if len(rest) != ID_BYTES:
            topic.add(Damage.BAD_KEY, TABLE_BUFFER, rest, f"{len(rest)} bytes, not an id")
            continue
        total += 1
        try:
            arrival, raw = msgpack.unpackb(value)
            if type(arrival) is not int or type(raw) is not bytes:
                raise ValueError("not [arrival, raw]")
        except Exception as exc:  # msgpack raises many types for malformed input
            topic.add(Damage.BAD_RECORD, TABLE_BUFFER, rest, type(exc).__name__)
            continue
        try:
            event = decode_event(raw)
        except EventFormatError as exc:
            topic.add(Damage.UNDECODABLE, TABLE_BUFFER, rest, str(exc.reason))
            continue
        if event.id != rest:
            topic.add(Damage.ID_MISMATCH, TABLE_BUFFER, rest, f"holds {event.id.hex()[:16]}")
        elif event.topic_id() != topic.t:
            topic.add(Damage.WRONG_TOPIC, TABLE_BUFFER, rest, event.topic_id().hex()[:16])
        elif not verify_signature(event):
            topic.add(Damage.BAD_SIGNATURE, TABLE_BUFFER, rest)
        if topic.applied(rest):
            topic.add(Damage.BUFFERED_APPLIED, TABLE_BUFFER, rest, "applied and still buffered")
        per_author[event.author] += 1
        at = arrival.to_bytes(U64, "big") + rest
        for index in (BUF_BY_AGE + at, BUF_BY_AUTHOR + event.author + at):
            if topic.get(TABLE_BUFFER_INDEX, index) is None:
                topic.add(Damage.UNINDEXED, TABLE_BUFFER_INDEX, index,
                          f"buffered event {rest.hex()[:16]} has no index entry")
    _walk_buffer_index(topic)
    _check_counter(topic, META_BUFFER_TOTAL, total, "buffered events")
    recorded: dict[bytes, int] = {}
    for rest, value in topic.scan(TABLE_META, META_BUFFER_AUTHOR):
        recorded[rest[len(META_BUFFER_AUTHOR):]] = _u64(value)
    for author in set(recorded) | set(per_author):
        if recorded.get(author, 0) != per_author[author]:
            topic.add(Damage.COUNTER_MISMATCH, TABLE_META, META_BUFFER_AUTHOR + author,
                      f"counter {recorded.get(author, 0)}, {per_author[author]} buffered")


def _walk_buffer_index(topic: _Topic) -> None:
    rejections = _u64(topic.get(TABLE_META, META_REJECTIONS))
    sizes = {BUF_WAIT: 1 + 2 * ID_BYTES, BUF_BY_AUTHOR: 1 + 2 * ID_BYTES + U64,
             BUF_BY_AGE: 1 + U64 + ID_BYTES, BUF_REJECTED: 1 + ID_BYTES}
    for rest, value in topic.scan(TABLE_BUFFER_INDEX):
        kind = rest[:1]
        if len(rest) != sizes.get(kind, -1):
            topic.add(Damage.BAD_KEY, TABLE_BUFFER_INDEX, rest, f"{len(rest)} bytes")
            continue
        event_id = rest[-ID_BYTES:]
        if kind == BUF_REJECTED:
            _check_rejection(topic, rest, value, event_id, rejections)
        elif kind != BUF_WAIT and topic.get(TABLE_BUFFER, event_id) is None:
            # (a stale "waits on" entry is tolerated: node.core.rejections drops it)
            topic.add(Damage.INDEX_DANGLING, TABLE_BUFFER_INDEX, rest,
                      f"names {event_id.hex()[:16]}, not buffered")


def _check_rejection(topic: _Topic, rest: bytes, value: bytes, event_id: bytes,
                     counter: int) -> None:
    try:
        value[U64:].decode("utf-8")
        if len(value) < U64:
            raise ValueError("shorter than its ordinal")
    except ValueError as exc:
        topic.add(Damage.BAD_RECORD, TABLE_BUFFER_INDEX, rest, f"rejection record: {exc}")
        return
    if _u64(value[:U64]) >= counter:
        topic.add(Damage.COUNTER_MISMATCH, TABLE_BUFFER_INDEX, rest,
                  f"ordinal {_u64(value[:U64])}, counter {counter}")
    if topic.applied(event_id):
        topic.add(Damage.REJECTED_APPLIED, TABLE_BUFFER_INDEX, rest, "rejected yet applied")


def _check_counter(topic: _Topic, name: bytes, counted: int, what: str) -> None:
    stored = _u64(topic.get(TABLE_META, name))
    if stored != counted:
        topic.add(Damage.COUNTER_MISMATCH, TABLE_META, name,
                  f"counter {stored}, {counted} {what}")


# ------------------------------------------------------------------ authors, meta


def walk_authors(topic: _Topic) -> None:
    """Each per-author entry names an applied event (the graph walk checks the converse)."""
    for rest, _ in topic.scan(TABLE_AUTHORS):
        if len(rest) != 2 * ID_BYTES + U64:
            topic.add(Damage.BAD_KEY, TABLE_AUTHORS, rest, f"{len(rest)} bytes")
        elif not topic.applied(rest[-ID_BYTES:]):
            topic.add(Damage.EVENT_MISSING, TABLE_AUTHORS, rest,
                      f"names {rest[-ID_BYTES:].hex()[:16]}, not applied")


def walk_meta(topic: _Topic) -> None:
    """The topic's counters are 8-byte integers (the graph walk checks `delivered`'s value)."""
    for name in _COUNTERS:
        value = topic.get(TABLE_META, name)
        if value is not None and len(value) != U64:
            topic.add(Damage.BAD_RECORD, TABLE_META, name, f"{len(value)} bytes, not 8")
    for rest, value in topic.scan(TABLE_META, META_BUFFER_AUTHOR):
        if len(rest) != len(META_BUFFER_AUTHOR) + ID_BYTES or len(value) != U64:
            topic.add(Damage.BAD_RECORD, TABLE_META, rest, "not author -> 8-byte count")


def check_topic_records(txn: lmdb.Transaction, meta: Any) -> list[Finding]:
    """Store-wide: each node topic record has a 32-byte topic id and a known value."""
    found = []
    for key, value in _scan(txn, meta, TOPIC_META_PREFIX):
        topic = key[len(TOPIC_META_PREFIX):]
        if len(topic) != ID_BYTES or value not in (b"", WANTS_MEMBERSHIP):
            found.append(Finding(Damage.BAD_TOPIC_RECORD, table=TABLE_META,
                                 key=key[:64].hex(), detail=f"value {value[:16]!r}"))
    return found


# ------------------------------------------------------------------ state


def walk_state(topic: _Topic) -> None:
    """State groups and event records (node.state.store)."""
    next_gid = _u64(topic.get(TABLE_STATE, ST_NEXT))
    groups: dict[int, tuple[int | None, int]] = {}  # gid -> (base, extra chunks)
    for rest, value in topic.scan(TABLE_STATE, ST_GROUP):
        if len(rest) != 1 + U64:
            topic.add(Damage.BAD_KEY, TABLE_STATE, rest, f"{len(rest)} bytes")
            continue
        gid = _u64(rest[1:])
        try:
            base, chain, extra, changes = msgpack.unpackb(value, raw=False)
            if not (base is None or type(base) is int) or type(extra) is not int \
                    or type(chain) is not int or type(changes) is not list:
                raise ValueError("not [base, chain, extra, changes]")
        except Exception as exc:  # msgpack raises many types for malformed input
            topic.add(Damage.BAD_RECORD, TABLE_STATE, rest, f"state group {gid}: "
                      f"{type(exc).__name__}")
            groups[gid] = (None, 0)  # present, if unreadable: reported once, here
            continue
        groups[gid] = (base, extra)
        if gid >= next_gid:
            topic.add(Damage.COUNTER_MISMATCH, TABLE_STATE, rest,
                      f"state group {gid}, next group counter {next_gid}")
    exists = lambda gid: gid == EMPTY_GROUP or gid in groups  # noqa: E731
    for gid, (base, extra) in groups.items():
        key = ST_GROUP + gid.to_bytes(U64, "big")
        if base is not None and not exists(base):
            topic.add(Damage.GROUP_MISSING, TABLE_STATE, key,
                      f"state group {base} missing (the base of group {gid})")
        for index in range(1, extra + 1):
            if topic.get(TABLE_STATE, ST_CHUNK + key[1:] + index.to_bytes(4, "big")) is None:
                topic.add(Damage.GROUP_MISSING, TABLE_STATE, key,
                          f"state group {gid} lost chunk {index}")
    for rest, value in topic.scan(TABLE_STATE, ST_CHUNK):
        if len(rest) != 1 + U64 + ST_CHUNK_INDEX_BYTES or _u64(rest[1:1 + U64]) not in groups:
            topic.add(Damage.INDEX_DANGLING, TABLE_STATE, rest, "a chunk of no state group")
    _walk_state_events(topic, exists)
    _walk_handed_count(topic)
    for rest, value in topic.scan(TABLE_STATE, ST_MEMO):
        if len(value) != U64 or not exists(_u64(value)):
            topic.add(Damage.GROUP_MISSING, TABLE_STATE, rest,
                      f"resolution memo names state group {_u64(value[:U64])}, missing")


def _walk_handed_count(topic: _Topic) -> None:
    """The replica's count of what subscribers are handed (node.replica.delivery_count):
    three 8-byte numbers, over positions the graph holds, counting no more than them.
    (The node counts again what it cannot trust: a finding, not a loss.)"""
    value = topic.get(TABLE_STATE, HANDED_KEY)
    if value is None:
        return  # stored before the count was kept: counted once by reading back
    if len(value) != 3 * U64:
        topic.add(Damage.BAD_RECORD, TABLE_STATE, HANDED_KEY, "not three 8-byte numbers")
        return
    end, handed, acks = (_u64(value[i:i + U64]) for i in range(0, 3 * U64, U64))
    delivered = _u64(topic.get(TABLE_META, META_DELIVERED))
    if end > delivered or handed > end or acks > handed:
        topic.add(Damage.COUNTER_MISMATCH, TABLE_STATE, HANDED_KEY,
                  f"{handed} handed out ({acks} acks) of {end} positions, {delivered} delivered")


def _walk_state_events(topic: _Topic, exists: Callable[[int], bool]) -> None:
    for rest, value in topic.scan(TABLE_STATE, ST_EVENT):
        event_id = rest[1:]
        if len(event_id) != ID_BYTES or len(value) < 2 * U64:
            topic.add(Damage.BAD_RECORD, TABLE_STATE, rest, "not id -> before, after, reason")
            continue
        try:
            value[2 * U64:].decode("utf-8")
        except UnicodeDecodeError:
            topic.add(Damage.BAD_RECORD, TABLE_STATE, rest, "reason is not UTF-8")
        if not topic.applied(event_id):
            topic.add(Damage.EVENT_MISSING, TABLE_STATE, rest,
                      f"state of {event_id.hex()[:16]}, not applied")
        for name, gid in (("before", _u64(value[:U64])), ("after", _u64(value[U64:2 * U64]))):
            if not exists(gid):
                topic.add(Damage.GROUP_MISSING, TABLE_STATE, rest,
                          f"state group {gid} missing (the state {name} {event_id.hex()[:16]})")
    for rest, _ in topic.scan(TABLE_STATE, ST_REJECTED):
        record = topic.get(TABLE_STATE, ST_EVENT + rest[1:])
        if record is None or len(record) <= 2 * U64:
            topic.add(Damage.INDEX_DANGLING, TABLE_STATE, rest,
                      "rejected index names no rejected event record")


# ------------------------------------------------------------------ order


def walk_order(topic: _Topic) -> None:
    """The confirmed prefix, node positions, exclusions and proxies (node.replica.ordering)."""
    count = _u64(topic.get(TABLE_ORDER, OR_COUNT))
    expected = 0
    for rest, value in topic.scan(TABLE_ORDER, OR_CONFIRMED):
        if len(rest) != 1 + U64:
            topic.add(Damage.BAD_KEY, TABLE_ORDER, rest, f"{len(rest)} bytes")
            continue
        position = _u64(rest[1:])
        if position != expected:
            missing = (f" {expected}" if position == expected + 1
                       else f"s {expected}..{position - 1}")
            topic.add(Damage.CONFIRMED_HOLE, TABLE_ORDER, rest,
                      f"confirmed position{missing} missing")
        expected = position + 1
        if len(value) != ID_BYTES or not topic.applied(value):
            topic.add(Damage.EVENT_MISSING, TABLE_ORDER, rest,
                      f"confirmed position {position} names {value.hex()[:16]}, not applied")
    if expected != count:
        topic.add(Damage.COUNTER_MISMATCH, TABLE_ORDER, OR_COUNT,
                  f"{count} confirmed, the last confirmed position is {expected - 1}")
    _walk_nodes(topic)
    delivered = _u64(topic.get(TABLE_META, META_DELIVERED))
    for rest, value in topic.scan(TABLE_ORDER, OR_BATCH):
        if len(rest) != 1 + U64 or len(value) != U64 or \
                not _u64(rest[1:]) < _u64(value) <= delivered:
            topic.add(Damage.BAD_RECORD, TABLE_ORDER, rest,
                      f"batch {_u64(rest[1:])}..{_u64(value[:U64])}, {delivered} delivered")
    for rest, value in topic.scan(TABLE_ORDER, OR_EXCLUDED):  # node.replica.order_bans
        if len(rest) != 1 + ID_BYTES or not value:
            topic.add(Damage.BAD_RECORD, TABLE_ORDER, rest, "not id -> reason")
        elif not topic.applied(rest[1:]):
            topic.add(Damage.EVENT_MISSING, TABLE_ORDER, rest,
                      f"excluded event {rest[1:].hex()[:16]}, not applied")
    for rest, value in topic.scan(TABLE_ORDER, OR_PROXY):
        deps = [value[i:i + ID_BYTES] for i in range(0, len(value), ID_BYTES)]
        if len(rest) != 1 + ID_BYTES or len(value) % ID_BYTES:
            topic.add(Damage.BAD_RECORD, TABLE_ORDER, rest, "not id -> ids")
        elif not all(topic.applied(i) for i in [rest[1:], *deps]):
            topic.add(Damage.EVENT_MISSING, TABLE_ORDER, rest,
                      "a proxy or its deps not applied")


def _walk_nodes(topic: _Topic) -> None:
    """`w|id` and `l|lane|seq` name each other; `k` counts them (node.replica.order_records)."""
    where = 0
    for rest, value in topic.scan(TABLE_ORDER, OR_WHERE):
        node_id = rest[1:]
        if len(node_id) != ID_BYTES or len(value) != U64:
            topic.add(Damage.BAD_RECORD, TABLE_ORDER, rest, "not id -> position")
            continue
        where += 1
        lane, seq = divmod(_u64(value), LANE_STRIDE)
        at = OR_AT + lane.to_bytes(LANE_BYTES, "big") + seq.to_bytes(U64, "big")
        if topic.get(TABLE_ORDER, at) != node_id:
            topic.add(Damage.ORDER_MISMATCH, TABLE_ORDER, rest,
                      f"node {node_id.hex()[:16]} at lane {lane} seq {seq}: no such record")
        if not topic.applied(node_id):
            topic.add(Damage.EVENT_MISSING, TABLE_ORDER, rest,
                      f"ordered node {node_id.hex()[:16]}, not applied")
    at_count = 0
    for rest, node_id in topic.scan(TABLE_ORDER, OR_AT):
        if len(rest) != 1 + LANE_BYTES + U64:
            topic.add(Damage.BAD_KEY, TABLE_ORDER, rest, f"{len(rest)} bytes")
            continue
        at_count += 1
        lane, seq = _u64(rest[1:1 + LANE_BYTES]), _u64(rest[1 + LANE_BYTES:])
        position = topic.get(TABLE_ORDER, OR_WHERE + node_id)
        if position is None or _u64(position) != lane * LANE_STRIDE + seq:
            topic.add(Damage.ORDER_MISMATCH, TABLE_ORDER, rest,
                      f"lane {lane} seq {seq} holds {node_id.hex()[:16]}, placed elsewhere")
    recorded = _u64(topic.get(TABLE_ORDER, OR_RECORDED))
    if not recorded == where == at_count:
        topic.add(Damage.COUNTER_MISMATCH, TABLE_ORDER, OR_RECORDED,
                  f"counter {recorded}, {where} node positions, {at_count} lane records")


# ------------------------------------------------------------------ every table


# Which walk covers each table of node.core.store.TABLES. The graph walk
# (node.check.check_topic) covers delivery, events, extremities, children and
# the meta counter `delivered`; "graph" marks those.
GRAPH_WALK = "graph"
TABLE_WALKS: dict[str, str] = {
    TABLE_DELIVERY: GRAPH_WALK,
    TABLE_EVENTS: GRAPH_WALK,
    TABLE_EXTREMITIES: GRAPH_WALK,
    TABLE_CHILDREN: GRAPH_WALK,
    TABLE_BUFFER: "buffer",
    TABLE_BUFFER_INDEX: "buffer",
    TABLE_AUTHORS: "authors",
    TABLE_META: "meta",
    TABLE_STATE: "state",
    TABLE_ORDER: "order",
}
_WALKS: dict[str, Callable[[_Topic], None]] = {
    "buffer": walk_buffer, "authors": walk_authors, "meta": walk_meta,
    "state": walk_state, "order": walk_order,
}


def walk_tables(txn: lmdb.Transaction, dbs: Dbs, report: TopicReport) -> None:
    """Run every walk whose tables are present for `report.topic` (after the graph walk)."""
    topic = _Topic(txn, dbs, report.topic, report)
    if TABLE_EVENTS not in dbs:
        return  # nothing can say what is applied
    for name in dict.fromkeys(TABLE_WALKS.values()):
        needed = [t for t, walk in TABLE_WALKS.items() if walk == name]
        if name != GRAPH_WALK and all(t in dbs for t in needed):
            _WALKS[name](topic)


# ------------------------------------------------------------------ at start


def quick_check_records(store: Store, topic: bytes, extremities: list[bytes]) -> str | None:
    """What the start check finds missing in the state and order tables, or None.

    A few reads: the newest state group (`n` - 1), the state groups of up to
    QUICK_CHECK_EXTREMITIES forward extremities (what the first status or
    publish loads), and the last confirmed position. Damage deeper in the
    tables is found by `megnode check`, or when a read meets it
    (node.core.store.DamagedTopicError).
    """
    def group_missing(gid: int) -> bool:
        return gid != EMPTY_GROUP and store.get(
            TABLE_STATE, topic + ST_GROUP + gid.to_bytes(U64, "big")) is None

    newest = _u64(store.get(TABLE_STATE, topic + ST_NEXT)) - 1
    if newest > EMPTY_GROUP and group_missing(newest):
        return f"state group {newest} missing"
    for event_id in extremities[:QUICK_CHECK_EXTREMITIES]:
        record = store.get(TABLE_STATE, topic + ST_EVENT + event_id)
        if record is None:
            continue  # not judged yet (authorization off, an older store): caught up later
        for gid in (_u64(record[:U64]), _u64(record[U64:2 * U64])):
            if group_missing(gid):
                return f"state group {gid} missing"
    confirmed = _u64(store.get(TABLE_ORDER, topic + OR_COUNT))
    if confirmed and store.get(TABLE_ORDER, topic + OR_CONFIRMED
                               + (confirmed - 1).to_bytes(U64, "big")) is None:
        return f"confirmed position {confirmed - 1} missing"
    return None
