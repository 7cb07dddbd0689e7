"""Events: the vertices of the Matrix Event Graph, and their one canonical encoding.

An event is a signed, content-addressed record. On the wire and on disk it is a
msgpack array (never a map, so field order is fixed)::

    [version, topic, author, seq, parents, auth, timestamp_ms, kind, state_key,
     payload, signature]

The payload is signed and hashed through its digest (BLAKE2b-256), not its
bytes: the signature is ed25519 over `SIGNING_DOMAIN || packb(the first nine
fields + digest)`, and the event id is BLAKE2b-256 of the event's *withheld
form*, the same array with the payload replaced by `ExtType(WITHHELD_EXT,
digest)`. So a node may pass on an event without its payload (a topic whose
history a new member may not read, issue 15: `docs/access.md`), and the
receiver still checks the id, the signature and the whole graph structure;
only the content is missing. That is how Matrix keeps redacted events
verifiable (its content hash). State events are never withheld: their content
is the topic state everyone must resolve. The domain separation keeps a
megnode signature from ever being valid for another protocol that signs
msgpack with the same key. Every node recomputes ids rather than trusting
them, and two events with the same id carry the same payload (the digest).

There is exactly one valid encoding per event: decoding and re-encoding must
give back the same bytes (`decode_event` checks this), so a relay cannot mint
new ids for an existing event by re-encoding it.

The topic's create event is the root vertex: it has no parents, its `topic`
field is empty and its id becomes the topic id. Every other event names the
topic it belongs to.

State events (topic state: membership, power levels, metadata) are events
whose `state_key` is not None; their `kind` is the Matrix event type
(`m.room.member`, ...) and their payload is the msgpack map of the content.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Any

import msgpack

from node.core.fastinit import fast_init
from node.core.outcomes import RejectReason

EVENT_VERSION = 2  # 2: payloads signed and hashed by digest, so they can be withheld
SIGNING_DOMAIN = b"megnode/event/v2\x00"

ID_BYTES = 32
DIGEST_BYTES = 32
WITHHELD_EXT = 1  # msgpack ext type of a withheld payload: the ext's data is its digest
KEY_BYTES = 32
SIGNATURE_BYTES = 64

MAX_EVENT_BYTES = 64 * 1024
# What an event's fields other than its payload take at most, encoded: MAX_PARENTS
# and MAX_AUTH_REFS ids, a MAX_KIND_BYTES kind, a MAX_STATE_KEY_BYTES state key, the
# author, topic, signature and integers with their msgpack headers add up to 1,506
# bytes (tests/core/test_event.py builds that worst case); rounded up to 2 KiB. (A
# dummy may name MAX_DUMMY_PARENTS, 1,496 bytes more: dummies carry no payload.)
EVENT_OVERHEAD_BYTES = 2 * 1024
# The largest payload a local publish accepts, whatever the topic's d_max: 63,488
# bytes (62 KiB). Publishing more is refused before anything is signed.
MAX_PAYLOAD_BYTES = MAX_EVENT_BYTES - EVENT_OVERHEAD_BYTES
MAX_PARENTS = 20
# A dummy event (KIND_DUMMY) may name this many: it has no payload and no purpose but
# merging extremities, and each one merges MAX_DUMMY_PARENTS - 1 of them. Held to
# MAX_PARENTS, a join storm of 1000 members needed 53 dummies at once and the
# simulated 600-node world's width stayed over its bound for seconds; at 64, 16 do
# (docs/anti-entropy.md, "Wider dummies"). 64 ids are 2.2 KB encoded.
MAX_DUMMY_PARENTS = 64
MAX_AUTH_REFS = 10
MAX_STATE_KEY_BYTES = 255
MAX_KIND_BYTES = 64
MAX_SEQ = (1 << 63) - 1
MAX_TIMESTAMP_MS = (1 << 63) - 1

FIELD_COUNT = 11

# One Packer for the hot paths (signing, the canonical-form check, store
# records): `msgpack.packb` builds a Packer and its buffer on every call,
# which cost twice the packing itself. `pack` runs in C under the GIL and
# calls back into Python only through a `default` hook, which this one has
# not, so sharing it between graphs (or threads) is safe.
_PACKER = msgpack.Packer(use_bin_type=True)
pack = _PACKER.pack

# Kinds with a meaning to the core. Any other kind is application-defined.
KIND_CREATE = "m.room.create"
KIND_MESSAGE = "message"
KIND_DUMMY = "dummy"


class EventFormatError(ValueError):
    """Bytes that are not one canonical megnode event; `reason` names what is wrong."""

    def __init__(self, reason: RejectReason, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else str(reason))
        self.reason = reason
        self.detail = detail


@fast_init
@dataclass(frozen=True, slots=True)
class Event:
    """A decoded, self-consistent event. `raw` is its canonical encoding, `id` its hash.

    Construct with `sign_event` (local authors) or `decode_event` (bytes from
    outside); both guarantee `id == event_id_of(raw)`. Signature validity is
    checked separately (`verify_signature`) because it is the expensive part.
    """

    version: int
    topic: bytes
    author: bytes
    seq: int
    parents: tuple[bytes, ...]
    auth: tuple[bytes, ...]
    timestamp_ms: int
    kind: str
    state_key: str | None
    payload: bytes  # b"" when withheld
    signature: bytes
    raw: bytes  # the full encoding, or the withheld form if `withheld`
    id: bytes
    digest: bytes  # BLAKE2b-256 of the payload
    withheld: bool = False  # the payload is not here, only its digest (module docstring)

    @property
    def is_create(self) -> bool:
        return self.kind == KIND_CREATE and not self.parents

    @property
    def is_state(self) -> bool:
        return self.state_key is not None

    def topic_id(self) -> bytes:
        """The topic this event belongs to (for the create event: its own id)."""
        return self.id if self.is_create else self.topic

    def content(self) -> Any:
        """The payload decoded as msgpack (state events carry a map here)."""
        return unpack_payload(self.payload)

    def signing_body(self) -> bytes:
        """What the author signed: the domain and the body with the payload's digest."""
        return SIGNING_DOMAIN + _digest_body(self.raw, payload_element_start(self), self.digest)

    def withheld_form(self) -> bytes:
        """This event's bytes without the payload (what its id hashes)."""
        return self.raw if self.withheld else _withheld_form(self.raw, len(self.payload),
                                                              self.digest)

    def __repr__(self) -> str:  # ids in hex: readable test failures and logs
        return (
            f"Event(id={self.id.hex()[:12]}, kind={self.kind!r}, author={self.author.hex()[:8]}, "
            f"seq={self.seq}, parents={[p.hex()[:8] for p in self.parents]})"
        )


