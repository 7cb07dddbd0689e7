"""Wire messages of dissemination: gossip push, anti-entropy, backfill by id.

Theory of operation
-------------------
Every message is one msgpack array, ``[WIRE_VERSION, type tag, topic, ...]``,
so a frame names its protocol version, its kind and the topic it is about
before anything else. Five kinds move events (see `transport.dissemination` and
`transport.anti_entropy` for the protocol that uses them):

* `Push`   — new events, eagerly sent to neighbours (the gossip fast path). On
  the tree fast path, a push of events an exchange or a want brought somewhere
  (a repair passed on along the tree) goes under its own tag, so that its
  copies' ages do not count as the tree's lateness (`Push.repair`).
* `Offer`  — anti-entropy: "these are my heads; these `since` heads we had in
  common; this Bloom filter holds my events above `floor` that are not below
  `since`". The Kleppmann–Howard Algorithm 2 message, plus a depth floor.
* `Reply`  — the answer to an Offer: the responder's heads, the events the
  offerer lacks (parents first), and two flags: `more` (the answer was cut at
  the message bounds; offer again to continue) and `truncated` (the Bloom
  window was too shallow to judge; offer again with a deeper one).
* `Want`   — ask for events by id (the Algorithm 1 needs-loop: the missing
  parents of buffered events).
* `Events` — events sent outside a Reply: answers to a Want, and the
  offerer's second half of a reconciliation (what the responder lacks).

Five more carry the join handshake of a private topic
(`transport.join_handshake`): `JoinAsk` (may I join?), `JoinTemplate` (yes:
sign your join on these parents, auth refs and seq), `JoinRefused` (one
reason, `not_found`, whatever the cause, so a refusal reveals nothing),
`JoinSubmit` (my signed join; with the invite that let me join, if the members
may not hold it) and `JoinMissing` (a member to an invitee whose frames it
refused: I do not hold your join, submit it to me).

Three more carry the eager/lazy tree fast path (`transport.eager_lazy`):
`IHave` (ids of new events, announced on a lazy link), `Graft` (send me
these announced ids, and make this link eager for their authors) and
`Prune` (make this link lazy for this author: your push brought me nothing
new).

Decoding is strict and bounded: the frame size is checked before parsing,
msgpack is told the largest string/array/bin it may allocate, and every field
is type- and range-checked, and the frame must be the one encoding of its
message (re-encoded and compared). Anything wrong raises `MessageError(reason)` —
never another exception type — so the engine can count a misbehaving peer and
move on. Event bytes inside messages are only size-checked here; the
Reference Monitor validates them.

Encoding checks the same bounds and raises `ValueError`: sending a frame the
peer must reject is a local bug, not a remote fault (h11's split between
local and remote protocol errors).

The Bloom filter is salted per exchange (keyed BLAKE2b), so an attacker who
mines event ids cannot make them collide in everyone's filters (the
automerge-poison attack on unsalted filters).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Union

import msgpack

from node.core.event import ID_BYTES, MAX_AUTH_REFS, MAX_EVENT_BYTES, MAX_PARENTS, MAX_SEQ

WIRE_VERSION = 1

# Message type tags (part of the wire format: never renumber).
TAG_PUSH = 1
TAG_OFFER = 2
TAG_REPLY = 3
TAG_WANT = 4
TAG_EVENTS = 5
TAG_JOIN_ASK = 6
TAG_JOIN_TEMPLATE = 7
TAG_JOIN_REFUSED = 8
TAG_JOIN_SUBMIT = 9
TAG_IHAVE = 10
TAG_GRAFT = 11
TAG_PRUNE = 12
TAG_JOIN_MISSING = 13
TAG_REPAIR_PUSH = 14  # a Push with `repair` set
TAG_JOIN_SUBMIT_INVITED = 15  # a JoinSubmit with `invite` set

# Limits. A peer can make us allocate or loop at most this much per message.
MAX_FRAME_BYTES = 4 * 1024 * 1024  # one message; a libp2p frame or a sim packet
MAX_EVENTS_PER_MESSAGE = 1_024  # events in one Push/Reply/Events
MAX_HEADS = 512  # ids in `heads` and in `since` (wider graphs offer a subset)
MAX_WANT_IDS = 1_024  # ids in one Want
MAX_BLOOM_BYTES = 64 * 1024  # 512 Kibit: ~52k events at 10 bits each
MAX_BLOOM_HASHES = 16
BLOOM_SALT_BYTES = 16
MAX_XID = (1 << 32) - 1  # exchange ids wrap at 32 bits
MAX_DEPTH = (1 << 63) - 1
# The largest array msgpack may allocate while decoding: the longest list above.
_MAX_ARRAY = max(MAX_EVENTS_PER_MESSAGE, MAX_HEADS, MAX_WANT_IDS, 16)


class MessageError(ValueError):
    """Bytes from a peer that are not one valid message; `reason` names what is wrong.

    Reasons (stable strings for logs and counters): too_large, not_msgpack,
    bad_shape, unknown_version, unknown_type, bad_field, too_many_events,
    event_too_large, too_many_ids, bloom_too_large, not_canonical.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


