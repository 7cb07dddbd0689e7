"""`P2PHost`: one py-libp2p host as a trio async context manager.

The node's adapter to the network. It owns one py-libp2p host (TCP + Noise +
yamux) whose peer identity is the node's ed25519 key (the libp2p key pair is
built from the same 32-byte seed as `node.core.identity.Identity.from_seed`,
so the peer id embeds the author key), and offers:

* `connect`, `disconnect`, `peers()`, and peer up/down notifications through a
  synchronous callback `on_peer(PeerEvent)`. A callback, not a channel: it
  cannot fill up and block py-libp2p's connection path, and it cannot lose a
  "down". It runs inside the library's notifee task, so it must only record
  the event (e.g. `send_nowait` into the owner's own channel);
* request/response (`transport.libp2p_requests`) and one-way message streams
  (`transport.libp2p_messages`) for our own protocols, with misbehaviour
  reports (`transport.libp2p_streams`);
* GossipSub topics (`transport.libp2p_gossip`), on by default.

Everything we start runs in this host's nursery; leaving the `async with`
cancels it and then closes the libp2p connections and host explicitly,
shielded and bounded: leaving py-libp2p's `host.run()` alone does not close
the sockets (its connection tasks are cancelled half-way through their own
close), so peers would never see us go down.

What we configure on py-libp2p 0.8.1 and why:

* Security: Noise only. `new_host` otherwise also offers TLS, SECIO and
  *plaintext*.
* Muxer: yamux only (mplex is the fallback the library also offers).
* `ConnectionConfig(max_connections_per_peer=1)`: the default (3) makes
  `connect` wait ~250 ms for a second address ("happy eyeballs").
* The library's auto-connector is stopped: it re-dials any peer in the
  peerstore while below its watermarks (100 connections by default), which
  would undo our `disconnect` of a misbehaving peer. The node chooses whom to
  dial (bootstrap, mDNS).
* Identify's observed-address discovery is off so `listen_addrs()` reports
  what we bound, not what loopback peers saw.
* Secure-channel writes are whole-or-abort (`transport.libp2p_patches`):
  py-libp2p lets a cancelled write leave half a Noise message on the wire,
  which silently wedges or breaks the connection.

Dead connections. A peer that stops reading keeps its connection "open" for
as long as nobody writes to it. Three things turn that into a clean "down"
(counted in `connections_aborted`): a write the peer does not take within
`WRITE_STALL_TIMEOUT_S` aborts the connection; `STALE_STREAM_FAILURES`
timed-out stream opens/writes in a row abort it too; and `connect` to a peer
we think we are connected to first checks the connection with a libp2p ping
(`LIVENESS_PROBE_TIMEOUT_S`) and redials if it is dead. Whom to redial after
a "down" is the owner's choice (`transport.libp2p_redial`).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from types import TracebackType

import multiaddr
import trio
from libp2p import new_host
from libp2p.abc import IHost, INetConn, INetStream, INetwork, INotifee
from libp2p.crypto.ed25519 import Ed25519PublicKey, create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as create_noise_key_pair
from libp2p.custom_types import TProtocol
from libp2p.host.ping import ID as PING_PROTOCOL_ID
from libp2p.host.ping import PING_LENGTH
from libp2p.io.utils import read_exactly
from libp2p.network.config import ConnectionConfig
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.peer.peerstore import PeerStoreError
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from libp2p.tools.anyio_service import background_trio_service

from transport import libp2p_patches
from transport.libp2p_patches import abort_session
from transport.libp2p_gossip import GossipConfig, GossipHandler, GossipStats, GossipTopics, build_pubsub
from transport.libp2p_messages import MessageStreams
from transport.libp2p_requests import RequestProtocols
from transport.libp2p_streams import (
    PEER_ID_CACHE_SIZE,
    REQUEST_TIMEOUT_S,
    STREAM_ERRORS,
    MessageHandler,
    Misbehaviour,
    MisbehaviourCallback,
    RequestHandler,
    StreamLimits,
    close_quietly,
    parse_peer_id,
)

logger = logging.getLogger(__name__)

SEED_BYTES = 32
DEFAULT_LISTEN = "/ip4/127.0.0.1/tcp/0"
MAX_CONNECTIONS_PER_PEER = 1
CONNECT_TIMEOUT_S = 10.0
DIAL_TIMEOUT_S = 10.0
HOST_CLOSE_TIMEOUT_S = 5.0  # bound on the shielded close at exit
GOSSIP_MESH_TIMEOUT_S = 10.0
# A live connection answers a libp2p ping well within this even when busy;
# `connect` to a peer that does not is treated as a dead connection.
LIVENESS_PROBE_TIMEOUT_S = 5.0
# After aborting a connection, how long `connect` waits for py-libp2p to
# forget it (its close path ends with a fixed 0.1 s sleep) before dialling.
CONNECTION_GONE_TIMEOUT_S = 2.0
CONNECTION_GONE_POLL_S = 0.05
DEFAULT_GOSSIP = GossipConfig()
DEFAULT_LIMITS = StreamLimits()


class ConnectError(Exception):
    """A peer address could not be dialled; the message says why."""


def check_ports_free(addresses: Sequence[str]) -> None:
    """Raise OSError (EADDRINUSE) if a listen address's fixed port is already bound.

    py-libp2p binds its listeners with SO_REUSEPORT (for TCP hole punching),
    so a second node told to listen on a taken port binds it too, silently,
    and the kernel then splits incoming dials between two different nodes.
    A plain bind, without SO_REUSEPORT, fails on a port anyone holds; the
    probe is closed at once and the host binds for real. Port 0 (any free
    port) and names other than /ip4 and /ip6 are not probed.
    """
    import socket

    for address in addresses:
        parsed = multiaddr.Multiaddr(address)
        names = [protocol.name for protocol in parsed.protocols()]
        if names[:2] not in (["ip4", "tcp"], ["ip6", "tcp"]):
            continue
        port = int(parsed.value_for_protocol("tcp"))
        if port == 0:
            continue
        family = socket.AF_INET if names[0] == "ip4" else socket.AF_INET6
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # A port left in TIME_WAIT by our own last run is free to reuse.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((parsed.value_for_protocol(names[0]), port))


@dataclass(frozen=True)
class PeerEvent:
    peer_id: str
    up: bool  # True: first connection opened; False: last connection closed


PeerCallback = Callable[[PeerEvent], None]


def key_pair_from_seed(seed: bytes) -> KeyPair:
    """The libp2p ed25519 key pair of `Identity.from_seed(seed)`."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"seed must be {SEED_BYTES} bytes")
    return create_new_key_pair(seed)


