"""Wire messages of the relay protocol: how a relayed writer hands events to a relay.

A *relayed writer* is a device that holds only a signing key: no store, no
replica, no view of the graph. It cannot know the parents, the auth
references or the next sequence number of its next event, so it asks a relay
node (a full replica where it is a member with the relayed role) for them,
signs the event itself, and submits the signed bytes. The relay runs them
through the same path as any remote event (Reference Monitor, auth rules),
commits them, references them promptly (an ack) so they enter the total
order, and disseminates them (`node.relay` serves; `node.relay_client` asks).

Protocol id `PROTOCOL_RELAY`; one request/response exchange per stream
(`transport.libp2p_requests`: varint frame each way, bounded sizes and
timeouts). Every message is one msgpack array ``[WIRE_VERSION, tag, ...]``.
The author is never named in a request: it is the requesting peer, whose
libp2p identity *is* its ed25519 event key (the Noise handshake proved it).

    device -> relay   TemplateRequest  [1, 1, topic, kind, state_key|nil, payload]
                      "I am about to sign this (kind, state key, payload);
                      what do I need?" The relay checks the draft against
                      the auth rules before the device spends a signature.
    relay -> device   Template         [1, 2, topic, seq, parents, auth, d_max, now_ms]
                      the next sequence number of the device's chain, the
                      parents (its own previous event's chain kept), the auth
                      references, the topic's d_max and the relay's clock
                      (a device without a real-time clock may use it).
    device -> relay   SubmitRequest    [1, 3, topic, [event bytes, ...]]
                      up to MAX_SUBMIT_EVENTS signed events (MAX_SUBMIT_BYTES
                      in all), parents first: a device signs a chain from one
                      Template (event i+1's only parent is event i).
    relay -> device   SubmitResult     [1, 4, topic, [[id|nil, status, reason], ...]]
                      one entry per submitted event, in order. status is a
                      `SubmitStatus`: ACCEPTED (applied, durable), DUPLICATE
                      (already here: a retry), BUFFERED (durable but waiting
                      for parents the relay lacks) or REJECTED with a stable
                      reason (a Reference Monitor reason, an auth-rule
                      reason, or a `RelayReason`). The id is nil when the
                      bytes were not an event at all.
    relay -> device   Refused          [1, 5, reason, detail]
                      the whole request was refused (a `RelayReason`; detail
                      is one human-readable line).

Who gets an answer. For a topic whose join rule is not public, a relay
answers a TemplateRequest or SubmitRequest only to a key joined in the
topic's current resolved state, or to an invited key asking about its own
join; anyone else gets `Refused(UNKNOWN_TOPIC)` worded as for a topic the
relay never heard of (`node.relay`, docs/access.md). A Template names event
ids (parents, auth references): it is a read.

Decoding is strict and bounded like `transport.messages`: anything wrong
raises `RelayMessageError(reason)` and nothing else. Encoding checks the same
bounds and raises ValueError (sending what the peer must reject is a local
bug).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Union

import msgpack

from node.core.event import ID_BYTES, MAX_AUTH_REFS, MAX_EVENT_BYTES, MAX_KIND_BYTES, MAX_PARENTS
from node.core.event import MAX_SEQ, MAX_STATE_KEY_BYTES, MAX_TIMESTAMP_MS

PROTOCOL_RELAY = "/megnode/relay/1.0.0"
WIRE_VERSION = 1

# Message type tags (part of the wire format: never renumber).
TAG_TEMPLATE_REQUEST = 1
TAG_TEMPLATE = 2
TAG_SUBMIT = 3
TAG_SUBMIT_RESULT = 4
TAG_REFUSED = 5

# Limits. A submit fits one request frame of the node's request/response
# streams (transport.libp2p_streams.MAX_REQUEST_BYTES = 1 MiB) with room to spare.
MAX_SUBMIT_EVENTS = 64
MAX_SUBMIT_BYTES = 960 * 1024  # event bytes in one SubmitRequest
MAX_RELAY_FRAME_BYTES = 1024 * 1024
MAX_REASON_CHARS = 64
MAX_DETAIL_CHARS = 512
MAX_D_MAX_FIELD = 1_000  # only range-checked here; the topic's own bound is smaller


class SubmitStatus(StrEnum):
    """What the relay did with one submitted event (its value is the wire string)."""

    ACCEPTED = "accepted"  # applied, durable
    DUPLICATE = "duplicate"  # already here: a retry
    BUFFERED = "buffered"  # durable, waiting for parents the relay lacks
    REJECTED = "rejected"  # not applied; the outcome's reason says why


class RelayReason(StrEnum):
    """Reasons the relay gives: stable strings in logs, counters, client errors and on the wire.

    A whole request's `Refused.reason`, or a rejected outcome's reason when the
    relay (not the Reference Monitor or the auth rules) turned the event down.
    Decoding keeps a received reason a plain `str`: a newer relay may send one
    this build does not know, and a client still shows it.
    """

    BAD_REQUEST = "bad_request"  # the request did not decode (detail says why)
    # "Not found": the relay does not replicate the topic, has not received its
    # create event yet, or the requester's key may not read it (docs/access.md).
    # One reason for the three, so a refusal reveals nothing to a non-member; the
    # wire string predates that and stays. ("not_ready", the old answer while the
    # create event was missing, is no longer sent; clients keep reasons as str.)
    UNKNOWN_TOPIC = "unknown_topic"
    RATE_LIMITED = "rate_limited"  # too many requests from this peer; retry later
    NOT_RELAYED_WRITER = "not_relayed_writer"  # the author lacks the relayed role
    NOT_AUTHORIZED = "not_authorized"  # the auth rules refuse the draft
    RELAY_CANNOT_REFERENCE = "relay_cannot_reference"  # the relay is no writer here
    AUTHOR_NOT_SENDER = "author_not_sender"  # event signed by another key than the peer's
    WRONG_TOPIC = "wrong_topic"  # event of another topic than the request's
    NOT_AN_EVENT = "not_an_event"  # bytes that are not one canonical event



class RelayMessageError(ValueError):
    """Bytes that are not one valid relay message; `reason` names what is wrong."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class TemplateRequest:
    topic: bytes
    kind: str
    state_key: str | None
    payload: bytes


