"""`P2PHost`: one py-libp2p host as a trio async context manager.

The node's adapter to the network. It owns one py-libp2p host (TCP + Noise +
yamux) whose peer identity is the node's ed25519 key (the libp2p key pair is
built from the same 32-byte seed as `node.core.identity.Identity.from_seed`,
so the peer id embeds the author key), and offers:

* `connect`, `disconnect`, `peers()`, and peer up/down notifications through a
  synchronous callback `on_peer(PeerEvent)` (`transport.libp2p_liveness`,
  which also finds and drops dead connections), and a connection gate
  `refuse(peer_id)` asked of every new connection (a banned peer's is closed
  as soon as py-libp2p reports it, before it makes an "up");
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
  what we bound, not what loopback peers saw; a host bound to `0.0.0.0`/`::`
  advertises its interfaces' addresses instead (`libp2p_listen.advertised_addresses`).
* Secure-channel writes are whole-or-abort (`transport.libp2p_patches`):
  py-libp2p lets a cancelled write leave half a Noise message on the wire,
  which silently wedges or breaks the connection.

Who the host is (its key pair from the node's seed, peer id <-> author key)
lives in `transport.libp2p_identity`; where it listens, and the check that a
fixed port is not already taken, in `transport.libp2p_listen`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from types import TracebackType

import multiaddr
import trio
from libp2p import new_host
from libp2p.abc import IHost
from libp2p.crypto.x25519 import create_new_key_pair as create_noise_key_pair
from libp2p.custom_types import TProtocol
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
from transport.libp2p_gossip import (GossipConfig, GossipHandler, GossipStats, GossipTopics,
                                     GossipValidator, build_pubsub)
from transport.libp2p_identity import key_pair_from_seed, peer_id_of_key_pair
from transport.libp2p_listen import advertised_addresses
from transport.defaults import DEFAULT_LISTEN
from transport.libp2p_liveness import (
    CLOSE_TIMEOUT_S,
    LIVENESS_PROBE_TIMEOUT_S,
    PeerCallback,
    PeerTracker,
    abort_peer,
    close_connections,
    disconnect_peer,
    ping,
)
from transport.libp2p_messages import MessageStreams
from transport.libp2p_requests import RequestProtocols
from transport.libp2p_streams import (
    REQUEST_TIMEOUT_S,
    STREAM_ERRORS,
    MessageHandler,
    Misbehaviour,
    MisbehaviourCallback,
    RequestHandler,
    StreamLimits,
    parse_peer_id,
)

logger = logging.getLogger(__name__)

MAX_CONNECTIONS_PER_PEER = 1
CONNECT_TIMEOUT_S = 10.0
DIAL_TIMEOUT_S = 10.0
GOSSIP_MESH_TIMEOUT_S = 10.0
DEFAULT_GOSSIP = GossipConfig()
DEFAULT_LIMITS = StreamLimits()


def forget_failed_dials(host: IHost, peer_id: ID) -> None:
    """Lift py-libp2p's negative dial cache entry for `peer_id` (if this version has one)."""
    unblock = getattr(host.get_network(), "unblock_peer", None)
    if unblock is not None:
        unblock(peer_id)


def forget_addresses(host: IHost, peer_id: ID, keep: Sequence[multiaddr.Multiaddr]) -> None:
    """Drop the peerstore's addresses of `peer_id` before dialling it at a given one.

    py-libp2p's `connect(info)` adds `info`'s address to the peerstore and then dials
    what the peerstore holds, at most one address per transport (TCP: the first):
    with an old address of a peer that moved still there, the dial of its new
    address went to the old one and failed. The node keeps its own addresses per
    peer (the redialer, the peer book); identify refills the peerstore. Only when the
    peerstore holds an address other than `keep` (clearing it always, even when it held
    nothing stale, slowed a fresh fleet's mesh: 16-20 s against 5-9 s in
    tests/e2e/test_fleet_heals.py).
    """
    try:
        store = host.get_peerstore()
        wanted = {str(a) for a in keep}
        if any(str(a) not in wanted for a in store.addrs(peer_id)):
            store.clear_addrs(peer_id)
    except (PeerStoreError, KeyError, AttributeError):
        pass


def forget_identify(host: IHost, peer_id: ID) -> None:
    """Make the next connection of `peer_id` run identify again.

    py-libp2p skips identify for a peer whose protocols its peerstore already lists
    (`BasicHost._has_cached_protocols`), and keeps them after the peer disconnects:
    a peer that came back on a new port was then known at its old address only, and
    peer exchange spread that address (two nodes restarted together on new ports
    never found each other; issue 12). Called when a peer's last connection closes.
    """
    try:
        host.get_peerstore().clear_protocol_data(peer_id)
    except (PeerStoreError, KeyError, AttributeError):
        pass


