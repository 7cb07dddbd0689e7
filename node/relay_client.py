"""The device side of the relay protocol: publish with a key and no replica.

A relayed writer holds only its ed25519 key. It dials a relay node over
libp2p (a bare host: no store, no gossip, no listening needed), asks for a
template (parents, auth references, next sequence number), signs the event
with `node.core.identity.sign_event` - the same code every node signs with -
and submits it (`transport.relay` has the messages, `node.relay` the relay's
rules). An id returned by `publish` is durable at the relay, which references
it promptly so it enters the topic's total order.

    async with RelayedWriter.open("device.key", relay_address, topic_id) as writer:
        await writer.join()                     # once: declares the relayed role
        event_id = await writer.publish(b"21.5C")
        ids = await writer.publish_many([b"a", b"b"])

Before `join` works an admin of the topic grants the device's key the writing
level (`megnode topic add-writer TOPIC DEVICE_KEY`, which also invites it).
One writer publishes one event at a time (a lock): each event's sequence
number and parents depend on the previous one. Errors are `RelayError`s whose
message is one line a user can act on.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from node.core.event import KIND_MESSAGE, Event, pack_payload
from node.core.identity import Identity, sign_event
from node.keyfile import KeyFileError, load_identity
from node.effects import PROTOCOL_DISSEMINATION
from node.state.types import TYPE_MEMBER, Membership, user_id
from node.state.roles import RELAYED_FLAG
from transport.libp2p_gossip import GossipConfig
from transport.libp2p_host import ConnectError, P2PHost
from transport.libp2p_requests import RequestError
from transport.relay import (
    MAX_SUBMIT_BYTES,
    MAX_SUBMIT_EVENTS,
    PROTOCOL_RELAY,
    Outcome,
    Refused,
    RelayMessageError,
    SubmitRequest,
    SubmitResult,
    Template,
    TemplateRequest,
    decode,
    encode,
)

RELAY_REQUEST_TIMEOUT_S = 15.0  # one template or submit exchange, connection included
RELAY_CONNECT_TIMEOUT_S = 10.0
# A device need not listen: it only dials. py-libp2p still wants an address to
# bind, so it binds an ephemeral loopback port nobody is told about.
DEVICE_LISTEN = ("/ip4/127.0.0.1/tcp/0",)
TOPIC_ID_BYTES = 32


class RelayError(Exception):
    """Publishing through the relay failed; the message is one line for the user."""


class RelayRefusedError(RelayError):
    """The relay refused the request as a whole; `reason` is a `transport.relay.RelayReason`
    value (a plain str: a newer relay may give one this build does not name)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"relay refused ({reason}): {detail}" if detail else
                         f"relay refused ({reason})")
        self.reason = reason
        self.detail = detail


class EventRejectedError(RelayError):
    """An event was rejected; `accepted` holds the ids of those before it that were not."""

    def __init__(self, index: int, outcome: Outcome, accepted: list[bytes]) -> None:
        super().__init__(f"event {index + 1} rejected by the relay: {outcome.reason}")
        self.reason = outcome.reason
        self.event_id = outcome.event_id
        self.accepted = accepted


def parse_topic_id(value: bytes | str) -> bytes:
    """A topic id from 32 bytes or 64 hex characters; RelayError otherwise."""
    if isinstance(value, bytes):
        raw = value
    else:
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            raw = b""
    if len(raw) != TOPIC_ID_BYTES:
        raise RelayError(f"not a topic id (64 hex characters): {value!r}")
    return raw


def load_key(key: Identity | str | Path) -> Identity:
    if isinstance(key, Identity):
        return key
    try:
        return load_identity(key)
    except KeyFileError as exc:
        raise RelayError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class _Clock:
    """The relay's clock as of a template, advanced by our monotonic clock.

    A small device may have no real-time clock; the relay's avoids its
    events being refused as from the future (Reference Monitor).
    """

    relay_ms: int
    at_ns: int

    def now_ms(self) -> int:
        return self.relay_ms + (time.monotonic_ns() - self.at_ns) // 1_000_000