def payload_digest(payload: bytes) -> bytes:
    return _blake2b(payload, digest_size=DIGEST_BYTES).digest()


_blake2b = hashlib.blake2b


# Ids of the last raw events named, by their bytes. A pushed event is named
# five times within its frame's handling (the push, the intake, the tree's
# receipt, its spread and its holders); each naming parsed and hashed it again,
# about 2 % of a loaded daemon's time. A catch-up page of 1,024 events is named
# page by page (the next page's offer, the common heads, the intake): with a memo
# of 64 every pass named each event afresh, 6.8 % of a 50k catch-up's CPU
# (py-spy). Two pages fit: the one applied and the one asked ahead of it.
EVENT_ID_MEMO_SIZE = 2_048
# Only encodings up to this size go in that memo, so it holds at most
# EVENT_ID_MEMO_SIZE * EVENT_ID_MEMO_MAX_BYTES = 8 MiB of raws alive; larger ones
# go in a memo of EVENT_ID_LARGE_MEMO_SIZE (the old size: a frame's worth), at
# most 4 MiB more (MAX_EVENT_BYTES each).
EVENT_ID_MEMO_MAX_BYTES = 4_096
EVENT_ID_LARGE_MEMO_SIZE = 64


def event_id_of(raw: bytes) -> bytes:
    """The id of the event encoded (fully or withheld) by `raw`.

    Total: bytes from anywhere get a name (the duplicate check runs before the
    decoder); bytes that are no event get their plain hash, and decoding refuses
    them anyway. Parses the bytes to find the payload; the decoder and the
    store compute ids from fields they already hold (`full_event_id`).
    """
    if type(raw) is bytes:  # (a bytes object keeps its hash once computed)
        if len(raw) <= EVENT_ID_MEMO_MAX_BYTES:
            return _memo_event_id(raw)
        return _memo_large_event_id(raw)
    return _event_id(raw)


