"""The node: the sans-IO core driven by trio, libp2p and LMDB.

One `Node` owns one LMDB store, one libp2p host and one nursery. Everything
it starts — inbound message handling, the protocol timer, outbound senders,
the log writer, bootstrap dialling — belongs to that nursery and stops when
the `async with Node.open(...)` block exits (or the process gets Ctrl-C).

    async with Node.open("data/", listen=["/ip4/0.0.0.0/tcp/4001"]) as node:
        topic = await node.create_topic("kitchen")
        event_id = await topic.publish(b"21.5C")          # returns once durable
        async for delivered in topic.subscribe(since=0):   # causal order, resumable
            print(delivered.position, delivered.event.payload)

The core (`Disseminator` + `Replica`s) is synchronous and runs on the trio
thread: a call into it never awaits, so no two handlers interleave inside it
and no lock is needed. Its effects are carried out here: `Send` goes to
the peer's own bounded outbound queue without waiting (a stalled peer never
holds up the core or the other peers; when its queue is full the frame is
dropped and anti-entropy repairs the gap), `Log` goes to the JSON-lines dissemination log, and
`Disconnect` drops a misbehaving peer.

Data dir layout::

    node.key      the identity (ed25519 seed, mode 0600), created on first open
    store/        the LMDB environment (locked: one process per data dir)
    logs/         dissemination logs (analytics.logschema), rotated
    control.sock  the local control socket used by the `megnode` CLI
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from analytics.logschema import JsonLinesLogWriter
from node.committer import CommitError, Committer
from node.config import NodeConfig
from node.core.event import Event
from node.core.identity import Identity, KeyFileError
from node.core.replica import Replica, ReplicaConfig, StateDisabledError
from node.ordering import KIND_ACK, OrderConfig, Rewind
from node.metrics import MetricsExporter, close_listeners, open_metrics_listeners
from node.relay import Handled, RelayServer
from node.state.actions import NotAuthorizedError, RoleError
from node.state.roles import Role
from node.state.types import RULE_INVITE, RULE_PUBLIC
from storage.lmdb_store import LmdbStore, StoreLockedError
from storage.protocol import TABLE_META, Delete, Put
from transport.dissemination import (
    Announce,
    Disconnect,
    DisseminationConfig,
    Disseminator,
    Log,
    Send,
)
from transport.libp2p_gossip import GossipConfig, gossip_chunks
from transport import libp2p_write_path
from transport.libp2p_streams import Misbehaviour, StreamLimits
from transport.messages import MAX_FRAME_BYTES
from transport.relay import PROTOCOL_RELAY, REASON_BAD_REQUEST, Refused
from transport.relay import encode as encode_relay
from transport.libp2p_host import (
    ConnectError,
    P2PHost,
    PeerEvent,
    check_ports_free,
    peer_id_of_public_key,
    public_key_of_peer_id,
)
from transport.libp2p_redial import Redialer

logger = logging.getLogger("megnode")

PROTOCOL_DISSEMINATION = "/megnode/dissemination/1.0.0"
GOSSIP_TOPIC_PREFIX = "megnode/topic/"
KEY_FILE = "node.key"
STORE_DIR = "store"
CONTROL_SOCKET = "control.sock"

TICK_INTERVAL_S = 0.05  # how often the protocol timer runs; its own intervals are longer
PEER_EVENT_CAPACITY = 1_024
SUBSCRIBE_BATCH = 256  # deliveries read from the store per wake-up
BOOTSTRAP_RETRY_S = 2.0
BOOTSTRAP_RETRY_MAX_S = 30.0
MAX_TOPICS = 1_024
JOIN_RETRY_MS = 1_000
# Protocol faults on our own streams (oversized or garbage framing, trailing
# bytes: see transport.libp2p_streams) come over an authenticated channel, so
# they are the peer's code, not line noise; still, one could be our own bug
# or a library glitch, and a ban splits the fleet for BAN_DURATION_MS. So a
# peer is banned at the third within TRANSPORT_FAULT_WINDOW_MS: a hostile
# peer reaches that at once, an honest one never. Breakages (a stream ending
# mid-frame because its connection died) never count: they are logged and
# counted as `transport_breakages`.
TRANSPORT_FAULTS_BEFORE_BAN = 3
TRANSPORT_FAULT_WINDOW_MS = 10 * 60 * 1_000
BAN_DURATION_MS = 10 * 60 * 1_000  # a peer disconnected for misbehaviour stays out this long
ACCESS_OPEN = "open"
ACCESS_INVITE = "invite"
ACCESS_MODES = (ACCESS_OPEN, ACCESS_INVITE)
_TOPIC_META_PREFIX = b"megnode/topic/"
_WANTS_MEMBERSHIP = b"join"


def sole_exception(group: BaseExceptionGroup) -> BaseException | None:
    """The one exception inside `group` (through nested groups), or None if there are more."""
    leaves: list[BaseException] = []

    def collect(error: BaseException) -> None:
        if isinstance(error, BaseExceptionGroup):
            for inner in error.exceptions:
                collect(inner)
        else:
            leaves.append(error)

    collect(group)
    return leaves[0] if len(leaves) == 1 else None


class NodeError(Exception):
    """The node cannot do what was asked; the message says why (for users, not tracebacks)."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Delivered:
    """One event handed to a subscriber: its position in the topic's delivery order."""

    position: int
    event: Event


