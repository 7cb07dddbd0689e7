"""GossipSub on a py-libp2p host, configured so it carries what it should.

py-libp2p 0.8.1's defaults silently lose messages (see
`shared/research/py-libp2p-measurements.md` and section 4 of
`gossip-and-anti-entropy.md`). What this module sets, and why:

* Offer only `/meshsub/1.1.0` and `/meshsub/1.0.0`: with 1.2 the library sends
  IDONTWANT to every mesh peer for every message, doubling the per-message cost
  and filling the same outbound queue (4 hosts at 200 msg/s: 38% -> 100%).
* Degree 3 (low 2, high 4): small fleets, and every extra mesh link costs
  ~2-3 ms of CPU per message per node.
* Heartbeat 1 s (library default 120 s): mesh repair and GRAFT of late joiners.
* Spam protection off (default caps a topic at 10 msg/s per forwarder, even
  for our own publishes); adaptive gossip off (keeps the configured degrees);
  eclipse protection off (it wants 3 distinct IPs in a mesh, which a loopback
  cluster or a fleet behind one NAT never has, and keeps grafting).
* No libp2p message signature (`strict_signing=False`): events are already
  ed25519-signed by their author and checked by the Reference Monitor.
* Message id = BLAKE2b-256 over the topic names and the data, so the same
  bytes relayed twice are one message, whatever seqno/from they carry.
* The subscription queue is drained at once by a task into our own larger
  inbox, and overflow there is counted, not silent.
* Every joined topic has a topic validator (`GossipValidator`, set by the
  node: `Disseminator.check_gossip`): the library forwards a message, and
  hands it to us, only once it said yes, so junk (a non-member's signed
  events, bad signatures, garbage) stops at the first honest node and counts
  against the peer that forwarded it. It is synchronous and cheap (decode,
  signature, auth rules at the parents, no write); our own publishes skip it.
  A refused message id is cached by the library (`validation_cache`), so its
  copies from other peers cost one hash.
* The per-peer outbound RPC queue is enlarged (`transport.libp2p_patches.enlarge_gossip_queues`, applied by the host).

What the library would not let us configure:

* StrictNoSign: unsigned messages still carry `from` and `seqno` (the library
  always sets them) and signed messages from others are still accepted.
* The outbound queue size has no constructor argument (module-level
  workaround below); drops at that queue are only logged at DEBUG, so they
  cannot be counted here.
* Heartbeat is whole seconds (`heartbeat_interval: int`).
* No flood-publish; IHAVE gossip goes to non-mesh peers only, so with few
  peers gossip repairs nothing: anti-entropy remains the guarantee.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass

import trio
from libp2p.abc import IHost, ISubscriptionAPI
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub

from transport.libp2p_streams import parse_peer_id
from transport.messages import MAX_EVENTS_PER_MESSAGE

logger = logging.getLogger(__name__)

GOSSIP_PROTOCOLS = (PROTOCOL_ID_V11, PROTOCOL_ID)  # preference order
GOSSIP_DEGREE = 3
GOSSIP_DEGREE_LOW = 2
GOSSIP_DEGREE_HIGH = 4
GOSSIP_HEARTBEAT_S = 1  # the library takes whole seconds
GOSSIP_SEEN_TTL_S = 120  # dedup window for message ids
GOSSIP_INBOX_MESSAGES = 8192  # ours, between the drainers and the handler
# The library refuses RPCs above 1 MiB; leave room for the RPC envelope.
MAX_GOSSIP_MESSAGE_BYTES = 512 * 1024
MESSAGE_ID_BYTES = 32
# A Push's msgpack envelope (version, tag, topic id) and per-event framing
# (a bin header) are bounded by these; chunks leave room for both.
PUSH_ENVELOPE_BYTES = 64
PUSH_EVENT_FRAMING_BYTES = 5
ORIGIN_CACHE_SIZE = 1024  # from_id bytes -> base58, saves an encode per message

GossipHandler = Callable[[str, str, bytes], Awaitable[None]]
# (gossip topic, forwarding peer id, data) -> forward and take it in? Synchronous:
# the library runs sync validators inline, before its forwarding.
GossipValidator = Callable[[str, str, bytes], bool]


@dataclass(frozen=True)
class GossipConfig:
    enabled: bool = True
    degree: int = GOSSIP_DEGREE
    degree_low: int = GOSSIP_DEGREE_LOW
    degree_high: int = GOSSIP_DEGREE_HIGH
    heartbeat_s: int = GOSSIP_HEARTBEAT_S
    spam_protection: bool = False
    # Only used with spam_protection: size it to the topic's expected rate.
    max_messages_per_topic_per_second: float = 1000.0
    inbox_messages: int = GOSSIP_INBOX_MESSAGES


@dataclass(frozen=True)
class GossipStats:
    received: int
    inbox_dropped: int
    published: int
    validated: int = 0  # messages from others the validator accepted
    refused: int = 0  # ... and refused (neither forwarded nor taken in)


def content_message_id(message: rpc_pb2.Message) -> bytes:
    """BLAKE2b-256 over the length-prefixed topic names, then the data."""
    digest = hashlib.blake2b(digest_size=MESSAGE_ID_BYTES)
    for topic in message.topicIDs:
        name = topic.encode()
        digest.update(len(name).to_bytes(4, "big"))
        digest.update(name)
    digest.update(message.data)
    return digest.digest()


def gossip_chunks(raws: Sequence[bytes],
                  max_bytes: int = MAX_GOSSIP_MESSAGE_BYTES) -> Iterator[list[bytes]]:
    """Consecutive chunks of `raws`, each small enough for one gossip Push message.

    A batch publish is gossiped as one message per chunk, not one per event:
    gossipsub's cost is per message (an RPC, a message id, a seen-cache entry,
    a write per mesh peer). A chunk holds at most MAX_EVENTS_PER_MESSAGE
    events, and its encoded Push at most `max_bytes`; an event too large for
    any chunk (it cannot be, events are far below the limit) travels alone.
    """
    budget = max_bytes - PUSH_ENVELOPE_BYTES
    chunk: list[bytes] = []
    size = 0
    for raw in raws:
        cost = len(raw) + PUSH_EVENT_FRAMING_BYTES
        if chunk and (size + cost > budget or len(chunk) >= MAX_EVENTS_PER_MESSAGE):
            yield chunk
            chunk, size = [], 0
        chunk.append(raw)
        size += cost
    if chunk:
        yield chunk


@functools.lru_cache(maxsize=ORIGIN_CACHE_SIZE)
def _origin_of(from_id: bytes) -> str:
    try:
        return ID(from_id).to_base58()
    except Exception:
        return ""


def build_pubsub(host: IHost, config: GossipConfig) -> tuple[Pubsub, GossipSub]:
    """Router and pubsub, not yet running; create before the host connects."""
    router = GossipSub(
        protocols=list(GOSSIP_PROTOCOLS),
        degree=config.degree,
        degree_low=config.degree_low,
        degree_high=config.degree_high,
        heartbeat_interval=config.heartbeat_s,
        spam_protection_enabled=config.spam_protection,
        max_messages_per_topic_per_second=config.max_messages_per_topic_per_second,
        adaptive_gossip_enabled=False,
        eclipse_protection_enabled=False,
    )
    pubsub = Pubsub(
        host,
        router,
        strict_signing=False,
        msg_id_constructor=content_message_id,
        seen_ttl=GOSSIP_SEEN_TTL_S,
    )
    return pubsub, router


class GossipTopics:
    """Joined topics, their drainers, and the handler dispatch.

    Each joined topic gets a drainer task that moves messages from the
    library's subscription channel into one inbox at once; one dispatcher
    task calls the handler for each, in arrival order. Our own publishes,
    which the library also hands to our subscription, are skipped.
    """

    def __init__(
        self, pubsub: Pubsub, router: GossipSub, nursery: trio.Nursery, config: GossipConfig
    ) -> None:
        self._pubsub = pubsub
        self._router = router
        self._nursery = nursery
        self._own_id = pubsub.host.get_id().to_bytes()
        self._subscriptions: dict[str, ISubscriptionAPI] = {}
        self._inbox_send, self._inbox_receive = trio.open_memory_channel[tuple[str, rpc_pb2.Message]](
            config.inbox_messages
        )
        self.handler: GossipHandler | None = None
        self.validator: GossipValidator | None = None
        self._validated = 0
        self._refused = 0
        self._received = 0
        self._inbox_dropped = 0
        self._published = 0
        nursery.start_soon(self._dispatch)

    def stats(self) -> GossipStats:
        return GossipStats(self._received, self._inbox_dropped, self._published,
                           self._validated, self._refused)

    def topics(self) -> frozenset[str]:
        return frozenset(self._subscriptions)

    async def join(self, topic: str) -> None:
        if topic in self._subscriptions:
            return
        # Before subscribing: no message of the topic may pass unvalidated.
        self._pubsub.set_topic_validator(topic, functools.partial(self._validate, topic), False)
        subscription = await self._pubsub.subscribe(topic)
        self._subscriptions[topic] = subscription
        self._nursery.start_soon(self._drain, topic, subscription)

    async def leave(self, topic: str) -> None:
        if self._subscriptions.pop(topic, None) is None:
            return
        # Closes the library's channel, which ends our drainer.
        await self._pubsub.unsubscribe(topic)
        self._pubsub.remove_topic_validator(topic)

    def _validate(self, topic: str, forwarder: ID, message: rpc_pb2.Message) -> bool:
        """The library's sync topic validator: our own publishes pass, others ask `validator`."""
        if forwarder.to_bytes() == self._own_id:
            return True
        validator = self.validator
        if validator is None:
            return True
        try:
            accepted = validator(topic, forwarder.to_base58(), message.data)
        except Exception:
            # Never forward what could not be checked; the library would let the
            # exception end the forwarder's stream handler.
            logger.exception("gossip validator failed for topic %s", topic)
            accepted = False
        if accepted:
            self._validated += 1
        else:
            self._refused += 1
        return accepted

    async def publish(self, topic: str, data: bytes) -> None:
        if len(data) > MAX_GOSSIP_MESSAGE_BYTES:
            raise ValueError(
                f"gossip message of {len(data)} bytes exceeds MAX_GOSSIP_MESSAGE_BYTES={MAX_GOSSIP_MESSAGE_BYTES}"
            )
        await self._pubsub.publish(topic, data)
        self._published += 1

    def mesh_peers(self, topic: str) -> frozenset[str]:
        return frozenset(peer.to_base58() for peer in self._router.mesh.get(topic, ()))

    async def wait_mesh_peer(self, topic: str, peer_id: str, timeout_s: float) -> None:
        """Wait until `peer_id` is in our mesh for `topic`; `trio.TooSlowError` if not."""
        await self._router.wait_for_mesh(parse_peer_id(peer_id), topic, timeout=timeout_s)

    async def _drain(self, topic: str, subscription: ISubscriptionAPI) -> None:
        async for message in subscription:  # ends when we unsubscribe
            if message.from_id == self._own_id:
                continue
            try:
                self._inbox_send.send_nowait((topic, message))
            except trio.WouldBlock:
                # Counted, never silent; anti-entropy fetches what gossip lost.
                self._inbox_dropped += 1

    async def _dispatch(self) -> None:
        async for topic, message in self._inbox_receive:
            self._received += 1
            handler = self.handler
            if handler is None:
                continue
            try:
                await handler(topic, _origin_of(message.from_id), message.data)
            except Exception:
                logger.exception("gossip handler failed for topic %s", topic)
