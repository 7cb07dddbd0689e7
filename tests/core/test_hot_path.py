"""The shortcuts of the per-event hot path must not change any answer.

* a known id skips the signature check (and only a known id does);
* `decode_event`'s one-expression fast test accepts nothing the detailed
  checks refuse;
* `fast_init` records behave like the dataclasses they are;
* a pure-MEG replica never builds topic state.
"""

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import node.core.monitor as monitor_module
from node.core.event import (
    EVENT_VERSION,
    KIND_MESSAGE,
    EventFormatError,
    _check_fields,
    _plainly_valid,
    decode_event,
    make_event,
)
from node.core.fastinit import fast_init
from node.core.add_result import AddResult
from node.core.outcomes import AddStatus, RejectReason, Rejection
from node.replica.delivery_count import HANDED_KEY
from node.replica.replica import Received, Replica, ReplicaConfig
from storage.memory import MemoryStore
from node.core.store import TABLE_STATE
from tests.helpers import child, craft_raw, identity, new_topic

NOW_MS = 10_000


@pytest.fixture
def verify_calls(monkeypatch):
    calls = []
    real = monitor_module.verify_signature

    def counting(event):
        calls.append(event.id)
        return real(event)

    monkeypatch.setattr(monitor_module, "verify_signature", counting)
    return calls


def test_a_known_event_is_not_verified_again(verify_calls):
    origin = new_topic()
    bob = identity("bob")
    first = child(bob, origin.topic_id, [origin.topic_id], seq=1)
    orphan = child(bob, origin.topic_id, [b"\x55" * 32], seq=2)
    replica = Replica(MemoryStore(), origin.topic_id, identity("x"))
    root = origin.graph.get(origin.topic_id)
    for event in (root, first, orphan):
        replica.receive(event.raw, NOW_MS)
    assert len(verify_calls) == 3
    for event in (root, first, orphan):  # applied or buffered: both known
        assert replica.receive(event.raw, NOW_MS).status is AddStatus.DUPLICATE
    assert len(verify_calls) == 3
    assert replica.counters["duplicate"] == 3
    # asking for another id still fails, known bytes or not
    wrong = replica.receive(first.raw, NOW_MS, expected_id=b"\x01" * 32)
    assert (wrong.status, wrong.reason) == (AddStatus.REJECTED, RejectReason.ID_MISMATCH)


def test_an_unknown_event_with_a_known_looking_body_is_still_verified(verify_calls):
    origin = new_topic()
    first = child(identity("bob"), origin.topic_id, [origin.topic_id], seq=1)
    replica = Replica(MemoryStore(), origin.topic_id, identity("x"))
    replica.receive(origin.graph.get(origin.topic_id).raw, NOW_MS)
    replica.receive(first.raw, NOW_MS)
    forged = first.raw[:-1] + bytes([first.raw[-1] ^ 1])  # another signature: another id
    outcome = replica.receive(forged, NOW_MS)
    assert (outcome.status, outcome.reason) == (AddStatus.REJECTED, RejectReason.BAD_SIGNATURE)
    assert len(verify_calls) == 3


text = st.one_of(st.text(max_size=70), st.sampled_from(["message", "m.room.member", "é", ""]))
ids = st.binary(min_size=31, max_size=33)
anything = st.one_of(st.none(), st.integers(-2, 2**64), st.binary(max_size=40), text,
                     st.lists(ids, max_size=3))


@settings(max_examples=500, deadline=None)
@given(fields=st.tuples(
    st.one_of(st.just(EVENT_VERSION), anything),
    st.one_of(st.just(b"t" * 32), st.just(b""), anything),
    st.one_of(st.just(b"a" * 32), anything),
    st.one_of(st.integers(0, 2**63), anything),
    st.one_of(st.lists(ids, max_size=21), anything),
    st.one_of(st.lists(ids, max_size=11), anything),
    st.one_of(st.integers(0, 2**63), anything),
    st.one_of(text, anything),
    st.one_of(st.none(), text, anything),
    st.one_of(st.binary(max_size=8), anything),
    st.one_of(st.binary(min_size=64, max_size=64), anything),
))
def test_the_fast_test_never_accepts_what_the_detailed_checks_refuse(fields):
    if _plainly_valid(*fields):
        _check_fields(*fields)  # must not raise


@settings(max_examples=200, deadline=None)
@given(seq=st.integers(0, 2**63 - 1), kind=text, state_key=st.one_of(st.none(), text),
       payload=st.binary(max_size=64))
def test_decode_agrees_with_the_detailed_checks(seq, kind, state_key, payload):
    topic = b"t" * 32
    fields = [EVENT_VERSION, topic, identity("a").public_key, seq, [b"p" * 32], [topic],
              NOW_MS, kind, state_key, payload]
    raw = craft_raw(fields, identity("a"))
    try:
        _check_fields(*fields, b"s" * 64)
        expected = None
    except EventFormatError as error:
        expected = error.reason
    try:
        event = decode_event(raw)
        assert expected is None
        assert (event.kind, event.state_key, event.seq, event.payload) == (kind, state_key, seq,
                                                                           payload)
    except EventFormatError as error:
        assert error.reason == expected


def test_fast_init_records_are_still_frozen_dataclasses():
    rejection = Rejection(b"x", reason=RejectReason.BUFFER_FULL)
    assert rejection == Rejection(b"x", RejectReason.BUFFER_FULL)
    assert hash(rejection) == hash(Rejection(b"x", RejectReason.BUFFER_FULL))
    with pytest.raises(dataclasses.FrozenInstanceError):
        rejection.reason = RejectReason.WRONG_TOPIC  # type: ignore[misc]
    result = AddResult(AddStatus.APPLIED, b"id")
    assert result.applied == () and result.reason is None
    duplicate = dataclasses.replace(result, status=AddStatus.DUPLICATE)
    assert duplicate.status is AddStatus.DUPLICATE
    received = Received(AddStatus.DUPLICATE, None)
    assert received.unauthorized == () and received.order is None
    with pytest.raises(TypeError):
        AddResult(AddStatus.APPLIED)  # type: ignore[call-arg]
    event = child(identity("bob"), b"t" * 32, [b"p" * 32], seq=1)
    assert make_event(*(getattr(event, f.name) for f in dataclasses.fields(event))) == event


def test_fast_init_refuses_what_it_cannot_reproduce():
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Factory:
        a: list = dataclasses.field(default_factory=list)

    for cls in (NoSlots, Factory):
        with pytest.raises(TypeError):
            fast_init(cls)


def test_a_pure_meg_replica_never_builds_topic_state():
    origin = new_topic()
    store = MemoryStore()
    replica = Replica(store, origin.topic_id, identity("x"), ReplicaConfig(authorization=False))
    replica.receive(origin.graph.get(origin.topic_id).raw, NOW_MS)
    rng = random.Random(1)
    for n in range(20):
        replica.publish(b"%d" % n, NOW_MS, rng)
        replica.receive(child(identity("bob"), origin.topic_id, replica.graph.extremities(),
                              seq=n + 1, kind=KIND_MESSAGE).raw, NOW_MS)
    replica.commit()
    assert replica._tracker is None and not replica.authorizing
    # No state record: only the count of what subscribers are handed (every event here).
    assert [k for k, _ in store.scan(TABLE_STATE, b"")] == [origin.topic_id + HANDED_KEY]
    assert replica.handed_count.delivered == replica.graph.delivered_count
