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
and no lock is needed. Every write to the store — received frames, publishes,
state actions, acks, joins, relayed submits, topic creation and the node's
own topic records — goes through the committer (node.committer), the only
writer: one queue, applied in order, one commit per step, and the caller
wakes (or the effects go out) only once it is durable.

This module wires the parts and owns the lifecycle and the table of joined
topics; each part is its own module:

    node.topic_handle    `Topic`: publish, state actions, subscriptions, status
    node.topic_writes    what the node authors inside committer steps (publishes,
                         state actions, acks, membership joins)
    node.effects         the engine's effects on the network and the log
    node.peer_executor   the pure peer policy's inputs and effects (bans, redials)
    node.dialer          `connect`, bootstrap dialling, mDNS discovery
    node.topic_records   the durable list of the topics this node replicates
    node.relay_intake    relayed writers' requests, through the committer
    node.keyfile         the node's key file (`load_or_create_identity`)
    node.errors          `NodeError`, `JoinRefusedError`

Data dir layout::

    node.key      the identity (ed25519 seed, mode 0600), created on first open
    store/        the LMDB environment (locked: one process per data dir)
    logs/         dissemination logs (node.logschema), rotated
    control.sock  the local control socket used by the `megnode` CLI
"""

from __future__ import annotations

import itertools
import logging
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from node.topic_writes import TopicWrites
from node.committer import Act, CommitError, Committer, Create, Drive, Records, Tick
from node.config import FastPath, NodeConfig
from node.control_client import CONTROL_SOCKET
from node.core.event import Event
from node.core.identity import Identity
from node.core.peer_policy import TRANSPORT_FAULTS_BEFORE_BAN, PeerPolicy
from node.backup import BackupError, finish_backup, prepare_target
from node.check import quick_check_topic
from node.core.store import DamagedTopicError, Op, StoreError, damaged_topic_message
from node.core.peer_book import PeerBook
from node.core.parents import DepletionPolicy
from node.dialer import Dialer
from node.fleet import BookKeeper, ConnectionKeeper, PeerExchange, peers_report
from node.effects import (GOSSIP_TOPIC_PREFIX, PROTOCOL_DISSEMINATION, EffectRunner,
                          gossip_message_topic, gossip_topic)
from node.errors import JoinRefusedError, NodeError, TopicNotFound, sole_exception
from node.keyfile import load_or_create_identity
from node.logschema import JsonLinesLogWriter
from node.metrics import MetricsExporter, close_listeners, open_metrics_listeners
from node.peer_executor import PeerExecutor
from node.peer_ids import node_id_of, now_ms
from node.relay_intake import RelayIntake, remote_ip
from node.replica.cache_budget import CacheBudget
from node.replica.delivery_count import DeliveryCount
from node.replica.ordering import OrderConfig
from node.replica.replica import Replica, ReplicaConfig
from node.state.types import HISTORY_SETTINGS, HISTORY_SHARED, RULE_INVITE, RULE_PUBLIC, Membership
from node.topic_handle import (
    COUNT_PAUSE_S,
    COUNT_SLICE_EVENTS,
    MAX_REJECT_REASONS_SHOWN,
    Delivered,
    Topic,
    most_common,
    parse_topic_id,
)
from node.topic_records import WANTS_MEMBERSHIP, forget_topic, stored_topics, topic_record
from node.data_dir import KEY_FILE, STORE_DIR, open_data_dir
from storage.lmdb_store import LmdbStore
from transport.dissemination import Disseminator, key_of_hex_peer
from transport.dissemination_config import DisseminationConfig
from transport.libp2p_gossip import GossipConfig
from transport.libp2p_host import P2PHost
from transport.libp2p_listen import check_ports_free
from transport.libp2p_liveness import PeerEvent
from transport.libp2p_redial import Redialer
from transport.libp2p_streams import Misbehaviour, StreamLimits
from transport.messages import MAX_FRAME_BYTES
from transport.relay import PROTOCOL_RELAY

# The names callers import from here (the CLI, the control socket, the relay
# client, tests, the README), some re-exported from the modules that own them.
__all__ = [
    "ACCESS_INVITE", "ACCESS_MODES", "ACCESS_OPEN", "CONTROL_SOCKET", "Delivered",
    "GOSSIP_TOPIC_PREFIX", "JOIN_HANDSHAKE_TIMEOUT_S", "JoinRefusedError", "KEY_FILE",
    "MAX_TOPICS", "Node", "NodeError",
    "PROTOCOL_DISSEMINATION", "STORE_DIR", "TRANSPORT_FAULTS_BEFORE_BAN", "Topic",
    "load_or_create_identity", "now_ms", "parse_topic_id", "sole_exception",
]

logger = logging.getLogger("megnode")


TICK_INTERVAL_S = 0.05  # how often the protocol timer runs; its own intervals are longer
PEER_EVENT_CAPACITY = 1_024
MAX_TOPICS = 1_024
MAX_BANS_SHOWN = 32  # banned peers listed by status (their count is always given)
MAX_REFUSALS_SHOWN = 8  # the intake's newest refusals listed by status, newest first
# A join by id (no local state) gives up after this long: waiting for a first peer,
# asking peers (`Disseminator.request_join`) and receiving enough of the topic to
# hold its own join. A member answers at once and the topic follows by
# anti-entropy, so a second is usual on a LAN; ten leave room for a slow link.
JOIN_HANDSHAKE_TIMEOUT_S = 10.0
ACCESS_OPEN = "open"
ACCESS_INVITE = "invite"
ACCESS_MODES = (ACCESS_OPEN, ACCESS_INVITE)


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
        self.node_id = identity.public_key.hex()
        fast_path = config.fast_path
        self.disseminator = Disseminator(
            self.node_id, rng,
            DisseminationConfig(
                push=fast_path in (FastPath.PUSH, FastPath.TREE),
                tree=fast_path == FastPath.TREE,  # transport.eager_lazy
                # GossipSub carries every event authored here (`Announce` effects).
                announce=fast_path == FastPath.GOSSIPSUB,
                sync_interval_ms=config.anti_entropy_interval_ms,
                sync_jitter_ms=min(config.anti_entropy_jitter_ms,
                                   config.anti_entropy_interval_ms - 1),
                width_sample_ms=config.width_sample_interval_ms,
                misbehaviour_threshold=config.peer_misbehaviour_limit,
                # The metrics' latency histogram reads the `delivered` records too.
                log=log_writer is not None or config.metrics_port > 0,
            ),
            commits=False,  # the committer is the node's only writer
            # The engine names peers by node id: the hex of the ed25519 key their
            # libp2p peer id embeds (node.peer_ids.node_id_of), which the Noise
            # handshake proved. The read filter of private topics reads that key.
            peer_key=key_of_hex_peer,
        )
        self._topics: dict[bytes, Topic] = {}
        # The topics' biggest caches share one budget (issue 17: flat memory).
        self._cache_budget = CacheBudget()
        self._cache_shares = self._cache_budget.shares(1)  # as last applied to every topic
        # Joins by handshake under way: a second `join` of the same topic waits for it.
        self._joining: dict[bytes, trio.Event] = {}
        # GossipSub: topics subscribed (open ones), and topics whose join rule is
        # not known yet (no create event): decided once they are ready (`_ticker`).
        self._gossip_subscribed: set[bytes] = set()
        self._gossip_undecided: set[bytes] = set()
        # Stored topics the start check found damaged (node.check): not opened, not served.
        self.damaged_topics: dict[bytes, str] = {}
        self.stats: dict[str, int] = {"outbox_dropped": 0, "send_failed": 0, "log_failed": 0,
                                      "redials": 0, "gossip_ignored": 0, "frames_from_banned": 0,
                                      "connections_gated": 0}
        self.metrics: MetricsExporter | None = None  # set by open() when metrics_port > 0
        self._peer_receive = peer_events
        self._misbehaviour_receive = misbehaviour
        # Peers whose connection dies (stalled, stale, restarted) are redialled
        # when the peer policy says (`Redial` effects); the Redialer knows addresses.
        redialer = Redialer(host)
        # Bans, transport-fault windows and redial backoff are decided by the pure
        # peer policy (node.core.peer_policy); the executor feeds it events and
        # carries out its effects (node.peer_executor).
        self.peer_policy = PeerPolicy(rng)
        # Every peer met, kept across restarts (node.core.peer_book; node.fleet writes it).
        self.peer_book = PeerBook.load(store)
        self._peers = PeerExecutor(self.peer_policy, host, redialer, self.disseminator,
                                   nursery, self.stats, self._run, self.peer_book)
        self._effects = EffectRunner(host, nursery, self._topics, self.stats, log_writer,
                                     on_misbehaving=self._peers.misbehaved)
        self._dialer = Dialer(host, redialer, nursery)
        # The node's only writer: frames, local authoring, ticks and the node's
        # own records are applied in its steps, one commit each (node.committer).
        self.committer = Committer(self.disseminator, self._run, now_ms, store,
                                   window_ms=config.commit_interval_ms)
        self.committer.on_damaged = lambda topic_id, exc: self.mark_damaged(topic_id, exc.what)
        self._writes = TopicWrites(self.committer, self._topics, rng)
        # Relayed writers' requests (node.relay_intake); their peers are devices, not replicas.
        self._relay_intake = RelayIntake(self.committer, self._topics,
                                         self._peers.add_relay_client,
                                         self._writes.acknowledge, rng,
                                         lambda peer: remote_ip(host.libp2p, peer))
        self.relay = self._relay_intake.server
        self._book_keeper = BookKeeper(self.peer_book, self.committer, host, self._dialer,
                                       nursery, dial=config.dial_known_peers)
        # Peers tell each other where the peers of shared topics are (node.fleet).
        self._peer_exchange = PeerExchange(
            self.peer_book, host, self._dialer, nursery,
            topics=lambda: [(t, topic.replica.may_read) for t, topic in self._topics.items()
                            if topic.ready],
            wanted=lambda: self._connections.wants_more(), is_banned=self._peers.is_banned,
            reset_redial=self._peers.reset_redial, stats=self.stats)
        # How many connections, and which (node.core.connection_manager; node.fleet).
        self._connections = ConnectionKeeper(
            config.connection_limits(), self.peer_book, host, self._dialer, nursery,
            our_topics=lambda: {t.hex() for t in self._topics},
            remote_ip=lambda peer: remote_ip(host.libp2p, peer), stats=self.stats,
            fill=config.dial_known_peers)
        self._peers.on_replica_up = self._peer_exchange.peer_up
        self._peers.admit = self._connections.peer_up
        self._peers.on_down = self._connections.peer_down
        self._peers.wants_redial = self._connections.needs_more

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
        reinit: bool = False,
    ) -> AsyncIterator["Node"]:
        """Open (creating if needed) the data dir, start networking, yield the node.

        `reinit` lets a node that has run before start with a missing or empty
        store (`node.data_dir_open`); without it that is refused.
        """
        config = (config or NodeConfig()).with_overrides(
            listen=list(listen) if listen is not None else None,
            bootstrap=list(bootstrap) if bootstrap is not None else None)
        data_dir = Path(data_dir)
        identity, store = open_data_dir(data_dir, reinit=reinit)
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
                gossip = GossipConfig(enabled=config.fast_path == FastPath.GOSSIPSUB)
                # One frame of the dissemination protocol may be as large as the
                # protocol allows (a bounded reply of many events).
                transport_timeout_s = config.transport_timeout_ms / 1000
                limits = StreamLimits(max_message_bytes=MAX_FRAME_BYTES,
                                      open_stream_timeout_s=transport_timeout_s,
                                      message_write_timeout_s=transport_timeout_s,
                                      write_stall_timeout_s=transport_timeout_s)
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
                    node._attach_metrics(MetricsExporter(node, metrics_listeners))
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

    def _attach_metrics(self, exporter: MetricsExporter) -> None:
        self.metrics = exporter
        self._effects.log_observer = exporter.on_log  # the latency histogram reads `Log`s

    async def _start(self) -> None:
        host = self.host
        host.set_connection_gate(self._refuse)  # before any frame is read
        host.set_message_handler(PROTOCOL_DISSEMINATION, self._on_frame)
        host.set_request_handler(PROTOCOL_RELAY, self._relay_intake.on_request)
        if host.gossip_enabled:
            host.set_gossip_handler(self._on_gossip)
            host.set_gossip_validator(self._validate_gossip)
        self._nursery.start_soon(self.committer.run)  # first: opening topics writes through it
        for topic_id, wants_membership in stored_topics(self.store):
            damage = quick_check_topic(self.store, topic_id)  # node.check: a few reads
            if damage is not None:  # serve the others; `megnode check` / `repair` fix it
                self.mark_damaged(topic_id, damage)
                continue
            try:
                topic = await self._open_topic(topic_id, record=None)  # its record stays
            except DamagedTopicError as exc:
                self.mark_damaged(topic_id, exc.what)
                continue
            topic.wants_membership = wants_membership
        self._nursery.start_soon(self._peers.watch_peers, self._peer_receive)
        self._nursery.start_soon(self._peers.watch_transport, self._misbehaviour_receive)
        self._nursery.start_soon(self._ticker)
        if self.metrics is not None:
            self._nursery.start_soon(self.metrics.serve)
        for address in self.config.bootstrap:
            self._nursery.start_soon(self._dialer.dial_with_retry, address)
        self._book_keeper.start()  # dials the peer book too (node.fleet)
        self._peer_exchange.start()
        self._connections.start()
        if self.config.mdns:
            self._nursery.start_soon(self._dialer.discover_on_lan)

    # ------------------------------------------------------------------ topics

    @property
    def topics(self) -> dict[bytes, Topic]:
        return dict(self._topics)

    def topic(self, topic_id: bytes) -> Topic:
        try:
            return self._topics[topic_id]
        except KeyError:
            damage = self.damaged_topics.get(topic_id)
            if damage is not None:
                raise NodeError(damaged_topic_message(topic_id, damage)) from None
            raise TopicNotFound(f"topic {topic_id.hex()} is not replicated here (join it first: "
                                f"`megnode topic join {topic_id.hex()} --wait`)") from None

    def mark_damaged(self, topic_id: bytes, what: str) -> None:
        """Stop serving a topic whose stored records are damaged; serve the others.

        Called by the start check, and whenever a read or a step meets a
        `DamagedTopicError` (missing state group, order record...). The topic
        leaves the engine and its subscriptions end; its record stays, so
        after `megnode repair` and a restart the node fetches it again.
        """
        if topic_id in self.damaged_topics:
            return
        self.damaged_topics[topic_id] = what
        logger.error("%s", damaged_topic_message(topic_id, what))
        if self._drop_topic(topic_id):
            self._nursery.start_soon(self.host.leave, gossip_topic(topic_id))

    async def create_topic(self, name: str = "", d_max: int | None = None,
                           access: str = ACCESS_OPEN, history: str = HISTORY_SHARED) -> Topic:
        """Create a new topic with this node's identity as its creator and first indexer.

        `access="open"`: anyone who knows the topic id may join and publish (a
        publish-subscribe topic). `access="invite"`: members must be invited,
        and writing is granted per member (`Topic.add_writer`).
        `history` (invite topics): "shared" lets a member read the whole topic,
        "joined" only events from its join on (docs/access.md, "History").
        """
        if access not in ACCESS_MODES:
            raise NodeError(f"access must be one of {', '.join(ACCESS_MODES)}")
        if history not in HISTORY_SETTINGS:
            raise NodeError(f"history must be one of {', '.join(HISTORY_SETTINGS)}")
        if history != HISTORY_SHARED and access == ACCESS_OPEN:
            raise NodeError("history joined needs access invite: anyone may join an open topic "
                            "and read it")
        self._check_room()
        kwargs = {} if d_max is None else {"d_max": d_max}

        def make(now: int) -> Replica:  # runs inside the committer's step
            return Replica.create_topic(
                self.store, self.identity, now, name=name, config=self._replica_config(),
                authorization=True, join_rule=RULE_PUBLIC if access == ACCESS_OPEN else RULE_INVITE,
                members_write=access == ACCESS_OPEN, history=history, commit=False, **kwargs)

        try:
            # The topic and the record that this node replicates it: one transaction.
            replica = await self.committer.submit(Create(make, topic_record))
        except ValueError as exc:
            raise NodeError(str(exc)) from None
        except CommitError as exc:
            raise NodeError(f"topic not stored: {exc}") from None
        topic = await self._register(replica, record=None)
        now = now_ms()
        effects: list[object] = []
        for _, event in replica.graph.deliveries(0, limit=16):  # create + the bootstrap state
            effects += self.disseminator.announce(replica.topic_id, [event], now)  # durable
        self._run(effects)
        return topic

    async def join(self, topic_id: bytes | str, *, wait: bool = True,
                   timeout_s: float = JOIN_HANDSHAKE_TIMEOUT_S) -> Topic:
        """Join a topic by id; returns once this node is a member.

        A topic it does not hold goes through the join handshake
        (`_join_by_handshake`): it returns once this node's join is in its own
        resolved state, or raises `JoinRefusedError` (no peer let it in within
        `timeout_s`) and keeps nothing of the topic. A topic this node holds
        already (a restart, a re-join after `leave`) has its membership pursued
        by the ticker (`TopicWrites.pursue_memberships`, a later step): with
        `wait` (the default) this returns once that join is in the resolved
        state too (`Topic.joined`: JoinTimeout after `timeout_s`, Banned), without
        it at once (`publish` then waits for the join itself, bounded).
        """
        topic = await self._join(topic_id, timeout_s)
        if wait:
            await topic.joined(timeout_s)
        return topic

    async def _join(self, topic_id: bytes | str, timeout_s: float) -> Topic:
        topic_id = parse_topic_id(topic_id)
        under_way = self._joining.get(topic_id)
        if under_way is not None:  # another caller's handshake: share its outcome
            await under_way.wait()
            if topic_id not in self._topics:
                raise JoinRefusedError(f"topic {topic_id.hex()} not found or you are not "
                                       "invited")
        held = self._topics.get(topic_id)
        if held is not None:
            if held.membership() != Membership.JOIN and not held.wants_membership:
                # Replicated here without membership (synced, or stored so): pursue it now.
                held.wants_membership = True
                await self._write_records(topic_record(topic_id, WANTS_MEMBERSHIP))
            return held
        damage = self.damaged_topics.get(topic_id) or quick_check_topic(self.store, topic_id)
        if damage is not None:
            raise NodeError(damaged_topic_message(topic_id, damage))
        replica = Replica(self.store, topic_id, self.identity, self._replica_config())
        if not replica.ready:
            done = self._joining[topic_id] = trio.Event()
            try:
                return await self._join_by_handshake(replica, timeout_s)
            finally:
                del self._joining[topic_id]
                done.set()
        topic = await self._register(replica, record=WANTS_MEMBERSHIP)
        topic.wants_membership = True
        for peer in self.disseminator.peers:
            self._run(self.disseminator.sync_with(peer, topic_id, now_ms()))
        return topic

    async def _join_by_handshake(self, replica: Replica, timeout_s: float) -> Topic:
        """Ask peers to let this node in; the topic once its own join is resolved here.

        The replica is added empty, with no record: nothing durable says this
        node replicates the topic until it is a member. The engine asks every
        connected peer (`Disseminator.request_join`, inside a committer step);
        a member that lets us in answers a template, the engine signs our join
        and submits it, and the member then serves the whole topic. Waiting
        ends when the replica's state holds our join, when every asked peer
        refused, or after `timeout_s` (a first peer is waited for within it).
        Failing, the topic is forgotten: no record, no retries.
        """
        topic_id = replica.topic_id
        # `wants_membership` stays False: the handshake authors the join, and the
        # membership pursuit must not author a second one once the state arrives.
        topic = await self._register(replica, record=None)
        asked = 0
        try:
            with trio.move_on_after(timeout_s):
                while not self.disseminator.peers:
                    await topic.wait_changed()  # peer-up and every committer step wake it
                await self.committer.submit(Drive(
                    lambda now: self.disseminator.request_join(topic_id, now)))
                while True:
                    progress = self.disseminator.join_progress(topic_id)
                    asked = progress.asked
                    if self._own_membership(replica) == Membership.JOIN:
                        await self._write_records(topic_record(topic_id))
                        return topic
                    if asked and progress.refused >= asked:
                        break
                    await topic.wait_changed()
        except BaseException:
            await self._forget(topic_id)
            raise
        await self._forget(topic_id)
        peers = f"asked {asked} peer{'s' if asked != 1 else ''}" if asked else \
            f"no peer connected within {timeout_s:g} s"
        raise JoinRefusedError(f"topic {topic_id.hex()} not found or you are not invited "
                               f"({peers})")

    def _own_membership(self, replica: Replica) -> Membership | None:
        if not replica.ready or not replica.authorizing:
            return None
        return replica.membership_of(self.identity.public_key)

    async def leave(self, topic_id: bytes | str) -> None:
        """Stop replicating a topic (its events stay in the store for a later re-join)."""
        topic_id = parse_topic_id(topic_id)
        if topic_id not in self._topics or topic_id in self._joining:
            raise TopicNotFound(f"topic {topic_id.hex()} is not replicated here")
        await self._forget(topic_id)
        await self._write_records(forget_topic(topic_id))

    async def _forget(self, topic_id: bytes) -> None:
        """Stop replicating a topic here (its stored events stay); its record is the caller's."""
        if self._drop_topic(topic_id):
            with trio.CancelScope(shield=True):  # also when a cancelled join forgets it
                await self.host.leave(gossip_topic(topic_id))

    def _drop_topic(self, topic_id: bytes) -> bool:
        """Take a topic out of the node and the engine; True if its GossipSub topic must be left."""
        topic = self._topics.pop(topic_id, None)
        if topic is None:
            return False
        self._share_caches()
        self.disseminator.remove_topic(topic_id)
        topic.end_subscriptions()  # they end (NodeError) instead of waiting for ever
        self._gossip_undecided.discard(topic_id)
        if topic_id not in self._gossip_subscribed:
            return False
        self._gossip_subscribed.discard(topic_id)
        return True

    def _replica_config(self) -> ReplicaConfig:
        interval = self.config.ack_interval_ms
        merge = self.config.dummy_max_parents
        return ReplicaConfig(ordering=OrderConfig() if interval is None
                             else OrderConfig(ack_interval_ms=interval),
                             depletion=(DepletionPolicy() if merge is None
                                        else DepletionPolicy(max_parents=merge)),
                             caches=self._cache_budget.shares(len(self._topics) + 1))

    def _share_caches(self) -> None:
        """Re-apply the cache budget's shares to every open topic (one opened or closed)."""
        shares = self._cache_budget.shares(len(self._topics))
        if shares == self._cache_shares:
            return
        self._cache_shares = shares
        for topic in self._topics.values():
            topic.replica.resize_caches(shares)

    async def _open_topic(self, topic_id: bytes, record: bytes | None = b"") -> Topic:
        replica = Replica(self.store, topic_id, self.identity, self._replica_config())
        return await self._register(replica, record)

    async def _register(self, replica: Replica, record: bytes | None = b"") -> Topic:
        """Replicate `replica` here; `record` (unless None: written already) marks it stored."""
        self._check_room()
        topic = Topic(self.node_id, replica, self._writes)
        self._topics[replica.topic_id] = topic
        self._share_caches()
        replica.resize_caches(self._cache_shares)  # made when fewer or more topics were open
        self.disseminator.add_topic(replica)
        if record is not None:
            await self._write_records(topic_record(replica.topic_id, record))
        if self.host.gossip_enabled:
            self._gossip_undecided.add(replica.topic_id)
            await self._decide_gossip()
        return topic

    async def _decide_gossip(self) -> None:
        """Subscribe GossipSub for ready open topics; never for private ones.

        Anyone connected learns a node's subscriptions and may subscribe and
        read: a private topic (join rule not public) travels only on the push
        and anti-entropy paths, which serve members alone. The join rule is
        known once the create event is here, so a topic waits undecided until
        then. (A later change of the join rule does not re-decide.)
        """
        for topic_id in sorted(self._gossip_undecided):
            topic = self._topics.get(topic_id)
            # Another task's call may have decided it while this one awaited a join.
            if topic is None or not topic.ready or topic_id not in self._gossip_undecided:
                continue
            self._gossip_undecided.discard(topic_id)
            if not topic.private:
                self._gossip_subscribed.add(topic_id)
                await self.host.join(gossip_topic(topic_id))

    def _check_room(self) -> None:
        if len(self._topics) >= MAX_TOPICS:
            raise NodeError(f"this node already replicates MAX_TOPICS={MAX_TOPICS} topics")

    async def _write_records(self, ops: Sequence[Op]) -> None:
        """Write the node's own records through the committer (the only writer)."""
        try:
            await self.committer.submit(Records(tuple(ops)))
        except CommitError as exc:
            raise NodeError(f"not stored: {exc}") from None

    # ------------------------------------------------------------------ background tasks

    def _run(self, effects: Sequence[object]) -> None:
        """Carry out the engine's effects (node.effects) and wake the topics' subscribers."""
        self._effects.run(effects)

    async def _ticker(self) -> None:
        while True:
            # The engine's tick, membership pursuit and acks: one committer step.
            try:
                await self.committer.submit(Tick(self._writes.tick_duties))
            except CommitError:
                pass  # the committer logged it and reloaded the topics; the next tick retries
            self._peers.enforce_bans(now_ms())
            if self._gossip_undecided:
                await self._decide_gossip()
            await trio.sleep(TICK_INTERVAL_S)

    def _refuse(self, peer_id: str) -> bool:
        """The host's connection gate: a banned peer's new connection is closed at once.

        Asked inside py-libp2p's notifee as each connection is reported, so a
        banned flooder that redials is cut off before its frames are read,
        not at the next policy tick (node.peer_executor.enforce_bans).
        """
        if not self._peers.is_banned(peer_id):
            return False
        self.stats["connections_gated"] += 1
        return True

    async def _on_frame(self, peer: str, data: bytes) -> None:
        node_id = node_id_of(peer)
        if node_id is None:
            return
        if self._peers.policy.is_banned(node_id, now_ms()):
            # Read off its stream while its connection is being dropped: not worth a
            # signature check, and blaming it again would only repeat the ban.
            self.stats["frames_from_banned"] += 1
            return
        await self.committer.receive(node_id, data)  # applied in the next group commit

    def _validate_gossip(self, topic_name: str, forwarder: str, data: bytes) -> bool:
        """GossipSub's topic validator: forward and take in only what the engine would keep.

        Runs before the library forwards anything (transport.libp2p_gossip), on
        the trio thread between committer steps, so it sees committed state
        alone and writes nothing (`Disseminator.check_gossip`). Unlike the
        message's origin, the forwarder handed it to us itself: its faults count.
        """
        topic_id = gossip_message_topic(data)
        if topic_id not in self._gossip_subscribed or topic_name != gossip_topic(topic_id):
            self.stats["gossip_ignored"] += 1
            return False
        node_id = node_id_of(forwarder)
        if node_id is None or self._peers.policy.is_banned(node_id, now_ms()):
            return False
        accepted, effects = self.disseminator.check_gossip(node_id, data, now_ms())
        if effects:
            self._run(effects)
        return accepted

    async def _on_gossip(self, topic_name: str, origin: str, data: bytes) -> None:
        # Only topics this node subscribed (open ones) are taken from gossip, and
        # only messages about that very topic: private topics never use it.
        topic_id = gossip_message_topic(data)
        if topic_id not in self._gossip_subscribed or topic_name != gossip_topic(topic_id):
            self.stats["gossip_ignored"] += 1
            return
        # The origin a GossipSub message names is unsigned (strict_signing is off:
        # events carry their own signatures) and others relayed it: its faults
        # must not be held against that origin (`accountable=False`).
        node_id = node_id_of(origin)
        if node_id is not None:
            await self.committer.receive(node_id, data, accountable=False)

    # ------------------------------------------------------------------ backup

    async def backup(self, out: str | Path) -> dict[str, object]:
        """A consistent copy of the store into the empty directory `out` (node.backup).

        The copy runs in a worker thread: LMDB reads one snapshot in its own
        read transaction, the committer keeps writing and the trio loop stays
        free. Everything committed before the call is in the copy.
        """
        try:
            target = prepare_target(Path(out))
            await trio.to_thread.run_sync(self.store.copy_to, target)
            return await trio.to_thread.run_sync(finish_backup, target)
        except (BackupError, StoreError) as exc:
            raise NodeError(str(exc)) from None
        except OSError as exc:
            raise NodeError(f"backup to {out} failed: {exc.strerror or exc}") from None

    # ------------------------------------------------------------------ peers and status

    async def connect(self, address: str) -> str:
        """Dial a peer by its /p2p/ multiaddr; returns its peer id.

        A peer we hold a connection to is checked first (P2PHost.connect): a
        dead connection is dropped and dialled anew, not taken as "connected".
        """
        return await self._dialer.connect(address)

    @property
    def gossip_subscriptions(self) -> frozenset[bytes]:
        """The topics this node takes from GossipSub (open ones; never private ones)."""
        return frozenset(self._gossip_subscribed)

    @property
    def addresses(self) -> tuple[str, ...]:
        return self.host.listen_addrs()

    def _topic_statuses(self) -> list[dict[str, Any]]:
        """Each served topic's status; a topic found damaged meanwhile is listed as damaged."""
        out = []
        for topic_id, topic in list(self._topics.items()):
            try:
                out.append(topic.status())
            except DamagedTopicError as exc:
                self.mark_damaged(topic_id, exc.what)
        return out

    async def count_deliveries(self) -> None:
        """Bring every topic's count of delivered events (status's `delivered`, `acks`) up
        to date without holding up the node.

        Each replica keeps its count as it applies events (`Replica.handed_count`):
        nothing to do. A topic stored by an older build has none: its history is
        read back (`Topic.count_delivered`, about 14 s per million events; in one
        go by a status call, that held the event loop, and so every peer, for as
        long), COUNT_SLICE_EVENTS at a time with a pause of COUNT_PAUSE_S between
        slices so that the other tasks run, and the result is handed to the
        replica in a step (`Replica.adopt_count`), which keeps it from then on. The
        control socket counts this way before answering; an embedding application
        may await it before its first `status`.
        """
        while True:
            behind = False
            for topic_id, topic in sorted(self._topics.items()):
                try:
                    behind = not topic.count_delivered(COUNT_SLICE_EVENTS) or behind
                except DamagedTopicError as exc:  # as `status` does: listed as damaged
                    self.mark_damaged(topic_id, exc.what)
            if not behind:
                break
            await trio.sleep(COUNT_PAUSE_S)
        for topic_id, topic in sorted(self._topics.items()):
            counted = topic.counted()
            if counted is None:
                continue
            try:
                await self.committer.submit(Act(_adopting(topic.replica, counted)))
            except Exception as exc:  # counted again at the next status: nothing lost
                logger.warning("keeping the delivered count of topic %s failed: %s",
                               topic_id.hex(), exc)

    def status(self) -> dict[str, Any]:
        """What `megnode status` prints (docs/control.md lists the fields); every list bounded.

        Synchronous: a topic stored without a kept delivered count (an older
        build's) is counted here in one go (`count_deliveries` does it in slices)."""
        topics = self._topic_statuses()
        rejected: Counter[str] = Counter()
        for topic in topics:
            rejected.update(topic["rejected"])
        return {
            "node": self.node_id,
            "peer_id": self.host.peer_id,
            "addresses": list(self.addresses),
            "peers": sorted(self.host.peers()),
            "bootstrap": self._dialer.bootstrap_status(),
            "peer_book": self._book_keeper.status(),
            "connections": self._connections.status(),
            "fast_path": self.config.fast_path,
            "banned_peers": self._banned_peers(now_ms()),
            "rejected": most_common(dict(rejected), MAX_REJECT_REASONS_SHOWN),
            "refusals": self._refusals(),
            "topics": topics,
            "damaged_topics": {t.hex(): why for t, why in self.damaged_topics.items()},
            "stats": dict(self.stats) | {k: v for k, v in self.disseminator.stats.items()}
            | {f"relay.{k}": v for k, v in self.relay.stats.items()}
            | {f"commit.{k}": v for k, v in self.committer.stats.items()},
        }

    def peers_report(self) -> dict[str, Any]:
        """What `megnode peers` prints (node.fleet.peers_report)."""
        return peers_report(self.peer_book, self.host.peers(), self.peer_policy, now_ms())

    def _refusals(self) -> dict[str, Any]:
        """The intake's recent refusals by the auth rules (`Disseminator.refusals`, the
        newest MAX_REJECTIONS_KEPT): how many are kept, by reason, and the newest few."""
        kept = self.disseminator.refusals
        reasons: Counter[str] = Counter(r.reason for r in kept)
        newest = [{"topic": r.topic.hex(), "event": r.event_id.hex(), "reason": r.reason,
                   "peer": r.peer} for r in itertools.islice(reversed(kept), MAX_REFUSALS_SHOWN)]
        return {"kept": len(kept), "by_reason": most_common(dict(reasons),
                                                            MAX_REJECT_REASONS_SHOWN),
                "newest": newest}

    def _banned_peers(self, now: int) -> dict[str, Any]:
        """The peers banned now, the longest remaining first (at most MAX_BANS_SHOWN listed)."""
        live = sorted(((until - now, peer) for peer, until in self.peer_policy.bans().items()
                       if until > now), reverse=True)
        return {"count": len(live),
                "peers": [{"peer": peer, "remaining_s": round(left_ms / 1000, 1)}
                          for left_ms, peer in live[:MAX_BANS_SHOWN]]}


def _adopting(replica: Replica, counted: DeliveryCount) -> Callable[[int], list[tuple[bytes, Event]]]:
    """An `Act` that hands `counted` (a topic's history read back) to its replica."""
    def run(now_ms: int) -> list[tuple[bytes, Event]]:
        replica.adopt_count(counted)
        return []  # nothing authored
    return run