def _sole_exception(group: BaseExceptionGroup) -> BaseException | None:
    """The one exception inside nested groups; None if there are several."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        item = pending.pop()
        if isinstance(item, BaseExceptionGroup):
            pending += item.exceptions
        else:
            leaves.append(item)
    return leaves[0] if len(leaves) == 1 else None


async def _ignore(peer: str, data: bytes) -> None:
    """Dissemination frames a relay sent before it knew this peer is a device."""


class RelayedWriter:
    """Publishes a key's events to one topic through one relay (see the module docstring)."""

    def __init__(self, identity: Identity, host: P2PHost, relay_peer: str, topic_id: bytes) -> None:
        self.identity = identity
        self.topic_id = topic_id
        self.relay_peer = relay_peer
        self._host = host
        self._lock = trio.Lock()

    @classmethod
    @asynccontextmanager
    async def open(cls, key: Identity | str | Path, relay_address: str,
                   topic_id: bytes | str) -> AsyncIterator["RelayedWriter"]:
        """Load the key, dial the relay, yield a writer; the connection closes on exit."""
        identity = load_key(key)
        topic = parse_topic_id(topic_id)
        host = P2PHost(bytes(identity.signing_key), DEVICE_LISTEN,
                       gossip=GossipConfig(enabled=False))
        try:
            async with host:
                # The relay sees a new peer and may offer it anti-entropy before the
                # first relay request tells it this is a device: swallow that quietly
                # rather than make the relay log a failed stream per device connection.
                host.set_message_handler(PROTOCOL_DISSEMINATION, _ignore)
                try:
                    peer = await host.connect(relay_address, timeout_s=RELAY_CONNECT_TIMEOUT_S)
                except ValueError as exc:
                    raise RelayError(f"bad relay address: {exc}") from None
                except ConnectError as exc:
                    raise RelayError(f"relay unreachable: {exc}") from None
                yield cls(identity, host, peer, topic)
        except BaseExceptionGroup as group:
            # The host's nurseries wrap whatever leaves the block; the caller
            # should see its own error (or ours), not three layers of groups.
            sole = _sole_exception(group)
            if sole is None:
                raise
            raise sole from None

    # ------------------------------------------------------------------ publishing

    async def publish(self, payload: bytes, kind: str = KIND_MESSAGE) -> bytes:
        """Sign and hand over one event; its id once the relay holds it durably."""
        return (await self.publish_many([payload], kind))[0]

    async def publish_many(self, payloads: Sequence[bytes], kind: str = KIND_MESSAGE) -> list[bytes]:
        """Publish a chain of events (each the next one's parent); their ids, in order.

        Sent in batches within transport.relay's bounds, one template per batch.
        On a rejection raises EventRejectedError naming the ids accepted before it.
        """
        ids: list[bytes] = []
        async with self._lock:
            remaining = list(payloads)
            while remaining:
                template, clock = await self._template(kind, None, remaining[0])
                batch = self._sign_chain(template, clock, kind, None, remaining)
                ids += await self._submit(batch, ids)
                remaining = remaining[len(batch):]
        return ids

    async def join(self) -> bytes:
        """Join the topic as a relayed writer (after an invite and a writing-level grant)."""
        payload = pack_payload({"membership": Membership.JOIN, RELAYED_FLAG: True})
        state_key = user_id(self.identity.public_key)
        async with self._lock:
            template, clock = await self._template(TYPE_MEMBER, state_key, payload)
            batch = self._sign_chain(template, clock, TYPE_MEMBER, state_key, [payload])
            return (await self._submit(batch, []))[0]

    def _sign_chain(self, template: Template, clock: _Clock, kind: str, state_key: str | None,
                    payloads: Sequence[bytes]) -> list[Event]:
        """Sign up to one submit's worth of `payloads`: the first on the template's
        parents, each next one on the previous (same auth refs: they change no state)."""
        events: list[Event] = []
        size = 0
        parents = template.parents
        for index, payload in enumerate(payloads[:MAX_SUBMIT_EVENTS]):
            event = sign_event(
                self.identity, topic=self.topic_id, seq=template.seq + index, parents=parents,
                timestamp_ms=clock.now_ms(), kind=kind, payload=payload, state_key=state_key,
                auth=template.auth)
            if events and size + len(event.raw) > MAX_SUBMIT_BYTES:
                break
            events.append(event)
            size += len(event.raw)
            parents = (event.id,)
            if state_key is not None:
                break  # a state event changes the auth refs of what follows: new template
        return events

    # ------------------------------------------------------------------ requests

    async def _template(self, kind: str, state_key: str | None,
                        payload: bytes) -> tuple[Template, _Clock]:
        reply = await self._request(encode(TemplateRequest(self.topic_id, kind, state_key, payload)))
        if not isinstance(reply, Template) or reply.topic != self.topic_id:
            raise RelayError(f"the relay answered a template request with {type(reply).__name__}")
        return reply, _Clock(reply.now_ms, time.monotonic_ns())

    async def _submit(self, events: list[Event], accepted_before: list[bytes]) -> list[bytes]:
        reply = await self._request(encode(SubmitRequest(self.topic_id, tuple(e.raw for e in events))))
        if (not isinstance(reply, SubmitResult) or reply.topic != self.topic_id
                or len(reply.outcomes) != len(events)):
            raise RelayError("the relay answered a submit with something else than one outcome "
                             "per event")
        ids: list[bytes] = []
        for index, (event, outcome) in enumerate(zip(events, reply.outcomes)):
            if not outcome.ok:
                raise EventRejectedError(len(accepted_before) + index, outcome,
                                         accepted_before + ids)
            ids.append(event.id)
        return ids

    async def _request(self, data: bytes) -> Template | SubmitResult:
        try:
            response = await self._host.request(self.relay_peer, PROTOCOL_RELAY, data,
                                                timeout_s=RELAY_REQUEST_TIMEOUT_S)
        except RequestError as exc:
            raise RelayError(f"relay unreachable or not serving {PROTOCOL_RELAY}: {exc}") from None
        try:
            reply = decode(response)
        except RelayMessageError as exc:
            raise RelayError(f"invalid response from the relay: {exc}") from None
        if isinstance(reply, Refused):
            raise RelayRefusedError(reply.reason, reply.detail)
        if not isinstance(reply, (Template, SubmitResult)):
            raise RelayError(f"the relay answered with a {type(reply).__name__}")
        return reply
