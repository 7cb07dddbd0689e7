"""The Reference Monitor: every rejection has a crafted event, and rejections leave no trace."""

import random

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.core.event import (
    EVENT_VERSION,
    KIND_DUMMY,
    MAX_AUTH_REFS,
    MAX_DUMMY_PARENTS,
    MAX_EVENT_BYTES,
    MAX_PARENTS,
    MAX_STATE_KEY_BYTES,
    WITHHELD_EXT,
    EventFormatError,
    decode_event,
)
from node.core import antichain as antichain_module
from node.core.monitor import MAX_FUTURE_SKEW_MS, Rejected
from node.core.outcomes import AddStatus, RejectReason
from node.replica.replica import Replica
from storage.memory import MemoryStore
from node.core.store import TABLES
from tests.helpers import child, craft_raw, identity, new_topic, valid_fields

NOW_MS = 10_000


def dump(store) -> dict:
    return {table: list(store.scan(table, b"")) for table in TABLES}


@pytest.fixture
def world():
    """A creator's replica holding a small chain, and a receiving replica with the same events."""
    origin = new_topic()
    bob = identity("bob")
    first = child(bob, origin.topic_id, [origin.topic_id], seq=1)
    second = child(bob, origin.topic_id, [first.id], seq=2)
    store = MemoryStore()
    receiver = Replica(store, origin.topic_id, identity("carol"))
    for event in (origin.graph.get(origin.topic_id), first, second):
        assert receiver.receive(event.raw, NOW_MS).status is AddStatus.APPLIED
    receiver.commit()
    return receiver, store, first, second


def fields_of(world, **changes):
    receiver, _, first, second = world
    fields = valid_fields(identity("mallory"), receiver.topic_id, [second.id])
    names = ["version", "topic", "author", "seq", "parents", "auth", "ts", "kind", "state_key",
             "payload"]
    for name, value in changes.items():
        fields[names.index(name)] = value
    return fields


def without_rejection_memory(dumped: dict, topic_id: bytes) -> dict:
    """The store dump minus the graph's memory of application-time rejections."""
    memory = (topic_id + b"r", topic_id + b"rejections")
    return {table: [(k, v) for k, v in pairs
                    if not (table in ("buffer_index", "meta") and k.startswith(memory))]
            for table, pairs in dumped.items()}


def assert_rejected(world, raw, reason, expected_id=None, remembered=False):
    """Rejected for `reason`, store untouched — except, for a rejection at application
    time (`remembered`), the graph's bounded memory of it (see node.core.rejections)."""
    receiver, store, _, _ = world
    before = dump(store)
    outcome = receiver.receive(raw, NOW_MS, expected_id=expected_id)
    receiver.commit()
    assert outcome.status is AddStatus.REJECTED, outcome
    assert outcome.reason is RejectReason(reason)
    after = dump(store)
    if remembered:
        assert receiver.graph.rejected_reason(outcome.event_id) is RejectReason(reason)
        assert after != before
        after = without_rejection_memory(after, receiver.topic_id)
    assert after == before, "a rejection must not touch the store"
    assert receiver.counters[f"rejected.{reason}"] >= 1


def test_valid_crafted_event_is_accepted(world):
    receiver = world[0]
    outcome = receiver.receive(craft_raw(fields_of(world), identity("mallory")), NOW_MS)
    assert outcome.status is AddStatus.APPLIED


def test_not_msgpack(world):
    assert_rejected(world, b"\xc1 definitely not msgpack", "not_msgpack")


def test_truncated_msgpack(world):
    raw = craft_raw(fields_of(world), identity("mallory"))
    assert_rejected(world, raw[:-5], "not_msgpack")


def test_not_an_array(world):
    assert_rejected(world, msgpack.packb({"id": 1}), "bad_shape")


def test_unknown_version(world):
    assert_rejected(world, craft_raw(fields_of(world, version=EVENT_VERSION + 1), identity("mallory")), "unknown_version")


