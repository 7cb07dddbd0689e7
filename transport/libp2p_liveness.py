"""Peer liveness on a py-libp2p host: who is up, is a connection alive, dropping it.

The node needs two things py-libp2p does not give it directly:

* Clean up/down edges per peer. py-libp2p reports every connection opened
  and closed; `PeerTracker` counts them per peer and turns the counts into
  one `PeerEvent(up=True)` for the first connection and one
  `PeerEvent(up=False)` for the last (and a `link_lost` one when any other
  closes: frames in flight on it may be lost), through a synchronous callback. A
  callback, not a channel: it cannot fill up and block py-libp2p's
  connection path, and it cannot lose a "down". It runs inside the
  library's notifee task, so it must only record the event (e.g.
  `send_nowait` into the owner's own channel).
* A "down" for a connection that died without closing. A peer that stops
  reading keeps its connection "open" for as long as nobody writes to it.
  Three things turn that into a clean "down" (the host counts them in
  `connections_aborted`): a write the peer does not take within
  `libp2p_patches.WRITE_STALL_TIMEOUT_S` aborts the connection;
  `libp2p_streams.STALE_STREAM_FAILURES` timed-out stream opens/writes in a
  row abort it too (`P2PHost._stale`); and `connect` to a peer we think we
  are connected to first checks the connection with a libp2p ping (`ping`,
  bounded by `LIVENESS_PROBE_TIMEOUT_S`) and redials if it is dead. Whom to
  redial after a "down" is the owner's choice (`transport.libp2p_redial`).
* A gate on every new connection. `PeerTracker.refuse(peer_id)` is asked as
  soon as py-libp2p reports a connection (its peer id is known, the muxer has
  just started): a refused connection (a peer the node has banned) has its
  socket closed there and then, is never counted and never makes an "up".
  Without it, a banned peer that dials again while its old connection is
  still being aborted gets a connection nobody looks at (no new "up" while
  the old one is counted) until the next policy tick.

Closing is here too (`close_connections`, `disconnect_peer`, `abort_peer`):
py-libp2p's own close paths can leave a socket open under cancellation, and
then the peer never sees us go down, which is what the rest of this module
exists to prevent.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import multiaddr
import trio
from libp2p.abc import IHost, INetConn, INetStream, INetwork, INotifee
from libp2p.host.ping import ID as PING_PROTOCOL_ID
from libp2p.host.ping import PING_LENGTH
from libp2p.io.utils import read_exactly

from transport.libp2p_patches import abort_session
from transport.libp2p_streams import STREAM_ERRORS, close_quietly, parse_peer_id

logger = logging.getLogger(__name__)

# A live connection answers a libp2p ping well within this even when busy;
# `connect` to a peer that does not is treated as a dead connection.
LIVENESS_PROBE_TIMEOUT_S = 5.0
# Bound on a shielded close (one peer's connections, or a whole host's at exit).
CLOSE_TIMEOUT_S = 5.0
# After aborting a connection, how long `abort_peer` waits for py-libp2p to
# forget it (its close path ends with a fixed 0.1 s sleep) before returning.
CONNECTION_GONE_TIMEOUT_S = 2.0
CONNECTION_GONE_POLL_S = 0.05


@dataclass(frozen=True)
class PeerEvent:
    peer_id: str
    up: bool  # True: first connection opened; False: last connection closed
    # With up=True: one of the peer's connections closed and another remains (the
    # peer is still up). What was in flight on the closed one may be lost: a peer
    # that aborted a connection to us while we were stopped redials on our return,
    # and our first frames went out on the old connection.
    link_lost: bool = False


PeerCallback = Callable[[PeerEvent], None]


@dataclass
class PeerTracker(INotifee):
    """Connection counts per peer, turned into up/down edges for the owner.

    `on_down` runs first on a "down" (the host closes the peer's message
    streams), then `on_peer` hears the event.
    """

    on_peer: PeerCallback | None
    on_down: Callable[[str], None]
    refuse: Callable[[str], bool] | None = None  # True: close this new connection now
    # Told first when one of several connections to a peer closes (`link_lost`), with
    # its muxed connection: the host stops the message streams that ran on it.
    on_link_lost: Callable[[str, object], None] | None = None
    connections: dict[str, int] = field(default_factory=dict)
    refused: int = 0  # connections closed by the gate
    # Refused connections whose "disconnected" is still to come (weak: one py-libp2p
    # never reports closed is not kept alive, and no later connection is mistaken for it).
    _refused_conns: weakref.WeakSet[INetConn] = field(default_factory=weakref.WeakSet)

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        peer_id = conn.muxed_conn.peer_id.to_base58()
        if self._refused(peer_id):
            self.refused += 1
            self._refused_conns.add(conn)
            await _drop_connection(conn)
            return
        count = self.connections.get(peer_id, 0)
        self.connections[peer_id] = count + 1
        if count == 0:
            self._emit(PeerEvent(peer_id, up=True))

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        peer_id = conn.muxed_conn.peer_id.to_base58()
        if self._refused_conns and conn in self._refused_conns:
            self._refused_conns.discard(conn)
            return  # never counted
        count = self.connections.get(peer_id, 0)
        if count == 0:
            return  # a connection we never counted (closed during setup)
        if count > 1:
            self.connections[peer_id] = count - 1
            if self.on_link_lost is not None:
                try:
                    self.on_link_lost(peer_id, conn.muxed_conn)
                except Exception:
                    logger.exception("link-lost callback failed for %s", peer_id)
            self._emit(PeerEvent(peer_id, up=True, link_lost=True))
            return
        del self.connections[peer_id]
        self.on_down(peer_id)
        self._emit(PeerEvent(peer_id, up=False))

    def _refused(self, peer_id: str) -> bool:
        if self.refuse is None:
            return False
        try:
            return self.refuse(peer_id)
        except Exception:
            logger.exception("connection gate failed for %s", peer_id)
            return False

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


async def ping(host: IHost, peer_id: str, timeout_s: float = LIVENESS_PROBE_TIMEOUT_S) -> bool:
    """True if the connection to `peer_id` answers a libp2p ping within `timeout_s`."""
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


async def close_connection(connection: INetConn) -> None:
    """Close one connection and, whatever state py-libp2p left it in, its socket."""
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


async def _drop_connection(connection: INetConn) -> None:
    """Close one connection's socket at once (no goodbye), then the connection itself."""
    with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT_S):
        secured = getattr(connection.muxed_conn, "secured_conn", None)
        if secured is not None:
            await abort_session(secured)
        await close_connection(connection)


