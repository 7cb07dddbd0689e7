"""Relayed writers over the network: real nodes, real libp2p on 127.0.0.1, real LMDB.

A relay node creates an invite-only topic, a second node joins it, and a
device that holds only a key publishes through the relay (`RelayedWriter`).
The properties that matter: the device's event is accepted (durable at the
relay), referenced by the relay's own event, delivered to the second node,
and part of the confirmed total order there; a device that is no member of
the invite-only topic hears "not found" and a member without the relayed
role is refused with a reason; garbage is refused and the relay
keeps serving. Every wait is bounded and waits on a condition.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from node.core.event import decode_event, pack_payload
from node.core.identity import Identity, sign_event
from node.relay import NOT_FOUND_DETAIL
from node.relay_client import RelayedWriter, RelayError, RelayRefusedError
from node.runtime import Node, Topic
from node.state.types import TYPE_MEMBER, Membership
from transport.libp2p_gossip import GossipConfig
from transport.libp2p_host import P2PHost
from transport.relay import (
    PROTOCOL_RELAY,
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

TEST_TIMEOUT_S = 60.0
WAIT_S = 30.0
LOOPBACK_LISTEN = ["/ip4/127.0.0.1/tcp/0"]
LINES = 5


@asynccontextmanager
async def relay_world(tmp_path: Path) -> AsyncIterator[tuple[Node, Node, Topic, Topic]]:
    """Relay node A (creator of an invite-only topic) and node B, joined and ready."""
    async with Node.open(tmp_path / "a", listen=LOOPBACK_LISTEN, seed=1) as a:
        topic_a = await a.create_topic("sensors", access="invite")
        async with Node.open(tmp_path / "b", listen=LOOPBACK_LISTEN,
                             bootstrap=[a.addresses[0]], seed=2) as b:
            await topic_a.add_writer(b.identity.public_key)
            topic_b = await b.join(topic_a.topic_id)
            await topic_b.wait_ready(WAIT_S)
            with trio.fail_after(WAIT_S):
                while topic_b.membership() != Membership.JOIN:
                    await trio.sleep(0.05)
            yield a, b, topic_a, topic_b


async def wait_confirmed(topic: Topic, event_id: bytes) -> int:
    """The confirmed position of `event_id` at `topic` (bounded wait)."""
    with trio.fail_after(WAIT_S):
        async for delivered in topic.subscribe(order="confirmed"):
            if delivered.event.id == event_id:
                return delivered.position
    raise AssertionError("unreachable")


async def wait_referenced_by(topic: Topic, event_id: bytes, authors: set[bytes]) -> None:
    graph = topic.replica.graph
    with trio.fail_after(WAIT_S):
        while not any(graph.get(child).author in authors for child in graph.children(event_id)):
            await trio.sleep(0.02)


async def test_device_publishes_through_relay_into_confirmed_order(tmp_path: Path) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with relay_world(tmp_path) as (a, b, topic_a, topic_b):
            device = Identity.from_seed(b"d" * 32)
            await topic_a.add_writer(device.public_key)  # invite + writing level
            async with RelayedWriter.open(device, a.addresses[0], topic_a.id_hex) as writer:
                await writer.join()  # declares the relayed role
                event_id = await writer.publish(b"21.5C")
                more = await writer.publish_many([b"line %d" % i for i in range(LINES)])
            assert topic_a.replica.role_of(device.public_key).value == "relayed"
            # Durable and authorised at the relay; never authored by the relay itself.
            event = topic_a.replica.graph.get(event_id)
            assert event is not None and event.author == device.public_key
            assert not topic_a.replica.is_rejected(event_id)
            # The device's chain: sequence numbers in a row; within one batch each event
            # is the next one's parent (a new template starts on the tip above the last).
            chain = [topic_a.replica.graph.get(i) for i in [event_id, *more]]
            assert [e.seq for e in chain] == list(range(chain[0].seq, chain[0].seq + LINES + 1))
            assert all(chain[i].id in chain[i + 1].parents for i in range(1, LINES))
            # A writer references the device's latest event (an ack: the relay's, or the
            # second node's when it holds the event first), so the chain gets ordered.
            await wait_referenced_by(topic_a, more[-1],
                                     {a.identity.public_key, b.identity.public_key})
            # Delivered to the second node and confirmed there, in the device's order.
            positions = [await wait_confirmed(topic_b, i) for i in [event_id, *more]]
            assert positions == sorted(positions)
            assert positions == [await wait_confirmed(topic_a, i) for i in [event_id, *more]]
            assert a.status()["stats"]["relay.submitted.accepted"] == LINES + 2  # join too
            # Every request was rate-limited by its source address too, not only its key.
            assert a.status()["stats"]["relay.requests_with_source"] == \
                a.status()["stats"]["relay.requests"]


async def test_unauthorised_device_is_refused_with_a_reason(tmp_path: Path) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with relay_world(tmp_path) as (a, _b, topic_a, _topic_b):
            stranger = Identity.from_seed(b"s" * 32)
            async with RelayedWriter.open(stranger, a.addresses[0], topic_a.topic_id) as writer:
                # Invite-only, and nobody invited it: "not found", the very answer for a
                # topic the relay never heard of (no role, no auth-rule reason: docs/access.md).
                with pytest.raises(RelayRefusedError) as refused:
                    await writer.publish(b"let me in")
                assert refused.value.reason == RelayReason.UNKNOWN_TOPIC
                assert refused.value.detail == NOT_FOUND_DETAIL
                with pytest.raises(RelayRefusedError) as refused:
                    await writer.join()
                assert refused.value.reason == RelayReason.UNKNOWN_TOPIC
                assert refused.value.detail == NOT_FOUND_DETAIL
            async with RelayedWriter.open(stranger, a.addresses[0], b"\x07" * 32) as writer:
                with pytest.raises(RelayRefusedError) as unknown:
                    await writer.join()
                assert str(unknown.value) == str(refused.value)
            # A full writer's key is not a relayed writer either: it publishes itself.
            async with RelayedWriter.open(_b.identity, a.addresses[0], topic_a.topic_id) as writer:
                with pytest.raises(RelayRefusedError) as refused:
                    await writer.publish(b"heads belong to replicas")
                assert refused.value.reason == RelayReason.NOT_RELAYED_WRITER
            assert topic_a.replica.graph.author_latest_seq(stranger.public_key) is None
            with pytest.raises(RelayError, match="not a topic id"):
                async with RelayedWriter.open(stranger, a.addresses[0], "beef"):
                    pass


async def raw_request(host: P2PHost, peer: str, data: bytes) -> object:
    return decode(await host.request(peer, PROTOCOL_RELAY, data))


async def test_garbage_is_refused_and_the_relay_keeps_serving(tmp_path: Path) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with relay_world(tmp_path) as (a, _b, topic_a, _topic_b):
            device = Identity.from_seed(b"g" * 32)
            other = Identity.from_seed(b"o" * 32)
            await topic_a.add_writer(device.public_key)
            async with P2PHost(bytes(device.signing_key), LOOPBACK_LISTEN,
                               gossip=GossipConfig(enabled=False)) as host:
                peer = await host.connect(a.addresses[0])
                for garbage in (b"", b"\xc1", b"\x93\x01\x02\x03", encode(Refused("x", "y"))):
                    reply = await raw_request(host, peer, garbage)
                    assert isinstance(reply, Refused) and reply.reason == RelayReason.BAD_REQUEST
                reply = await raw_request(host, peer, encode(SubmitRequest(b"\x07" * 32, ())))
                assert isinstance(reply, Refused) and reply.reason == RelayReason.UNKNOWN_TOPIC
                # The device joins with a hand-made event (as RelayedWriter.join does) ...
                join_payload = pack_payload({"membership": "join", "relayed": True})
                template = await raw_request(host, peer, encode(TemplateRequest(
                    topic_a.topic_id, TYPE_MEMBER, device.public_key.hex(), join_payload)))
                assert isinstance(template, Template)
                join = sign_event(device, topic=topic_a.topic_id, seq=template.seq,
                                  parents=template.parents, timestamp_ms=template.now_ms,
                                  kind=TYPE_MEMBER, state_key=device.public_key.hex(),
                                  payload=join_payload, auth=template.auth)
                reply = await raw_request(host, peer, encode(SubmitRequest(topic_a.topic_id,
                                                                           (join.raw,))))
                assert isinstance(reply, SubmitResult) and reply.outcomes[0].ok
                # ... then per-event rejections: not an event, another key's, a bad signature.
                template = await raw_request(host, peer, encode(TemplateRequest(
                    topic_a.topic_id, "message", None, b"y")))
                assert isinstance(template, Template)
                foreign = sign_event(other, topic=topic_a.topic_id, seq=0, parents=template.parents,
                                     timestamp_ms=template.now_ms, kind="message", payload=b"x",
                                     auth=template.auth)
                mine = sign_event(device, topic=topic_a.topic_id, seq=template.seq,
                                  parents=template.parents, timestamp_ms=template.now_ms,
                                  kind="message", payload=b"y", auth=template.auth)
                forged = mine.raw[:-3] + bytes(b ^ 0xFF for b in mine.raw[-3:])
                reply = await raw_request(host, peer, encode(SubmitRequest(
                    topic_a.topic_id, (b"junk", foreign.raw, forged))))
                assert isinstance(reply, SubmitResult)
                assert [o.status for o in reply.outcomes] == [SubmitStatus.REJECTED] * 3
                assert reply.outcomes[0].reason.startswith(RelayReason.NOT_AN_EVENT)
                assert reply.outcomes[1].reason == RelayReason.AUTHOR_NOT_SENDER
                assert reply.outcomes[2].reason == "bad_signature"
            # Still serving, and nothing of the garbage was stored.
            assert all(topic_a.replica.graph.get(i) is None
                       for i in (foreign.id, decode_event(forged).id))
            async with RelayedWriter.open(device, a.addresses[0], topic_a.topic_id) as writer:
                event_id = await writer.publish(b"after the garbage")
            assert topic_a.replica.graph.get(event_id) is not None
            assert a.status()["stats"]["relay.refused.bad_request"] == 4