class _Changes:
    """Wakes subscribers when a topic's delivery count grows; ends them when it is left."""

    def __init__(self) -> None:
        self._event = trio.Event()
        self._closed = False

    def notify(self) -> None:
        self._event.set()
        self._event = trio.Event()

    def close(self) -> None:
        """The topic was left: every waiter (now or later) gets NodeError."""
        self._closed = True
        self.notify()

    async def wait(self) -> None:
        if not self._closed:
            await self._event.wait()
        if self._closed:
            raise NodeError("this topic was left")


class Topic:
    """A handle on one joined topic of a running node."""

    def __init__(self, node: "Node", replica: Replica) -> None:
        self._node = node
        self.replica = replica
        self.topic_id = replica.topic_id
        self._changes = _Changes()
        self.wants_membership = False  # join as soon as the topic's state allows
        self._acks_counted_to = 0  # delivery position up to which acks were counted
        self._acks = 0
        self.last_join_attempt_ms = -JOIN_RETRY_MS

    def membership(self) -> str | None:
        """This node's membership in the topic state ("join", "invite", ...), if any."""
        if not self.replica.ready or not self.replica.authorizing:
            return None
        member = self.replica.state().get(("m.room.member", self._node.node_id))
        if member is None:
            return None
        content = member.content()
        return content.get("membership") if isinstance(content, dict) else None

    def state(self) -> dict[str, dict[str, Any]]:
        """The current resolved topic state as {"type|state_key": {sender, content}}."""
        out: dict[str, dict[str, Any]] = {}
        for (kind, key), event in sorted(self.replica.state().items()):
            try:
                content = event.content()
            except Exception:
                content = None
            out[f"{kind}|{key}"] = {"event": event.id.hex(), "sender": event.author.hex(),
                                    "content": content}
        return out

    def _order_status(self) -> dict[str, Any] | None:
        if not self.replica.ready or not self.replica.authorizing:
            return None
        status = self.replica.order_status()
        return None if status is None else status.as_dict()

    async def set_state(self, kind: str, state_key: str, content: dict[str, Any]) -> bytes:
        return self._node._state_action(self, lambda r, n, g: [r.set_state(kind, state_key, content, n, g)])[-1]

    async def invite(self, key: bytes) -> bytes:
        return self._node._state_action(self, lambda r, n, g: [r.invite(key, n, g)])[-1]

    async def add_writer(self, key: bytes) -> bytes | None:
        """Make `key` a writer; the id of the last event that did, or None if it already was."""
        made = self._node._state_action(self, lambda r, n, g: list(r.add_writer(key, n, g)))
        return made[-1] if made else None

    async def set_role(self, key: bytes, role: str) -> bytes | None:
        """Give `key` a role; the id of the last event that did, or None if it had it already."""
        try:
            parsed = Role(role)
        except ValueError:
            raise NodeError(f"role must be one of {', '.join(r.value for r in Role)}") from None
        made = self._node._state_action(self, lambda r, n, g: list(r.set_role(key, parsed, n, g)))
        return made[-1] if made else None

    async def ban(self, key: bytes, reason: str | None = None) -> bytes:
        return self._node._state_action(self, lambda r, n, g: [r.ban(key, n, g, reason=reason)])[-1]

    @property
    def id_hex(self) -> str:
        return self.topic_id.hex()

    @property
    def ready(self) -> bool:
        """True once the topic's create event is here (publishing needs it)."""
        return self.replica.ready

    async def publish(self, payload: bytes, kind: str = "message") -> bytes:
        """Author an event; returns its id once it is durable (LMDB commit) and sent on."""
        return await self._node._publish(self, payload, kind)

    async def publish_many(self, payloads: Sequence[bytes], kind: str = "message") -> list[bytes]:
        """Author several events in one group commit; their ids once all are durable."""
        return await self._node._publish_many(self, payloads, kind)

    async def wait_ready(self, timeout_s: float) -> None:
        with trio.fail_after(timeout_s):
            while not self.ready:
                await self._changes.wait()

    async def wait_delivered(self, count: int, timeout_s: float) -> None:
        """Wait until at least `count` events (create event included) are delivered here."""
        with trio.fail_after(timeout_s):
            while self.replica.graph.delivered_count < count:
                await self._changes.wait()

    async def subscribe(self, since: int = 0,
                        order: str = "causal") -> AsyncIterator[Delivered | Rewind]:
        """Events from position `since` on, waiting for more.

        order="causal": every delivered event, never before its parents (default).
        order="confirmed": the quorum-confirmed total order; positions never change.
        order="tentative": the full order (confirmed prefix, then the tentative
        tail), which may reorder: a `Rewind(to_length)` item says to drop every
        entry from position `to_length` on; the `Delivered` items after it replay
        from there. Each `Delivered` position is the subscriber's current length
        (positions from `since` on are watched). Only these yield `Rewind`.
        """
        if order not in ("causal", "confirmed", "tentative"):
            raise NodeError('subscribe order must be "causal", "confirmed" or "tentative"')
        if order != "causal":
            view = self._subscribe_confirmed if order == "confirmed" else self._subscribe_tentative
            async for item in view(since):
                yield item
            return
        position = since
        while True:
            batch = self.replica.deliveries(since=position, limit=SUBSCRIBE_BATCH)
            if not batch:
                if position < self.replica.graph.delivered_count:
                    position = self.replica.graph.delivered_count  # only rejected events there
                    continue
                await self._changes.wait()
                continue
            for pos, event in batch:
                yield Delivered(pos, event)
                position = pos + 1

    async def _subscribe_confirmed(self, since: int) -> AsyncIterator[Delivered]:
        position = since
        while True:
            batch = (self.replica.ordered("confirmed", since=position, limit=SUBSCRIBE_BATCH)
                     if self.replica.ready and self.replica.authorizing else [])
            if not batch:
                await self._changes.wait()
                continue
            for pos, event in batch:
                yield Delivered(pos, event)
                position = pos + 1

    async def _subscribe_tentative(self, since: int) -> AsyncIterator[Delivered | Rewind]:
        position = since  # the subscriber's length
        stable = since  # entries sent below this were confirmed: they never change
        sent: list[bytes] = []  # ids sent at positions stable .. position - 1
        while True:
            order = self.replica.ordering if self.replica.ready and self.replica.authorizing else None
            if order is None:
                await self._changes.wait()
                continue
            # The order may have changed while the consumer held an item: compare
            # what was sent with the current view; only unconfirmed entries can differ.
            current = order.full_slice(stable, len(sent))
            keep = next((i for i, (_, now) in enumerate(current) if sent[i] != now), len(current))
            if keep < len(sent):
                del sent[keep:]
                position = stable + keep
                yield Rewind(position)
            settled = min(order.confirmed_length, position) - stable
            if settled > 0:
                del sent[:settled]
                stable += settled
            batch = self.replica.ordered("tentative", since=position, limit=SUBSCRIBE_BATCH)
            if not batch:
                await self._changes.wait()
                continue
            for pos, event in batch:
                yield Delivered(pos, event)
                sent.append(event.id)
                position = pos + 1

    def _count_acks(self) -> int:
        """Acknowledgements among delivered events (counted incrementally, bounded per call)."""
        graph = self.replica.graph
        end = graph.delivered_count
        while self._acks_counted_to < end:
            page = graph.deliveries(self._acks_counted_to, limit=SUBSCRIBE_BATCH * 4)
            self._acks += sum(1 for _, event in page if event.kind == KIND_ACK)
            self._acks_counted_to = page[-1][0] + 1
        return self._acks

    def status(self) -> dict[str, Any]:
        graph = self.replica.graph
        return {
            "topic": self.id_hex,
            "name": self.replica.params.name,
            "ready": self.ready,
            "delivered": graph.delivered_count,
            "acks": self._count_acks(),  # empty acknowledgements among the delivered
            "extremities": graph.width,
            "buffered": graph.buffered_count,
            "equivocations": graph.equivocation_count,
            "membership": self.membership(),
            "indexers": sorted(k.hex() for k in self.replica.indexers())
            if self.replica.ready and self.replica.authorizing else [],
            "order": self._order_status(),
            "rejected": {k.split(".", 1)[1]: v for k, v in self.replica.counters.items()
                         if k.startswith("rejected.")},
        }


