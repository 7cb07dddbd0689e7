"""The metrics exporter under slow sockets (issue 16: 8 of them made it answer 0/20 scrapes).

An exporter over a node that has nothing to report, on a real loopback
listener. Slow sockets connect and send nothing or half a request head;
while more of them are open than the exporter has slots, an honest scrape
(its request sent at once) is answered 200 within a bound, because a new
connection evicts the one that has waited longest for its head. Each wait
is bounded and waits on a condition.
"""

from __future__ import annotations


import trio

from node.metrics import (
    MAX_CONNECTIONS,
    REQUEST_HEAD_TIMEOUT_S,
    MetricsExporter,
    open_metrics_listeners,
)
from tests.helpers import QuietNode

SLOW_SOCKETS = MAX_CONNECTIONS + 4  # more than every slot
HONEST_SCRAPE_S = 1.0  # the bound an honest scrape must be answered within
SCRAPES = 20  # the count
SETUP_TIMEOUT_S = 10.0
POLL_S = 0.01


async def scrape(port: int) -> bytes:
    with trio.fail_after(HONEST_SCRAPE_S):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"GET /metrics HTTP/1.0\r\n\r\n")
            data = b""
            while chunk := await stream.receive_some(65_536):
                data += chunk
    return data


async def open_slow(port: int, index: int) -> trio.SocketStream:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    if index % 2:
        await stream.send_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n")  # no blank line, ever
    return stream


async def test_honest_scrapes_are_answered_while_slow_sockets_hold_every_slot() -> None:
    exporter = MetricsExporter(QuietNode(), await open_metrics_listeners(0))  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(exporter.serve)
        slow = [await open_slow(exporter.port, i) for i in range(SLOW_SOCKETS)]
        with trio.fail_after(SETUP_TIMEOUT_S):  # every slot taken, the surplus evicted
            while exporter.counts["evicted"] < SLOW_SOCKETS - MAX_CONNECTIONS:
                await trio.sleep(POLL_S)
        assert exporter.open_connections == MAX_CONNECTIONS
        for n in range(SCRAPES):
            # The attacker opens one more slow socket before each scrape.
            slow.append(await open_slow(exporter.port, n))
            reply = await scrape(exporter.port)
            assert reply.startswith(b"HTTP/1.0 200 "), reply[:80]
            assert b"megnode_topics 0.0" in reply
        assert exporter.open_connections <= MAX_CONNECTIONS
        assert exporter.counts["refused"] == 0  # no honest scrape was turned away
        for stream in slow:
            await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_a_client_that_never_finishes_its_head_gets_408_after_the_timeout() -> None:
    exporter = MetricsExporter(QuietNode(), await open_metrics_listeners(0))  # type: ignore[arg-type]
    clock_start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(exporter.serve)
        stream = await open_slow(exporter.port, 1)
        with trio.fail_after(SETUP_TIMEOUT_S):
            data = b""
            while chunk := await stream.receive_some(4_096):
                data += chunk
        await stream.aclose()
        assert data.startswith(b"HTTP/1.0 408 ")
        assert exporter.counts["timed_out"] == 1 and exporter.open_connections == 0
        nursery.cancel_scope.cancel()
    assert trio.current_time() - clock_start >= REQUEST_HEAD_TIMEOUT_S
