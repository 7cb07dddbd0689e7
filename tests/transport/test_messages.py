"""Wire messages: every kind round-trips; every malformed frame is a MessageError, nothing else."""

from __future__ import annotations

import hashlib
import random

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.core.event import MAX_EVENT_BYTES
from transport.messages import (
    BLOOM_SALT_BYTES,
    MAX_BLOOM_BYTES,
    MAX_EVENTS_PER_MESSAGE,
    MAX_FRAME_BYTES,
    MAX_HEADS,
    MAX_WANT_IDS,
    MAX_XID,
    TAG_EVENTS,
    TAG_OFFER,
    TAG_PUSH,
    TAG_REPLY,
    TAG_WANT,
    WIRE_VERSION,
    BloomFilter,
    Events,
    MessageError,
    Offer,
    Push,
    Reply,
    Want,
    decode,
    encode,
    event_bytes,
)

TOPIC = hashlib.blake2b(b"topic", digest_size=32).digest()
SALT = bytes(range(BLOOM_SALT_BYTES))


def ids(n: int, tag: bytes = b"id") -> tuple[bytes, ...]:
    return tuple(hashlib.blake2b(tag + i.to_bytes(4, "big"), digest_size=32).digest()
                 for i in range(n))


def a_bloom() -> BloomFilter:
    return BloomFilter.build(list(ids(20)), SALT, 10, 7)