def claimed_parents(raw: bytes) -> list[bytes] | None:
    """The parent ids an encoding names, not validated; None if it is no event's shape.

    For planning only (a catch-up's next offer, `transport.anti_entropy`):
    nothing is trusted from it. A full decode of each event of a page there
    cost 4% of a catch-up's CPU, and the intake decodes the page again anyway.
    """
    try:
        fields = _unpackb(raw)
    except Exception:  # msgpack raises many types for malformed input
        return None
    if type(fields) is not list or len(fields) != FIELD_COUNT or type(fields[4]) is not list:
        return None
    parents = fields[4]
    return parents if all(type(p) is bytes for p in parents) else None


def _event_id(raw: bytes) -> bytes:
    try:
        payload = _unpackb(raw)[9]
    except Exception:  # not an event at all: a name for the bytes, which decoding refuses
        payload = None
    if type(payload) is bytes:
        start = _payload_start(raw, len(payload))
        if start > 0:
            return _blake2b(raw[:start] + _WITHHELD_HEADER
                            + _blake2b(payload, digest_size=DIGEST_BYTES).digest()
                            + raw[-_SIGNATURE_TAIL:], digest_size=ID_BYTES).digest()
    return _blake2b(raw, digest_size=ID_BYTES).digest()


_memo_event_id = functools.lru_cache(maxsize=EVENT_ID_MEMO_SIZE)(_event_id)
_memo_large_event_id = functools.lru_cache(maxsize=EVENT_ID_LARGE_MEMO_SIZE)(_event_id)
_unpackb = msgpack.unpackb


# Byte surgery on the canonical encoding: the payload is the tenth element and the
# 64-byte signature (0xc4 0x40 + bytes) the eleventh and last, so the payload's
# element starts `_SIGNATURE_TAIL + its packed length` bytes before the end.
def _bin_header_bytes(length: int) -> int:
    return 2 if length < 0x100 else 3 if length < 0x10000 else 5


def _payload_start(raw: bytes, payload_length: int) -> int:
    return len(raw) - _SIGNATURE_TAIL - _bin_header_bytes(payload_length) - payload_length


_WITHHELD_HEADER = bytes([0xC7, DIGEST_BYTES, WITHHELD_EXT])  # ext 8 of 32 bytes
_WITHHELD_TAIL = len(_WITHHELD_HEADER) + DIGEST_BYTES
_DIGEST_BIN = bytes([0xC4, DIGEST_BYTES])


def _withheld_form(raw: bytes, payload_length: int, digest: bytes) -> bytes:
    start = _payload_start(raw, payload_length)
    return raw[:start] + _WITHHELD_HEADER + digest + raw[-_SIGNATURE_TAIL:]


def is_withheld_form(raw: bytes) -> bool:
    """Does `raw` encode an event in its withheld form? (A cheap test first: the ext
    header where the digest would start; a decode confirms, so a payload that happens
    to hold those bytes there is not mistaken for one.)"""
    at = len(raw) - _SIGNATURE_TAIL - _WITHHELD_TAIL
    if at <= 0 or raw[at:at + len(_WITHHELD_HEADER)] != _WITHHELD_HEADER:
        return False
    try:
        return decode_event(raw).withheld
    except EventFormatError:
        return False


def full_event_id(raw: bytes, payload_length: int, digest: bytes) -> bytes:
    """BLAKE2b-256 of the withheld form of a full encoding (`_withheld_form`, inline)."""
    return _blake2b(raw[:_payload_start(raw, payload_length)] + _WITHHELD_HEADER + digest
                    + raw[-_SIGNATURE_TAIL:], digest_size=ID_BYTES).digest()


def _digest_body(raw: bytes, start: int, digest: bytes) -> bytes:
    """The packed ten-field signed body (payload -> digest) of an encoding whose
    payload element (or withheld ext) starts at `start`."""
    return bytes([_BODY_HEADER]) + raw[1:start] + _DIGEST_BIN + digest


def payload_element_start(event: "Event") -> int:
    """Where the payload's element (or its withheld ext) starts in `event.raw`."""
    if event.withheld:
        return len(event.raw) - _SIGNATURE_TAIL - _WITHHELD_TAIL
    return _payload_start(event.raw, len(event.payload))