@dataclass(frozen=True, slots=True)
class Template:
    topic: bytes
    seq: int
    parents: tuple[bytes, ...]
    auth: tuple[bytes, ...]
    d_max: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    topic: bytes
    events: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the relay did with one submitted event."""

    event_id: bytes | None
    status: SubmitStatus
    reason: str = ""  # a RelayReason, or the monitor's or auth rules' reason

    @property
    def ok(self) -> bool:
        return self.status is not SubmitStatus.REJECTED


@dataclass(frozen=True, slots=True)
class SubmitResult:
    topic: bytes
    outcomes: tuple[Outcome, ...]


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str
    detail: str = ""


RelayMessage = Union[TemplateRequest, Template, SubmitRequest, SubmitResult, Refused]


# --------------------------------------------------------------------------- encoding


def _ids(ids: Sequence[bytes], limit: int, what: str) -> list[bytes]:
    if len(ids) > limit or any(len(i) != ID_BYTES for i in ids):
        raise ValueError(f"{what}: at most {limit} ids of {ID_BYTES} bytes")
    return list(ids)


def encode(message: RelayMessage) -> bytes:
    """The frame for `message`; ValueError if it breaks a bound the peer enforces."""
    if isinstance(message, TemplateRequest):
        body: list[Any] = [TAG_TEMPLATE_REQUEST, message.topic, message.kind, message.state_key,
                           message.payload]
    elif isinstance(message, Template):
        body = [TAG_TEMPLATE, message.topic, message.seq, _ids(message.parents, MAX_PARENTS, "parents"),
                _ids(message.auth, MAX_AUTH_REFS, "auth"), message.d_max, message.now_ms]
    elif isinstance(message, SubmitRequest):
        if len(message.events) > MAX_SUBMIT_EVENTS:
            raise ValueError(f"{len(message.events)} events exceed MAX_SUBMIT_EVENTS")
        if sum(len(e) for e in message.events) > MAX_SUBMIT_BYTES:
            raise ValueError("events exceed MAX_SUBMIT_BYTES")
        body = [TAG_SUBMIT, message.topic, list(message.events)]
    elif isinstance(message, SubmitResult):
        body = [TAG_SUBMIT_RESULT, message.topic,
                [[o.event_id, o.status, o.reason[:MAX_REASON_CHARS]] for o in message.outcomes]]
    elif isinstance(message, Refused):
        body = [TAG_REFUSED, message.reason[:MAX_REASON_CHARS], message.detail[:MAX_DETAIL_CHARS]]
    else:
        raise TypeError(f"not a relay message: {message!r}")
    frame = msgpack.packb([WIRE_VERSION, *body], use_bin_type=True)
    if len(frame) > MAX_RELAY_FRAME_BYTES:
        raise ValueError(f"relay frame of {len(frame)} bytes exceeds MAX_RELAY_FRAME_BYTES")
    return frame


# --------------------------------------------------------------------------- decoding


def _fail(reason: str, detail: str = "") -> RelayMessageError:
    return RelayMessageError(reason, detail)


def _topic(value: Any) -> bytes:
    if not (isinstance(value, bytes) and len(value) == ID_BYTES):
        raise _fail("bad_field", "topic")
    return value


def _int(value: Any, high: int, name: str) -> int:
    if type(value) is not int or not 0 <= value <= high:
        raise _fail("bad_field", name)
    return value


def _text(value: Any, limit: int, name: str, allow_empty: bool = True) -> str:
    if not isinstance(value, str) or len(value) > limit or (not allow_empty and not value):
        raise _fail("bad_field", name)
    return value


def _id_list(value: Any, limit: int, name: str) -> tuple[bytes, ...]:
    if not isinstance(value, list) or len(value) > limit:
        raise _fail("bad_field", name)
    if not all(isinstance(i, bytes) and len(i) == ID_BYTES for i in value):
        raise _fail("bad_field", name)
    return tuple(value)


def _events(value: Any) -> tuple[bytes, ...]:
    if not isinstance(value, list):
        raise _fail("bad_field", "events")
    if len(value) > MAX_SUBMIT_EVENTS:
        raise _fail("too_many_events", f"{len(value)} > {MAX_SUBMIT_EVENTS}")
    if not all(isinstance(raw, bytes) for raw in value):
        raise _fail("bad_field", "events")
    if any(len(raw) > MAX_EVENT_BYTES for raw in value):
        raise _fail("event_too_large", f"an event exceeds {MAX_EVENT_BYTES} bytes")
    if sum(len(raw) for raw in value) > MAX_SUBMIT_BYTES:
        raise _fail("too_large", f"events exceed {MAX_SUBMIT_BYTES} bytes")
    return tuple(value)


def _outcome(value: Any) -> Outcome:
    if not (isinstance(value, list) and len(value) == 3):
        raise _fail("bad_field", "outcome")
    event_id, status, reason = value
    if event_id is not None and not (isinstance(event_id, bytes) and len(event_id) == ID_BYTES):
        raise _fail("bad_field", "outcome id")
    if not isinstance(status, str) or status not in _SUBMIT_STATUSES:
        raise _fail("bad_field", "outcome status")
    return Outcome(event_id, SubmitStatus(status),
                   _text(reason, MAX_REASON_CHARS, "outcome reason"))


_SUBMIT_STATUSES = frozenset(SubmitStatus)


# Field count (after version and tag) of each message kind.
_ARITY = {TAG_TEMPLATE_REQUEST: 4, TAG_TEMPLATE: 6, TAG_SUBMIT: 2, TAG_SUBMIT_RESULT: 2,
          TAG_REFUSED: 2}


def decode(data: bytes) -> RelayMessage:
    """Parse one relay frame; raise RelayMessageError (only) if it is not a valid message."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise _fail("bad_shape", "not bytes")
    if len(data) > MAX_RELAY_FRAME_BYTES:
        raise _fail("too_large", f"{len(data)} > {MAX_RELAY_FRAME_BYTES} bytes")
    try:
        value = msgpack.unpackb(
            data, raw=False, use_list=True, strict_map_key=True,
            max_bin_len=MAX_RELAY_FRAME_BYTES, max_str_len=MAX_RELAY_FRAME_BYTES,
            max_array_len=MAX_SUBMIT_EVENTS + 8, max_map_len=0, max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises many types for malformed input
        raise _fail("not_msgpack", type(exc).__name__) from None
    if not (isinstance(value, list) and len(value) >= 2):
        raise _fail("bad_shape", "expected [version, type, ...]")
    version, tag, fields = value[0], value[1], value[2:]
    if type(version) is not int or version != WIRE_VERSION:
        raise _fail("unknown_version", repr(version)[:32])
    if type(tag) is not int or tag not in _ARITY:
        raise _fail("unknown_type", repr(tag)[:32])
    if len(fields) != _ARITY[tag]:
        raise _fail("bad_shape", f"type {tag} takes {_ARITY[tag]} fields, got {len(fields)}")
    if tag == TAG_REFUSED:
        return Refused(_text(fields[0], MAX_REASON_CHARS, "reason", allow_empty=False),
                       _text(fields[1], MAX_DETAIL_CHARS, "detail"))
    topic = _topic(fields[0])
    if tag == TAG_TEMPLATE_REQUEST:
        _, kind, state_key, payload = fields
        if state_key is not None:
            _text(state_key, MAX_STATE_KEY_BYTES, "state_key")
        if not isinstance(payload, bytes) or len(payload) > MAX_EVENT_BYTES:
            raise _fail("bad_field", "payload")
        return TemplateRequest(topic, _text(kind, MAX_KIND_BYTES, "kind", allow_empty=False),
                               state_key, payload)
    if tag == TAG_TEMPLATE:
        _, seq, parents, auth, d_max, now_ms = fields
        return Template(topic, _int(seq, MAX_SEQ, "seq"), _id_list(parents, MAX_PARENTS, "parents"),
                        _id_list(auth, MAX_AUTH_REFS, "auth"), _int(d_max, MAX_D_MAX_FIELD, "d_max"),
                        _int(now_ms, MAX_TIMESTAMP_MS, "now_ms"))
    if tag == TAG_SUBMIT:
        return SubmitRequest(topic, _events(fields[1]))
    outcomes = fields[1]
    if not isinstance(outcomes, list) or len(outcomes) > MAX_SUBMIT_EVENTS:
        raise _fail("bad_field", "outcomes")
    return SubmitResult(topic, tuple(_outcome(o) for o in outcomes))