EXAMPLES = [
    Push(TOPIC, (b"event-one", b"event-two")),
    Push(TOPIC, ()),
    Offer(TOPIC, 7, ids(3), ids(2, b"s"), 12, False, a_bloom()),
    Offer(TOPIC, MAX_XID, (), (), 0, True, BloomFilter(SALT, 1, b"\x00")),
    Reply(TOPIC, 7, ids(4), True, False, ()),
    Reply(TOPIC, 0, (), False, True, (b"x" * 300,)),
    Want(TOPIC, ids(5)),
    Events(TOPIC, 3, True, (b"a", b"b", b"c")),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_kind_round_trips(message):
    assert decode(encode(message)) == message


def test_event_bytes_counts_only_event_payload():
    assert event_bytes(Events(TOPIC, 1, False, (b"abc", b"de"))) == 5
    assert event_bytes(Want(TOPIC, ids(3))) == 0


def test_limits_round_trip_at_their_bounds():
    big = (b"e" * MAX_EVENT_BYTES,) * 3
    assert decode(encode(Push(TOPIC, big))) == Push(TOPIC, big)
    many = (b"e",) * MAX_EVENTS_PER_MESSAGE
    assert decode(encode(Events(TOPIC, 1, False, many))).events == many
    assert len(decode(encode(Want(TOPIC, ids(MAX_WANT_IDS)))).ids) == MAX_WANT_IDS
    offer = Offer(TOPIC, 1, ids(MAX_HEADS), ids(MAX_HEADS, b"s"), 0, False,
                  BloomFilter(SALT, 7, b"\xff" * MAX_BLOOM_BYTES))
    assert decode(encode(offer)) == offer


# ------------------------------------------------------------------ the Bloom filter


def test_bloom_has_no_false_negatives_and_about_one_percent_false_positives():
    members = list(ids(2_000))
    bloom = BloomFilter.build(members, SALT, 10, 7)
    assert all(m in bloom for m in members)
    others = ids(20_000, b"other")
    rate = sum(o in bloom for o in others) / len(others)
    assert rate < 0.02  # theory for 10 bits, 7 hashes: 0.82%


def test_bloom_salt_changes_which_ids_are_false_positives():
    members = list(ids(500))
    others = ids(5_000, b"other")
    one, two = (BloomFilter.build(members, salt, 10, 7) for salt in (SALT, b"\x01" * 16))
    first = {o for o in others if o in one}
    second = {o for o in others if o in two}
    assert first and second
    assert len(first & second) < len(first) / 4  # independent: a mined id stays rare


def test_bloom_refuses_to_outgrow_the_wire_limit():
    with pytest.raises(ValueError):
        BloomFilter.build(list(ids(MAX_BLOOM_BYTES)), SALT, 10, 7)


# ------------------------------------------------------------------ malformed frames


def frame(*fields) -> bytes:
    return msgpack.packb(list(fields), use_bin_type=True)


GOOD_BLOOM = [SALT, 7, b"\x00" * 8]
ID = ids(1)[0]

MALFORMED = {
    "empty": (b"", "not_msgpack"),
    "garbage": (b"\xc1\xff\x00garbage", "not_msgpack"),
    "truncated": (encode(EXAMPLES[2])[:-5], "not_msgpack"),
    "trailing bytes": (encode(EXAMPLES[0]) + b"\x00", "not_msgpack"),
    "a map": (msgpack.packb({"v": 1}), "bad_shape"),
    "an int": (msgpack.packb(5), "bad_shape"),
    "too short": (frame(WIRE_VERSION), "bad_shape"),
    "unknown version": (frame(2, TAG_PUSH, TOPIC, []), "unknown_version"),
    "version as bool": (frame(True, TAG_PUSH, TOPIC, []), "unknown_version"),
    "unknown type": (frame(WIRE_VERSION, 99, TOPIC), "unknown_type"),
    "type as string": (frame(WIRE_VERSION, "push", TOPIC, []), "unknown_type"),
    "missing field": (frame(WIRE_VERSION, TAG_PUSH, TOPIC), "bad_shape"),
    "extra field": (frame(WIRE_VERSION, TAG_PUSH, TOPIC, [], 1), "bad_shape"),
    "short topic": (frame(WIRE_VERSION, TAG_PUSH, b"short", []), "bad_field"),
    "topic as str": (frame(WIRE_VERSION, TAG_PUSH, "x" * 32, []), "bad_field"),
    "events not a list": (frame(WIRE_VERSION, TAG_PUSH, TOPIC, b"raw"), "bad_field"),
    "event not bytes": (frame(WIRE_VERSION, TAG_PUSH, TOPIC, [1]), "bad_field"),
    "event too large": (frame(WIRE_VERSION, TAG_PUSH, TOPIC, [b"e" * (MAX_EVENT_BYTES + 1)]),
                        "event_too_large"),
    "too many events": (frame(WIRE_VERSION, TAG_EVENTS, TOPIC, 1, False,
                              [b"e"] * (MAX_EVENTS_PER_MESSAGE + 1)), "not_msgpack"),
    "negative xid": (frame(WIRE_VERSION, TAG_EVENTS, TOPIC, -1, False, []), "bad_field"),
    "xid too big": (frame(WIRE_VERSION, TAG_EVENTS, TOPIC, MAX_XID + 1, False, []), "bad_field"),
    "xid as bool": (frame(WIRE_VERSION, TAG_EVENTS, TOPIC, True, False, []), "bad_field"),
    "flag as int": (frame(WIRE_VERSION, TAG_EVENTS, TOPIC, 1, 1, []), "bad_field"),
    "ids not a list": (frame(WIRE_VERSION, TAG_WANT, TOPIC, ID), "bad_field"),
    "short id": (frame(WIRE_VERSION, TAG_WANT, TOPIC, [b"short"]), "bad_field"),
    "too many wanted ids": (frame(WIRE_VERSION, TAG_WANT, TOPIC, [ID] * (MAX_WANT_IDS + 1)),
                            "not_msgpack"),
    "too many heads": (frame(WIRE_VERSION, TAG_REPLY, TOPIC, 1, [ID] * (MAX_HEADS + 1), False,
                             False, []), "too_many_ids"),
    "too many since ids": (frame(WIRE_VERSION, TAG_OFFER, TOPIC, 1, [], [ID] * (MAX_HEADS + 1),
                                 0, False, GOOD_BLOOM), "too_many_ids"),
    "negative floor": (frame(WIRE_VERSION, TAG_OFFER, TOPIC, 1, [], [], -1, False, GOOD_BLOOM),
                       "bad_field"),
    "floor as float": (frame(WIRE_VERSION, TAG_OFFER, TOPIC, 1, [], [], 1.5, False, GOOD_BLOOM),
                       "bad_field"),
    "bloom not a list": (frame(WIRE_VERSION, TAG_OFFER, TOPIC, 1, [], [], 0, False, b"bits"),
                         "bad_field"),
    "bloom short salt": (frame(WIRE_VERSION, TAG_OFFER, TOPIC, 1, [], [], 0, False,
                               [b"salt", 7, b"\x00"]), "bad_field"),
    "bloom zero hashes": (frame(WIRE_VERSION, TAG_OFFER, TOPIC, 1, [], [], 0, False,
                                [SALT, 0, b"\x00"]), "bad_field"),
    "bloom too many hashes": (frame(WIRE_VERSION, TAG_OFFER, TOPIC, 1, [], [], 0, False,
                                    [SALT, 17, b"\x00"]), "bad_field"),
    "bloom no bits": (frame(WIRE_VERSION, TAG_OFFER, TOPIC, 1, [], [], 0, False,
                            [SALT, 7, b""]), "bad_field"),
    "bloom too large": (frame(WIRE_VERSION, TAG_OFFER, TOPIC, 1, [], [], 0, False,
                              [SALT, 7, b"\x00" * (MAX_BLOOM_BYTES + 1)]), "bloom_too_large"),
    "ext type": (msgpack.packb([WIRE_VERSION, TAG_PUSH, TOPIC, [msgpack.ExtType(1, b"x")]]),
                 "not_msgpack"),
    "deep nesting": (b"\x91" * 10_000 + b"\x00", "not_msgpack"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_frame_is_a_named_message_error(name):
    data, reason = MALFORMED[name]
    with pytest.raises(MessageError) as caught:
        decode(data)
    assert caught.value.reason == reason, caught.value


def test_oversized_frame_is_refused_before_parsing():
    with pytest.raises(MessageError) as caught:
        decode(b"\x00" * (MAX_FRAME_BYTES + 1))
    assert caught.value.reason == "too_large"


def test_non_bytes_input_is_a_message_error():
    with pytest.raises(MessageError):
        decode("a string")  # type: ignore[arg-type]


def assert_decodes_canonically_or_is_refused(data: bytes) -> bool:
    """Either a MessageError (nothing else), or a message with exactly these bytes:
    decode(b) re-encodes to b, and decode(encode(m)) == m. True if accepted."""
    try:
        message = decode(data)
    except MessageError as error:
        assert error.reason, error  # every refusal is named
        return False
    assert encode(message) == data  # one encoding per message: nothing smuggled or lost
    assert decode(encode(message)) == message
    return True


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_decode_or_raise_only_message_error(data):
    assert_decodes_canonically_or_is_refused(data)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from([encode(m) for m in EXAMPLES]), st.integers(0, 2**32), st.integers(1, 8))
def test_mutated_frames_decode_or_raise_only_message_error(data, seed, flips):
    rng = random.Random(seed)
    mutated = bytearray(data)
    for _ in range(flips):
        choice = rng.random()
        position = rng.randrange(len(mutated))
        if choice < 0.6:
            mutated[position] = rng.randrange(256)
        elif choice < 0.8:
            del mutated[position:]
            if not mutated:
                break
        else:
            mutated.insert(position, rng.randrange(256))
    assert_decodes_canonically_or_is_refused(bytes(mutated))


@pytest.mark.parametrize("mutated", [
    # Found by the mutation fuzz (seed 29545, 2 flips): the version 1 written as
    # `0xcc 0x01` (uint 8) decoded to a message whose frame is `0x01`.
    b"\x99\xcc\x01" + encode(Offer(TOPIC, 2**32 - 1, (), (), 0, True, BloomFilter(SALT, 1, b"\x00")))[2:],
    # The same for a length: a 32-byte topic with a bin 16 header.
    b"\x94\x01\x04\xc5\x00\x20" + TOPIC + b"\x90",
])
def test_a_frame_in_a_second_encoding_of_its_message_is_refused(mutated):
    with pytest.raises(MessageError) as refused:
        decode(mutated)
    assert refused.value.reason == "not_canonical"


def test_the_mutation_fuzz_reaches_accepted_frames():
    # The round-trip checks above only bite on frames the decoder accepts: the
    # mutations (same loop, fixed seeds) must produce plenty of those.
    accepted = 0
    for seed in range(2_000):
        rng = random.Random(seed)
        mutated = bytearray(encode(EXAMPLES[seed % len(EXAMPLES)]))
        position = rng.randrange(len(mutated))
        mutated[position] = rng.randrange(256)
        accepted += assert_decodes_canonically_or_is_refused(bytes(mutated))
    assert accepted >= 1_000, accepted  # 1 701 with these seeds


# ------------------------------------------------------------------ encoding refuses what peers reject


@pytest.mark.parametrize("message", [
    Push(TOPIC, (b"e",) * (MAX_EVENTS_PER_MESSAGE + 1)),
    Push(TOPIC, (b"e" * (MAX_EVENT_BYTES + 1),)),
    Want(TOPIC, ids(MAX_WANT_IDS + 1)),
    Want(TOPIC, (b"short",)),
    Reply(TOPIC, 1, ids(MAX_HEADS + 1), False, False, ()),
    Offer(TOPIC, 1, (), (), 0, False, BloomFilter(SALT, 0, b"\x00")),
    Push(TOPIC, (b"e" * MAX_EVENT_BYTES,) * 70),  # 4.4 MiB > MAX_FRAME_BYTES
], ids=["events", "event size", "want ids", "id size", "heads", "bloom hashes", "frame size"])
def test_encode_refuses_messages_a_peer_would_reject(message):
    with pytest.raises(ValueError):
        encode(message)