def _body_fields(
    version: int, topic: bytes, author: bytes, seq: int, parents: tuple[bytes, ...],
    auth: tuple[bytes, ...], timestamp_ms: int, kind: str, state_key: str | None, payload: bytes,
) -> list[Any]:
    return [version, topic, author, seq, list(parents), list(auth), timestamp_ms, kind,
            state_key, payload]


def signing_body(
    version: int, topic: bytes, author: bytes, seq: int, parents: tuple[bytes, ...],
    auth: tuple[bytes, ...], timestamp_ms: int, kind: str, state_key: str | None, payload: bytes,
) -> bytes:
    """What the author signs: the domain and the ten-field body, the payload by its digest."""
    fields = _body_fields(version, topic, author, seq, parents, auth, timestamp_ms, kind,
                          state_key, payload_digest(payload))
    return SIGNING_DOMAIN + msgpack.packb(fields, use_bin_type=True)


def signing_message(packed_body: bytes, payload: bytes) -> tuple[bytes, bytes]:
    """(what to sign, the payload's digest) for a packed ten-field body that holds `payload`."""
    digest = payload_digest(payload)
    start = len(packed_body) - _bin_header_bytes(len(payload)) - len(payload)
    return SIGNING_DOMAIN + packed_body[:start] + _DIGEST_BIN + digest, digest


# The canonical encoding is an array of ten body fields plus the signature. msgpack
# writes an array of up to 15 elements as one header byte (0x90 | n) followed by
# the elements, and a 64-byte bin as 0xc4 0x40 + bytes, so the signed encoding is
# the packed body with its header bumped from 10 to 11 and the signature appended.
_BODY_HEADER = 0x90 | (FIELD_COUNT - 1)
_SIGNED_HEADER = bytes([0x90 | FIELD_COUNT])
_SIGNATURE_PREFIX = bytes([0xC4, SIGNATURE_BYTES])
_SIGNATURE_TAIL = len(_SIGNATURE_PREFIX) + SIGNATURE_BYTES


def signed_encoding(packed_body: bytes, signature: bytes) -> bytes:
    """The event's bytes from its packed ten-field body and signature."""
    assert packed_body[0] == _BODY_HEADER and len(signature) == SIGNATURE_BYTES
    return _SIGNED_HEADER + packed_body[1:] + _SIGNATURE_PREFIX + signature


def body_of_signed(raw: bytes) -> bytes:
    """The packed ten-field body inside a canonical event encoding (inverse of the above)."""
    return bytes([_BODY_HEADER]) + raw[1:-_SIGNATURE_TAIL]


def pack_payload(content: Any) -> bytes:
    """Canonical msgpack for application content (maps are sorted by key)."""
    return msgpack.packb(_canonical(content), use_bin_type=True)


def unpack_payload(payload: bytes) -> Any:
    return msgpack.unpackb(payload, raw=False, strict_map_key=False)


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _canonical(value[k]) for k in sorted(value, key=_sort_key)}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def _sort_key(key: Any) -> tuple[str, Any]:
    return (type(key).__name__, key)


def _unpack_strict(raw: bytes) -> Any:
    # Bounded decoding: nothing inside an event can be larger than the event.
    return msgpack.unpackb(
        raw,
        raw=False,
        use_list=True,
        strict_map_key=True,
        max_bin_len=MAX_EVENT_BYTES,
        max_str_len=MAX_EVENT_BYTES,
        max_array_len=MAX_EVENT_BYTES,
        max_map_len=MAX_EVENT_BYTES,
        max_ext_len=DIGEST_BYTES,
    )


def _expect(condition: bool, reason: RejectReason, detail: str = "") -> None:
    if not condition:
        raise EventFormatError(reason, detail)


def _is_id(value: Any) -> bool:
    return isinstance(value, bytes) and len(value) == ID_BYTES