# --------------------------------------------------------------------------- Bloom filter


@dataclass(frozen=True, slots=True)
class BloomFilter:
    """A salted Bloom filter over event ids (no false negatives; false positives ~1%).

    Positions come from one keyed BLAKE2b digest per id, split into two 64-bit
    halves and combined by double hashing (Kirsch–Mitzenmacher): k probes for
    the price of one hash.
    """

    salt: bytes
    hashes: int
    bits: bytes

    @classmethod
    def build(cls, ids: Sequence[bytes], salt: bytes, bits_per_item: int,
              hashes: int) -> "BloomFilter":
        """A filter of `bits_per_item` bits per id holding every id of `ids`."""
        size = max(1, math.ceil(len(ids) * bits_per_item / 8))
        if size > MAX_BLOOM_BYTES:
            raise ValueError(f"Bloom filter of {size} bytes exceeds MAX_BLOOM_BYTES")
        array = bytearray(size)
        nbits = size * 8
        for event_id in ids:
            for position in _positions(event_id, salt, hashes, nbits):
                array[position >> 3] |= 1 << (position & 7)
        return cls(salt=salt, hashes=hashes, bits=bytes(array))

    def __contains__(self, event_id: bytes) -> bool:
        bits = self.bits
        return all(bits[p >> 3] & (1 << (p & 7))
                   for p in _positions(event_id, self.salt, self.hashes, len(bits) * 8))


def _positions(event_id: bytes, salt: bytes, hashes: int, nbits: int) -> list[int]:
    digest = hashlib.blake2b(event_id, digest_size=16, key=salt).digest()
    h1 = int.from_bytes(digest[:8], "big")
    h2 = int.from_bytes(digest[8:], "big") | 1  # odd: probes never collapse onto one bit
    return [(h1 + i * h2) % nbits for i in range(hashes)]


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class Push:
    """Events for the receiver to take in and pass on.

    `repair`: they are a repair passed on along the tree (an exchange or a want
    brought them to some node), not the tree's own flow; as old as the loss or
    partition they repair, so their ages say nothing of the hops
    (`transport.tree_lateness`). Its receiver passes them on marked too.
    """

    topic: bytes
    events: tuple[bytes, ...]
    repair: bool = False


@dataclass(frozen=True, slots=True)
class Offer:
    """Anti-entropy opener: my heads, our common heads, a filter of my recent events.

    The filter holds exactly the sender's events that are not below `since`
    and whose depth is >= `floor`. `final` says the sender cannot widen the
    window any further (the filter hit its size bound): the responder should
    then send what it cannot judge instead of asking for a deeper window.
    """

    topic: bytes
    xid: int
    heads: tuple[bytes, ...]
    since: tuple[bytes, ...]
    floor: int
    final: bool
    bloom: BloomFilter


@dataclass(frozen=True, slots=True)
class Reply:
    topic: bytes
    xid: int
    heads: tuple[bytes, ...]
    truncated: bool
    more: bool
    events: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Want:
    topic: bytes
    ids: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Events:
    """Events outside a Reply; `more` asks the receiver to offer again to continue."""

    topic: bytes
    xid: int
    more: bool
    events: tuple[bytes, ...]


class JoinRefusal(StrEnum):
    """Why a join was refused; one value on purpose (module docstring)."""

    NOT_FOUND = "not_found"  # unknown topic, not a member myself, or you may not join


@dataclass(frozen=True, slots=True)
class JoinAsk:
    """A would-be member asks a peer for the terms of its join."""

    topic: bytes


@dataclass(frozen=True, slots=True)
class JoinTemplate:
    """The terms on which the asker may join: sign a join with these (node.replica.joining)."""

    topic: bytes
    parents: tuple[bytes, ...]
    auth: tuple[bytes, ...]
    seq: int


@dataclass(frozen=True, slots=True)
class JoinRefused:
    topic: bytes
    reason: JoinRefusal = JoinRefusal.NOT_FOUND


@dataclass(frozen=True, slots=True)
class JoinSubmit:
    """The asker's signed join, for the member to receive like any event; `invite`, if
    not empty, the member-signed invite that let it join (for members that may not
    know the joiner at all: transport.join_handshake, "A sponsor that also invited")."""

    topic: bytes
    raw: bytes
    invite: bytes = b""


