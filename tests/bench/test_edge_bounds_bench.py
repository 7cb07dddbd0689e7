"""Attack volume on the node's edge services: metrics slow sockets, Sybil relay flood, spoofed mDNS.

Issue 16's second round: 8 slow sockets made the metrics exporter answer
0/20 scrapes; a relay client taking a fresh key every 40 requests made the
relay verify 143,360 events in 20 s; an mDNS spoofer made the node dial
attacker-chosen addresses, ~4 rounds per fake peer id, with no bound on ids.
Each measurement here replays that attack on the code under test (run it on
an older commit for the "before" figure) and writes bench-results/edge_bounds.json:

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/bench/test_edge_bounds_bench.py -s

Not part of `make test`.
"""

from __future__ import annotations

import inspect
import random
import time
from collections import Counter
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

import node.core.monitor as monitor
from node.core.event import EVENT_VERSION, pack, signed_encoding
from node.core.event import pack_payload
from node.metrics import MetricsExporter, open_metrics_listeners
from node.relay import RelayServer
from node.state.types import RULE_PUBLIC, TYPE_MEMBER
from tests.helpers import QuietNode, authorized_topic, identity
from transport.libp2p_host import ConnectError
from transport.relay import SubmitRequest, encode

# ------------------------------------------------------------------ metrics

SLOW_SOCKETS = 8  # the figure
SCRAPES = 20
SCRAPE_TIMEOUT_S = 1.0
HONEST_REQUEST = b"GET /metrics HTTP/1.0\r\n\r\n"


async def _slow_socket(port: int, partial: bool) -> trio.SocketStream:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    if partial:
        await stream.send_all(b"GET /metrics HTTP/1.0\r\n")  # never the blank line
    return stream


async def _scrape(port: int) -> int | None:
    """The status of one honest scrape, or None if it got no answer in time."""
    with trio.move_on_after(SCRAPE_TIMEOUT_S):
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(HONEST_REQUEST)
                data = b""
                while chunk := await stream.receive_some(65_536):
                    data += chunk
            return int(data.split(b" ", 2)[1])
        except (OSError, trio.BrokenResourceError, IndexError, ValueError):
            return None
    return None


async def metrics_under_slow_sockets() -> dict[str, Any]:
    listeners = await open_metrics_listeners(0)
    exporter = MetricsExporter(QuietNode(), listeners)  # type: ignore[arg-type]
    port = exporter.port
    ok = 0
    started = time.perf_counter()
    latencies = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(exporter.serve)
        slow = [await _slow_socket(port, i % 2 == 1) for i in range(SLOW_SOCKETS)]
        for _ in range(SCRAPES):
            # The attacker keeps its slow sockets open: every one the exporter
            # closed is opened again before the next scrape.
            slow = [s for s in slow if not await _closed(s)]
            while len(slow) < SLOW_SOCKETS:
                slow.append(await _slow_socket(port, len(slow) % 2 == 1))
            begin = time.perf_counter()
            if await _scrape(port) == 200:
                ok += 1
                latencies.append(time.perf_counter() - begin)
        for stream in slow:
            await stream.aclose()
        nursery.cancel_scope.cancel()
    return {"slow_sockets": SLOW_SOCKETS, "scrapes": SCRAPES, "scrapes_ok": ok,
            "scrape_s_max": round(max(latencies), 4) if latencies else None,
            "wall_s": round(time.perf_counter() - started, 2)}


async def _closed(stream: trio.SocketStream) -> bool:
    """True if the exporter closed `stream` (EOF or reset), without blocking."""
    with trio.move_on_after(0):
        try:
            return await stream.receive_some(1) == b""
        except (trio.BrokenResourceError, OSError):
            return True
    return False


# ------------------------------------------------------------------ relay

SYBIL_KEYS = 112
REQUESTS_PER_KEY = 40
EVENTS_PER_REQUEST = 32
ATTACK_S = 20
SOURCE = "127.0.0.1"  # every Sybil key comes from one address


def _bogus_member_events(key: bytes, topic: bytes, parents: list[bytes],
                         first_seq: int) -> tuple[bytes, ...]:
    """Own member events (the path a non-relayed key may take) with zero signatures."""
    own = key.hex()
    payload = pack_payload({"membership": "join", "relayed": True})
    return tuple(signed_encoding(pack([EVENT_VERSION, topic, key, first_seq + i, parents, [], 1,
                                       TYPE_MEMBER, own, payload]), bytes(64))
                 for i in range(EVENTS_PER_REQUEST))