def make_event(
    version: int, topic: bytes, author: bytes, seq: int, parents: tuple[bytes, ...],
    auth: tuple[bytes, ...], timestamp_ms: int, kind: str, state_key: str | None,
    payload: bytes, signature: bytes, raw: bytes, id: bytes, digest: bytes,
    withheld: bool = False,
) -> Event:
    """`Event(...)` for the hot paths (signing, decoding, reading the store back).

    A frozen dataclass's `__init__` sets each field through
    `object.__setattr__`, which made building an event cost more than hashing
    it; setting the slots through their descriptors gives the same immutable
    object at about half the cost. Callers guarantee `id == event_id_of(raw)` and
    `digest == payload_digest(payload)` (unless withheld).
    """
    event = _new_object(Event)
    _set_version(event, version)
    _set_topic(event, topic)
    _set_author(event, author)
    _set_seq(event, seq)
    _set_parents(event, parents)
    _set_auth(event, auth)
    _set_timestamp_ms(event, timestamp_ms)
    _set_kind(event, kind)
    _set_state_key(event, state_key)
    _set_payload(event, payload)
    _set_signature(event, signature)
    _set_raw(event, raw)
    _set_id(event, id)
    _set_digest(event, digest)
    _set_withheld(event, withheld)
    return event


_new_object = object.__new__
_set_version = Event.version.__set__  # type: ignore[attr-defined]
_set_topic = Event.topic.__set__  # type: ignore[attr-defined]
_set_author = Event.author.__set__  # type: ignore[attr-defined]
_set_seq = Event.seq.__set__  # type: ignore[attr-defined]
_set_parents = Event.parents.__set__  # type: ignore[attr-defined]
_set_auth = Event.auth.__set__  # type: ignore[attr-defined]
_set_timestamp_ms = Event.timestamp_ms.__set__  # type: ignore[attr-defined]
_set_kind = Event.kind.__set__  # type: ignore[attr-defined]
_set_state_key = Event.state_key.__set__  # type: ignore[attr-defined]
_set_payload = Event.payload.__set__  # type: ignore[attr-defined]
_set_signature = Event.signature.__set__  # type: ignore[attr-defined]
_set_raw = Event.raw.__set__  # type: ignore[attr-defined]
_set_id = Event.id.__set__  # type: ignore[attr-defined]
_set_digest = Event.digest.__set__  # type: ignore[attr-defined]
_set_withheld = Event.withheld.__set__  # type: ignore[attr-defined]


def decode_event(raw: bytes) -> Event:
    """Parse and structurally validate one event; raise EventFormatError with a reason.

    Checks everything that needs no other event and no cryptography: size,
    msgpack well-formedness, canonical encoding, field types and limits.
    Signature, parents' existence and topic membership are the Reference
    Monitor's job.

    Every event from the network passes here, so the common case (a
    non-create event with ASCII kind and state key) is recognised by one
    expression (`_plainly_valid`); anything else goes through the checks one
    by one (`_check_fields`), which name the reason. The fast test only ever
    accepts what the detailed checks accept.
    """
    # `if ...: raise` rather than `_expect`: its detail strings would be built
    # for every valid event too.
    if type(raw) is not bytes:
        _expect(isinstance(raw, (bytes, bytearray)), RejectReason.NOT_BYTES)
        raw = bytes(raw)
    if len(raw) > MAX_EVENT_BYTES:
        raise EventFormatError(RejectReason.TOO_LARGE, f"{len(raw)} > {MAX_EVENT_BYTES} bytes")
    try:
        fields = _unpack_strict(raw)
    except Exception as exc:  # msgpack raises many types for malformed input
        raise EventFormatError(RejectReason.NOT_MSGPACK, type(exc).__name__) from None
    if type(fields) is not list or len(fields) != FIELD_COUNT:
        raise EventFormatError(RejectReason.BAD_SHAPE, f"expected an array of {FIELD_COUNT} fields")
    if not _plainly_valid(*fields):
        _check_fields(*fields)
    # One encoding per event: re-encoding what we decoded must give the same bytes.
    if pack(fields) != raw:
        raise EventFormatError(RejectReason.NOT_CANONICAL, "re-encoding differs")
    (version, topic, author, seq, parents, auth, timestamp_ms, kind, state_key, payload,
     signature) = fields
    return _built(version, topic, author, seq, parents, auth, timestamp_ms, kind, state_key,
                  payload, signature, raw)


