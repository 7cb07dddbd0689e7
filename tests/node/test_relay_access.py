"""Who a relay answers: for an invite-only topic, members only; everyone else "not found".

`RelayServer` is sans-IO (a relay replica in memory, keys, a clock passed
in), so each property is exact: a key that may not read the topic gets the
very bytes a topic the relay never heard of gets (no ids, no role, no
reason), whatever it asks and whoever it was (a stranger, a banned or a
departed member); an invited key may ask for its own join and nothing else;
a member that is no relayed writer is told why; an open topic answers as
before. docs/access.md states the rules.
"""

from __future__ import annotations

import random

from node.core.event import KIND_MESSAGE, decode_event, pack_payload
from node.core.identity import Identity, sign_event
from node.relay import NOT_FOUND_DETAIL, Access, RelayServer, requester_access
from node.replica.replica import Replica
from node.state.types import RULE_PUBLIC, TYPE_MEMBER, Membership
from storage.memory import MemoryStore
from tests.helpers import authorized_topic, identity, sync
from transport.relay import (
    Refused,
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
UNKNOWN = b"\x07" * 32
JOIN = pack_payload({"membership": "join", "relayed": True})


class Relay:
    """Alice's topic on her own replica, which is the relay (a writer: it can reference)."""

    def __init__(self, join_rule: str = "invite") -> None:
        self.now_ms = NOW_MS
        self.rng = random.Random(3)
        self.replica = authorized_topic(author="alice", join_rule=join_rule)
        self.topic = self.replica.topic_id
        self.server = RelayServer(lambda t: self.replica if t == self.topic else None,
                                  random.Random(5))

    def tick(self) -> int:
        self.now_ms += 10
        return self.now_ms

    def raw(self, message: TemplateRequest | SubmitRequest, who: Identity) -> bytes:
        handled = self.server.handle(who.public_key, encode(message), self.tick())
        self.replica.commit()
        return handled.response

    def ask(self, message: TemplateRequest | SubmitRequest, who: Identity) -> object:
        return decode(self.raw(message, who))

    def template(self, who: Identity, kind: str = KIND_MESSAGE, state_key: str | None = None,
                 payload: bytes = b"x") -> TemplateRequest:
        return TemplateRequest(self.topic, kind, state_key, payload)

    def sign(self, who: Identity, template: Template, kind: str = KIND_MESSAGE,
             state_key: str | None = None, payload: bytes = b"x") -> bytes:
        return sign_event(who, topic=self.topic, seq=template.seq, parents=template.parents,
                          timestamp_ms=template.now_ms, kind=kind, payload=payload,
                          state_key=state_key, auth=template.auth).raw

    def join_device(self, device: Identity) -> None:
        """Grant `device` the writing level (invites it), then it joins as a relayed writer."""
        self.replica.add_writer(device.public_key, self.tick(), self.rng)
        self.replica.commit()
        own = device.public_key.hex()
        template = self.ask(self.template(device, TYPE_MEMBER, own, JOIN), device)
        assert isinstance(template, Template), template
        raw = self.sign(device, template, TYPE_MEMBER, own, JOIN)
        result = self.ask(SubmitRequest(self.topic, (raw,)), device)
        assert isinstance(result, SubmitResult) and result.outcomes[0].ok, result

    def not_found(self, who: Identity) -> bytes:
        """The relay's answer to `who` about a topic it never heard of."""
        return self.raw(SubmitRequest(UNKNOWN, ()), who)


def requests(relay: Relay, who: Identity, signed: tuple[bytes, ...]) -> list[object]:
    own = who.public_key.hex()
    return [relay.template(who), relay.template(who, TYPE_MEMBER, own, JOIN),
            relay.template(who, TYPE_MEMBER, identity("alice").public_key.hex(),
                           pack_payload({"membership": "leave"})),
            SubmitRequest(relay.topic, signed), SubmitRequest(relay.topic, ())]


def assert_only_not_found(relay: Relay, who: Identity, signed: tuple[bytes, ...] = ()) -> None:
    """Every request `who` can make about the topic gets the unknown topic's exact bytes."""
    expected = relay.not_found(who)
    assert decode(expected) == Refused(RelayReason.UNKNOWN_TOPIC, NOT_FOUND_DETAIL)
    for request in requests(relay, who, signed):
        assert relay.raw(request, who) == expected, request  # type: ignore[arg-type]


def test_a_stranger_gets_not_found_for_everything() -> None:
    relay = Relay()
    stranger = identity("stranger")
    forged_template = Template(relay.topic, 0, tuple(relay.replica.graph.extremities()), (),
                               10, NOW_MS)  # as if it had learned the heads elsewhere
    join = relay.sign(stranger, forged_template, TYPE_MEMBER, stranger.public_key.hex(), JOIN)
    assert_only_not_found(relay, stranger, (join,))
    assert relay.replica.graph.get(decode_event(join).id) is None  # never taken in
    assert relay.replica.graph.author_latest_seq(stranger.public_key) is None
    assert relay.server.stats["not_member_refused"] == len(requests(relay, stranger, ()))
    assert requester_access(relay.replica, stranger.public_key) is Access.NONE


def test_an_invitee_may_ask_for_its_join_and_nothing_else() -> None:
    relay = Relay()
    device = identity("device")
    relay.replica.add_writer(device.public_key, relay.tick(), relay.rng)  # invite + level
    relay.replica.commit()
    assert requester_access(relay.replica, device.public_key) is Access.INVITEE
    assert relay.raw(relay.template(device), device) == relay.not_found(device)
    own = device.public_key.hex()
    template = relay.ask(relay.template(device, TYPE_MEMBER, own, JOIN), device)
    assert isinstance(template, Template)
    raw = relay.sign(device, template, TYPE_MEMBER, own, JOIN)
    result = relay.ask(SubmitRequest(relay.topic, (raw,)), device)
    assert isinstance(result, SubmitResult) and result.outcomes[0].status is SubmitStatus.ACCEPTED
    # Joined: a reader now, and a relayed writer, so its messages are served.
    assert requester_access(relay.replica, device.public_key) is Access.READER
    template = relay.ask(relay.template(device), device)
    assert isinstance(template, Template)


def test_a_banned_device_gets_not_found_and_its_signed_events_are_not_taken() -> None:
    relay = Relay()
    device = identity("device")
    relay.join_device(device)
    template = relay.ask(relay.template(device), device)
    assert isinstance(template, Template)
    later = relay.sign(device, template)  # signed while a member, submitted after the ban
    relay.replica.ban(device.public_key, relay.tick(), relay.rng)
    relay.replica.commit()
    assert_only_not_found(relay, device, (later,))
    assert relay.replica.graph.get(decode_event(later).id) is None


def test_a_member_who_left_gets_not_found() -> None:
    relay = Relay()
    device = identity("device")
    relay.join_device(device)
    own = device.public_key.hex()
    leave = pack_payload({"membership": Membership.LEAVE})
    template = relay.ask(relay.template(device, TYPE_MEMBER, own, leave), device)
    assert isinstance(template, Template)
    raw = relay.sign(device, template, TYPE_MEMBER, own, leave)
    result = relay.ask(SubmitRequest(relay.topic, (raw,)), device)
    assert isinstance(result, SubmitResult) and result.outcomes[0].ok
    assert_only_not_found(relay, device)


def test_a_relay_without_the_create_event_answers_not_found() -> None:
    relay = Relay()
    waiting = Replica(MemoryStore(), relay.topic, identity("waiting"))  # joined by id only
    relay.server = RelayServer(lambda t: waiting if t == relay.topic else None,
                               random.Random(5))
    device = identity("device")
    assert relay.raw(relay.template(device), device) == relay.not_found(device)


def test_an_open_topic_answers_everyone_as_before() -> None:
    relay = Relay(join_rule=RULE_PUBLIC)
    stranger = identity("stranger")
    assert requester_access(relay.replica, stranger.public_key) is Access.READER
    reply = relay.ask(relay.template(stranger), stranger)
    assert isinstance(reply, Refused) and reply.reason == RelayReason.NOT_RELAYED_WRITER
    template = relay.ask(relay.template(stranger, TYPE_MEMBER, stranger.public_key.hex(), JOIN),
                         stranger)
    assert isinstance(template, Template)


def test_a_member_replica_reads_but_only_a_relayed_writer_submits() -> None:
    relay = Relay()
    bob = identity("bob")
    relay.replica.add_writer(bob.public_key, relay.tick(), relay.rng)
    relay.replica.commit()
    replica = Replica(MemoryStore(), relay.topic, bob)
    sync(relay.replica, replica)
    replica.join(relay.tick(), relay.rng)
    replica.commit()
    sync(replica, relay.replica)
    relay.replica.commit()
    event, _ = replica.publish(b"mine", relay.tick(), relay.rng)
    result = relay.ask(SubmitRequest(relay.topic, (event.raw,)), bob)
    assert isinstance(result, SubmitResult)
    assert result.outcomes[0].status is SubmitStatus.REJECTED
    assert result.outcomes[0].reason == RelayReason.NOT_RELAYED_WRITER