def test_too_large(world):
    big = fields_of(world, payload=b"x" * MAX_EVENT_BYTES)
    assert_rejected(world, craft_raw(big, identity("mallory")), "too_large")


def test_bad_signature(world):
    # Signed by someone other than the author named in the event.
    assert_rejected(world, craft_raw(fields_of(world), identity("eve")), "bad_signature")


def test_tampered_payload_breaks_signature(world):
    raw = craft_raw(fields_of(world), identity("mallory"))
    fields = msgpack.unpackb(raw)
    fields[9] = b"HELLO"
    assert_rejected(world, msgpack.packb(fields, use_bin_type=True), "bad_signature")


def test_id_mismatch(world):
    raw = craft_raw(fields_of(world), identity("mallory"))
    assert_rejected(world, raw, "id_mismatch", expected_id=b"\x07" * 32)


def test_too_many_parents(world):
    parents = sorted(bytes([i]) * 32 for i in range(MAX_PARENTS + 1))
    assert_rejected(world, craft_raw(fields_of(world, parents=parents), identity("mallory")),
                    "too_many_parents")


def test_a_dummy_may_name_more_parents_than_other_events_but_not_without_bound(world):
    """A dummy only merges extremities: the format lets it name MAX_DUMMY_PARENTS (a
    join storm's width comes down in a third of the dummies), and no more."""
    wide = sorted(bytes([i]) * 32 for i in range(MAX_DUMMY_PARENTS))
    dummy = decode_event(craft_raw(fields_of(world, parents=wide, kind=KIND_DUMMY, payload=b""),
                                   identity("mallory")))
    assert len(dummy.parents) == MAX_DUMMY_PARENTS > MAX_PARENTS
    with pytest.raises(EventFormatError) as refused:
        decode_event(craft_raw(fields_of(world, parents=wide, payload=b""), identity("mallory")))
    assert refused.value.reason is RejectReason.TOO_MANY_PARENTS  # a message: MAX_PARENTS
    wider = sorted(bytes([i]) * 32 for i in range(MAX_DUMMY_PARENTS + 1))
    assert_rejected(world, craft_raw(fields_of(world, parents=wider, kind=KIND_DUMMY, payload=b""),
                                     identity("mallory")), "too_many_parents")


def test_no_parents_on_a_non_create_event(world):
    assert_rejected(world, craft_raw(fields_of(world, parents=[]), identity("mallory")), "no_parents")


def test_duplicate_parents(world):
    _, _, first, _ = world
    fields = fields_of(world, parents=[first.id, first.id])
    assert_rejected(world, craft_raw(fields, identity("mallory")), "duplicate_parents")


def test_unsorted_parents_are_not_canonical(world):
    _, _, first, _ = world
    other = b"\x00" * 32 if first.id > b"\x00" * 32 else b"\xff" * 32
    fields = fields_of(world, parents=sorted([first.id, other], reverse=True))
    assert_rejected(world, craft_raw(fields, identity("mallory")), "not_canonical")


def test_too_many_auth_refs(world):
    auth = sorted(bytes([i]) * 32 for i in range(MAX_AUTH_REFS + 1))
    assert_rejected(world, craft_raw(fields_of(world, auth=auth), identity("mallory")),
                    "too_many_auth_refs")


def test_state_key_too_long(world):
    fields = fields_of(world, state_key="k" * (MAX_STATE_KEY_BYTES + 1), kind="m.room.topic")
    assert_rejected(world, craft_raw(fields, identity("mallory")), "state_key_too_long")


def test_timestamp_in_future(world):
    fields = fields_of(world, ts=NOW_MS + MAX_FUTURE_SKEW_MS + 1)
    assert_rejected(world, craft_raw(fields, identity("mallory")), "timestamp_in_future")


def test_timestamp_just_within_skew_is_accepted(world):
    receiver = world[0]
    fields = fields_of(world, ts=NOW_MS + MAX_FUTURE_SKEW_MS)
    outcome = receiver.receive(craft_raw(fields, identity("mallory")), NOW_MS)
    assert outcome.status is AddStatus.APPLIED


