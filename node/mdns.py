"""Finding peers on the local network with mDNS (config `mdns = true`).

py-libp2p 0.8.1 ships `MDNSDiscovery` (zeroconf underneath). We use its
pieces rather than `new_host(enable_mDNS=True)` for three reasons:

* zeroconf calls block (registering probes the LAN for ~1-2 s, closing
  sends goodbyes), so they run in a worker thread, not on the trio thread
  where `MDNSDiscovery.start()` would run them and stall the node;
* discoveries arrive on zeroconf's own thread through a process-wide
  emitter (`peerDiscovery`); `mdns_discovery` hands them to trio with the
  trio token, as plain `Discovered` values on a bounded channel;
* we advertise under a private service type (`_p2p-megnode._udp.local.`),
  so a node dials only other megnode nodes, not every libp2p peer (IPFS
  daemons, ...) on the LAN, and we advertise addresses peers can dial: a
  wildcard listen address (0.0.0.0) becomes the host's interface addresses.

Announcements are untrusted: anyone on the LAN can announce any peer id with
any addresses, and the node dials them (issue 16: ~4 rounds of dials per
fake id, no bound on ids). `DiscoveryBudget` bounds what a spoofer can make
the node do: at most MAX_DISCOVERED_PEERS peers are being dialled from
discovery at once (others are dropped until announced again) and at most
MAX_DISCOVERY_DIALS_PER_MIN dials to announced addresses leave the node in
any minute, all peer ids together (a dial over the budget waits for it).

The default is off: multicast announces the node and its addresses to the
whole LAN, most servers and clouds do not carry multicast at all, and a
fixed bootstrap list is the predictable choice; mDNS is for LANs and labs.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

logger = logging.getLogger("megnode.mdns")

SERVICE_FINGERPRINT = "megnode"  # service type _p2p-megnode._udp.local.
ADDRESS_TTL_S = 120  # how long a discovered address stays in the peerstore
DISCOVERED_CAPACITY = 256  # discoveries waiting for the dialler; more are dropped (re-announced later)
MAX_ADDRESSES_PER_PEER = 8  # a peer announcing more gets only its first ones dialled
STOP_TIMEOUT_S = 5.0  # unregistering and closing zeroconf, at shutdown
DIAL_DEFER_S = 3.0  # both sides discover each other; the larger peer id waits this long
DIAL_ATTEMPTS = 4
DIAL_RETRY_S = 2.0  # doubled after each failed round
# Untrusted discovery: a LAN of a few dozen nodes fits; a spoofer gets no more.
MAX_DISCOVERY_DIALS_PER_MIN = 60  # dials to announced addresses per minute, all peers
MAX_DISCOVERED_PEERS = 64  # peers being dialled from discovery at once
DIAL_WINDOW_MS = 60_000


class MdnsError(Exception):
    """mDNS cannot run here (no multicast-capable interface, port taken ...)."""


@dataclass(frozen=True, slots=True)
class Discovered:
    """A megnode peer seen on the LAN: its peer id and its addresses (each ending in /p2p/<id>)."""

    peer_id: str
    addresses: tuple[str, ...]


class DiscoveryBudget:
    """Sans-IO bounds on dials to announced peers: a table of peers and dials per minute.

        budget.admit(peer_id)          # False: already dialling it, or the table is full
        budget.dial_delay_ms(now_ms)   # 0: dial now (counted); else wait this long, ask again
        budget.release(peer_id)        # done with it (connected or gave up)
    """

    def __init__(self, dials_per_min: int = MAX_DISCOVERY_DIALS_PER_MIN,
                 max_peers: int = MAX_DISCOVERED_PEERS) -> None:
        self._dials_per_min = dials_per_min
        self._max_peers = max_peers
        self._dials: deque[int] = deque()  # times (ms) of the dials in the last window
        self._peers: set[str] = set()
        self.dropped = 0  # announcements not admitted because the table was full

    @property
    def peers(self) -> frozenset[str]:
        return frozenset(self._peers)

    def admit(self, peer_id: str) -> bool:
        if peer_id in self._peers:
            return False
        if len(self._peers) >= self._max_peers:
            self.dropped += 1
            return False
        self._peers.add(peer_id)
        return True

    def release(self, peer_id: str) -> None:
        self._peers.discard(peer_id)

    def dial_delay_ms(self, now_ms: int) -> int:
        """0 and the dial is counted, or how long until the window has room for one."""
        while self._dials and self._dials[0] <= now_ms - DIAL_WINDOW_MS:
            self._dials.popleft()
        if len(self._dials) < self._dials_per_min:
            self._dials.append(now_ms)
            return 0
        return self._dials[0] + DIAL_WINDOW_MS - now_ms


def advertised_addresses(listen: Sequence[str]) -> list[str]:
    """Our listen addresses as peers on the LAN can dial them, without /p2p/ suffixes."""
    import ifaddr  # zeroconf's own dependency

    result: list[str] = []
    for address in listen:
        bare = address.split("/p2p/")[0]
        if bare.startswith("/ip4/0.0.0.0/"):
            rest = bare[len("/ip4/0.0.0.0"):]
            for adapter in ifaddr.get_adapters():
                for ip in adapter.ips:
                    if isinstance(ip.ip, str) and not ip.ip.startswith("127."):
                        result.append(f"/ip4/{ip.ip}{rest}")
        else:
            result.append(bare)
    return result


def _port_of(addresses: Sequence[str]) -> int:
    for address in addresses:
        parts = address.split("/")
        if "tcp" in parts:
            return int(parts[parts.index("tcp") + 1])
    return 0


@asynccontextmanager
async def mdns_discovery(host, listen: Sequence[str]) -> AsyncIterator[trio.MemoryReceiveChannel[Discovered]]:
    """Announce `host` on the LAN and yield a channel of the megnode peers found there."""
    from libp2p.discovery.events.peerDiscovery import peerDiscovery
    from libp2p.discovery.mdns.mdns import create_mdns_discovery

    token = trio.lowlevel.current_trio_token()
    send, receive = trio.open_memory_channel[Discovered](DISCOVERED_CAPACITY)
    own_peer_id = str(host.get_id())

    def offer(found: Discovered) -> None:  # on the trio thread
        try:
            send.send_nowait(found)
        except (trio.WouldBlock, trio.ClosedResourceError):
            pass  # the dialler is behind or gone; the peer re-announces

    def on_discovered(info) -> None:
        # Runs on zeroconf's thread, for every discovery in this process (the
        # emitter is process-wide): never block, never raise.
        peer_id = str(info.peer_id)
        if peer_id == own_peer_id:
            return
        addresses = tuple(f"{a}/p2p/{peer_id}" for a in info.addrs[:MAX_ADDRESSES_PER_PEER])
        if not addresses:
            return
        try:
            token.run_sync_soon(offer, Discovered(peer_id, addresses))
        except trio.RunFinishedError:
            pass

    advertised = advertised_addresses(listen)

    def create():
        return create_mdns_discovery(host.get_network(), port=_port_of(advertised),
                                     listen_addrs=advertised,
                                     private_network_fingerprint=SERVICE_FINGERPRINT,
                                     ttl=ADDRESS_TTL_S)

    # Registered before the browser starts (in the constructor): no early discovery is missed.
    peerDiscovery.register_peer_discovered_handler(on_discovered)
    try:
        try:
            discovery = await trio.to_thread.run_sync(create)
        except Exception as exc:  # zeroconf raises OSError and its own errors
            raise MdnsError(f"cannot start mDNS: {exc!r}") from None
        try:
            await trio.to_thread.run_sync(discovery.broadcaster.register)
            logger.info("mDNS: announcing %s as %s", ", ".join(advertised),
                        discovery.service_name)
            yield receive
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(STOP_TIMEOUT_S):
                try:
                    await trio.to_thread.run_sync(discovery.stop, abandon_on_cancel=True)
                except Exception as exc:  # shutting down: a failed goodbye is not worth a crash
                    logger.warning("mDNS: stopping failed: %r", exc)
    finally:
        peerDiscovery.unregister_peer_discovered_handler(on_discovered)
        send.close()