@dataclass(frozen=True, slots=True)
class JoinMissing:
    """A member to a peer it counts as only invited, whose frames it refused: I do not
    hold your join (its sponsor never passed it on), submit it to me."""

    topic: bytes


@dataclass(frozen=True, slots=True)
class IHave:
    """Ids of events new at the sender, announced on a lazy link (transport.eager_lazy)."""

    topic: bytes
    ids: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Graft:
    """You are my parent in the topic's tree (push me its events), and push me these
    announced ids (none: only that)."""

    topic: bytes
    ids: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Prune:
    """I am not your child in the topic's tree: push me nothing unless you are mine
    (`source`: the root I follow, for diagnostics)."""

    topic: bytes
    source: bytes  # an author key

Message = Union[Push, Offer, Reply, Want, Events, JoinAsk, JoinTemplate, JoinRefused, JoinSubmit,
                JoinMissing, IHave, Graft, Prune]


# --------------------------------------------------------------------------- encoding


def _check_ids(ids: tuple[bytes, ...], limit: int, what: str) -> list[bytes]:
    if len(ids) > limit:
        raise ValueError(f"{len(ids)} {what} exceed the limit of {limit}")
    if any(len(i) != ID_BYTES for i in ids):
        raise ValueError(f"{what} must be {ID_BYTES}-byte ids")
    return list(ids)


def _check_events(events: tuple[bytes, ...]) -> list[bytes]:
    if len(events) > MAX_EVENTS_PER_MESSAGE:
        raise ValueError(f"{len(events)} events exceed MAX_EVENTS_PER_MESSAGE")
    if any(len(e) > MAX_EVENT_BYTES for e in events):
        raise ValueError("an event exceeds MAX_EVENT_BYTES")
    return list(events)


def encode(message: Message) -> bytes:
    """The frame for `message`; ValueError if it breaks a bound the peer enforces."""
    head: list[Any] = [WIRE_VERSION]
    if isinstance(message, Push):
        body = head + [TAG_REPAIR_PUSH if message.repair else TAG_PUSH, message.topic,
                       _check_events(message.events)]
    elif isinstance(message, Offer):
        bloom = message.bloom
        if len(bloom.bits) > MAX_BLOOM_BYTES or not 1 <= bloom.hashes <= MAX_BLOOM_HASHES:
            raise ValueError("Bloom filter out of bounds")
        body = head + [TAG_OFFER, message.topic, message.xid,
                       _check_ids(message.heads, MAX_HEADS, "heads"),
                       _check_ids(message.since, MAX_HEADS, "since ids"),
                       message.floor, message.final, [bloom.salt, bloom.hashes, bloom.bits]]
    elif isinstance(message, Reply):
        body = head + [TAG_REPLY, message.topic, message.xid,
                       _check_ids(message.heads, MAX_HEADS, "heads"), message.truncated,
                       message.more, _check_events(message.events)]
    elif isinstance(message, Want):
        body = head + [TAG_WANT, message.topic, _check_ids(message.ids, MAX_WANT_IDS, "wanted ids")]
    elif isinstance(message, Events):
        body = head + [TAG_EVENTS, message.topic, message.xid, message.more,
                       _check_events(message.events)]
    elif isinstance(message, JoinAsk):
        body = head + [TAG_JOIN_ASK, message.topic]
    elif isinstance(message, JoinTemplate):
        if not 1 <= len(message.parents) <= MAX_PARENTS or not 0 <= message.seq <= MAX_SEQ:
            raise ValueError("join template out of bounds")
        body = head + [TAG_JOIN_TEMPLATE, message.topic,
                       _check_ids(message.parents, MAX_PARENTS, "parents"),
                       _check_ids(message.auth, MAX_AUTH_REFS, "auth refs"), message.seq]
    elif isinstance(message, JoinRefused):
        body = head + [TAG_JOIN_REFUSED, message.topic, str(JoinRefusal(message.reason))]
    elif isinstance(message, JoinSubmit):
        if message.invite:
            body = head + [TAG_JOIN_SUBMIT_INVITED, message.topic,
                           *_check_events((message.raw, message.invite))]
        else:
            body = head + [TAG_JOIN_SUBMIT, message.topic, _check_events((message.raw,))[0]]
    elif isinstance(message, JoinMissing):
        body = head + [TAG_JOIN_MISSING, message.topic]
    elif isinstance(message, IHave):
        body = head + [TAG_IHAVE, message.topic, _check_ids(message.ids, MAX_WANT_IDS, "ids")]
    elif isinstance(message, Graft):
        body = head + [TAG_GRAFT, message.topic, _check_ids(message.ids, MAX_WANT_IDS, "ids")]
    elif isinstance(message, Prune):
        if len(message.source) != ID_BYTES:
            raise ValueError("a prune's source is a 32-byte key")
        body = head + [TAG_PRUNE, message.topic, message.source]
    else:
        raise TypeError(f"not a message: {message!r}")
    frame = msgpack.packb(body, use_bin_type=True)
    if len(frame) > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {len(frame)} bytes exceeds MAX_FRAME_BYTES")
    return frame