# Cached both ways: callers convert on every message, and base58 is pure Python.
@functools.lru_cache(maxsize=PEER_ID_CACHE_SIZE)
def peer_id_of_public_key(public_key: bytes) -> str:
    """The peer id (base58) of an ed25519 author key."""
    return ID.from_pubkey(Ed25519PublicKey.from_bytes(public_key)).to_base58()


@functools.lru_cache(maxsize=PEER_ID_CACHE_SIZE)
def public_key_of_peer_id(peer_id: str) -> bytes | None:
    """The ed25519 key embedded in an ed25519 peer id; None for other key types."""
    key = parse_peer_id(peer_id).extract_public_key()
    if not isinstance(key, Ed25519PublicKey):
        return None
    return key.to_bytes()


@dataclass
class _PeerTracker(INotifee):
    """Connection counts per peer, turned into up/down edges for the owner."""

    on_peer: PeerCallback | None
    on_down: Callable[[str], None]
    connections: dict[str, int] = field(default_factory=dict)

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        peer_id = conn.muxed_conn.peer_id.to_base58()
        count = self.connections.get(peer_id, 0)
        self.connections[peer_id] = count + 1
        if count == 0:
            self._emit(PeerEvent(peer_id, up=True))

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        peer_id = conn.muxed_conn.peer_id.to_base58()
        count = self.connections.get(peer_id, 0)
        if count == 0:
            return  # a connection we never counted (closed during setup)
        if count > 1:
            self.connections[peer_id] = count - 1
            return
        del self.connections[peer_id]
        self.on_down(peer_id)
        self._emit(PeerEvent(peer_id, up=False))

    def _emit(self, event: PeerEvent) -> None:
        if self.on_peer is None:
            return
        try:
            self.on_peer(event)
        except Exception:
            logger.exception("peer callback failed for %s", event)

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def listen(self, network: INetwork, multiaddr: multiaddr.Multiaddr) -> None:
        pass

    async def listen_close(self, network: INetwork, multiaddr: multiaddr.Multiaddr) -> None:
        pass


