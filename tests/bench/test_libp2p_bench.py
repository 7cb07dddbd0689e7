"""py-libp2p transport figures for P2PHost, all hosts in this one process, loopback.

* request/response round trip: p50/p99 over sequential 300-byte requests,
  ours and py-libp2p's `RequestResponse` helper interleaved in the same run;
* one-way messages/s: `P2PHost.send` (queued, coalesced writes) against one
  `stream.write` per message on a raw stream, same receiver, same run: the
  ratio is the figure that matters on a shared machine;
* gossipsub with our configuration: 4 hosts fully connected, one publisher at
  50 and at 200 msg/s, delivery ratio at the other three after a bounded
  drain, and publish -> delivery latency p50/p99 (same process, one clock).

Writes bench-results/libp2p.json. Not part of `make test`.
"""

from __future__ import annotations

import os
import statistics
import time
from contextlib import AsyncExitStack

import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.request_response import BytesCodec, RequestResponse

from transport.framing import encode_frame
from transport.libp2p_gossip import GossipConfig
from transport.libp2p_host import P2PHost

PAYLOAD_BYTES = 300
RTT_REQUESTS = 2000
ONE_WAY_MESSAGES = 20_000
ONE_WAY_UNBATCHED_MESSAGES = 3_000  # one write each is slow; fewer keeps the run short
GOSSIP_HOSTS = 4
GOSSIP_RUNS = ((50, 500), (200, 2000))  # (msg/s, messages): ~10 s of publishing each
GOSSIP_DRAIN_S = 10.0
MESH_TIMEOUT_S = 15.0
RR = "/megnode-bench/rr/1"
RR_LIBRARY = "/megnode-bench/rr-library/1"
RTT_ROUNDS = 4  # alternate ours / the library helper to share the machine's noise
MSG = "/megnode-bench/msg/1"
TOPIC = "megnode-bench"
NO_GOSSIP = GossipConfig(enabled=False)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


async def echo(peer_id: str, request: bytes) -> bytes:
    return request


async def library_echo(request: bytes, context: object) -> bytes:
    return request


