"""The relay protocol without a network: wire messages, rate limit, the relay's decisions.

`RelayServer` is sans-IO: a relay replica in memory, a device that signs
from the templates it is served, a clock passed in. These tests pin the
properties the network test cannot reach deterministically: the relay's own
ack references what it accepted (the relay duty), a relayed event stays out
of the order until then, a flood is rate-limited, a relay that cannot
reference is refused up front, and no byte string makes the decoder raise
anything but RelayMessageError.
"""

from __future__ import annotations

import random

import msgpack
import pytest

from node.core.event import KIND_MESSAGE, pack_payload
from node.core.identity import Identity, sign_event
from node.replica.replica import Replica
from node.relay import RateLimiter, RelayLimits, RelayServer
from node.state.roles import Role
from node.state.types import TYPE_MEMBER
from storage.memory import MemoryStore
from tests.helpers import authorized_topic, identity, sync
from transport.relay import (
    MAX_SUBMIT_EVENTS,
    Outcome,
    Refused,
    RelayMessageError,
    RelayReason,
    SubmitRequest,
    SubmitResult,
    SubmitStatus,
    Template,
    TemplateRequest,
    decode,
    encode,
)

NOW_MS = 5_000
DEVICE = identity("device")
BOB = identity("bob")
FUZZ_CASES = 2_000
FUZZ_SEED = 11


class World:
    """Alice's topic on a relay replica; the device holds only its key."""

    def __init__(self, *, relay_is_writer: bool = True, d_max: int = 10) -> None:
        self.now_ms = NOW_MS
        self.rng = random.Random(3)
        self.alice = authorized_topic(author="alice", d_max=d_max)
        self.relay = self.alice
        if not relay_is_writer:  # a reader replica as the relay
            reader = identity("reader")
            self.alice.invite(reader.public_key, self.tick(), self.rng)
            self.relay = Replica(MemoryStore(), self.alice.topic_id, reader)
            for _, event in self.alice.graph.deliveries(0):
                self.relay.receive(event.raw, self.now_ms)
            self.relay.join(self.tick(), self.rng)
        self.relay.commit()
        self.server = RelayServer(lambda t: self.relay if t == self.relay.topic_id else None,
                                  random.Random(5))

    def tick(self) -> int:
        self.now_ms += 10
        return self.now_ms

    def ask(self, message: TemplateRequest | SubmitRequest, who: Identity = DEVICE) -> object:
        handled = self.server.handle(who.public_key, encode(message), self.tick())
        self.relay.commit()
        return decode(handled.response)

    def publish(self, kind: str, state_key: str | None, payload: bytes,
                who: Identity = DEVICE) -> Outcome:
        template = self.ask(TemplateRequest(self.relay.topic_id, kind, state_key, payload), who)
        assert isinstance(template, Template), template
        event = sign_event(who, topic=self.relay.topic_id, seq=template.seq,
                           parents=template.parents, timestamp_ms=template.now_ms, kind=kind,
                           payload=payload, state_key=state_key, auth=template.auth)
        result = self.ask(SubmitRequest(self.relay.topic_id, (event.raw,)), who)
        assert isinstance(result, SubmitResult), result
        return result.outcomes[0]

    def join_member(self, who: Identity) -> Identity:
        """`who` joins as a full writer with its own replica (not a relayed device)."""
        self.alice.add_writer(who.public_key, self.tick(), self.rng)
        self.alice.commit()
        replica = Replica(MemoryStore(), self.alice.topic_id, who)
        sync(self.alice, replica)
        replica.join(self.tick(), self.rng)
        replica.commit()
        sync(replica, self.relay)
        self.relay.commit()
        return who

    def join_device(self) -> None:
        for event, _ in self.alice.add_writer(DEVICE.public_key, self.tick(), self.rng):
            pass
        self.alice.commit()
        outcome = self.publish(TYPE_MEMBER, DEVICE.public_key.hex(),
                               pack_payload({"membership": "join", "relayed": True}))
        assert outcome.status == SubmitStatus.ACCEPTED, outcome