# Per-entry framing overhead of a bin value in a msgpack array (bin 32 header),
# used by senders to budget how many events fit a frame.
EVENT_FRAMING_BYTES = 5
# Room left in a frame for everything but the events (header, heads, flags).
FRAME_HEADROOM_BYTES = 64 * 1024


# --------------------------------------------------------------------------- decoding


def _fail(reason: str, detail: str = "") -> MessageError:
    return MessageError(reason, detail)


def _is_bool(value: Any) -> bool:
    return type(value) is bool


def _int_in(value: Any, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def _topic(value: Any) -> bytes:
    if not (isinstance(value, bytes) and len(value) == ID_BYTES):
        raise _fail("bad_field", "topic")
    return value


def _xid(value: Any) -> int:
    if not _int_in(value, 0, MAX_XID):
        raise _fail("bad_field", "xid")
    return value


def _flag(value: Any, name: str) -> bool:
    if not _is_bool(value):
        raise _fail("bad_field", name)
    return value


def _ids(value: Any, limit: int, name: str) -> tuple[bytes, ...]:
    if not isinstance(value, list):
        raise _fail("bad_field", name)
    if len(value) > limit:
        raise _fail("too_many_ids", f"{len(value)} {name} > {limit}")
    if not all(isinstance(i, bytes) and len(i) == ID_BYTES for i in value):
        raise _fail("bad_field", name)
    return tuple(value)


def _events(value: Any) -> tuple[bytes, ...]:
    if not isinstance(value, list):
        raise _fail("bad_field", "events")
    if len(value) > MAX_EVENTS_PER_MESSAGE:
        raise _fail("too_many_events", f"{len(value)} > {MAX_EVENTS_PER_MESSAGE}")
    for raw in value:
        if not isinstance(raw, bytes):
            raise _fail("bad_field", "events")
        if len(raw) > MAX_EVENT_BYTES:
            raise _fail("event_too_large", f"{len(raw)} > {MAX_EVENT_BYTES} bytes")
    return tuple(value)


def _bloom(value: Any) -> BloomFilter:
    if not (isinstance(value, list) and len(value) == 3):
        raise _fail("bad_field", "bloom")
    salt, hashes, bits = value
    if not (isinstance(salt, bytes) and len(salt) == BLOOM_SALT_BYTES):
        raise _fail("bad_field", "bloom salt")
    if not _int_in(hashes, 1, MAX_BLOOM_HASHES):
        raise _fail("bad_field", "bloom hashes")
    if not isinstance(bits, bytes) or not bits:
        raise _fail("bad_field", "bloom bits")
    if len(bits) > MAX_BLOOM_BYTES:
        raise _fail("bloom_too_large", f"{len(bits)} > {MAX_BLOOM_BYTES} bytes")
    return BloomFilter(salt=salt, hashes=hashes, bits=bits)


# Field count (after version and tag) of each message kind.
_ARITY = {TAG_PUSH: 2, TAG_OFFER: 7, TAG_REPLY: 6, TAG_WANT: 2, TAG_EVENTS: 4,
          TAG_JOIN_ASK: 1, TAG_JOIN_TEMPLATE: 4, TAG_JOIN_REFUSED: 2, TAG_JOIN_SUBMIT: 2,
          TAG_IHAVE: 2, TAG_GRAFT: 2, TAG_PRUNE: 2, TAG_JOIN_MISSING: 1,
          TAG_REPAIR_PUSH: 2, TAG_JOIN_SUBMIT_INVITED: 3}
_REFUSALS = {r.value: r for r in JoinRefusal}


def decode(data: bytes) -> Message:
    """Parse one frame from a peer; raise MessageError (only) if it is not a valid message.

    A frame is accepted only in the one encoding `encode` gives its message
    (msgpack allows several for an int or a length: `0xcc 0x01` is also 1), so
    a message has exactly one frame: what is counted, logged or compared as
    bytes is what the message says, and nothing rides along unseen.
    """
    message = _parse(data)
    try:
        canonical = encode(message)
    except ValueError:  # decoding is at least as strict as encoding; never here
        raise _fail("bad_field", "out of bounds") from None
    if canonical != data:
        raise _fail("not_canonical", "not the one encoding of its message")
    return message


def _parse(data: bytes) -> Message:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise _fail("bad_shape", "not bytes")
    if len(data) > MAX_FRAME_BYTES:
        raise _fail("too_large", f"{len(data)} > {MAX_FRAME_BYTES} bytes")
    try:
        value = msgpack.unpackb(
            data, raw=False, use_list=True, strict_map_key=True,
            max_bin_len=MAX_FRAME_BYTES, max_str_len=MAX_FRAME_BYTES,
            max_array_len=_MAX_ARRAY, max_map_len=_MAX_ARRAY, max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises many types for malformed input
        raise _fail("not_msgpack", type(exc).__name__) from None
    if not (isinstance(value, list) and len(value) >= 2):
        raise _fail("bad_shape", "expected [version, type, ...]")
    version, tag, fields = value[0], value[1], value[2:]
    if version != WIRE_VERSION or type(version) is not int:
        raise _fail("unknown_version", repr(version)[:32])
    if type(tag) is not int or tag not in _ARITY:
        raise _fail("unknown_type", repr(tag)[:32])
    if len(fields) != _ARITY[tag]:
        raise _fail("bad_shape", f"type {tag} takes {_ARITY[tag]} fields, got {len(fields)}")
    topic = _topic(fields[0])
    if tag == TAG_PUSH or tag == TAG_REPAIR_PUSH:
        return Push(topic, _events(fields[1]), tag == TAG_REPAIR_PUSH)
    if tag == TAG_OFFER:
        _, xid, heads, since, floor, final, bloom = fields
        if not _int_in(floor, 0, MAX_DEPTH):
            raise _fail("bad_field", "floor")
        return Offer(topic, _xid(xid), _ids(heads, MAX_HEADS, "heads"),
                     _ids(since, MAX_HEADS, "since"), floor, _flag(final, "final"), _bloom(bloom))
    if tag == TAG_REPLY:
        _, xid, heads, truncated, more, events = fields
        return Reply(topic, _xid(xid), _ids(heads, MAX_HEADS, "heads"),
                     _flag(truncated, "truncated"), _flag(more, "more"), _events(events))
    if tag == TAG_WANT:
        return Want(topic, _ids(fields[1], MAX_WANT_IDS, "wanted ids"))
    if tag == TAG_IHAVE:
        return IHave(topic, _ids(fields[1], MAX_WANT_IDS, "ids"))
    if tag == TAG_GRAFT:
        return Graft(topic, _ids(fields[1], MAX_WANT_IDS, "ids"))
    if tag == TAG_PRUNE:
        source = fields[1]
        if not (isinstance(source, bytes) and len(source) == ID_BYTES):
            raise _fail("bad_field", "source")
        return Prune(topic, source)
    if tag >= TAG_JOIN_ASK:
        return _decode_join(tag, topic, fields)
    _, xid, more, events = fields
    return Events(topic, _xid(xid), _flag(more, "more"), _events(events))


def _decode_join(tag: int, topic: bytes, fields: list[Any]) -> Message:
    if tag == TAG_JOIN_ASK:
        return JoinAsk(topic)
    if tag == TAG_JOIN_MISSING:
        return JoinMissing(topic)
    if tag == TAG_JOIN_TEMPLATE:
        _, parents, auth, seq = fields
        parent_ids = _ids(parents, MAX_PARENTS, "parents")
        if not parent_ids:
            raise _fail("bad_field", "parents")
        if not _int_in(seq, 0, MAX_SEQ):
            raise _fail("bad_field", "seq")
        return JoinTemplate(topic, parent_ids, _ids(auth, MAX_AUTH_REFS, "auth refs"), seq)
    if tag == TAG_JOIN_REFUSED:
        reason = _REFUSALS.get(fields[1]) if isinstance(fields[1], str) else None
        if reason is None:
            raise _fail("bad_field", "reason")
        return JoinRefused(topic, reason)
    raws = fields[1:]
    for raw in raws:
        if not isinstance(raw, bytes):
            raise _fail("bad_field", "raw")
        if len(raw) > MAX_EVENT_BYTES:
            raise _fail("event_too_large", f"{len(raw)} > {MAX_EVENT_BYTES} bytes")
    return JoinSubmit(topic, *raws)


def event_bytes(message: Message) -> int:
    """Bytes of event payload a message carries (the rest of its frame is overhead)."""
    events = getattr(message, "events", ())
    return sum(len(raw) for raw in events)