async def _close_connection(connection: INetConn) -> None:
    try:
        await connection.close()
        # Under an outer cancellation the library's own connection task has
        # already begun `SwarmConn.close()` and been cancelled in it: the
        # connection is marked closed but its socket is still open. Close the
        # muxer (GO_AWAY, then the socket) ourselves; it is idempotent.
        muxed = connection.muxed_conn
        if not getattr(muxed, "is_closed", False):
            await muxed.close()
    except Exception:
        logger.debug("closing a connection failed", exc_info=True)


class P2PHost:
    """One libp2p host; use as `async with P2PHost(seed) as host:`."""

    def __init__(
        self,
        seed: bytes,
        listen: Sequence[str] = (DEFAULT_LISTEN,),
        *,
        gossip: GossipConfig = DEFAULT_GOSSIP,
        limits: StreamLimits = DEFAULT_LIMITS,
        on_peer: PeerCallback | None = None,
        on_misbehaviour: MisbehaviourCallback | None = None,
    ) -> None:
        self._key_pair = key_pair_from_seed(seed)
        self._listen = [multiaddr.Multiaddr(address) for address in listen]
        self._gossip_config = gossip
        self._limits = limits
        self._on_misbehaviour = on_misbehaviour
        self.peer_id = ID.from_pubkey(self._key_pair.public_key).to_base58()
        self._misbehaviour_counts: dict[str, int] = {}
        self.stale_aborts = 0  # connections we aborted because they looked dead
        self._tracker = _PeerTracker(on_peer, self._peer_went_down)
        self._host: IHost | None = None
        self._requests: RequestProtocols | None = None
        self._messages: MessageStreams | None = None
        self._gossip: GossipTopics | None = None
        self._nursery: trio.Nursery | None = None
        self._context: AbstractAsyncContextManager[None] | None = None

    # -- lifecycle --------------------------------------------------------------

    async def __aenter__(self) -> P2PHost:
        if self._context is not None:
            raise RuntimeError("P2PHost is not re-entrant")
        self._context = self._run()
        await self._context.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        assert self._context is not None
        return await self._context.__aexit__(exc_type, exc, traceback)

    @asynccontextmanager
    async def _run(self) -> AsyncIterator[None]:
        key_pair = self._key_pair
        libp2p_patches.apply()  # py-libp2p's fixes, explicitly here, never on import
        host = new_host(
            key_pair=key_pair,
            sec_opt={
                NOISE_PROTOCOL_ID: NoiseTransport(
                    key_pair, noise_privkey=create_noise_key_pair().private_key
                )
            },
            muxer_opt={TProtocol(YAMUX_PROTOCOL_ID): Yamux},
            connection_config=ConnectionConfig(
                max_connections_per_peer=MAX_CONNECTIONS_PER_PEER, dial_timeout=DIAL_TIMEOUT_S
            ),
            disable_identify_address_discovery=True,
        )
        self._host = host
        host.get_network().register_notifee(self._tracker)
        # Pubsub registers its own notifee and stream handlers: build it
        # before the host listens so no early connection escapes it.
        pubsub_router = build_pubsub(host, self._gossip_config) if self._gossip_config.enabled else None
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(host.run(self._listen))
            await host.get_network().auto_connector.stop()
            if pubsub_router is not None:
                pubsub, router = pubsub_router
                await stack.enter_async_context(background_trio_service(pubsub))
                await stack.enter_async_context(background_trio_service(router))
                await pubsub.wait_until_ready()
            # Exit runs in reverse: our tasks stop, then the connections close,
            # then pubsub stops. Stopping pubsub while connections are open
            # crashes the swarm: its pubsub stream handlers keep receiving and
            # spawn into pubsub's closed nursery ("closed to new arrivals").
            stack.push_async_callback(self._close_host, host)
            nursery = await stack.enter_async_context(trio.open_nursery())
            # Pushed after the nursery, so it runs first: cancel, then join.
            stack.callback(nursery.cancel_scope.cancel)
            self._nursery = nursery
            self._requests = RequestProtocols(host, self._limits, self._misbehaved)
            self._messages = MessageStreams(host, nursery, self._limits, self._misbehaved,
                                            self._stale)
            if pubsub_router is not None:
                self._gossip = GossipTopics(pubsub, router, nursery, self._gossip_config)
            try:
                yield
            finally:
                self._requests = None
                self._messages = None
                self._gossip = None
                self._nursery = None
                self._host = None

    @staticmethod
    async def _close_host(host: IHost) -> None:
        # Shielded: an exit under cancellation must still close the sockets,
        # else peers keep a dead connection and never see us go down.
        with trio.CancelScope(shield=True), trio.move_on_after(HOST_CLOSE_TIMEOUT_S) as scope:
            # Yamux's close ends with a fixed 0.1 s sleep and the swarm closes
            # connections one after another; closing them all at once first
            # keeps shutdown ~0.2 s whatever the number of peers.
            async with trio.open_nursery() as closers:
                for connection in host.get_network().get_connections():
                    closers.start_soon(_close_connection, connection)
            await host.close()
        if scope.cancelled_caught:
            logger.warning("libp2p host close took over %s s; abandoned", HOST_CLOSE_TIMEOUT_S)

    def _running_host(self) -> IHost:
        if self._host is None:
            raise RuntimeError("P2PHost is not running (use `async with`)")
        return self._host

    def _running_requests(self) -> RequestProtocols:
        if self._requests is None:
            raise RuntimeError("P2PHost is not running (use `async with`)")
        return self._requests

    def _running_messages(self) -> MessageStreams:
        if self._messages is None:
            raise RuntimeError("P2PHost is not running (use `async with`)")
        return self._messages

    def _running_gossip(self) -> GossipTopics:
        self._running_host()
        if self._gossip is None:
            raise RuntimeError("gossip is disabled on this host")
        return self._gossip

    @property
    def libp2p(self) -> IHost:
        """The py-libp2p host itself, for diagnostics and adversarial tests."""
        return self._running_host()

    # -- peers ------------------------------------------------------------------

    def listen_addrs(self) -> tuple[str, ...]:
        """Bound addresses, each ending in /p2p/<our peer id>."""
        return tuple(str(address) for address in self._running_host().get_addrs())

    def peers(self) -> frozenset[str]:
        """Peers with at least one open connection."""
        return frozenset(self._tracker.connections)

    def peer_addresses(self, peer_id: str) -> tuple[str, ...]:
        """Dialable addresses (`.../p2p/<id>`) the peerstore knows for `peer_id`.

        The ones we dialled, and the listen addresses a peer that dialled us
        announced through identify.
        """
        try:
            addresses = self._running_host().get_peerstore().addrs(parse_peer_id(peer_id))
        except (PeerStoreError, ValueError):
            return ()
        suffix = f"/p2p/{peer_id}"
        return tuple(str(a) if str(a).endswith(suffix) else f"{a}{suffix}" for a in addresses)

    async def connect(self, address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> str:
        """Dial a `/ip4/.../tcp/.../p2p/<id>` address; return the peer id.

        Raises `ValueError` for a malformed address, `ConnectError` if the
        peer cannot be reached or is not who the address says. A peer we hold
        a connection to is pinged first: if that connection is dead it is
        aborted and the peer dialled anew (py-libp2p alone would return at
        once, "connected").
        """
        host = self._running_host()
        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(address))
        except Exception as error:
            raise ValueError(f"not a peer address (/…/p2p/<id>): {address!r}: {error}") from None
        if info.peer_id.to_base58() == self.peer_id:
            raise ValueError(f"{address} is this host's own address")
        peer_id = info.peer_id.to_base58()
        if peer_id in self.peers() and not await self.is_alive(
                peer_id, min(timeout_s, LIVENESS_PROBE_TIMEOUT_S)):
            # "Connected" but dead: py-libp2p's connect would return at once.
            logger.info("connection to %s does not answer; redialling", peer_id)
            await self.abort(peer_id)
        try:
            with trio.fail_after(timeout_s):
                await host.connect(info)
        except trio.TooSlowError:
            raise ConnectError(f"connecting to {address} timed out after {timeout_s} s") from None
        except STREAM_ERRORS as error:
            raise ConnectError(f"cannot connect to {address}: {error}") from None
        return info.peer_id.to_base58()

    async def disconnect(self, peer_id: str) -> None:
        """Close every connection to `peer_id` (e.g. after misbehaviour).

        Each connection's muxer is closed directly, bounded and shielded, so
        the peer sees the socket go even if the library's own bookkeeping
        (which `host.disconnect` relies on) is mid-update.
        """
        host = self._running_host()
        target = parse_peer_id(peer_id)
        with trio.CancelScope(shield=True), trio.move_on_after(HOST_CLOSE_TIMEOUT_S):
            connections = [c for c in host.get_network().get_connections()
                           if c.muxed_conn.peer_id == target]
            async with trio.open_nursery() as closers:
                for connection in connections:
                    closers.start_soon(_close_connection, connection)
            try:
                await host.disconnect(target)
            except Exception:
                logger.debug("host.disconnect(%s) failed", peer_id, exc_info=True)

    async def is_alive(self, peer_id: str, timeout_s: float = LIVENESS_PROBE_TIMEOUT_S) -> bool:
        """True if the connection to `peer_id` answers a libp2p ping within `timeout_s`."""
        host = self._running_host()
        challenge = os.urandom(PING_LENGTH)
        stream: INetStream | None = None
        try:
            with trio.fail_after(timeout_s):
                stream = await host.new_stream(parse_peer_id(peer_id), [PING_PROTOCOL_ID])
                await stream.write(challenge)
                answer = await read_exactly(stream, PING_LENGTH)
        except (trio.TooSlowError, *STREAM_ERRORS):
            answer = b""
        if stream is not None:
            await close_quietly(stream, reset=answer != challenge)
        return answer == challenge

    async def abort(self, peer_id: str) -> None:
        """Drop every connection to `peer_id` at once: close the sockets, say no goodbye.

        For a connection that looks dead, where a graceful close would wait on
        writes the peer will never take. Returns once py-libp2p has forgotten
        the connections (bounded by CONNECTION_GONE_TIMEOUT_S).
        """
        host = self._running_host()
        target = parse_peer_id(peer_id)
        with trio.CancelScope(shield=True), trio.move_on_after(HOST_CLOSE_TIMEOUT_S):
            connections = [c for c in host.get_network().get_connections()
                           if c.muxed_conn.peer_id == target]
            for connection in connections:
                secured = getattr(connection.muxed_conn, "secured_conn", None)
                if secured is not None:
                    await abort_session(secured)
            async with trio.open_nursery() as closers:
                for connection in connections:
                    closers.start_soon(_close_connection, connection)
            with trio.move_on_after(CONNECTION_GONE_TIMEOUT_S):
                while any(c.muxed_conn.peer_id == target
                          for c in host.get_network().get_connections()):
                    await trio.sleep(CONNECTION_GONE_POLL_S)

    @property
    def connections_aborted(self) -> int:
        """Connections dropped as dead: found stale here, or stalled in a write (process-wide)."""
        return self.stale_aborts + libp2p_patches.stalled_aborts

    def _stale(self, peer_id: str, why: str) -> None:
        """The message streams found `peer_id`'s connection dead: abort it (the peer goes down)."""
        if self._nursery is None or peer_id not in self.peers():
            return
        self.stale_aborts += 1
        logger.warning("connection to %s looks dead (%s); aborting it", peer_id, why)
        self._nursery.start_soon(self.abort, peer_id)

    def _peer_went_down(self, peer_id: str) -> None:
        if self._messages is not None:
            self._messages.close_peer(peer_id)

    def _misbehaved(self, report: Misbehaviour) -> None:
        self._misbehaviour_counts[report.peer_id] = self._misbehaviour_counts.get(report.peer_id, 0) + 1
        if self._on_misbehaviour is not None:
            try:
                self._on_misbehaviour(report)
            except Exception:
                logger.exception("misbehaviour callback failed for %s", report)

    def misbehaviour_count(self, peer_id: str) -> int:
        return self._misbehaviour_counts.get(peer_id, 0)

    def requests_refused(self) -> int:
        """Inbound requests reset because every slot (total or per peer) was taken."""
        return self._running_requests().refused

    # -- request/response and one-way messages ----------------------------------

    def set_request_handler(self, protocol_id: str, handler: RequestHandler) -> None:
        """`async handler(peer_id, request) -> response` for inbound requests."""
        self._running_requests().set_handler(protocol_id, handler)

    async def request(
        self, peer_id: str, protocol_id: str, data: bytes, timeout_s: float = REQUEST_TIMEOUT_S
    ) -> bytes:
        """One request/response exchange; raises `libp2p_requests.RequestError`."""
        return await self._running_requests().request(peer_id, protocol_id, data, timeout_s)

    def set_message_handler(self, protocol_id: str, handler: MessageHandler) -> None:
        """`async handler(peer_id, message)`, called in order per inbound stream."""
        self._running_messages().set_handler(protocol_id, handler)

    async def send(self, peer_id: str, protocol_id: str, data: bytes) -> None:
        """Queue a one-way message; raises `libp2p_messages.SendError` if the stream failed."""
        await self._running_messages().send(peer_id, protocol_id, data)

    def send_nowait(self, peer_id: str, protocol_id: str, data: bytes) -> bool:
        """Queue a one-way message unless the peer's queue is full (then False, counted).

        Use it from a sender shared by all peers, so one stalled peer never
        holds up the others; `SendError` if the stream failed.
        """
        return self._running_messages().send_nowait(peer_id, protocol_id, data)

    def messages_dropped(self) -> int:
        """`send_nowait` calls refused because the peer's queue was full."""
        return self._running_messages().dropped

    def outbound_streams(self) -> frozenset[tuple[str, str]]:
        """(peer id, protocol) of the one-way streams open for `send`."""
        return self._running_messages().outbound_streams()

    # -- gossipsub --------------------------------------------------------------

    @property
    def gossip_enabled(self) -> bool:
        return self._gossip_config.enabled

    def set_gossip_handler(self, handler: GossipHandler) -> None:
        """`async handler(topic, origin_peer_id, data)` for others' gossip messages."""
        self._running_gossip().handler = handler

    async def join(self, topic: str) -> None:
        await self._running_gossip().join(topic)

    async def leave(self, topic: str) -> None:
        await self._running_gossip().leave(topic)

    async def publish(self, topic: str, data: bytes) -> None:
        await self._running_gossip().publish(topic, data)

    def gossip_mesh_peers(self, topic: str) -> frozenset[str]:
        return self._running_gossip().mesh_peers(topic)

    async def wait_gossip_mesh_peer(
        self, topic: str, peer_id: str, timeout_s: float = GOSSIP_MESH_TIMEOUT_S
    ) -> None:
        """Wait until `peer_id` is in our mesh for `topic`; `trio.TooSlowError` if not."""
        await self._running_gossip().wait_mesh_peer(topic, peer_id, timeout_s)

    def gossip_stats(self) -> GossipStats:
        return self._running_gossip().stats()
