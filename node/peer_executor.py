"""The peer policy's executor: feeds it peer and transport events, carries out its effects.

Bans, transport-fault windows and redial backoff are decided by the pure
peer policy (node.core.peer_policy: inputs are events and `now`, outputs are
effects). This module is its I/O half: it turns libp2p's peer up/down events
and the transport's misbehaviour reports into policy calls, and carries out
what comes back — aborting a banned peer's connections, counting, logging,
scheduling and making redials (transport.libp2p_redial knows the addresses).
It also tells the dissemination engine which replicas are connected, keeps
the peer book (node.core.peer_book) up to date with each connection and
failed redial, and keeps relayed devices (node.relay) out of all of it: they
are not replicas.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import trio

from node.core.peer_book import PeerBook
from node.core.peer_exchange import PROTOCOL_PX
from node.core.peer_policy import Abort, Count, Dial, Note, PeerPolicy, Redial
from node.peer_ids import node_id_of, now_ms, peer_id_of
from transport.dissemination import Disseminator
from transport.libp2p_host import P2PHost
from transport.libp2p_liveness import PeerEvent
from transport.libp2p_redial import Redialer
from transport.libp2p_streams import REQUEST_READ_TIMEOUT, Misbehaviour

logger = logging.getLogger("megnode")


class PeerExecutor:
    """Runs one node's peer policy against its libp2p host."""

    def __init__(self, policy: PeerPolicy, host: P2PHost, redialer: Redialer,
                 disseminator: Disseminator, nursery: trio.Nursery, stats: dict[str, int],
                 carry_out: Callable[[Sequence[object]], None], book: PeerBook) -> None:
        self.policy = policy
        self.book = book
        self._host = host
        self._redialer = redialer
        self._disseminator = disseminator
        self._nursery = nursery
        self._stats = stats  # the node's own counters (status, metrics)
        self._carry_out = carry_out  # the dissemination engine's effects (node.effects)
        self._dropping: set[str] = set()  # banned node ids whose connections are being aborted
        self._relay_clients: set[str] = set()  # node ids of connected relay clients
        self.on_replica_up: Callable[[str], None] | None = None  # peer exchange asks it (node.fleet)
        # The connection manager's say on each connection (node.fleet.ConnectionKeeper).
        self.admit: Callable[[str], bool] | None = None
        self.on_down: Callable[[str], bool] | None = None  # True: it closed the connection
        # Whether a lost peer is still worth a redial: only below the low water mark
        # (above it, a peer that trimmed us would be redialled and trim us again).
        self.wants_redial: Callable[[], bool] | None = None

    # ------------------------------------------------------------------ relayed devices

    def is_relay_client(self, node_id: str) -> bool:
        return node_id in self._relay_clients

    def add_relay_client(self, node_id: str) -> None:
        """A relayed device, not a replica: keep it out of push fan-out and anti-entropy."""
        if node_id not in self._relay_clients:
            self._relay_clients.add(node_id)
            self._carry_out(self._disseminator.on_peer_down(node_id, now_ms()))

    # ------------------------------------------------------------------ inputs

    async def watch_peers(self, events: trio.MemoryReceiveChannel[PeerEvent]) -> None:
        """Connection edges from the host, for the policy, the redialer and the engine."""
        async for event in events:
            node_id = node_id_of(event.peer_id)
            if node_id is None:
                logger.info("ignoring peer %s: not an ed25519 identity", event.peer_id)
                continue
            # Connection churn, refreshed on every peer event (status reads the stats).
            self._stats["connections_aborted"] = self._host.connections_aborted
            if event.link_lost:
                if node_id not in self._relay_clients:
                    self._carry_out(self._disseminator.on_link_lost(node_id, now_ms()))
                continue
            if event.up:
                if self.admit is not None and not self.admit(event.peer_id):
                    continue  # over a connection limit: being closed (node.fleet)
                if node_id in self._relay_clients:
                    continue  # a relayed device: no replica to gossip or sync with
                verdict = self.policy.peer_up(node_id, now_ms())
                if verdict:  # still banned: aborted at once
                    self.run(verdict)
                    continue
                self._redialer.peer_up(event.peer_id)
                self.book.connected(event.peer_id, self._redialer.addresses(event.peer_id),
                                    now_ms())
                self._carry_out(self._disseminator.on_peer_up(node_id, now_ms()))
                if self.on_replica_up is not None:
                    self.on_replica_up(event.peer_id)
            else:
                # A connection the connection manager closed (a limit, trimming) is not
                # redialled: that would undo it.
                dropped = self.on_down is not None and self.on_down(event.peer_id)
                if node_id not in self._relay_clients and not dropped:
                    self._redialer.peer_down(event.peer_id)  # identify may have added addresses
                    if event.peer_id in self.book:  # identify's addresses, for the next start
                        self.book.connected(event.peer_id,
                                            self._redialer.addresses(event.peer_id), now_ms())
                    self.run(self.policy.peer_down(
                        node_id, now_ms(), dialable=bool(self._redialer.addresses(event.peer_id))))
                self._relay_clients.discard(node_id)
                self._carry_out(self._disseminator.on_peer_down(node_id, now_ms()))

    async def watch_transport(self, reports: trio.MemoryReceiveChannel[Misbehaviour]) -> None:
        """What the transport reported about a peer's streams, judged by the peer policy.

        Protocol faults (oversized, garbage framing): TRANSPORT_FAULTS_BEFORE_BAN of them
        within the policy's window disconnect and ban the peer. Breakages (a stream
        cut mid-frame by its dying connection) are only logged and counted.
        """
        async for report in reports:
            node_id = node_id_of(report.peer_id)
            if node_id is None:
                continue
            if report.is_protocol_fault and not self._spurious(report):
                self.run(self.policy.protocol_fault(
                    node_id, report.reason, now_ms(), report.detail))
            else:
                self.run(self.policy.breakage(node_id, report.reason, report.detail))

    @staticmethod
    def _spurious(report: Misbehaviour) -> bool:
        """A peer-exchange request that did not arrive in time is not held against the peer.

        Its handler's read deadline runs on our clock: a node stopped (SIGSTOP, a
        suspended laptop) just after a peer opened the stream finds the deadline past
        when it resumes, with the request waiting in its buffer. Discovery chatter is
        no evidence worth a ban; it is counted as a breakage.
        """
        return report.protocol_id == PROTOCOL_PX and report.reason == REQUEST_READ_TIMEOUT

    def reset_redial(self, peer_id: str) -> None:
        """News that `peer_id` is reachable (peer exchange): a running redial dials now."""
        node_id = node_id_of(peer_id)
        if node_id is not None:
            self.run(self.policy.reset(node_id, now_ms()))

    def is_banned(self, peer_id: str) -> bool:
        node_id = node_id_of(peer_id)
        return node_id is not None and self.policy.is_banned(node_id, now_ms())

    def misbehaved(self, node_id: str, reason: str) -> None:
        """The dissemination engine caught a peer breaking the protocol (`Disconnect`)."""
        self.run(self.policy.misbehaviour(node_id, reason, now_ms()))

    def enforce_bans(self, now: int) -> None:
        """The policy's tick: forget expired bans, drop connections of banned peers.

        The "up" event alone is not enough: it fires when a peer's first
        connection opens, and a banned peer that dials again while its old
        connection is still being torn down gets no new "up". So every tick
        looks at who is connected.
        """
        connected = [n for n in map(node_id_of, self._host.peers()) if n is not None]
        self.run(self.policy.tick(now, connected))

    # ------------------------------------------------------------------ effects

    def run(self, effects: Sequence[object]) -> None:
        """Carry out the peer policy's effects (node.core.peer_policy)."""
        for effect in effects:
            if isinstance(effect, Abort):
                self._nursery.start_soon(self._disconnect, effect.peer)
            elif isinstance(effect, Count):
                self._stats[effect.name] = self._stats.get(effect.name, 0) + effect.by
            elif isinstance(effect, Note):
                (logger.warning if effect.warning else logger.info)("%s", effect.message)
            elif isinstance(effect, Redial):
                self._nursery.start_soon(self._redial_at, effect.peer, effect.at_ms)
            elif isinstance(effect, Dial):
                self._nursery.start_soon(self._redial, effect.peer)
            # Banned (recorded in the policy) and GaveUp (noted) need nothing more here.

    async def _disconnect(self, peer: str) -> None:
        """Drop a banned peer's connections at once (`abort`: no goodbye it could stall)."""
        if peer in self._dropping:
            return  # an abort is under way; `enforce_bans` looks again next tick
        self._dropping.add(peer)
        try:
            await self._host.abort(peer_id_of(peer))
        except Exception as exc:
            logger.debug("disconnect of %s failed: %s", peer, exc)
        finally:
            self._dropping.discard(peer)

    async def _redial_at(self, node_id: str, at_ms: int) -> None:
        await trio.sleep(max(0, at_ms - now_ms()) / 1_000)
        peer_id = peer_id_of(node_id)
        self.run(self.policy.redial_due(
            node_id, now_ms(), connected=peer_id in self._host.peers(),
            wanted=node_id not in self._relay_clients
            and (self.wants_redial is None or self.wants_redial())))

    async def _redial(self, node_id: str) -> None:
        """One redial attempt (every known address once); the policy decides what next."""
        peer_id = peer_id_of(node_id)
        if await self._redialer.dial(peer_id):
            self.run(self.policy.dial_succeeded(node_id))
        else:
            self.book.failed(peer_id, now_ms())
            self.run(self.policy.dial_failed(node_id, now_ms()))