def _built(version: int, topic: bytes, author: bytes, seq: int, parents: list[bytes],
           auth: list[bytes], timestamp_ms: int, kind: str, state_key: str | None,
           payload: bytes | msgpack.ExtType, signature: bytes, raw: bytes) -> Event:
    """The Event of checked fields: a full encoding, or the withheld form (payload an ExtType)."""
    if type(payload) is bytes:
        digest = payload_digest(payload)
        return make_event(
            version, topic, author, seq, tuple(parents), tuple(auth), timestamp_ms, kind,
            state_key, payload, signature, raw, full_event_id(raw, len(payload), digest), digest)
    return make_event(
        version, topic, author, seq, tuple(parents), tuple(auth), timestamp_ms, kind, state_key,
        b"", signature, raw, _blake2b(raw, digest_size=ID_BYTES).digest(), payload.data, True)


def max_parents_of(kind: str) -> int:
    """How many parents an event of `kind` may name: MAX_PARENTS, MAX_DUMMY_PARENTS for a dummy."""
    return MAX_DUMMY_PARENTS if kind == KIND_DUMMY else MAX_PARENTS


def _is_id_fast(value: Any) -> bool:
    return type(value) is bytes and len(value) == ID_BYTES


def _plainly_valid(
    version: Any, topic: Any, author: Any, seq: Any, parents: Any, auth: Any,
    timestamp_ms: Any, kind: Any, state_key: Any, payload: Any, signature: Any,
) -> bool:
    """True for a well-formed non-create event whose strings are ASCII.

    Stricter than `_check_fields` (exact types, ASCII only, parents present, at most
    MAX_PARENTS of them whatever the kind: a wider dummy takes the slow path), never
    looser: ASCII strings have as many bytes as characters, and
    `sorted(set(x)) == x` holds exactly for a sorted list without duplicates.
    """
    return (
        type(version) is int and version == EVENT_VERSION
        and type(topic) is bytes and len(topic) == ID_BYTES
        and type(author) is bytes and len(author) == KEY_BYTES
        and type(seq) is int and 0 <= seq <= MAX_SEQ
        and type(parents) is list and 0 < len(parents) <= MAX_PARENTS
        and all(map(_is_id_fast, parents)) and sorted(set(parents)) == parents
        and type(auth) is list and len(auth) <= MAX_AUTH_REFS
        and all(map(_is_id_fast, auth)) and sorted(set(auth)) == auth
        and type(timestamp_ms) is int and 0 <= timestamp_ms <= MAX_TIMESTAMP_MS
        and type(kind) is str and kind.isascii() and 0 < len(kind) <= MAX_KIND_BYTES
        and (state_key is None or (type(state_key) is str and state_key.isascii()
                                   and len(state_key) <= MAX_STATE_KEY_BYTES))
        and type(payload) is bytes
        and type(signature) is bytes and len(signature) == SIGNATURE_BYTES
    )


