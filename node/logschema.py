"""The dissemination log: one versioned schema, its validator, and its writer.

Every node (real or simulated) writes one JSON object per line for each
dissemination step it takes; the PySpark jobs in `analytics.jobs` read those
lines back. This module is the single source of truth for that format — the
node runtime and the simulator build records with `make_record` and write them
with `JsonLinesLogWriter`; the Spark loader derives its checks from the same
tables (`FIELDS`, `COMMON_REQUIRED`, `REQUIRED_BY_TYPE`), so writer, Python
validator and Spark loader cannot drift apart. `docs/log-schema.md` is the
user-facing copy of this docstring.

Schema version 1 (field `v` = 1)::

    field     JSON type   Spark type  required for            meaning
    v         integer     long        all                     schema version, always 1
    ts_ms     integer>=0  long        all                     node clock (virtual clock in simulation), ms
    node      hex         string      all                     the node that logged the record
    type      string      string      all                     one of RECORD_TYPES below
    topic     hex         string      all but peer_up/down    topic id
                                      (rejected: or peer)
    event     hex         string      per-event types         event id
    author    hex         string      -                       event author's public key
    kind      text<=64    string      -                       event kind (message, dummy, m.room.member...)
    depth     integer>=0  long        -                       event depth in the node's graph
    channel   string      string      received/delivered/     gossip | sync | relay
                                      duplicate
    reason    text<=256   string      rejected,               why the event was rejected;
                                      exchange_timeout        which exchange timed out
    width     integer>=0  long        width                   forward extremities (width samples);
                                                              on dummy: the width that triggered it
    buffered  integer>=0  long        width                   events waiting for missing parents
    peer      hex         string      peer_up / peer_down,    the remote node (rejected: the
                                      exchange_timeout        sender of what was refused;
                                      (rejected: or topic)    duplicate: of the copy)

Record types: `created` (the local author made the event; it counts as the
author's own delivery), `received` (bytes arrived), `buffered` (parents
missing, waiting), `delivered` (applied to the graph and handed to
subscribers), `rejected` (needs `reason` and at least one of `topic` and
`peer`: a frame that could not even be decoded names no topic, only the peer
that sent it — a peer-level rejection), `duplicate` (received again after delivery),
`width` (periodic sample), `dummy` (an extremity-depletion dummy event was
issued; always accompanied by a `created` record of kind `dummy` for the same
event, so dissemination sees dummies like any event), `peer_up`, `peer_down`,
`exchange_timeout` (an anti-entropy exchange this node opened with `peer`
got no answer in time; `reason` says which: `opening` or `streaming` (a
catch-up's page), with `:heard` when other frames of the peer came after
the offer).

Rules a reader applies (and the reasons it counts lines under, checked in this
order, first failure wins): a line longer than MAX_LINE_CHARS is `too_long`;
not one JSON value (also: duplicate keys, NaN, trailing data) is `bad_json`; a
JSON value that is not an object is `not_object`; `v` missing is
`missing_field`, not an integer `wrong_type`, not 1 `bad_version`; `type`
likewise, an unknown name is `unknown_type`; any other known field with the
wrong JSON type (a float or a string where an integer belongs, an integer
outside int64, ...) is `wrong_type`; a required field absent or null is
`missing_field` (so is a `rejected` record with neither `topic` nor `peer`);
a value out of its domain (negative integer, id that is not
lowercase hex, empty or over-long text, unknown channel) is `bad_value`.
Unknown keys are ignored and JSON null equals absent.

Versioning: adding an optional field keeps `v` = 1 (readers ignore unknown
keys). Removing, renaming or retyping a field, or changing what one means,
bumps `v`; a v1 reader counts other versions as `bad_version` rather than
guessing. Relaxing a requirement also keeps `v` = 1 when no field changes
meaning: `topic` became optional on `rejected` records that carry `peer`
(every earlier v1 record is still valid and means the same; an older reader
counts the new peer-level rejections as `missing_field`, which loses them but
misreads nothing). Adding a record type keeps `v` = 1 for the same reason
(`exchange_timeout`: an older reader counts it as `unknown_type`).

Ids are lowercase hex because the jobs join records from different nodes on
them as strings: one canonical spelling per id keeps those joins exact.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:  # pyspark is heavy; the node runtime imports this module without it.
    from pyspark.sql.types import StructType

SCHEMA_VERSION: Final = 1

# Limits. A line is bounded so one bad line cannot cost a reader unbounded work.
MAX_LINE_CHARS: Final = 16 * 1024
MAX_HEX_ID_CHARS: Final = 128  # a 64-byte id; ed25519 keys and BLAKE2b-256 ids use 64
MAX_KIND_CHARS: Final = 64  # == node.core.event.MAX_KIND_BYTES
MAX_REASON_CHARS: Final = 256
MAX_TYPE_CHARS: Final = 32
MAX_INT64: Final = (1 << 63) - 1

HEX_DIGITS: Final = "0123456789abcdef"
# fullmatch, not `^...$`: `$` also matches before a trailing newline.
_HEX_ID_RE: Final = re.compile(f"[{HEX_DIGITS}]{{1,{MAX_HEX_ID_CHARS}}}")

# Record types.
CREATED: Final = "created"
RECEIVED: Final = "received"
BUFFERED: Final = "buffered"
DELIVERED: Final = "delivered"
REJECTED: Final = "rejected"
DUPLICATE: Final = "duplicate"
WIDTH: Final = "width"
DUMMY: Final = "dummy"
PEER_UP: Final = "peer_up"
PEER_DOWN: Final = "peer_down"
EXCHANGE_TIMEOUT: Final = "exchange_timeout"

# Channels an event can arrive through.
GOSSIP: Final = "gossip"
SYNC: Final = "sync"  # anti-entropy / backfill
RELAY: Final = "relay"
CHANNELS: Final = (GOSSIP, SYNC, RELAY)

# Reasons a reader gives for a line it cannot use (checked in the docstring's order).
TOO_LONG: Final = "too_long"
BAD_JSON: Final = "bad_json"
NOT_OBJECT: Final = "not_object"
BAD_VERSION: Final = "bad_version"
UNKNOWN_TYPE: Final = "unknown_type"
WRONG_TYPE: Final = "wrong_type"
MISSING_FIELD: Final = "missing_field"
BAD_VALUE: Final = "bad_value"
REASONS: Final = (
    TOO_LONG, BAD_JSON, NOT_OBJECT, BAD_VERSION, UNKNOWN_TYPE, WRONG_TYPE, MISSING_FIELD, BAD_VALUE,
)

FieldKind = Literal["int", "hex", "text"]


@dataclass(frozen=True)
class FieldSpec:
    """One field: its JSON kind and, for text, its length bound."""

    name: str
    kind: FieldKind
    max_chars: int = 0  # text only


# Order here is the canonical key order of written records.
FIELDS: Final = (
    FieldSpec("v", "int"),
    FieldSpec("ts_ms", "int"),
    FieldSpec("node", "hex"),
    FieldSpec("topic", "hex"),
    FieldSpec("type", "text", MAX_TYPE_CHARS),
    FieldSpec("event", "hex"),
    FieldSpec("author", "hex"),
    FieldSpec("kind", "text", MAX_KIND_CHARS),
    FieldSpec("depth", "int"),
    FieldSpec("channel", "text", len(max(CHANNELS, key=len))),
    FieldSpec("reason", "text", MAX_REASON_CHARS),
    FieldSpec("width", "int"),
    FieldSpec("buffered", "int"),
    FieldSpec("peer", "hex"),
)
FIELD_NAMES: Final = tuple(f.name for f in FIELDS)
_V, _TYPE = FIELDS[0], FIELDS[4]

COMMON_REQUIRED: Final = ("v", "ts_ms", "node", "type")
REQUIRED_BY_TYPE: Final[dict[str, tuple[str, ...]]] = {
    CREATED: ("topic", "event"),
    RECEIVED: ("topic", "event", "channel"),
    BUFFERED: ("topic", "event"),
    DELIVERED: ("topic", "event", "channel"),
    REJECTED: ("reason",),  # an undecodable message has no event id; topic or peer: below
    DUPLICATE: ("topic", "event", "channel"),
    WIDTH: ("topic", "width", "buffered"),
    DUMMY: ("topic", "event"),
    PEER_UP: ("peer",),  # connections are not per topic
    PEER_DOWN: ("peer",),
    EXCHANGE_TIMEOUT: ("topic", "peer", "reason"),
}
RECORD_TYPES: Final = tuple(REQUIRED_BY_TYPE)
REQUIRED_ONE_OF_BY_TYPE: Final[dict[str, tuple[tuple[str, ...], ...]]] = {
    # A frame that could not be decoded names no topic: the rejection is the
    # peer's (peer-level); any other rejection names its topic.
    REJECTED: (("topic", "peer"),),
}
"""Groups of fields of which a record of the type must carry at least one."""


_SPEC_BY_NAME: Final = {f.name: f for f in FIELDS}
_REQUIRED: Final = {t: COMMON_REQUIRED + fields for t, fields in REQUIRED_BY_TYPE.items()}


def required_fields(record_type: str) -> tuple[str, ...]:
    """Every field a record of `record_type` must carry (see also `required_one_of`)."""
    return _REQUIRED[record_type]


def required_one_of(record_type: str) -> tuple[tuple[str, ...], ...]:
    """Groups of fields of which a record of `record_type` must carry at least one each."""
    return REQUIRED_ONE_OF_BY_TYPE.get(record_type, ())


# --------------------------------------------------------------------------- validation


def _json_type_ok(spec: FieldSpec, value: Any) -> bool:
    if spec.kind == "int":
        # bool is an int subclass in Python but `true` is not a JSON integer.
        return type(value) is int and -MAX_INT64 - 1 <= value <= MAX_INT64
    return isinstance(value, str)


def _value_ok(spec: FieldSpec, value: Any) -> bool:
    if spec.kind == "int":
        return value >= 0
    if spec.kind == "hex":
        return is_hex_id(value)
    if spec.name == "channel":
        return value in CHANNELS
    return 0 < len(value) <= spec.max_chars


def is_hex_id(value: str) -> bool:
    """A non-empty lowercase hex string of at most MAX_HEX_ID_CHARS."""
    return _HEX_ID_RE.fullmatch(value) is not None


def validate_record(obj: object) -> str | None:
    """Why `obj` (a parsed JSON value) is not a valid v1 record, or None if it is.

    The answer is one of REASONS; the order of checks is the module docstring's.
    Every record a node logs passes here too (`JsonLinesLogWriter.write`), so it
    makes one pass over the record's own keys rather than one per rule.
    """
    if not isinstance(obj, dict):
        return NOT_OBJECT
    for spec, known in ((_V, (SCHEMA_VERSION,)), (_TYPE, RECORD_TYPES)):
        value = obj.get(spec.name)
        if value is None:
            return MISSING_FIELD
        if not _json_type_ok(spec, value):
            return WRONG_TYPE
        if value not in known:
            return BAD_VERSION if spec is _V else UNKNOWN_TYPE
    bad_value = False  # reported only after every type and presence rule held
    for name, value in obj.items():
        spec = _SPEC_BY_NAME.get(name)
        if spec is None or value is None:
            continue  # unknown keys are ignored; null equals absent
        if not _json_type_ok(spec, value):
            return WRONG_TYPE
        bad_value = bad_value or not _value_ok(spec, value)
    record_type = obj["type"]
    if any(obj.get(name) is None for name in required_fields(record_type)):
        return MISSING_FIELD
    if any(all(obj.get(name) is None for name in group) for group in required_one_of(record_type)):
        return MISSING_FIELD
    return BAD_VALUE if bad_value else None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError("duplicate key")
    return result


def parse_line(line: str) -> tuple[dict[str, Any] | None, str | None]:
    """Parse and validate one log line: (record, None) or (None, reason)."""
    if len(line.rstrip("\r\n")) > MAX_LINE_CHARS:
        return None, TOO_LONG
    try:
        obj = json.loads(
            line, parse_constant=_reject_constant, object_pairs_hook=_reject_duplicate_keys
        )
    except ValueError:  # JSONDecodeError is a ValueError
        return None, BAD_JSON
    reason = validate_record(obj)
    return (obj, None) if reason is None else (None, reason)


# --------------------------------------------------------------------------- building


def make_record(
    record_type: str,
    *,
    ts_ms: int,
    node: str,
    topic: str | None = None,
    event: str | None = None,
    author: str | None = None,
    kind: str | None = None,
    depth: int | None = None,
    channel: str | None = None,
    reason: str | None = None,
    width: int | None = None,
    buffered: int | None = None,
    peer: str | None = None,
) -> dict[str, Any]:
    """A valid v1 record as a dict (absent fields omitted); ValueError if invalid.

    A rejection reason longer than MAX_REASON_CHARS is cut rather than refused:
    reasons often embed remote input, and the record must still be written.
    """
    if reason is not None:
        reason = reason[:MAX_REASON_CHARS]
    values = {
        "v": SCHEMA_VERSION, "ts_ms": ts_ms, "node": node, "topic": topic, "type": record_type,
        "event": event, "author": author, "kind": kind, "depth": depth, "channel": channel,
        "reason": reason, "width": width, "buffered": buffered, "peer": peer,
    }
    record = {name: values[name] for name in FIELD_NAMES if values[name] is not None}
    problem = validate_record(record)
    if problem is not None:
        raise ValueError(f"invalid {record_type!r} log record ({problem}): {record!r}")
    return record


def encode_record(record: dict[str, Any]) -> bytes:
    """One line of the log: compact ASCII JSON plus newline (so chars == bytes)."""
    return (_ENCODE(record) + "\n").encode("ascii")


# `json.dumps` with arguments builds an encoder per call: a third of a record's cost.
_ENCODE: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode


# --------------------------------------------------------------------------- Spark


def spark_schema() -> StructType:
    """The Spark schema of a loaded record set (column order = FIELDS)."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    spark_type = {"int": LongType(), "hex": StringType(), "text": StringType()}
    return StructType([StructField(f.name, spark_type[f.kind], nullable=True) for f in FIELDS])