def test_wrong_topic(world):
    assert_rejected(world, craft_raw(fields_of(world, topic=b"\x42" * 32), identity("mallory")),
                    "wrong_topic")


def test_second_create_event_of_another_topic(world):
    other = new_topic(author="dave")
    root = other.graph.get(other.topic_id)
    assert_rejected(world, root.raw, "wrong_topic")


@pytest.mark.parametrize(
    "field, value",
    [("author", b"short"), ("seq", -1), ("seq", "1"), ("kind", ""), ("payload", "text not bytes"),
     ("topic", b"\x01" * 5), ("ts", 1.5), ("parents", [b"\x01" * 31])],
)
def test_malformed_fields(world, field, value):
    assert_rejected(world, craft_raw(fields_of(world, **{field: value}), identity("mallory")),
                    "bad_field")


def test_parents_not_an_antichain(world):
    # second's parent is first: naming both makes one parent an ancestor of the other.
    _, _, first, second = world
    fields = fields_of(world, parents=sorted([first.id, second.id]))
    assert_rejected(world, craft_raw(fields, identity("mallory")),
                    RejectReason.PARENTS_NOT_ANTICHAIN, remembered=True)


ANTICHAIN_TEST_BUDGET = 10  # visits: scaled down from ANTICHAIN_SEARCH_VISITS


def long_chain(length: int):
    """A topic whose writer bob appended `length` events in a line; (origin, ids root first)."""
    origin = new_topic()
    bob = identity("bob")
    chain = [origin.topic_id]
    for seq in range(1, length + 1):
        event = child(bob, origin.topic_id, [chain[-1]], seq=seq)
        assert origin.receive(event.raw, NOW_MS).status is AddStatus.APPLIED
        chain.append(event.id)
    return origin, chain


def copy_of(origin: Replica, name: str) -> Replica:
    replica = Replica(MemoryStore(), origin.topic_id, identity(name))
    for _, event in origin.graph.deliveries(limit=10_000):
        assert replica.receive(event.raw, NOW_MS).status is AddStatus.APPLIED
    return replica


def test_an_exhausted_antichain_search_accepts_on_every_replica(monkeypatch):
    # Regression: running out of budget used to reject ("antichain_search_exhausted").
    monkeypatch.setattr(antichain_module, "ANTICHAIN_SEARCH_VISITS", ANTICHAIN_TEST_BUDGET)
    origin, chain = long_chain(40)
    side = child(identity("carol"), origin.topic_id, [origin.topic_id], seq=1)
    origin.receive(side.raw, NOW_MS)
    mallory = identity("mallory")
    honest = craft_raw(valid_fields(mallory, origin.topic_id, sorted([side.id, chain[-1]])),
                       mallory)
    # chain[1] is an ancestor of chain[-1], but 39 steps down: beyond the budget.
    deep = craft_raw(valid_fields(mallory, origin.topic_id, sorted([chain[1], chain[-1]]), seq=2),
                     mallory)
    near = craft_raw(valid_fields(mallory, origin.topic_id, sorted([chain[-3], chain[-1]]), seq=3),
                     mallory)
    verdicts = []
    for name in ("x", "y"):
        replica = copy_of(origin, name)
        verdicts.append([replica.receive(raw, NOW_MS).reason for raw in (honest, deep, near)])
        # deep only: honest's parents are both extremities, an antichain without a walk.
        assert replica.graph.antichain_searches_exhausted == 1
    # The same verdicts everywhere: the budget is a protocol constant.
    assert verdicts == [[None, None, RejectReason.PARENTS_NOT_ANTICHAIN]] * 2
    # Within the budget, the deep violation is found.
    monkeypatch.setattr(antichain_module, "ANTICHAIN_SEARCH_VISITS", 1_000)
    assert copy_of(origin, "z").receive(deep, NOW_MS).reason is RejectReason.PARENTS_NOT_ANTICHAIN


