"""The store's integrity check and the per-topic repair (`megnode check`, `megnode repair`).

Why: a disk, a filesystem or a bug can leave a store that opens fine but
holds an event that no longer decodes, an index that points nowhere or a
delivery log with a hole; the node would then serve (and gossip) damaged
history. `check_data_dir` walks every table of a stopped node's store in
one read transaction (a consistent snapshot) and reports, per topic, what
is damaged; `repair_topic` drops one topic's stored state so that the node
fetches the topic again from its peers on the next start.

What the walk checks, per topic T (the key layout is node.core.graph's and
node.core.buffer's; docs/graph.md):

- delivery: positions 0..n-1 with no hole; each record is msgpack
  [depth, raw]; raw decodes (node.core.event), belongs to T, its signature
  verifies (node.core.identity); the id index maps its id back to this
  position; every parent is applied at an earlier position; its depth is
  1 + the deepest parent's (0 for the create event);
- events (the id index): every entry points at a delivery record of that id;
- extremities and children: every id they name is applied;
- meta: the delivered counter equals the number of delivery records;
- every other table (buffer, rejections, authors, state groups and event
  states, the order's confirmed prefix, node positions and proxies, the
  node's topic records): `node.check.tables`. The check refuses to run if a
  table of node.core.store.TABLES has no walk there, and reports a named
  database the build does not know.

The check opens the environment read-only while holding the data dir's
lock, so no daemon can start (and write) while it reads; a running daemon
holds the lock, and the check refuses (`StoreLockedError`). Everything here
reads; only `repair_topic` writes, through `LmdbStore`, the same way a
node does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import msgpack

from node.core.event import ID_BYTES, EventFormatError, decode_event, event_id_of
from node.core.graph_commit import META_DELIVERED
from node.core.identity import verify_signature
from node.core.store import (
    MAX_BATCH_OPS,
    STORE_FORMAT,
    TABLE_AUTHORS,
    TABLE_CHILDREN,
    TABLE_DELIVERY,
    TABLE_EVENTS,
    TABLE_EXTREMITIES,
    TABLE_META,
    TABLES,
    Delete,
    Store,
    StoreError,
    prefix_upper_bound,
)
from node.check.report import (
    MAX_FINDINGS_LISTED,
    Damage,
    Finding,
    StoreReport,
    TopicReport,
)
from node.check.tables import (
    QUICK_CHECK_EXTREMITIES,
    TABLE_WALKS,
    check_topic_records,
    quick_check_records,
    walk_tables,
)
from node.topic_records import TOPIC_META_PREFIX, stored_topics, topic_record
from storage.lmdb_data_dir import lock_data_dir, unlock_data_dir
from storage.lmdb_meta import check_data_file
from storage.lmdb_store import LmdbStore
from storage.memory import STORE_FORMAT_KEY, encode_store_format

# Keys one repair transaction deletes (well under the store's MAX_BATCH_OPS).
REPAIR_BATCH_KEYS = min(100_000, MAX_BATCH_OPS)
POSITION_BYTES = 8
DATA_FILE = "data.mdb"  # LMDB's data file in an environment directory


class CheckError(Exception):
    """The store cannot be checked at all (absent, another format); one line for the user."""


# --------------------------------------------------------------------- the check


def check_data_dir(store_dir: Path) -> StoreReport:
    """Check the store in `store_dir` (a node's `<data dir>/store`); it must not be open.

    Raises StoreLockedError if a daemon holds it, CheckError if there is no
    store or it is in a format this build does not read.
    """
    if not (store_dir / DATA_FILE).is_file():
        raise CheckError(f"no store in {store_dir}")
    lock_fd = lock_data_dir(store_dir)
    try:
        env = _open_read_only(store_dir)
        try:
            try:
                with env.begin() as txn:
                    return _check_env(env, txn, store_dir)
            except lmdb.Error as exc:  # a corrupt B-tree page: no per-topic verdict possible
                report = StoreReport(store_dir)
                report.store_findings.append(Finding(Damage.UNREADABLE, detail=str(exc)))
                return report
        finally:
            env.close()
    finally:
        unlock_data_dir(lock_fd)


def _open_read_only(store_dir: Path) -> lmdb.Environment:
    try:
        # A truncated file would make LMDB's first read past its end a SIGBUS.
        check_data_file(store_dir, extend=False)
    except StoreError as exc:
        raise CheckError(str(exc)) from None
    try:
        # lock=False: we hold the data dir's flock, so no process writes.
        return lmdb.open(str(store_dir), readonly=True, lock=False, subdir=True,
                         max_dbs=len(TABLES))
    except lmdb.Error as exc:
        raise CheckError(f"cannot open the store in {store_dir}: {exc}") from None


def unwalked_tables() -> list[str]:
    """Tables of node.core.store.TABLES no walk covers (node.check.tables.TABLE_WALKS)."""
    return [name for name in TABLES if name not in TABLE_WALKS]


def _check_env(env: lmdb.Environment, txn: lmdb.Transaction, path: Path) -> StoreReport:
    unwalked = unwalked_tables()
    if unwalked:  # a table added without a walk: refuse rather than report "ok" unchecked
        raise CheckError(f"this build's check does not walk table(s) {', '.join(unwalked)}: "
                         "add them to node/check/tables.py (TABLE_WALKS)")
    report = StoreReport(path)
    for name in _named_tables(txn):
        if name not in TABLES:
            report.store_findings.append(Finding(Damage.UNKNOWN_TABLE, detail=name))
    dbs: dict[str, Any] = {}
    for name in TABLES:
        try:
            dbs[name] = env.open_db(name.encode("ascii"), txn=txn, create=False)
        except lmdb.NotFoundError:
            report.store_findings.append(Finding(Damage.MISSING_TABLE, detail=name))
    if TABLE_META in dbs:
        found = txn.get(STORE_FORMAT_KEY, db=dbs[TABLE_META])
        if found != encode_store_format(STORE_FORMAT):
            raise CheckError(f"the store in {path} has format {found!r}; this build checks "
                             f"format {STORE_FORMAT} only")
    if any(name not in dbs for name in (TABLE_DELIVERY, TABLE_EVENTS, TABLE_META)):
        return report  # nothing per topic can be read
    report.store_findings += check_topic_records(txn, dbs[TABLE_META])
    recorded = {topic for topic, _ in _records(txn, dbs[TABLE_META])}
    topics = set(recorded)
    for name in TABLES:  # every table but meta is keyed by topic first
        if name in dbs and name != TABLE_META:
            topics.update(_topic_prefixes(txn, dbs[name]))
    for topic in sorted(topics):
        topic_report = check_topic(txn, dbs, topic, topic in recorded)
        walk_tables(txn, dbs, topic_report)
        report.topics.append(topic_report)
    return report


def _named_tables(txn: lmdb.Transaction) -> list[str]:
    """The named databases in the environment (LMDB keeps their names in its main database)."""
    with txn.cursor() as cursor:
        return [key.decode("utf-8", "replace") for key in cursor.iternext(values=False)]


def _records(txn: lmdb.Transaction, meta: Any) -> list[tuple[bytes, bool]]:
    """The node's topic records, read like node.topic_records.stored_topics does."""
    out = []
    with txn.cursor(db=meta) as cursor:
        if cursor.set_range(TOPIC_META_PREFIX):
            for key in cursor.iternext(keys=True, values=False):
                if not key.startswith(TOPIC_META_PREFIX):
                    break
                topic = key[len(TOPIC_META_PREFIX):]
                if len(topic) == ID_BYTES:
                    out.append((topic, False))
    return out


def _topic_prefixes(txn: lmdb.Transaction, db: Any) -> Iterator[bytes]:
    """Every distinct 32-byte key prefix in `db`, jumping from one topic to the next."""
    with txn.cursor(db=db) as cursor:
        found = cursor.first()
        while found:
            topic = cursor.key()[:ID_BYTES]
            if len(topic) == ID_BYTES:
                yield topic
            bound = prefix_upper_bound(topic)
            found = bound is not None and cursor.set_range(bound)


def _u64(value: int) -> bytes:
    return value.to_bytes(POSITION_BYTES, "big")


def check_topic(txn: lmdb.Transaction, dbs: dict[str, Any], topic: bytes,
                recorded: bool = True) -> TopicReport:
    """Walk one topic's tables in `txn` (module docstring lists the checks)."""
    report = TopicReport(topic, recorded)
    delivery, events = dbs[TABLE_DELIVERY], dbs[TABLE_EVENTS]
    expected = 0
    with txn.cursor(db=delivery) as cursor:
        found = cursor.set_range(topic)
        while found:
            key, value = cursor.item()
            if not key.startswith(topic):
                break
            found = cursor.next()
            if len(key) != ID_BYTES + POSITION_BYTES:
                report.add(Damage.BAD_KEY, detail=f"delivery key of {len(key)} bytes",
                           table=TABLE_DELIVERY, key=key[ID_BYTES:])
                continue
            position = int.from_bytes(key[ID_BYTES:], "big")
            if position != expected:
                report.add(Damage.DELIVERY_HOLE, expected,
                           f"positions {expected}..{position - 1} missing", table=TABLE_DELIVERY)
            expected = position + 1
            report.events += 1
            _check_record(txn, dbs, topic, position, value, report)
    delivered = txn.get(topic + META_DELIVERED, db=dbs[TABLE_META])
    counter = 0 if delivered is None else int.from_bytes(delivered, "big")
    if counter != report.events or counter != expected:
        report.add(Damage.COUNTER_MISMATCH,
                   detail=f"delivered counter {counter}, {report.events} records, "
                          f"last position {expected - 1}", table=TABLE_META, key=META_DELIVERED)
    _check_index(txn, events, delivery, topic, report)
    if TABLE_EXTREMITIES in dbs:
        for key in _keys(txn, dbs[TABLE_EXTREMITIES], topic):
            if txn.get(key, db=events) is None:
                report.add(Damage.EXTREMITY_MISSING, detail=key[ID_BYTES:].hex(),
                           table=TABLE_EXTREMITIES, key=key[ID_BYTES:])
    if TABLE_CHILDREN in dbs:
        for key in _keys(txn, dbs[TABLE_CHILDREN], topic):
            child = key[ID_BYTES + POSITION_BYTES:]
            if len(child) != ID_BYTES or txn.get(topic + child, db=events) is None:
                report.add(Damage.CHILD_MISSING, detail=child.hex(), table=TABLE_CHILDREN,
                           key=key[ID_BYTES:])
    return report


def _keys(txn: lmdb.Transaction, db: Any, prefix: bytes) -> Iterator[bytes]:
    with txn.cursor(db=db) as cursor:
        if not cursor.set_range(prefix):
            return
        for key in cursor.iternext(keys=True, values=False):
            if not key.startswith(prefix):
                return
            yield key


def record_verdict(topic: bytes, value: bytes) -> tuple[int, Any] | Finding:
    """A delivery record's (depth, decoded event), or the Finding that says why not.

    Takes bytes, returns a verdict: the part of the check that needs no store.
    """
    try:
        depth, raw = msgpack.unpackb(value)
    except Exception as exc:  # msgpack raises many types for malformed input
        return Finding(Damage.BAD_RECORD, detail=type(exc).__name__)
    if type(depth) is not int or type(raw) is not bytes:
        return Finding(Damage.BAD_RECORD, detail="not [depth, raw]")
    try:
        event = decode_event(raw)
    except EventFormatError as exc:
        return Finding(Damage.UNDECODABLE, detail=str(exc.reason))
    if event.topic_id() != topic:
        return Finding(Damage.WRONG_TOPIC, detail=event.topic_id().hex()[:16])
    if not verify_signature(event):
        return Finding(Damage.BAD_SIGNATURE, detail=event.id.hex()[:16])
    return depth, event


def _check_record(txn: lmdb.Transaction, dbs: dict[str, Any], topic: bytes,
                  position: int, value: bytes, report: TopicReport) -> None:
    events, delivery = dbs[TABLE_EVENTS], dbs[TABLE_DELIVERY]
    verdict = record_verdict(topic, value)
    if isinstance(verdict, Finding):
        report.add(verdict.damage, position, verdict.detail, table=TABLE_DELIVERY)
        return
    depth, event = verdict
    if TABLE_AUTHORS in dbs:  # the per-author index (Graph.events_by, author_latest_seq)
        entry = event.author + event.seq.to_bytes(POSITION_BYTES, "big") + event.id
        if txn.get(topic + entry, db=dbs[TABLE_AUTHORS]) is None:
            report.add(Damage.UNINDEXED, position, f"{event.id.hex()[:16]} has no authors entry",
                       table=TABLE_AUTHORS, key=entry)
    if txn.get(topic + event.id, db=events) != _u64(position):
        report.add(Damage.ID_MISMATCH, position, f"id {event.id.hex()[:16]} not indexed here",
                   table=TABLE_EVENTS, key=event.id)
    parent_depths = []
    for parent in event.parents:
        at = txn.get(topic + parent, db=events)
        if at is None:
            report.add(Damage.MISSING_PARENT, position, parent.hex()[:16], table=TABLE_DELIVERY)
            continue
        if int.from_bytes(at, "big") >= position:
            report.add(Damage.PARENT_NOT_BEFORE, position, parent.hex()[:16],
                       table=TABLE_DELIVERY)
            continue
        record = txn.get(topic + at, db=delivery)
        try:
            parent_depths.append(msgpack.unpackb(record)[0] if record is not None else None)
        except Exception:
            parent_depths.append(None)  # the parent's own record is reported at its position
    if len(parent_depths) == len(event.parents) and None not in parent_depths:
        want = 1 + max(parent_depths) if parent_depths else 0
        if depth != want:
            report.add(Damage.BAD_DEPTH, position, f"depth {depth}, parents say {want}",
                       table=TABLE_DELIVERY)


def _check_index(txn: lmdb.Transaction, events: Any, delivery: Any, topic: bytes,
                 report: TopicReport) -> None:
    """Every id index entry points at a delivery record of that very id."""
    with txn.cursor(db=events) as cursor:
        if not cursor.set_range(topic):
            return
        for key, at in cursor.iternext():
            if not key.startswith(topic):
                return
            event_id = key[ID_BYTES:]
            record = txn.get(topic + at, db=delivery) if len(at) == POSITION_BYTES else None
            if record is not None:
                try:
                    raw = msgpack.unpackb(record)[1]
                except Exception:
                    continue  # a broken record: the delivery walk reports it
                if type(raw) is not bytes or event_id_of(raw) == event_id:
                    continue
            position = int.from_bytes(at, "big") if len(at) == POSITION_BYTES else None
            report.add(Damage.INDEX_DANGLING, position, event_id.hex()[:16], table=TABLE_EVENTS,
                       key=event_id)


# --------------------------------------------------------------------- at start


def quick_check_topic(store: Store, topic: bytes) -> str | None:
    """What is wrong with `topic` by a cheap test, or None: run on every start.

    A few reads: the delivered counter must name the last delivery record
    (position counter - 1, none when 0); the newest state group, the state
    groups of the first forward extremities and the last confirmed position
    must exist (`node.check.tables.quick_check_records`). A torn or
    truncated topic fails it and the node refuses to serve that topic
    (serving the others); the full walk is `check_data_dir`.
    """
    counter = int.from_bytes(store.get(TABLE_META, topic + META_DELIVERED) or b"", "big")
    last = list(store.scan(TABLE_DELIVERY, topic, reverse=True, limit=1))
    if not last:
        return None if counter == 0 else f"delivered counter {counter} but no events stored"
    key = last[0][0]
    position = int.from_bytes(key[ID_BYTES:], "big") if len(key) == ID_BYTES + POSITION_BYTES \
        else -1
    if position != counter - 1:
        return f"delivered counter {counter} but the last stored position is {position}"
    extremities = [key[ID_BYTES:] for key, _ in
                   store.scan(TABLE_EXTREMITIES, topic, limit=QUICK_CHECK_EXTREMITIES)]
    return quick_check_records(store, topic, extremities)


# --------------------------------------------------------------------- the repair


@dataclass(frozen=True, slots=True)
class RepairResult:
    topic: bytes
    deleted: int  # keys removed, over every table
    recorded: bool  # the topic record was there (else it was written, so the node re-fetches)


def repair_topic(store_dir: Path, topic: bytes) -> RepairResult:
    """Drop every key of `topic` in every table, keep (or write) its topic record.

    On its next start the node opens the topic empty and fetches it from its
    peers (anti-entropy). Deletes go in batches of REPAIR_BATCH_KEYS, each
    its own transaction: an interrupted repair leaves a topic that `check`
    still reports and that a second `repair` finishes. Raises
    StoreLockedError if a daemon holds the store.
    """
    if not (store_dir / DATA_FILE).is_file():
        raise CheckError(f"no store in {store_dir}")
    with LmdbStore(store_dir) as store:
        deleted = 0
        for table in TABLES:
            while True:
                keys = [key for key, _ in store.scan(table, topic, limit=REPAIR_BATCH_KEYS)]
                if not keys:
                    break
                store.apply([Delete(table, key) for key in keys])
                deleted += len(keys)
        recorded = any(t == topic for t, _ in stored_topics(store))
        if not recorded:
            store.apply(topic_record(topic))
        return RepairResult(topic, deleted, recorded)


__all__ = ["MAX_FINDINGS_LISTED", "CheckError", "Damage", "Finding", "RepairResult", "StoreError",
           "StoreReport", "TopicReport", "check_data_dir", "check_topic", "quick_check_topic",
           "record_verdict", "repair_topic", "unwalked_tables"]