def test_relay_acks_what_it_accepted_and_only_then_is_it_ordered() -> None:
    world = World()
    world.join_device()
    assert world.relay.role_of(DEVICE.public_key) is Role.RELAYED
    outcome = world.publish(KIND_MESSAGE, None, b"21.5C")
    assert outcome.status == SubmitStatus.ACCEPTED and outcome.event_id is not None
    order = world.relay.ordering
    assert order is not None and outcome.event_id in order.pending_relayed()
    assert outcome.event_id not in [i for _, i in order.full_slice(0, 1_000)]  # kept aside
    made = world.relay.maybe_ack(world.tick() + 1_000, world.rng)  # the relay duty
    assert made is not None and outcome.event_id in made[0].parents
    world.relay.commit()
    assert outcome.event_id not in order.pending_relayed()
    assert outcome.event_id in [i for _, i in order.full_slice(0, 1_000)]
    # A retry of the same bytes is a duplicate, not a second event.
    event = world.relay.graph.get(outcome.event_id)
    again = world.ask(SubmitRequest(world.relay.topic_id, (event.raw,)))
    assert isinstance(again, SubmitResult) and again.outcomes[0].status == SubmitStatus.DUPLICATE


def test_template_keeps_the_device_chain_when_parents_are_scarce() -> None:
    world = World(d_max=1)  # one parent per event: the chain must win the only slot
    world.join_device()
    bob = Replica(MemoryStore(), world.relay.topic_id, BOB)
    world.alice.add_writer(BOB.public_key, world.tick(), world.rng)
    world.alice.commit()
    sync(world.alice, bob)
    bob.join(world.tick(), world.rng)
    sync(bob, world.alice)
    first = world.publish(KIND_MESSAGE, None, b"1")  # bob does not hear of it
    sibling, _ = bob.publish(b"bob's", world.tick(), world.rng)
    world.relay.receive(sibling.raw, world.tick())
    world.relay.commit()
    assert {first.event_id, sibling.id} <= set(world.relay.graph.extremities())
    template = world.ask(TemplateRequest(world.relay.topic_id, KIND_MESSAGE, None, b"2"))
    assert isinstance(template, Template)
    assert template.parents == (first.event_id,)
    assert template.seq == world.relay.graph.get(first.event_id).seq + 1


def test_relay_that_cannot_reference_refuses_up_front() -> None:
    world = World(relay_is_writer=False)
    world.alice.add_writer(DEVICE.public_key, world.tick(), world.rng)  # invites the device
    world.alice.commit()
    sync(world.alice, world.relay)
    world.relay.commit()
    join = TemplateRequest(world.relay.topic_id, TYPE_MEMBER, DEVICE.public_key.hex(),
                           pack_payload({"membership": "join", "relayed": True}))
    reply = world.ask(join)
    assert isinstance(reply, Refused) and reply.reason == RelayReason.RELAY_CANNOT_REFERENCE
    # Only to a key that may ask: to a stranger this relay does not serve the topic at all.
    reply = world.ask(join, identity("stranger"))
    assert isinstance(reply, Refused) and reply.reason == RelayReason.UNKNOWN_TOPIC


def test_another_members_state_is_not_the_devices_to_set() -> None:
    world = World()
    world.join_device()
    reply = world.ask(TemplateRequest(world.relay.topic_id, TYPE_MEMBER,
                                      identity("alice").public_key.hex(),
                                      pack_payload({"membership": "leave"})))
    assert isinstance(reply, Refused) and reply.reason == RelayReason.NOT_AUTHORIZED
    # A joined member that is no relayed writer hears why (it may read the topic).
    bob = world.join_member(BOB)
    reply = world.ask(TemplateRequest(world.relay.topic_id, KIND_MESSAGE, None, b"x"), bob)
    assert isinstance(reply, Refused) and reply.reason == RelayReason.NOT_RELAYED_WRITER
    assert "has role writer" in reply.detail


def test_a_flood_is_rate_limited_per_peer() -> None:
    world = World()
    world.server = RelayServer(lambda t: world.relay, random.Random(1),
                               RelayLimits(requests_per_s=10, burst=3))
    request = encode(TemplateRequest(world.relay.topic_id, KIND_MESSAGE, None, b"x"))
    reasons = [decode(world.server.handle(DEVICE.public_key, request, NOW_MS).response)
               for _ in range(5)]
    assert [getattr(r, "reason", None) for r in reasons][3:] == [RelayReason.RATE_LIMITED] * 2
    other = decode(world.server.handle(identity("other").public_key, request, NOW_MS).response)
    assert getattr(other, "reason", None) != RelayReason.RATE_LIMITED  # buckets are per peer
    later = decode(world.server.handle(DEVICE.public_key, request, NOW_MS + 100).response)
    assert getattr(later, "reason", None) != RelayReason.RATE_LIMITED  # refilled at 10/s