def relay_sybil_flood() -> dict[str, Any]:
    replica = authorized_topic(author="alice", join_rule=RULE_PUBLIC)
    replica.commit()
    server = RelayServer(lambda t: replica if t == replica.topic_id else None, random.Random(5))
    takes_source = "source" in inspect.signature(server.handle).parameters
    verified = Counter[str]()
    real_verify = monitor.verify_signature

    def counting_verify(event):  # type: ignore[no-untyped-def]
        verified["n"] += 1
        return real_verify(event)

    monitor.verify_signature = counting_verify
    total = SYBIL_KEYS * REQUESTS_PER_KEY
    parents = sorted(replica.graph.extremities())
    started = time.process_time()
    try:
        for n in range(total):
            key = identity(f"sybil-{n // REQUESTS_PER_KEY}").public_key
            request = encode(SubmitRequest(replica.topic_id,
                                           _bogus_member_events(key, replica.topic_id, parents, n * 64)))
            now_ms = 10_000 + n * ATTACK_S * 1_000 // total
            if takes_source:
                server.handle(key, request, now_ms, source=SOURCE)
            else:
                server.handle(key, request, now_ms)
            replica.commit()
    finally:
        monitor.verify_signature = real_verify
    return {"keys": SYBIL_KEYS, "requests": total, "events_sent": total * EVENTS_PER_REQUEST,
            "attack_s": ATTACK_S, "signatures_verified": verified["n"],
            "refused": {k: v for k, v in server.stats.items() if k.startswith("refused.")},
            "cpu_s": round(time.process_time() - started, 2)}


# ------------------------------------------------------------------ mDNS

SPOOF_IDS_PER_S = 20
SPOOF_ADDRESSES = 8
SPOOF_MINUTES = 5


class UnreachableHost:
    """A host whose every dial fails: counts dials per simulated minute."""

    peer_id = "Qm" + "z" * 44  # larger than any fake id: no deferred dial

    def __init__(self) -> None:
        self.dials_by_minute = Counter[int]()
        self.libp2p = None

    def peers(self) -> frozenset[str]:
        return frozenset()

    def listen_addrs(self) -> tuple[str, ...]:
        return ()

    async def connect(self, address: str) -> str:
        self.dials_by_minute[int(trio.current_time() // 60)] += 1
        raise ConnectError("unreachable")


def mdns_spoofing() -> dict[str, Any]:
    import node.mdns as mdns
    from node.dialer import Dialer

    host = UnreachableHost()

    @asynccontextmanager
    async def spoofed(_host, _listen):  # type: ignore[no-untyped-def]
        send, receive = trio.open_memory_channel[mdns.Discovered](mdns.DISCOVERED_CAPACITY)

        async def spoof() -> None:
            for n in range(SPOOF_IDS_PER_S * 60 * SPOOF_MINUTES):
                peer = f"Qm{n:044d}"
                addresses = tuple(f"/ip4/10.9.{i}.{n % 250}/tcp/4001/p2p/{peer}"
                                  for i in range(SPOOF_ADDRESSES))
                try:
                    send.send_nowait(mdns.Discovered(peer, addresses))
                except trio.WouldBlock:
                    pass  # the dialler's queue is full: this one is lost, as over zeroconf
                await trio.sleep(1 / SPOOF_IDS_PER_S)
            await send.aclose()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(spoof)
            yield receive

    async def main() -> None:
        real = mdns.mdns_discovery
        mdns.mdns_discovery = spoofed
        try:
            async with trio.open_nursery() as nursery:
                dialer = Dialer(host, None, nursery)  # type: ignore[arg-type]
                await dialer.discover_on_lan()
                nursery.cancel_scope.cancel()
        finally:
            mdns.mdns_discovery = real

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    per_minute = [host.dials_by_minute[m] for m in range(SPOOF_MINUTES)]
    return {"fake_ids": SPOOF_IDS_PER_S * 60 * SPOOF_MINUTES, "addresses_per_id": SPOOF_ADDRESSES,
            "dials_per_minute": per_minute, "dials_per_minute_max": max(per_minute)}


def test_edge_bounds(record_figures) -> None:
    figures = {"metrics": trio.run(metrics_under_slow_sockets),
               "relay": relay_sybil_flood(),
               "mdns": mdns_spoofing()}
    record_figures("edge_bounds", figures)