class ConnectError(Exception):
    """A peer address could not be dialled; the message says why."""


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
        refuse: Callable[[str], bool] | None = None,
    ) -> None:
        self._key_pair = key_pair_from_seed(seed)
        self._listen = [multiaddr.Multiaddr(address) for address in listen]
        self._gossip_config = gossip
        self._limits = limits
        self._on_misbehaviour = on_misbehaviour
        self.peer_id = peer_id_of_key_pair(self._key_pair)
        self._misbehaviour_counts: dict[str, int] = {}
        self.stale_aborts = 0  # connections we aborted because they looked dead
        # The connection gate (`refuse(peer_id)`: True closes a new connection at once).
        self._tracker = PeerTracker(on_peer, self._peer_went_down, refuse,
                                    on_link_lost=self._link_lost)
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
        # py-libp2p's fixes, explicitly here, never on import. The write-stall bound is
        # one value per process: this host sets it and puts the previous one back on exit.
        previous_stall_timeout_s = libp2p_patches.stall_timeout_s
        libp2p_patches.apply(self._limits.write_stall_timeout_s)
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
            # Bound to 0.0.0.0 / ::: advertise the interfaces' addresses instead.
            addrs_factory=advertised_addresses,
        )
        self._host = host
        host.get_network().register_notifee(self._tracker)
        # Pubsub registers its own notifee and stream handlers: build it
        # before the host listens so no early connection escapes it.
        pubsub_router = build_pubsub(host, self._gossip_config) if self._gossip_config.enabled else None
        async with AsyncExitStack() as stack:
            stack.callback(setattr, libp2p_patches, "stall_timeout_s", previous_stall_timeout_s)
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
        with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
            # The swarm closes connections one after another, each ending in a
            # fixed 0.1 s sleep; closing them all at once first keeps shutdown
            # ~0.2 s whatever the number of peers.
            await close_connections(host.get_network().get_connections())
            await host.close()
        if scope.cancelled_caught:
            logger.warning("libp2p host close took over %s s; abandoned", CLOSE_TIMEOUT_S)

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
        # py-libp2p refuses, for 60 s, every dial of a peer whose addresses all
        # failed once (its negative dial cache): a peer that restarted would stay
        # out a minute. When to dial is the node's choice (the peer policy's
        # backoff, an explicit `connect`), so the block is lifted before each dial.
        forget_failed_dials(host, info.peer_id)
        if peer_id not in self.peers():
            forget_addresses(host, info.peer_id, keep=info.addrs)
        try:
            with trio.fail_after(timeout_s):
                await host.connect(info)
        except trio.TooSlowError:
            raise ConnectError(f"connecting to {address} timed out after {timeout_s} s") from None
        except STREAM_ERRORS as error:
            raise ConnectError(f"cannot connect to {address}: {error}") from None
        return info.peer_id.to_base58()

    async def disconnect(self, peer_id: str) -> None:
        """Close every connection to `peer_id` (e.g. after misbehaviour), shielded and bounded."""
        await disconnect_peer(self._running_host(), peer_id)

    async def is_alive(self, peer_id: str, timeout_s: float = LIVENESS_PROBE_TIMEOUT_S) -> bool:
        """True if the connection to `peer_id` answers a libp2p ping within `timeout_s`."""
        return await ping(self._running_host(), peer_id, timeout_s)

    async def abort(self, peer_id: str) -> None:
        """Drop every connection to `peer_id` at once, for one that looks dead (`abort_peer`)."""
        await abort_peer(self._running_host(), peer_id)

    def set_connection_gate(self, refuse: Callable[[str], bool] | None) -> None:
        """`refuse(peer_id) -> bool`, asked of each new connection; True closes it at once
        (never counted, no "up"; `transport.libp2p_liveness.PeerTracker`)."""
        self._tracker.refuse = refuse

    @property
    def connections_gated(self) -> int:
        """New connections closed at once because `refuse` said so (a banned peer's)."""
        return self._tracker.refused

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

    def _link_lost(self, peer_id: str, connection: object) -> None:
        """One of `peer_id`'s connections closed, another remains: its streams go with it."""
        if self._messages is not None:
            self._messages.close_on(peer_id, connection)

    def _peer_went_down(self, peer_id: str) -> None:
        if self._messages is not None:
            self._messages.close_peer(peer_id)
        if self._host is not None:
            forget_identify(self._host, parse_peer_id(peer_id))

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

    def set_gossip_validator(self, validator: GossipValidator) -> None:
        """`validator(topic, forwarder_peer_id, data) -> bool`, run before the library
        forwards or delivers a message of a joined topic (transport.libp2p_gossip)."""
        self._running_gossip().validator = validator

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