@pytest.mark.parametrize("budget", [ANTICHAIN_TEST_BUDGET, antichain_module.ANTICHAIN_SEARCH_VISITS])
def test_parents_that_are_extremities_skip_the_walk_and_every_verdict_is_the_walk_s(
        monkeypatch, budget):
    # The graph skips the antichain walk when every parent is an extremity here. The
    # walk's verdict depends on the ancestry alone, so it is checked before each add:
    # an event is refused exactly when the walk finds a parent below another, whether
    # its parents are extremities (never refused) or any earlier events.
    monkeypatch.setattr(antichain_module, "ANTICHAIN_SEARCH_VISITS", budget)
    rng = random.Random(7)
    replica = new_topic()
    graph = replica.graph
    writers = [identity(name) for name in ("bob", "carol", "dave")]
    seqs = {w.public_key: 0 for w in writers}
    applied = [replica.topic_id]
    shortcuts = refused = exhausted = 0
    for i in range(400):
        extremities = graph.extremities()
        draw = rng.random()
        if draw < 0.3:  # a fork off any earlier event: the graph widens
            parents = [rng.choice(applied)]
        elif draw < 0.65 and len(extremities) > 1:
            parents = rng.sample(extremities, rng.randint(2, min(4, len(extremities))))
        else:
            parents = rng.sample(applied, min(len(applied), rng.randint(2, 3)))
        verdict = antichain_module.check(tuple(sorted(parents)), graph._node)
        if set(parents) <= set(extremities):
            shortcuts += 1
            assert verdict is not antichain_module.Verdict.NOT_ANTICHAIN
        writer = rng.choice(writers)
        seqs[writer.public_key] += 1
        event = child(writer, replica.topic_id, sorted(parents), seq=seqs[writer.public_key],
                      ts=2_000 + i)
        outcome = replica.receive(event.raw, NOW_MS)
        if verdict is antichain_module.Verdict.NOT_ANTICHAIN:
            refused += 1
            assert outcome.reason is RejectReason.PARENTS_NOT_ANTICHAIN
            seqs[writer.public_key] -= 1  # the seq stays free for the writer's next event
        else:
            exhausted += verdict is antichain_module.Verdict.SEARCH_EXHAUSTED
            assert outcome.status is AddStatus.APPLIED
            applied.append(event.id)
    assert shortcuts > 50 and refused > 20
    assert (exhausted > 0) == (budget == ANTICHAIN_TEST_BUDGET)


def test_an_old_head_merged_with_a_deep_one_never_blocks_publishing(monkeypatch):
    # Regression: a device offline since a shallow depth publishes on its old
    # head; every later publish here names that head and the deep one, and
    # each was refused ("local event not applied: rejected antichain_search_exhausted").
    monkeypatch.setattr(antichain_module, "ANTICHAIN_SEARCH_VISITS", ANTICHAIN_TEST_BUDGET)
    origin, chain = long_chain(30)
    late = child(identity("dave"), origin.topic_id, [chain[2]], seq=1)
    assert origin.receive(late.raw, NOW_MS).status is AddStatus.APPLIED
    assert origin.graph.extremities() == sorted([chain[-1], late.id])
    rng = random.Random(1)
    for n in range(3):
        event, outcome = origin.publish(b"after %d" % n, NOW_MS, rng)
        assert outcome.status is AddStatus.APPLIED
    assert origin.graph.width == 1  # the first publish merged both heads
    # A replica receiving the merge reaches the same verdict.
    replica = Replica(MemoryStore(), origin.topic_id, identity("x"))
    statuses = {replica.receive(e.raw, NOW_MS).status for _, e in origin.graph.deliveries()}
    assert statuses == {AddStatus.APPLIED}


def test_equivocation_is_accepted_and_recorded(world):
    receiver, _, first, second = world
    bob = identity("bob")
    twin = child(bob, receiver.topic_id, [first.id], seq=2, payload=b"the other story")
    outcome = receiver.receive(twin.raw, NOW_MS)
    assert outcome.status is AddStatus.APPLIED
    assert [e.id for e in outcome.equivocations] == [twin.id]
    assert receiver.graph.equivocation_count == 1
    assert sorted(receiver.graph.events_by(bob.public_key, 2)) == sorted([second.id, twin.id])


