"""Discovery chosen by measurement (issue 12): py-libp2p's Kademlia against peer exchange.

bench-results/discovery.json, `kademlia` part: KAD_NODES plain py-libp2p 0.8.1 hosts on
127.0.0.1, each running `libp2p.kad_dht.KadDHT` in server mode, all connected only to
host 0 (the fleet's single bootstrap, as in the peer-exchange figure); each provides
the key derived from a topic id (a sha2-256 multihash of it, as a topic's provider
record would be) and looks up its providers until it has found every other host.

* find_all_s: seconds from the DHTs starting until every host has found all the others
  as providers of the topic key (the peer-exchange counterpart: `mesh_10_s` of
  tests/bench/test_fleet_bench.py, ten daemons connected to each other from one
  bootstrap);
* lookups: find_providers calls that took, in total;
* failed_lookups: those that raised.

Finding providers is not connecting: a node then dials them, as peer exchange's answers
are dialled. Bytes at rest are not measured here: the DHT's traffic at rest is its
routing-table refresh (`start_periodic_refresh`) and provider republishing, on its own
timers; see docs/fleet.md for the decision.
"""

from __future__ import annotations

import hashlib
import time
from contextlib import AsyncExitStack

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.tools.anyio_service import background_trio_service

KAD_NODES = 10
WAIT_S = 120.0
LOOKUP_PAUSE_S = 0.2  # between one host's lookups while providers are missing
TOPIC_ID = bytes(range(32))


def topic_key(topic_id: bytes) -> str:
    """The provider-record key of a topic: a sha2-256 multihash (hex) of its id."""
    return "1220" + hashlib.sha256(b"megnode/topic/" + topic_id).hexdigest()


async def run_kademlia(nodes: int) -> dict[str, float]:
    hosts = [new_host(key_pair=create_new_key_pair(bytes([i + 1]) * 32)) for i in range(nodes)]
    listen = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]
    key = topic_key(TOPIC_ID)
    counts = {"lookups": 0, "failed": 0}
    found_at: dict[int, float] = {}
    async with AsyncExitStack() as stack:
        for host in hosts:
            await stack.enter_async_context(host.run(listen_addrs=listen))
        boot = hosts[0]
        boot_addr = str(boot.get_addrs()[0])
        if "/p2p/" not in boot_addr:
            boot_addr += f"/p2p/{boot.get_id().to_base58()}"
        for host in hosts[1:]:
            await host.connect(info_from_p2p_addr(multiaddr.Multiaddr(boot_addr)))
        dhts = [KadDHT(host, DHTMode.SERVER) for host in hosts]
        for dht, host in zip(dhts, hosts):
            for peer in host.get_connected_peers():
                await dht.routing_table.add_peer(peer)
            await stack.enter_async_context(background_trio_service(dht))
        started = time.perf_counter()
        for dht in dhts:
            await dht.provide(key)

        async def look(i: int) -> None:
            others = {h.get_id() for h in hosts} - {hosts[i].get_id()}
            while True:
                counts["lookups"] += 1
                try:
                    providers = await dhts[i].find_providers(key, count=nodes)
                except Exception:
                    counts["failed"] += 1
                    providers = []
                if others <= {p.peer_id for p in providers}:
                    found_at[i] = time.perf_counter() - started
                    return
                await trio.sleep(LOOKUP_PAUSE_S)

        with trio.move_on_after(WAIT_S):
            async with trio.open_nursery() as lookers:
                for i in range(nodes):
                    lookers.start_soon(look, i)
    return {"nodes": nodes, "found_all": len(found_at),
            "find_all_s": round(max(found_at.values()), 2) if len(found_at) == nodes else None,
            "lookups": counts["lookups"], "failed_lookups": counts["failed"]}


def test_kademlia_finds_the_providers_of_a_topic_key(record_figures) -> None:
    figures = trio.run(run_kademlia, KAD_NODES)
    record_figures("discovery", {"kademlia": figures})
    assert figures["found_all"] == KAD_NODES