def _check_fields(
    version: Any, topic: Any, author: Any, seq: Any, parents: Any, auth: Any,
    timestamp_ms: Any, kind: Any, state_key: Any, payload: Any, signature: Any,
) -> None:
    """Every structural rule, one at a time; raises EventFormatError naming the first broken."""
    _expect(type(version) is int, RejectReason.BAD_FIELD, "version")
    _expect(version == EVENT_VERSION, RejectReason.UNKNOWN_VERSION, str(version))
    _expect(isinstance(topic, bytes) and len(topic) in (0, ID_BYTES),
            RejectReason.BAD_FIELD, "topic")
    _expect(isinstance(author, bytes) and len(author) == KEY_BYTES,
            RejectReason.BAD_FIELD, "author")
    _expect(type(seq) is int and 0 <= seq <= MAX_SEQ, RejectReason.BAD_FIELD, "seq")
    _expect(isinstance(parents, list) and all(_is_id(p) for p in parents),
            RejectReason.BAD_FIELD, "parents")
    _expect(isinstance(auth, list) and all(_is_id(a) for a in auth), RejectReason.BAD_FIELD, "auth")
    _expect(type(timestamp_ms) is int and 0 <= timestamp_ms <= MAX_TIMESTAMP_MS,
            RejectReason.BAD_FIELD, "timestamp_ms")
    _expect(isinstance(kind, str) and 0 < len(kind.encode()) <= MAX_KIND_BYTES,
            RejectReason.BAD_FIELD, "kind")
    _expect(state_key is None or isinstance(state_key, str), RejectReason.BAD_FIELD, "state_key")
    _expect(isinstance(payload, bytes) or (
        isinstance(payload, msgpack.ExtType) and payload.code == WITHHELD_EXT
        and len(payload.data) == DIGEST_BYTES), RejectReason.BAD_FIELD, "payload")
    _expect(isinstance(signature, bytes) and len(signature) == SIGNATURE_BYTES,
            RejectReason.BAD_FIELD, "signature")
    if state_key is not None:
        _expect(len(state_key.encode()) <= MAX_STATE_KEY_BYTES, RejectReason.STATE_KEY_TOO_LONG,
                f"{len(state_key.encode())} > {MAX_STATE_KEY_BYTES} bytes")
    limit = max_parents_of(kind)
    _expect(len(parents) <= limit, RejectReason.TOO_MANY_PARENTS, f"{len(parents)} > {limit}")
    _expect(len(auth) <= MAX_AUTH_REFS,
            RejectReason.TOO_MANY_AUTH_REFS, f"{len(auth)} > {MAX_AUTH_REFS}")
    _expect(len(set(parents)) == len(parents), RejectReason.DUPLICATE_PARENTS)
    _expect(parents == sorted(parents), RejectReason.NOT_CANONICAL, "parents must be sorted")
    _expect(len(set(auth)) == len(auth), RejectReason.DUPLICATE_AUTH_REFS)
    _expect(auth == sorted(auth), RejectReason.NOT_CANONICAL, "auth refs must be sorted")
    is_create = kind == KIND_CREATE and not parents
    if not isinstance(payload, bytes):  # withheld: only content no one needs to resolve state
        _expect(state_key is None and not is_create, RejectReason.BAD_FIELD,
                "a state event's payload is never withheld")
    if is_create:
        _expect(topic == b"", RejectReason.BAD_FIELD, "a create event carries no topic")
        _expect(not auth, RejectReason.BAD_FIELD, "a create event has no auth refs")
    else:
        _expect(len(parents) > 0,
                RejectReason.NO_PARENTS, "only the create event may have no parents")
        _expect(len(topic) == ID_BYTES, RejectReason.BAD_FIELD, "topic")


def trusted_event(raw: bytes) -> Event:
    """Rebuild an Event from bytes this node already validated and stored.

    Skips the structural and canonical checks of `decode_event`: only for
    reading back our own store, never for bytes from outside.
    """
    (version, topic, author, seq, parents, auth, timestamp_ms, kind, state_key, payload,
     signature) = msgpack.unpackb(raw, raw=False)
    return _built(version, topic, author, seq, parents, auth, timestamp_ms, kind, state_key,
                  payload, signature, raw)


def check_local_event(
    raw: bytes, parents: tuple[bytes, ...], auth: tuple[bytes, ...], kind: str,
    state_key: str | None,
) -> None:
    """The limits a locally built event must meet (the full decode is for foreign bytes)."""
    if (len(raw) <= MAX_EVENT_BYTES and len(parents) <= MAX_PARENTS
            and len(auth) <= MAX_AUTH_REFS and kind.isascii() and 0 < len(kind) <= MAX_KIND_BYTES
            and (state_key is None
                 or (state_key.isascii() and len(state_key) <= MAX_STATE_KEY_BYTES))
            and (len(parents) < 2 or len(set(parents)) == len(parents))):
        return  # the common case in one test; the checks below name what is wrong
    _expect(len(raw) <= MAX_EVENT_BYTES,
            RejectReason.TOO_LARGE, f"{len(raw)} > {MAX_EVENT_BYTES} bytes")
    limit = max_parents_of(kind)
    _expect(len(parents) <= limit, RejectReason.TOO_MANY_PARENTS, f"{len(parents)} > {limit}")
    _expect(len(set(parents)) == len(parents), RejectReason.DUPLICATE_PARENTS)
    _expect(len(auth) <= MAX_AUTH_REFS,
            RejectReason.TOO_MANY_AUTH_REFS, f"{len(auth)} > {MAX_AUTH_REFS}")
    _expect(0 < len(kind.encode()) <= MAX_KIND_BYTES, RejectReason.BAD_FIELD, "kind")
    if state_key is not None:
        _expect(len(state_key.encode()) <= MAX_STATE_KEY_BYTES, RejectReason.STATE_KEY_TOO_LONG,
                f"{len(state_key.encode())} > {MAX_STATE_KEY_BYTES} bytes")