def assert_no_unexpected_rejection(receiver: Replica, raw: bytes) -> None:
    """Every rejection is a deliberate one: the monitor's catch-all (which
    reports a decoder bug as "bad_shape", detail "unexpected ...") never fires."""
    verdict = receiver.monitor.check(raw, NOW_MS, known=receiver.graph.knows)
    if isinstance(verdict, Rejected):
        assert not verdict.detail.startswith("unexpected"), verdict
    assert_decodes_canonically_or_is_refused(raw)


def assert_decodes_canonically_or_is_refused(raw: bytes) -> None:
    """The decoder refuses with a named reason, or its event re-encodes to exactly `raw`."""
    try:
        event = decode_event(raw)
    except EventFormatError as error:
        assert error.reason
        return
    rebuilt = msgpack.packb([event.version, event.topic, event.author, event.seq,
                             list(event.parents), list(event.auth), event.timestamp_ms,
                             event.kind, event.state_key,
                             msgpack.ExtType(WITHHELD_EXT, event.digest) if event.withheld
                             else event.payload, event.signature], use_bin_type=True)
    assert rebuilt == raw == event.raw
    assert decode_event(rebuilt) == event


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=600))
def test_random_bytes_only_ever_give_named_rejections(world, data):
    assert_no_unexpected_rejection(world[0], data)
    outcome = world[0].receive(data, NOW_MS)
    assert outcome.status is AddStatus.REJECTED and outcome.reason


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(position=st.integers(min_value=0), value=st.integers(min_value=0, max_value=255),
       cut=st.booleans())
def test_mutated_valid_events_never_raise(world, position, value, cut):
    receiver, _, first, _ = world
    raw = bytearray(child(identity("bob"), receiver.topic_id, [first.id], seq=9).raw)
    index = position % len(raw)
    if cut:
        raw = raw[:index]
    else:
        raw[index] = value
    assert_no_unexpected_rejection(receiver, bytes(raw))
    outcome = receiver.receive(bytes(raw), NOW_MS)
    assert outcome.status in set(AddStatus)
    if outcome.status is AddStatus.REJECTED:
        assert outcome.reason


def test_a_signature_checked_by_the_gossip_precheck_is_not_checked_again(monkeypatch):
    """The validator's look remembers a good signature; the ingest of the same bytes skips
    it, once; the memory is bounded (MAX_VERIFIED_IDS) and a bad signature is never kept."""
    import node.core.monitor as monitor_module
    from node.core.monitor import ReferenceMonitor
    origin = new_topic()
    events = [child(identity("bob"), origin.topic_id, [origin.topic_id], seq=n)
              for n in range(1, 5)]
    checks = []
    real = monitor_module.verify_signature
    monkeypatch.setattr(monitor_module, "verify_signature",
                        lambda event: checks.append(event.id) or real(event))
    monkeypatch.setattr(monitor_module, "MAX_VERIFIED_IDS", 2)
    monitor = ReferenceMonitor(origin.topic_id)
    first = events[0]
    assert monitor.check(first.raw, NOW_MS, remember=True) == first
    assert monitor.check(first.raw, NOW_MS, known=lambda _: False) == first  # the ingest
    assert checks == [first.id] and monitor.signatures_skipped == 1
    monitor.check(first.raw, NOW_MS)  # used once: checked again
    assert checks.count(first.id) == 2
    for event in events[1:]:  # three remembered, the bound is two: the oldest goes
        monitor.check(event.raw, NOW_MS, remember=True)
    monitor.check(events[1].raw, NOW_MS)
    assert checks.count(events[1].id) == 2
    tampered = bytearray(events[3].raw)
    tampered[-1] ^= 1  # another signature: another id (the id hashes every byte)
    assert monitor.check(bytes(tampered), NOW_MS, remember=True) != events[3]