class Node:
    """A running megnode: use `async with Node.open(data_dir, ...) as node:`."""

    def __init__(self, data_dir: Path, identity: Identity, store: LmdbStore, config: NodeConfig,
                 host: P2PHost, nursery: trio.Nursery, log_writer: JsonLinesLogWriter | None,
                 rng: random.Random,
                 peer_events: trio.MemoryReceiveChannel[PeerEvent],
                 misbehaviour: trio.MemoryReceiveChannel[Misbehaviour]) -> None:
        self.data_dir = data_dir
        self.identity = identity
        self.store = store
        self.config = config
        self.host = host
        self._nursery = nursery
        self._log_writer = log_writer
        self._rng = rng
        self.node_id = identity.public_key.hex()
        fast_path = config.fast_path
        self.disseminator = Disseminator(
            self.node_id, rng,
            DisseminationConfig(
                push=fast_path == "push",
                # GossipSub carries every event authored here (`Announce` effects).
                announce=fast_path == "gossipsub",
                sync_interval_ms=config.anti_entropy_interval_ms,
                sync_jitter_ms=min(config.anti_entropy_jitter_ms,
                                   config.anti_entropy_interval_ms - 1),
                width_sample_ms=config.width_sample_interval_ms,
                misbehaviour_threshold=config.peer_misbehaviour_limit,
                # The metrics' latency histogram reads the `delivered` records too.
                log=log_writer is not None or config.metrics_port > 0,
            ),
        )
        self._topics: dict[bytes, Topic] = {}
        self._banned: dict[str, int] = {}  # node id -> ms until which its connections are dropped
        self._dropping: set[str] = set()  # banned node ids whose connections are being aborted
        self._peer_receive = peer_events
        self._misbehaviour_receive = misbehaviour
        self._transport_faults: dict[str, int] = {}
        self.stats: dict[str, int] = {"outbox_dropped": 0, "send_failed": 0, "log_failed": 0}
        self.metrics: MetricsExporter | None = None  # set by open() when metrics_port > 0
        # Incoming frames and local publishes are applied in group commits (node.committer).
        self.committer = Committer(self.disseminator, self._run, now_ms,
                                   window_ms=config.commit_interval_ms)
        # Relayed writers' requests (node.relay); their peers are devices, not replicas.
        self.relay = RelayServer(self._relay_replica, rng)
        self._relay_clients: set[str] = set()  # node ids of connected relay clients

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        data_dir: str | Path,
        *,
        listen: Sequence[str] | None = None,
        bootstrap: Sequence[str] | None = None,
        config: NodeConfig | None = None,
        seed: int | None = None,
    ) -> AsyncIterator["Node"]:
        """Open (creating if needed) the data dir, start networking, yield the node."""
        config = (config or NodeConfig()).with_overrides(
            listen=list(listen) if listen is not None else None,
            bootstrap=list(bootstrap) if bootstrap is not None else None)
        data_dir = Path(data_dir)
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise NodeError(f"cannot create data dir {data_dir}: {exc.strerror}") from None
        identity = load_or_create_identity(data_dir / KEY_FILE)
        try:
            store = LmdbStore(data_dir / STORE_DIR)
        except StoreLockedError as exc:
            raise NodeError(str(exc)) from None
        log_writer = None
        peer_send, peer_receive = trio.open_memory_channel[PeerEvent](PEER_EVENT_CAPACITY)

        def on_peer(event: PeerEvent) -> None:
            # Runs inside py-libp2p's notifee task: record only, never block.
            try:
                peer_send.send_nowait(event)
            except trio.WouldBlock:
                logger.warning("peer event queue full; dropping %s", event)

        misbehaviour_send, misbehaviour_receive = trio.open_memory_channel[Misbehaviour](
            PEER_EVENT_CAPACITY)

        def on_misbehaviour(report: Misbehaviour) -> None:
            try:
                misbehaviour_send.send_nowait(report)
            except trio.WouldBlock:
                pass  # a flood of reports: the ones already queued will ban the peer

        try:
            async with AsyncExitStack() as stack:
                metrics_listeners = []  # bound first: a taken port is a plain NodeError
                if config.metrics_port:
                    try:
                        metrics_listeners = await open_metrics_listeners(config.metrics_port)
                    except OSError as exc:
                        raise NodeError(f"cannot serve metrics on port {config.metrics_port}: "
                                        f"{exc.strerror or exc}") from None
                    stack.push_async_callback(close_listeners, metrics_listeners)
                if config.log_dir is not None:
                    log_writer = JsonLinesLogWriter(data_dir / config.log_dir,
                                                    identity.public_key.hex())
                gossip = GossipConfig(enabled=config.fast_path == "gossipsub")
                # One frame of the dissemination protocol may be as large as the
                # protocol allows (a bounded reply of many events).
                transport_timeout_s = config.transport_timeout_ms / 1000
                limits = StreamLimits(max_message_bytes=MAX_FRAME_BYTES,
                                      open_stream_timeout_s=transport_timeout_s,
                                      message_write_timeout_s=transport_timeout_s)
                # The write-stall bound is one value per process (the write path patches
                # py-libp2p's classes); put it back on exit for the next in-process node.
                stack.callback(setattr, libp2p_write_path, "stall_timeout_s",
                               libp2p_write_path.stall_timeout_s)
                libp2p_write_path.stall_timeout_s = transport_timeout_s
                try:
                    check_ports_free(config.listen)
                    host = P2PHost(bytes(identity.signing_key), config.listen, gossip=gossip,
                                   limits=limits, on_peer=on_peer,
                                   on_misbehaviour=on_misbehaviour)
                    await stack.enter_async_context(host)
                except OSError as exc:
                    raise NodeError(f"cannot listen on {', '.join(config.listen)}: {exc}") from None
                except ValueError as exc:
                    raise NodeError(f"bad listen address {', '.join(config.listen)}: {exc}") from None
                if not host.listen_addrs():
                    # py-libp2p logs a failed bind (port taken, address not local)
                    # and carries on listening nowhere; a node nobody can reach
                    # is a mistake to report, not to run.
                    raise NodeError(f"cannot listen on {', '.join(config.listen)}: the address "
                                    "is in use or not on this machine")
                nursery = await stack.enter_async_context(trio.open_nursery())
                node = cls(data_dir, identity, store, config, host, nursery, log_writer,
                           random.Random(seed), peer_receive, misbehaviour_receive)
                if metrics_listeners:
                    node.metrics = MetricsExporter(node, metrics_listeners)
                await node._start()
                try:
                    yield node
                finally:
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # The node's and the host's nurseries wrap whatever leaves the
            # `async with` body; hand a lone exception back as itself, so an
            # embedding application's `except NodeError` (or its own
            # exception types) still match.
            sole = sole_exception(group)
            if sole is None:
                raise
            raise sole from None
        finally:
            if log_writer is not None:
                log_writer.close()
            store.close()

    async def _start(self) -> None:
        host = self.host
        host.set_message_handler(PROTOCOL_DISSEMINATION, self._on_frame)
        host.set_request_handler(PROTOCOL_RELAY, self._on_relay_request)
        if host.gossip_enabled:
            host.set_gossip_handler(self._on_gossip)
        for topic_id, wants_membership in self._stored_topics():
            topic = await self._open_topic(topic_id)
            topic.wants_membership = wants_membership
        self._nursery.start_soon(self._peer_events)
        self._nursery.start_soon(self._transport_misbehaviour)
        self._nursery.start_soon(self._ticker)
        self._nursery.start_soon(self.committer.run)
        if self.metrics is not None:
            self._nursery.start_soon(self.metrics.serve)
        # Peers whose connection dies (stalled, stale, restarted) are redialled
        # while wanted (see _wants_peer); transport faults are windowed per peer.
        self._redialer = Redialer(self.host, self._nursery, self._rng, self._wants_peer)
        self._fault_times: dict[str, list[int]] = {}
        for address in self.config.bootstrap:
            self._nursery.start_soon(self._dial_with_retry, address)
        if self.config.mdns:
            self._nursery.start_soon(self._discover_on_lan)

    # ------------------------------------------------------------------ topics

    @property
    def topics(self) -> dict[bytes, Topic]:
        return dict(self._topics)

    def topic(self, topic_id: bytes) -> Topic:
        try:
            return self._topics[topic_id]
        except KeyError:
            raise NodeError(f"not a member of topic {topic_id.hex()}") from None

    async def create_topic(self, name: str = "", d_max: int | None = None,
                           access: str = ACCESS_OPEN) -> Topic:
        """Create a new topic with this node's identity as its creator and first indexer.

        `access="open"`: anyone who knows the topic id may join and publish (a
        publish-subscribe topic). `access="invite"`: members must be invited,
        and writing is granted per member (`Topic.add_writer`).
        """
        if access not in ACCESS_MODES:
            raise NodeError(f"access must be one of {', '.join(ACCESS_MODES)}")
        kwargs = {} if d_max is None else {"d_max": d_max}
        try:
            replica = Replica.create_topic(
                self.store, self.identity, now_ms(), name=name, config=self._replica_config(),
                authorization=True, join_rule=RULE_PUBLIC if access == ACCESS_OPEN else RULE_INVITE,
                members_write=access == ACCESS_OPEN, **kwargs)
        except ValueError as exc:
            raise NodeError(str(exc)) from None
        topic = await self._register(replica)
        now = now_ms()
        effects: list[object] = []
        for _, event in replica.graph.deliveries(0, limit=16):  # create + the bootstrap state
            effects += self.disseminator.on_publish(replica.topic_id, event, now)
        self._run(effects)
        return topic

    async def join(self, topic_id: bytes | str) -> Topic:
        """Join a topic by id: its events arrive from peers (anti-entropy fetches the root)."""
        topic_id = parse_topic_id(topic_id)
        if topic_id in self._topics:
            return self._topics[topic_id]
        topic = await self._open_topic(topic_id)
        topic.wants_membership = True
        self.store.apply([Put(TABLE_META, _TOPIC_META_PREFIX + topic_id, _WANTS_MEMBERSHIP)])
        for peer in self.disseminator.peers:
            self._run(self.disseminator.sync_with(peer, topic_id, now_ms()))
        return topic

    async def leave(self, topic_id: bytes | str) -> None:
        """Stop replicating a topic (its events stay in the store for a later re-join)."""
        topic_id = parse_topic_id(topic_id)
        topic = self._topics.pop(topic_id, None)
        if topic is None:
            raise NodeError(f"not a member of topic {topic_id.hex()}")
        self.disseminator.remove_topic(topic_id)
        topic._changes.close()  # its subscribers end (NodeError) instead of waiting for ever
        self.store.apply([Delete(TABLE_META, _TOPIC_META_PREFIX + topic_id)])
        if self.host.gossip_enabled:
            await self.host.leave(GOSSIP_TOPIC_PREFIX + topic_id.hex())

    def _replica_config(self) -> ReplicaConfig:
        interval = self.config.ack_interval_ms
        return ReplicaConfig(ordering=OrderConfig() if interval is None
                             else OrderConfig(ack_interval_ms=interval))

    async def _open_topic(self, topic_id: bytes) -> Topic:
        replica = Replica(self.store, topic_id, self.identity, self._replica_config())
        return await self._register(replica)

    async def _register(self, replica: Replica) -> Topic:
        if len(self._topics) >= MAX_TOPICS:
            raise NodeError(f"this node already replicates MAX_TOPICS={MAX_TOPICS} topics")
        topic = Topic(self, replica)
        self._topics[replica.topic_id] = topic
        self.disseminator.add_topic(replica)
        self.store.apply([Put(TABLE_META, _TOPIC_META_PREFIX + replica.topic_id, b"")])
        if self.host.gossip_enabled:
            await self.host.join(GOSSIP_TOPIC_PREFIX + replica.topic_id.hex())
        return topic

    def _stored_topics(self) -> list[tuple[bytes, bool]]:
        prefix = _TOPIC_META_PREFIX
        return [(key[len(prefix):], value == _WANTS_MEMBERSHIP)
                for key, value in self.store.scan(TABLE_META, prefix)]

    def _acknowledge(self, now: int) -> None:
        """Indexers append empty acks so confirmation does not stall when writers go quiet
        (rate-limited inside the replica; see Replica.maybe_ack)."""
        for topic in self._topics.values():
            replica = topic.replica
            if not replica.ready or not replica.authorizing:
                continue
            try:
                made = replica.maybe_ack(now, self._rng)
            except Exception as exc:  # no power to ack, ordering off: nothing to do
                logger.debug("no ack on %s: %s", topic.id_hex, exc)
                continue
            if made is not None:
                self._run(self.disseminator.on_publish(topic.topic_id, made[0], now))

    def _pursue_memberships(self, now: int) -> None:
        """Join topics we asked to join, once their state says we may (rate-limited)."""
        for topic in self._topics.values():
            if not topic.wants_membership or now - topic.last_join_attempt_ms < JOIN_RETRY_MS:
                continue
            replica = topic.replica
            if not replica.ready or not replica.authorizing:
                continue
            if topic.membership() == "join":
                topic.wants_membership = False
                continue
            topic.last_join_attempt_ms = now
            try:
                event, _ = replica.join(now, self._rng)
            except NotAuthorizedError as exc:
                logger.info("cannot join %s yet: %s", topic.id_hex, exc)
                continue
            self._run(self.disseminator.on_publish(topic.topic_id, event, now))

    # ------------------------------------------------------------------ publishing

    async def _publish(self, topic: Topic, payload: bytes, kind: str) -> bytes:
        return (await self._publish_many(topic, [payload], kind))[0]

    async def _publish_many(self, topic: Topic, payloads: Sequence[bytes],
                            kind: str) -> list[bytes]:
        """Author the events in the committer's next batch (one group commit with whatever
        else arrived); their ids once that commit returned and they were sent on."""
        if not payloads:
            return []
        self._check_publishable(topic)
        replica = topic.replica

        def make(now: int) -> list[Event]:  # runs inside the batch step
            events: list[Event] = []
            try:
                for payload in payloads:
                    events.append(replica.publish(payload, now, self._rng, kind=kind)[0])
            except NotAuthorizedError as exc:
                if events:
                    replica.graph.discard_pending()  # all or nothing
                raise NodeError(f"not allowed to publish: {exc}") from None
            return events

        try:
            events = await self.committer.author(topic.topic_id, make)
        except CommitError as exc:
            raise NodeError(f"publish not stored: {exc}") from None
        return [e.id for e in events]

    def _state_action(self, topic: Topic, action) -> list[bytes]:
        """Run a state-changing replica action; publish its events; their ids."""
        self._check_publishable(topic)
        try:
            made = action(topic.replica, now_ms(), self._rng)
        except (NotAuthorizedError, RoleError, StateDisabledError) as exc:
            raise NodeError(str(exc)) from None
        now = now_ms()
        effects: list[object] = []
        for event, _ in made:
            effects += self.disseminator.on_publish(topic.topic_id, event, now)
        self._run(effects)
        return [event.id for event, _ in made]

    def _check_publishable(self, topic: Topic) -> None:
        if topic.topic_id not in self._topics:
            raise NodeError("this topic was left")
        if not topic.ready:
            raise NodeError("the topic's create event has not arrived yet; wait for sync "
                            "(Topic.wait_ready) before publishing")

    async def _gossip_publish(self, topic_id: bytes, raws: Sequence[bytes]) -> None:
        """Gossip a batch of new events: one Push per chunk that fits a gossip message."""
        from transport.messages import Push, encode  # the same frame the push path uses

        name = GOSSIP_TOPIC_PREFIX + topic_id.hex()
        for chunk in gossip_chunks(list(raws)):
            try:
                await self.host.publish(name, encode(Push(topic_id, tuple(chunk))))
            except Exception as exc:  # gossip is best effort: anti-entropy repairs
                logger.debug("gossip publish failed: %s", exc)

    # ------------------------------------------------------------------ relayed writers

    def _relay_replica(self, topic_id: bytes) -> Replica | None:
        topic = self._topics.get(topic_id)
        return None if topic is None else topic.replica

    async def _on_relay_request(self, peer: str, data: bytes) -> bytes:
        """A relayed device's request (node.relay, transport.relay). A submit is answered
        only after what it added is durable, disseminated, and an ack is asked for."""
        node_id = self._node_id_of(peer)
        if node_id is None:
            return encode_relay(Refused(REASON_BAD_REQUEST, "not an ed25519 peer id"))
        if node_id not in self._relay_clients:
            # A device, not a replica: keep it out of push fan-out and anti-entropy.
            self._relay_clients.add(node_id)
            self._run(self.disseminator.on_peer_down(node_id, now_ms()))
        handled = self.relay.handle(bytes.fromhex(node_id), data, now_ms())
        if handled.topic is not None and handled.wrote:
            self._relayed_accepted(handled)
        return handled.response

    def _relayed_accepted(self, handled: Handled) -> None:
        """Commit what a submit added, push it on as its entry point, reference it now."""
        topic = self._topics.get(handled.topic) if handled.topic is not None else None
        if topic is None:
            return
        topic.replica.commit()  # one group commit for the whole submit
        now = now_ms()
        effects: list[object] = []
        for event in handled.applied:  # commits nothing more; logs `created` here, pushes
            effects += self.disseminator.on_publish(topic.topic_id, event, now)
        self._run(effects)
        self._acknowledge(now)  # the relay duty: reference them (rate-limited in the replica)

    # ------------------------------------------------------------------ effects

    def _run(self, effects: Sequence[object]) -> None:
        """Carry out the core's effects, then wake subscribers of topics that moved.

        Announcements (events authored here, for GossipSub) of one call are
        gossiped together per topic: one gossip message per chunk, not per event.
        """
        announced: dict[bytes, list[bytes]] = {}
        for effect in effects:
            if isinstance(effect, Announce):
                announced.setdefault(effect.topic, []).extend(effect.raws)
            elif isinstance(effect, Send):
                self._send_now(effect.peer, effect.data)
            elif isinstance(effect, Log):
                self._write_log(effect.record)
                if self.metrics is not None:
                    self.metrics.on_log(effect.record)
            elif isinstance(effect, Disconnect):
                logger.warning("disconnecting peer %s: %s", effect.peer, effect.reason)
                self._banned[effect.peer] = now_ms() + BAN_DURATION_MS
                self._nursery.start_soon(self._disconnect, effect.peer)
        if announced and self.host.gossip_enabled:
            for topic_id, raws in announced.items():
                self._nursery.start_soon(self._gossip_publish, topic_id, raws)
        for topic in self._topics.values():
            topic._changes.notify()

    def _write_log(self, record: dict[str, Any]) -> None:
        if self._log_writer is None:
            return
        try:
            self._log_writer.write(record)
        except (OSError, ValueError) as exc:
            self.stats["log_failed"] += 1
            logger.debug("log record dropped: %s", exc)

    async def _disconnect(self, peer: str) -> None:
        """Drop a banned peer's connections at once (`abort`: no goodbye it could stall)."""
        if peer in self._dropping:
            return  # an abort is under way; `_enforce_bans` looks again next tick
        self._dropping.add(peer)
        try:
            await self.host.abort(self._peer_id_of(peer))
        except Exception as exc:
            logger.debug("disconnect of %s failed: %s", peer, exc)
        finally:
            self._dropping.discard(peer)

    def _enforce_bans(self, now: int) -> None:
        """Drop connections of banned peers; forget bans that expired.

        The "up" event alone is not enough: it fires when a peer's first
        connection opens, and a banned peer that dials again while its old
        connection is still being torn down gets no new "up". So every tick
        looks at who is connected.
        """
        banned = self._banned
        for node_id in [n for n, until in banned.items() if until <= now]:
            del banned[node_id]
        if not banned:
            return
        for peer_id in self.host.peers():
            node_id = self._node_id_of(peer_id)
            if node_id in banned:
                self._nursery.start_soon(self._disconnect, node_id)

    def _wants_peer(self, peer_id: str) -> bool:
        """Should a connection to `peer_id` that died be redialled? Not if banned or a device."""
        node_id = self._node_id_of(peer_id)
        return (node_id is not None and node_id not in self._relay_clients
                and self._banned.get(node_id, 0) <= now_ms())

    # ------------------------------------------------------------------ background tasks

    # The core names peers by their node id (hex of the ed25519 key, the id the
    # logs use); libp2p by peer id. An ed25519 peer id embeds the key, so the two
    # convert both ways without a table that could go stale.

    @staticmethod
    def _node_id_of(peer_id: str) -> str | None:
        try:
            key = public_key_of_peer_id(peer_id)
        except Exception:
            return None
        return None if key is None else key.hex()

    @staticmethod
    def _peer_id_of(node_id: str) -> str:
        return peer_id_of_public_key(bytes.fromhex(node_id))

    def _send_now(self, peer: str, data: bytes) -> None:
        """Queue a frame on the peer's own stream; a full queue drops it (anti-entropy repairs).

        Never waits: one stalled peer must not hold up frames to the others.
        """
        try:
            if not self.host.send_nowait(self._peer_id_of(peer), PROTOCOL_DISSEMINATION, data):
                self.stats["outbox_dropped"] += 1
        except Exception as exc:  # the peer went away or its stream failed
            self.stats["send_failed"] += 1
            logger.debug("send to %s failed: %s", peer, exc)

    async def _ticker(self) -> None:
        while True:
            self._run(self.disseminator.tick(now_ms()))
            self._enforce_bans(now_ms())
            self._pursue_memberships(now_ms())
            self._acknowledge(now_ms())
            await trio.sleep(TICK_INTERVAL_S)

    async def _peer_events(self) -> None:
        async for event in self._peer_receive:
            node_id = self._node_id_of(event.peer_id)
            if node_id is None:
                logger.info("ignoring peer %s: not an ed25519 identity", event.peer_id)
                continue
            # Connection churn, refreshed on every peer event (status reads self.stats).
            self.stats["connections_aborted"] = self.host.connections_aborted
            self.stats["redials"] = self._redialer.redials
            if event.up:
                if node_id in self._relay_clients:
                    continue  # a relayed device: no replica to gossip or sync with
                if self._banned.get(node_id, 0) > now_ms():
                    self._nursery.start_soon(self._disconnect, node_id)  # still banned
                    continue
                self._redialer.peer_up(event.peer_id)
                self._run(self.disseminator.on_peer_up(node_id, now_ms()))
            else:
                if node_id not in self._relay_clients:
                    self._redialer.peer_down(event.peer_id)
                self._relay_clients.discard(node_id)
                self._run(self.disseminator.on_peer_down(node_id, now_ms()))

    async def _transport_misbehaviour(self) -> None:
        """What the transport reported about a peer's streams.

        Protocol faults (oversized, garbage framing): TRANSPORT_FAULTS_BEFORE_BAN of them
        within TRANSPORT_FAULT_WINDOW_MS disconnect and ban the peer. Breakages (a stream
        cut mid-frame by its dying connection) are only logged and counted.
        """
        async for report in self._misbehaviour_receive:
            node_id = self._node_id_of(report.peer_id)
            if node_id is None:
                continue
            if not report.is_protocol_fault:
                self.stats["transport_breakages"] = self.stats.get("transport_breakages", 0) + 1
                logger.info("peer %s: stream broke (%s: %s); not counted as a fault",
                            node_id, report.reason, report.detail)
                continue
            now = now_ms()
            recent = [t for t in self._fault_times.get(node_id, ())
                      if now - t < TRANSPORT_FAULT_WINDOW_MS]
            recent.append(now)
            self._fault_times[node_id] = recent
            self._transport_faults[node_id] = self._transport_faults.get(node_id, 0) + 1
            self.stats["transport_faults"] = self.stats.get("transport_faults", 0) + 1
            logger.info("peer %s: transport fault %s (%s)", node_id, report.reason, report.detail)
            if len(recent) >= TRANSPORT_FAULTS_BEFORE_BAN:
                del self._fault_times[node_id]
                self.stats["transport_bans"] = self.stats.get("transport_bans", 0) + 1
                self._run([Disconnect(node_id, f"transport:{report.reason}")])

    async def _on_frame(self, peer: str, data: bytes) -> None:
        node_id = self._node_id_of(peer)
        if node_id is not None:
            await self.committer.receive(node_id, data)  # applied in the next group commit

    async def _on_gossip(self, topic_name: str, origin: str, data: bytes) -> None:
        # The origin a GossipSub message names is unsigned (strict_signing is off:
        # events carry their own signatures) and others relayed it: its faults
        # must not be held against that origin (`accountable=False`).
        node_id = self._node_id_of(origin)
        if node_id is not None:
            await self.committer.receive(node_id, data, accountable=False)

    async def _dial_with_retry(self, address: str) -> None:
        delay = BOOTSTRAP_RETRY_S
        while True:
            try:
                await self.connect(address)
                return
            except NodeError as exc:
                logger.info("bootstrap %s: %s (retrying in %.0f s)", address, exc, delay)
            await trio.sleep(delay)
            delay = min(delay * 2, BOOTSTRAP_RETRY_MAX_S)

    async def _discover_on_lan(self) -> None:
        """Dial the megnode peers mDNS finds on the LAN (config `mdns`); see node.mdns."""
        from node import mdns  # imported only when enabled: zeroconf is a heavy import

        dialling: set[str] = set()
        try:
            async with mdns.mdns_discovery(self.host.libp2p, self.addresses) as found:
                async for peer in found:
                    if peer.peer_id not in dialling and peer.peer_id not in self.host.peers():
                        dialling.add(peer.peer_id)
                        self._nursery.start_soon(self._dial_discovered, peer, dialling)
        except mdns.MdnsError as exc:
            logger.warning("mDNS discovery is off: %s", exc)

    async def _dial_discovered(self, peer: Any, dialling: set[str]) -> None:
        from node import mdns

        try:
            # Both sides find each other at about the same time; one dial is enough.
            if peer.peer_id > self.host.peer_id:
                await trio.sleep(mdns.DIAL_DEFER_S)
            delay = mdns.DIAL_RETRY_S
            for _ in range(mdns.DIAL_ATTEMPTS):
                for address in peer.addresses:
                    if peer.peer_id in self.host.peers():
                        return
                    try:
                        await self.connect(address)
                        return
                    except NodeError as exc:
                        logger.info("mDNS peer %s: %s", address, exc)
                await trio.sleep(delay)
                delay *= 2
        finally:
            dialling.discard(peer.peer_id)  # found again later, it is dialled again

    # ------------------------------------------------------------------ peers and status

    async def connect(self, address: str) -> str:
        """Dial a peer by its /p2p/ multiaddr; returns its peer id.

        A peer we hold a connection to is checked first (P2PHost.connect): a
        dead connection is dropped and dialled anew, not taken as "connected".
        """
        try:
            peer_id = await self.host.connect(address)
        except ValueError as exc:
            raise NodeError(str(exc)) from None
        except ConnectError as exc:
            raise NodeError(str(exc)) from None
        self._redialer.remember(peer_id, [address])
        return peer_id

    @property
    def addresses(self) -> tuple[str, ...]:
        return self.host.listen_addrs()

    def status(self) -> dict[str, Any]:
        return {
            "node": self.node_id,
            "peer_id": self.host.peer_id,
            "addresses": list(self.addresses),
            "peers": sorted(self.host.peers()),
            "fast_path": self.config.fast_path,
            "topics": [t.status() for t in self._topics.values()],
            "stats": dict(self.stats) | {k: v for k, v in self.disseminator.stats.items()}
            | {f"relay.{k}": v for k, v in self.relay.stats.items()},
        }


def parse_topic_id(value: bytes | str) -> bytes:
    if isinstance(value, bytes):
        if len(value) != 32:
            raise NodeError("a topic id is 32 bytes")
        return value
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise NodeError(f"not a topic id (64 hex characters): {value!r}")
    return raw


def load_or_create_identity(path: Path) -> Identity:
    """The node's identity from `path`, generated (mode 0600) if the file does not exist."""
    if not path.exists():
        identity = Identity.generate()
        try:
            identity.save(path)
        except KeyFileError as exc:
            raise NodeError(str(exc)) from None
        return identity
    try:
        return Identity.load(path)
    except KeyFileError as exc:
        raise NodeError(str(exc)) from None