async def close_connections(connections: Iterable[INetConn]) -> None:
    """Close `connections` all at once.

    Yamux's close ends with a fixed 0.1 s sleep; closing one after another
    (as the swarm does) would cost that per connection.
    """
    async with trio.open_nursery() as closers:
        for connection in connections:
            closers.start_soon(close_connection, connection)


def _connections_to(host: IHost, peer_id: str) -> list[INetConn]:
    target = parse_peer_id(peer_id)
    return [c for c in host.get_network().get_connections() if c.muxed_conn.peer_id == target]


async def disconnect_peer(host: IHost, peer_id: str) -> None:
    """Close every connection to `peer_id`, bounded and shielded.

    Each connection's muxer is closed directly, so the peer sees the socket
    go even if the library's own bookkeeping (which `host.disconnect` relies
    on) is mid-update.
    """
    with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT_S):
        await close_connections(_connections_to(host, peer_id))
        try:
            await host.disconnect(parse_peer_id(peer_id))
        except Exception:
            logger.debug("host.disconnect(%s) failed", peer_id, exc_info=True)


async def abort_peer(host: IHost, peer_id: str) -> None:
    """Drop every connection to `peer_id` at once: close the sockets, say no goodbye.

    For a connection that looks dead, where a graceful close would wait on
    writes the peer will never take. Returns once py-libp2p has forgotten
    the connections (bounded by CONNECTION_GONE_TIMEOUT_S).
    """
    with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT_S):
        connections = _connections_to(host, peer_id)
        for connection in connections:
            secured = getattr(connection.muxed_conn, "secured_conn", None)
            if secured is not None:
                await abort_session(secured)
        await close_connections(connections)
        with trio.move_on_after(CONNECTION_GONE_TIMEOUT_S):
            while _connections_to(host, peer_id):
                await trio.sleep(CONNECTION_GONE_POLL_S)
