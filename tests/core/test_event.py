"""Event encoding: one canonical form, ids are hashes, signatures cover the body."""

import msgpack
import pytest

from node.core.event import (
    MAX_EVENT_BYTES,
    EventFormatError,
    decode_event,
    event_id_of,
    pack_payload,
    trusted_event,
)
from node.core.identity import sign_event, verify_signature
from node.core.outcomes import RejectReason
from tests.helpers import child, craft_raw, identity, new_topic, valid_fields


def test_signed_event_round_trips_to_identical_bytes_and_id():
    replica = new_topic()
    event = child(identity("bob"), replica.topic_id, [replica.topic_id], seq=1, payload=b"x")
    again = decode_event(event.raw)
    assert again == event
    assert again.id == event_id_of(event.raw)
    assert trusted_event(event.raw) == event
    assert verify_signature(event)


def test_parents_are_sorted_by_the_signer():
    replica = new_topic()
    bob = identity("bob")
    a = child(bob, replica.topic_id, [replica.topic_id], seq=1)
    b = child(identity("carol"), replica.topic_id, [replica.topic_id], seq=1)
    unsorted = sorted([a.id, b.id], reverse=True)
    event = sign_event(bob, topic=replica.topic_id, seq=2, parents=unsorted, timestamp_ms=1,
                       kind="message", auth=(replica.topic_id,))
    assert list(event.parents) == sorted([a.id, b.id])


def test_create_event_is_the_root_and_its_id_is_the_topic():
    replica = new_topic(name="kitchen", d_max=4)
    root = replica.graph.get(replica.topic_id)
    assert root is not None and root.is_create and root.parents == ()
    assert root.topic_id() == replica.topic_id
    assert replica.params.name == "kitchen" and replica.params.d_max == 4


def _encode_with_seq_bytes(fields, signature, seq_bytes):
    """An array of 11 whose 4th element (seq) uses the given, possibly non-minimal, encoding."""
    parts = [msgpack.packb(f, use_bin_type=True) for f in fields + [signature]]
    parts[3] = seq_bytes
    return b"\x9b" + b"".join(parts)


def test_non_canonical_integer_encoding_is_rejected():
    replica = new_topic()
    bob = identity("bob")
    fields = valid_fields(bob, replica.topic_id, [replica.topic_id])
    raw = craft_raw(fields, bob)
    signature = msgpack.unpackb(raw)[-1]
    assert _encode_with_seq_bytes(fields, signature, b"\x01") == raw  # the canonical form
    with pytest.raises(EventFormatError) as info:
        decode_event(_encode_with_seq_bytes(fields, signature, b"\xcd\x00\x01"))  # uint16 for 1
    assert info.value.reason is RejectReason.NOT_CANONICAL


def test_payload_maps_are_packed_canonically():
    assert pack_payload({"b": 1, "a": {"d": 2, "c": 3}}) == pack_payload({"a": {"c": 3, "d": 2}, "b": 1})


def test_oversized_event_is_rejected_before_parsing():
    with pytest.raises(EventFormatError) as info:
        decode_event(b"\x00" * (MAX_EVENT_BYTES + 1))
    assert info.value.reason is RejectReason.TOO_LARGE


def test_max_payload_fits_the_worst_case_event():
    """MAX_PAYLOAD_BYTES leaves room for every other field at its limit (event.py)."""
    from node.core.event import (EVENT_OVERHEAD_BYTES, MAX_AUTH_REFS, MAX_EVENT_BYTES,
                                 MAX_KIND_BYTES, MAX_PARENTS, MAX_PAYLOAD_BYTES, MAX_SEQ,
                                 MAX_STATE_KEY_BYTES, MAX_TIMESTAMP_MS)

    ids = sorted(bytes([i]) * 32 for i in range(MAX_PARENTS))
    event = sign_event(identity("alice"), topic=b"\x01" * 32, seq=MAX_SEQ, parents=ids,
                       auth=ids[:MAX_AUTH_REFS], timestamp_ms=MAX_TIMESTAMP_MS,
                       kind="k" * MAX_KIND_BYTES, state_key="s" * MAX_STATE_KEY_BYTES,
                       payload=b"\xff" * MAX_PAYLOAD_BYTES)
    assert len(event.raw) <= MAX_EVENT_BYTES
    assert len(event.raw) - MAX_PAYLOAD_BYTES <= EVENT_OVERHEAD_BYTES