async def measure_rtt() -> dict:
    ours: list[float] = []
    library: list[float] = []
    async with P2PHost(bytes([1]) * 32, gossip=NO_GOSSIP) as a, \
            P2PHost(bytes([2]) * 32, gossip=NO_GOSSIP) as b:
        a.set_request_handler(RR, echo)
        RequestResponse(a.libp2p).set_handler(TProtocol(RR_LIBRARY), library_echo, BytesCodec())
        helper = RequestResponse(b.libp2p)
        server = ID.from_base58(a.peer_id)
        await b.connect(a.listen_addrs()[0])
        payload = bytes(PAYLOAD_BYTES)
        for _ in range(50):  # warm-up: identify, window growth
            await b.request(a.peer_id, RR, payload)
            await helper.send_request(server, [TProtocol(RR_LIBRARY)], payload, BytesCodec())
        for _ in range(RTT_ROUNDS):
            for _ in range(RTT_REQUESTS // RTT_ROUNDS):
                start = time.perf_counter()
                await b.request(a.peer_id, RR, payload)
                ours.append(time.perf_counter() - start)
            for _ in range(RTT_REQUESTS // RTT_ROUNDS):
                start = time.perf_counter()
                await helper.send_request(server, [TProtocol(RR_LIBRARY)], payload, BytesCodec())
                library.append(time.perf_counter() - start)
    return {
        "requests": len(ours),
        "payload_bytes": PAYLOAD_BYTES,
        "rtt_p50_ms": ms(percentile(ours, 0.50)),
        "rtt_p99_ms": ms(percentile(ours, 0.99)),
        "library_helper_rtt_p50_ms": ms(percentile(library, 0.50)),
        "library_helper_rtt_p99_ms": ms(percentile(library, 0.99)),
    }


async def measure_one_way() -> dict:
    received = 0
    target = 0
    done = trio.Event()

    async def count(peer_id: str, data: bytes) -> None:
        nonlocal received
        received += 1
        if received == target:
            done.set()

    async with P2PHost(bytes([1]) * 32, gossip=NO_GOSSIP) as a, \
            P2PHost(bytes([2]) * 32, gossip=NO_GOSSIP) as b:
        a.set_message_handler(MSG, count)
        await b.connect(a.listen_addrs()[0])
        payload = bytes(PAYLOAD_BYTES)

        received, target, done = 0, ONE_WAY_MESSAGES, trio.Event()
        start = time.perf_counter()
        for _ in range(ONE_WAY_MESSAGES):
            await b.send(a.peer_id, MSG, payload)
        await done.wait()
        batched_rate = ONE_WAY_MESSAGES / (time.perf_counter() - start)

        received, target, done = 0, ONE_WAY_UNBATCHED_MESSAGES, trio.Event()
        stream = await b.libp2p.new_stream(ID.from_base58(a.peer_id), [TProtocol(MSG)])
        frame = encode_frame(payload)
        start = time.perf_counter()
        for _ in range(ONE_WAY_UNBATCHED_MESSAGES):
            await stream.write(frame)
        await done.wait()
        unbatched_rate = ONE_WAY_UNBATCHED_MESSAGES / (time.perf_counter() - start)
        await stream.close()
    return {
        "payload_bytes": PAYLOAD_BYTES,
        "batched_messages": ONE_WAY_MESSAGES,
        "batched_msgs_per_s": round(batched_rate),
        "one_write_per_message_messages": ONE_WAY_UNBATCHED_MESSAGES,
        "one_write_per_message_msgs_per_s": round(unbatched_rate),
        "batched_over_unbatched": round(batched_rate / unbatched_rate, 1),
    }


async def measure_gossip(rate_per_s: int, count: int) -> dict:
    latencies: list[float] = []
    seen: list[set[int]] = []
    expected = count * (GOSSIP_HOSTS - 1)
    all_in = trio.Event()
    sent_at: dict[int, float] = {}

    async with AsyncExitStack() as stack:
        hosts = [
            await stack.enter_async_context(P2PHost(bytes([index + 1]) * 32))
            for index in range(GOSSIP_HOSTS)
        ]
        for host in hosts[1:]:
            got: set[int] = set()
            seen.append(got)

            async def on_gossip(topic: str, origin: str, data: bytes, got: set[int] = got) -> None:
                number = int.from_bytes(data[:8], "big")
                if number not in got:
                    got.add(number)
                    latencies.append(time.perf_counter() - sent_at[number])
                    if len(latencies) == expected:
                        all_in.set()

            host.set_gossip_handler(on_gossip)
        for index, host in enumerate(hosts):
            for other in hosts[index + 1:]:
                await other.connect(host.listen_addrs()[0])
        for host in hosts:
            await host.join(TOPIC)
        publisher = hosts[0]
        with trio.fail_after(MESH_TIMEOUT_S):
            for host in hosts[1:]:
                await publisher.wait_gossip_mesh_peer(TOPIC, host.peer_id, MESH_TIMEOUT_S)

        interval = 1.0 / rate_per_s
        start = trio.current_time()
        for number in range(count):
            # Pace against the schedule, not per message, so the rate holds.
            await trio.sleep_until(start + number * interval)
            sent_at[number] = time.perf_counter()
            await publisher.publish(TOPIC, number.to_bytes(8, "big") + bytes(PAYLOAD_BYTES - 8))
        publish_s = trio.current_time() - start
        with trio.move_on_after(GOSSIP_DRAIN_S):
            await all_in.wait()
        dropped = sum(host.gossip_stats().inbox_dropped for host in hosts[1:])
    delivered = sum(len(got) for got in seen)
    return {
        "hosts": GOSSIP_HOSTS,
        "rate_per_s": rate_per_s,
        "messages": count,
        "achieved_publish_rate_per_s": round(count / publish_s, 1),
        "delivery_ratio": round(delivered / expected, 4),
        "latency_p50_ms": ms(percentile(latencies, 0.50)) if latencies else None,
        "latency_p99_ms": ms(percentile(latencies, 0.99)) if latencies else None,
        "latency_mean_ms": ms(statistics.fmean(latencies)) if latencies else None,
        "inbox_dropped": dropped,
    }


async def test_libp2p_transport_figures(record_figures) -> None:
    figures = {
        "load_average_1m_at_start": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "request_response": await measure_rtt(),
        "one_way": await measure_one_way(),
        "gossipsub": [await measure_gossip(rate, count) for rate, count in GOSSIP_RUNS],
        "gossip_config": {
            "protocols": ["/meshsub/1.1.0", "/meshsub/1.0.0"],
            "degree": [GossipConfig().degree_low, GossipConfig().degree, GossipConfig().degree_high],
            "heartbeat_s": GossipConfig().heartbeat_s,
            "spam_protection": GossipConfig().spam_protection,
        },
    }
    figures["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    record_figures("libp2p", figures)
    assert figures["one_way"]["batched_over_unbatched"] > 1