# --------------------------------------------------------------------------- writing

DEFAULT_MAX_BYTES: Final = 64 * 1024 * 1024  # per segment file
DEFAULT_MAX_FILES: Final = 16  # segments kept per node: at most 1 GiB of logs by default
MIN_MAX_BYTES: Final = MAX_LINE_CHARS  # a segment must hold the longest line
SEGMENT_SUFFIX: Final = ".jsonl"
_SEGMENT_DIGITS: Final = 6


class JsonLinesLogWriter:
    """Append records of one node to size-rotated JSON-lines segment files.

    Segments are `<directory>/<node>.<seq>.jsonl` with seq rising from 0. A new
    writer always starts a fresh segment after the highest existing one instead
    of appending: if the previous process died mid-line, appending would glue a
    new record onto the torn one and lose both. When a segment would exceed
    `max_bytes` the writer moves to the next; when more than `max_files`
    segments exist, the oldest are deleted (the bound on disk use).

    Every `write` flushes to the OS, so a crash of the process loses nothing
    already written and the logs can be read while the node runs; a node
    flushes once per step instead (`write(..., flush=False)`, then `flush`:
    a crash loses at most the step being logged, whose events its store holds
    whole or not at all). Not thread-safe: one writer per node, used by one
    thread.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        node_id_hex: str,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_files: int = DEFAULT_MAX_FILES,
    ) -> None:
        if not is_hex_id(node_id_hex):
            raise ValueError(f"node id must be lowercase hex, got {node_id_hex!r}")
        if max_bytes < MIN_MAX_BYTES:
            raise ValueError(f"max_bytes must be >= {MIN_MAX_BYTES}, got {max_bytes}")
        if max_files < 1:
            raise ValueError(f"max_files must be >= 1, got {max_files}")
        self._directory = os.fspath(directory)
        self._node = node_id_hex
        self._max_bytes = max_bytes
        self._max_files = max_files
        os.makedirs(self._directory, exist_ok=True)
        existing = self._segments()
        self._seq = existing[-1] + 1 if existing else 0
        self._file: Any = None  # opened on first write: a silent node leaves no empty file
        self._size = 0
        self._closed = False

    @property
    def path(self) -> str:
        """The segment the next record goes to (it may not exist yet)."""
        return self._segment_path(self._seq)

    def write(self, record: dict[str, Any], *, flush: bool = True) -> None:
        """Append one record; ValueError if it is invalid or belongs to another node.

        `flush=False` leaves the line in the file's buffer until the next `flush`
        (or a write that flushes): a node writes a step's records and flushes once.
        """
        if self._closed:
            raise ValueError("write to a closed JsonLinesLogWriter")
        problem = validate_record(record)
        if problem is not None:
            raise ValueError(f"invalid log record ({problem}): {record!r}")
        if record["node"] != self._node:
            raise ValueError(f"record of node {record['node']} given to the writer of {self._node}")
        line = encode_record(record)
        if len(line) - 1 > MAX_LINE_CHARS:
            raise ValueError(f"log record longer than {MAX_LINE_CHARS} characters")
        if self._file is not None and self._size + len(line) > self._max_bytes:
            self._file.close()
            self._file = None
            self._seq += 1
        if self._file is None:
            self._open_segment()
        self._file.write(line)
        if flush:
            self._file.flush()
        self._size += len(line)

    def flush(self) -> None:
        """Hand the buffered lines to the OS (`write(..., flush=False)`)."""
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Flush and close; idempotent."""
        self._closed = True
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> JsonLinesLogWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _open_segment(self) -> None:
        self._file = open(self._segment_path(self._seq), "ab")  # noqa: SIM115 - lives across calls
        self._size = self._file.tell()
        # Keep max_files segments including this one; older ones go.
        for seq in self._segments()[: -self._max_files]:
            os.unlink(self._segment_path(seq))

    def _segment_path(self, seq: int) -> str:
        name = f"{self._node}.{seq:0{_SEGMENT_DIGITS}d}{SEGMENT_SUFFIX}"
        return os.path.join(self._directory, name)

    def _segments(self) -> list[int]:
        """Sequence numbers of this node's segments on disk, ascending."""
        prefix = self._node + "."
        seqs = []
        for name in os.listdir(self._directory):
            middle = name[len(prefix) : -len(SEGMENT_SUFFIX)]
            if name.startswith(prefix) and name.endswith(SEGMENT_SUFFIX) and middle.isdigit():
                seqs.append(int(middle))
        return sorted(seqs)