def test_rate_limiter_forgets_the_oldest_peers_within_its_bound() -> None:
    limiter = RateLimiter(rate_per_s=1, burst=1, max_peers=2)
    assert limiter.allow(b"a", 0) and not limiter.allow(b"a", 0)
    assert limiter.allow(b"b", 0) and limiter.allow(b"c", 0)  # "a" forgotten: bound of 2
    assert limiter.allow(b"a", 0)


@pytest.mark.parametrize("message", [
    TemplateRequest(b"\x01" * 32, "message", None, b"payload"),
    TemplateRequest(b"\x01" * 32, TYPE_MEMBER, "ab" * 32, b""),
    Template(b"\x01" * 32, 7, (b"\x02" * 32, b"\x03" * 32), (b"\x04" * 32,), 10, 123),
    SubmitRequest(b"\x01" * 32, (b"e1", b"e2")),
    SubmitResult(b"\x01" * 32, (Outcome(b"\x05" * 32, SubmitStatus.ACCEPTED),
                                Outcome(None, SubmitStatus.REJECTED, RelayReason.NOT_AN_EVENT))),
    Refused(RelayReason.RATE_LIMITED, "retry later"),
])
def test_messages_round_trip(message: object) -> None:
    assert decode(encode(message)) == message  # type: ignore[arg-type]


def test_statuses_and_reasons_are_their_wire_strings() -> None:
    """The enums' values are the wire format (and the stats keys): they never change."""
    assert [status.value for status in SubmitStatus] == [
        "accepted", "duplicate", "buffered", "rejected"]
    assert [reason.value for reason in RelayReason] == [
        "bad_request", "unknown_topic", "rate_limited", "not_relayed_writer",
        "not_authorized", "relay_cannot_reference", "author_not_sender", "wrong_topic",
        "not_an_event"]
    frame = encode(SubmitResult(b"\x01" * 32, (Outcome(b"\x05" * 32, SubmitStatus.BUFFERED),)))
    assert msgpack.unpackb(frame)[3] == [[b"\x05" * 32, "buffered", ""]]
    decoded = decode(frame)
    assert isinstance(decoded, SubmitResult) and decoded.outcomes[0].status is SubmitStatus.BUFFERED
    refused = decode(encode(Refused(RelayReason.RATE_LIMITED)))
    assert isinstance(refused, Refused) and refused.reason == "rate_limited"
    # A status outside the enum, or not a string at all, is a malformed message.
    for status in ("maybe", 1, b"accepted"):
        bad = msgpack.packb([1, 4, b"\x01" * 32, [[None, status, ""]]], use_bin_type=True)
        with pytest.raises(RelayMessageError, match="outcome status"):
            decode(bad)


def test_encoder_refuses_what_the_peer_would_reject() -> None:
    with pytest.raises(ValueError):
        encode(SubmitRequest(b"\x01" * 32, (b"x",) * (MAX_SUBMIT_EVENTS + 1)))


def test_decoder_raises_only_relay_message_errors() -> None:
    rng = random.Random(FUZZ_SEED)
    valid = [encode(TemplateRequest(b"\x01" * 32, "message", None, b"p")),
             encode(SubmitRequest(b"\x01" * 32, (b"e",))),
             encode(Template(b"\x01" * 32, 1, (b"\x02" * 32,), (), 10, 1))]
    for case in range(FUZZ_CASES):
        base = bytearray(rng.choice(valid))
        for _ in range(rng.randint(1, 4)):
            base[rng.randrange(len(base))] = rng.randrange(256)
        data = bytes(base[:rng.randint(0, len(base))]) if case % 3 == 0 else bytes(base)
        try:
            decode(data)
        except RelayMessageError:
            pass


def test_garbage_request_is_refused_not_raised() -> None:
    world = World()
    for garbage in (b"", b"\xff" * 100, encode(Refused("x"))):
        reply = decode(world.server.handle(DEVICE.public_key, garbage, NOW_MS).response)
        assert isinstance(reply, Refused) and reply.reason == RelayReason.BAD_REQUEST
