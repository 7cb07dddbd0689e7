"""P2PHost on real py-libp2p hosts over 127.0.0.1.

Every test is bounded by `trio.fail_after` and waits on conditions (events
recorded by callbacks and handlers), never on a sleep. Adversarial peers use
the underlying py-libp2p host (`P2PHost.libp2p`) to write raw bytes.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Generic, TypeVar

import pytest
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from node.core.identity import Identity
from transport.framing import FrameDecoder, FrameTooLarge, MalformedFrame, encode_frame, encode_uvarint
from transport.libp2p_gossip import GossipConfig
from transport.libp2p_host import ConnectError, P2PHost
from transport.libp2p_identity import peer_id_of_public_key, public_key_of_peer_id
from transport.libp2p_liveness import PeerEvent
from transport.libp2p_requests import RequestError
from transport.libp2p_streams import (
    MALFORMED_FRAME,
    OVERSIZED_FRAME,
    STREAM_ERRORS,
    TRAILING_BYTES,
    Misbehaviour,
    StreamLimits,
)

TEST_TIMEOUT_S = 15.0
SHUTDOWN_BOUND_S = 5.0
RR = "/megnode-test/rr/1"
MSG = "/megnode-test/msg/1"
TOPIC = "megnode-test-topic"
NO_GOSSIP = GossipConfig(enabled=False)

T = TypeVar("T")


def seed(n: int) -> bytes:
    return bytes([n]) * 32


class Recorder(Generic[T]):
    """Collects callback values; `wait_until` blocks until a predicate holds."""

    def __init__(self) -> None:
        self.items: list[T] = []
        self._changed = trio.Event()

    def __call__(self, item: T) -> None:
        self.items.append(item)
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, predicate: Callable[[list[T]], bool]) -> None:
        while not predicate(self.items):
            await self._changed.wait()


@asynccontextmanager
async def open_hosts(count: int, **kwargs) -> AsyncIterator[list[P2PHost]]:
    async with AsyncExitStack() as stack:
        hosts = [
            await stack.enter_async_context(P2PHost(seed(index + 1), **kwargs))
            for index in range(count)
        ]
        yield hosts


async def ignore_message(peer_id: str, data: bytes) -> None:
    pass


async def echo_with_peer(peer_id: str, request: bytes) -> bytes:
    return peer_id.encode() + b"|" + request


def test_frame_decoder_reassembles_frames_split_anywhere() -> None:
    rng = random.Random(6)
    frames = [bytes(rng.randrange(256) for _ in range(size)) for size in (0, 1, 127, 128, 300, 16_384, 70_000)]
    wire = b"".join(encode_frame(frame) for frame in frames)
    for _ in range(20):
        decoder = FrameDecoder(max_frame_bytes=70_000)
        decoded: list[bytes] = []
        position = 0
        while position < len(wire):
            step = rng.choice((1, 2, 3, 100, 4096, 65_536))
            decoded += decoder.feed(wire[position:position + step])
            position += step
        assert decoded == frames
        assert decoder.buffered_bytes == 0


def test_frame_decoder_refuses_bad_prefixes_before_buffering() -> None:
    decoder = FrameDecoder(max_frame_bytes=1000)
    with pytest.raises(FrameTooLarge):
        decoder.feed(encode_uvarint(1001))  # refused on the prefix alone
    with pytest.raises(FrameTooLarge):
        decoder.feed(encode_frame(b"ok"))  # a failed decoder stays failed
    with pytest.raises(MalformedFrame):
        FrameDecoder(1000).feed(b"\x81\x00")  # 1 encoded in two bytes
    with pytest.raises(MalformedFrame):
        FrameDecoder(1000).feed(b"\xff" * 10 + b"\x01")
    assert FrameDecoder(1000).feed(b"\xff" * 9) == []  # incomplete, not yet wrong


def test_peer_id_is_the_node_key() -> None:
    identity = Identity.from_seed(seed(7))
    host = P2PHost(seed(7), gossip=NO_GOSSIP)
    assert host.peer_id == peer_id_of_public_key(identity.public_key)
    assert public_key_of_peer_id(host.peer_id) == identity.public_key
    with pytest.raises(ValueError):
        P2PHost(b"short")


async def test_two_hosts_connect_and_see_each_other() -> None:
    events_a: Recorder[PeerEvent] = Recorder()
    events_b: Recorder[PeerEvent] = Recorder()
    with trio.fail_after(TEST_TIMEOUT_S):
        async with P2PHost(seed(1), gossip=NO_GOSSIP, on_peer=events_a) as a, \
                P2PHost(seed(2), gossip=NO_GOSSIP, on_peer=events_b) as b:
            (address,) = a.listen_addrs()
            assert address.startswith("/ip4/127.0.0.1/tcp/")
            assert address.endswith(f"/p2p/{a.peer_id}")
            assert not address.endswith("/tcp/0/p2p/" + a.peer_id)

            assert await b.connect(address) == a.peer_id
            await events_a.wait_until(lambda items: PeerEvent(b.peer_id, True) in items)
            await events_b.wait_until(lambda items: PeerEvent(a.peer_id, True) in items)
            assert a.peers() == {b.peer_id}
            assert b.peers() == {a.peer_id}

            # A second connect reuses the connection: no second "up".
            await b.connect(address)
            assert events_b.items == [PeerEvent(a.peer_id, True)]

            with pytest.raises(ValueError):
                await b.connect("/ip4/127.0.0.1/tcp/1")  # no /p2p part
            with pytest.raises(ValueError):
                await a.connect(address)  # itself
            # Noise authenticates the peer id: the right port with someone
            # else's id is refused.
            impostor = peer_id_of_public_key(Identity.from_seed(seed(9)).public_key)
            with pytest.raises(ConnectError):
                await b.connect(address.replace(a.peer_id, impostor), timeout_s=5)

            await a.disconnect(b.peer_id)
            await events_a.wait_until(lambda items: PeerEvent(b.peer_id, False) in items)
            await events_b.wait_until(lambda items: PeerEvent(a.peer_id, False) in items)
            assert a.peers() == b.peers() == frozenset()


async def test_request_response_round_trip() -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_hosts(2, gossip=NO_GOSSIP) as (a, b):
            a.set_request_handler(RR, echo_with_peer)
            await b.connect(a.listen_addrs()[0])

            assert await b.request(a.peer_id, RR, b"hello") == f"{b.peer_id}|hello".encode()
            assert await b.request(a.peer_id, RR, b"") == f"{b.peer_id}|".encode()

            responses: dict[int, bytes] = {}

            async def one(n: int) -> None:
                responses[n] = await b.request(a.peer_id, RR, b"%d" % n)

            async with trio.open_nursery() as nursery:
                for n in range(6):  # within MAX_INBOUND_REQUESTS_PER_PEER
                    nursery.start_soon(one, n)
            assert responses == {n: f"{b.peer_id}|{n}".encode() for n in range(6)}

            with pytest.raises(RequestError):
                await b.request(a.peer_id, "/megnode-test/unknown/1", b"x")


async def test_failing_or_slow_handler_fails_only_that_request() -> None:
    async def broken(peer_id: str, request: bytes) -> bytes:
        if request == b"crash":
            raise RuntimeError("handler bug")
        if request == b"stall":
            await trio.sleep_forever()
        return b"ok"

    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_hosts(2, gossip=NO_GOSSIP) as (a, b):
            a.set_request_handler(RR, broken)
            await b.connect(a.listen_addrs()[0])
            with pytest.raises(RequestError):
                await b.request(a.peer_id, RR, b"crash")
            with pytest.raises(RequestError):
                await b.request(a.peer_id, RR, b"stall", timeout_s=0.5)
            assert await b.request(a.peer_id, RR, b"fine") == b"ok"
            assert a.misbehaviour_count(b.peer_id) == 0


async def test_thousand_one_way_messages_arrive_in_order() -> None:
    count = 1000
    received: Recorder[tuple[str, bytes]] = Recorder()

    async def on_message(peer_id: str, data: bytes) -> None:
        received((peer_id, data))

    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_hosts(2, gossip=NO_GOSSIP) as (a, b):
            a.set_message_handler(MSG, on_message)
            await b.connect(a.listen_addrs()[0])
            sent = [b"message %d " % n + bytes(n % 300) for n in range(count)]
            for data in sent:
                await b.send(a.peer_id, MSG, data)
            await received.wait_until(lambda items: len(items) >= count)
            assert [data for _, data in received.items] == sent
            assert {peer for peer, _ in received.items} == {b.peer_id}
            assert b.outbound_streams() == {(a.peer_id, MSG)}


async def test_send_nowait_refuses_when_a_stalled_peer_fills_its_queue() -> None:
    """A receiver that stops reading fills its queue; nothing accepted is lost."""
    max_attempts = 200_000
    release = trio.Event()
    received: Recorder[bytes] = Recorder()

    async def slow(peer_id: str, data: bytes) -> None:
        await release.wait()  # stops reading: yamux window, then our queue, fill up
        received(data)

    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_hosts(2, gossip=NO_GOSSIP) as (a, b):
            a.set_message_handler(MSG, slow)
            await b.connect(a.listen_addrs()[0])
            accepted: list[bytes] = []
            for n in range(max_attempts):
                data = b"%d" % n
                if not b.send_nowait(a.peer_id, MSG, data):
                    break
                accepted.append(data)
                if n % 100 == 0:
                    await trio.sleep(0)  # let the writer move what it can
            else:
                pytest.fail("the queue never filled")
            assert b.messages_dropped() == 1
            release.set()
            await received.wait_until(lambda items: len(items) >= len(accepted))
            assert received.items == accepted


async def test_oversized_request_is_refused_and_host_keeps_serving() -> None:
    reports: Recorder[Misbehaviour] = Recorder()
    big = StreamLimits(max_request_bytes=4 * 1024 * 1024)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with P2PHost(seed(1), gossip=NO_GOSSIP, on_misbehaviour=reports) as server, \
                P2PHost(seed(2), gossip=NO_GOSSIP, limits=big) as bad, \
                P2PHost(seed(3), gossip=NO_GOSSIP) as good:
            server.set_request_handler(RR, echo_with_peer)
            await bad.connect(server.listen_addrs()[0])
            await good.connect(server.listen_addrs()[0])

            with pytest.raises(RequestError):
                await bad.request(server.peer_id, RR, bytes(server_limit() + 1))
            await reports.wait_until(lambda items: len(items) >= 1)
            assert reports.items[0].peer_id == bad.peer_id
            assert reports.items[0].reason == OVERSIZED_FRAME
            assert server.misbehaviour_count(bad.peer_id) == 1

            assert await good.request(server.peer_id, RR, b"still here") == f"{good.peer_id}|still here".encode()
            # The offender's connection still works for valid requests; the
            # node decides (by its score) whether to disconnect it.
            assert await bad.request(server.peer_id, RR, b"ok") == f"{bad.peer_id}|ok".encode()

            with pytest.raises(ValueError):
                await good.request(server.peer_id, RR, bytes(server_limit() + 1))


def server_limit() -> int:
    return StreamLimits().max_request_bytes


async def raw_stream(sender: P2PHost, receiver: P2PHost, protocol_id: str):
    return await sender.libp2p.new_stream(ID.from_base58(receiver.peer_id), [TProtocol(protocol_id)])


async def assert_stream_dropped(stream) -> None:
    """The receiver reset or closed the stream: a read fails or hits the end."""
    try:
        data = await stream.read(1024)
    except STREAM_ERRORS:
        return
    assert data == b""


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xff" * 11, MALFORMED_FRAME),  # a varint that never ends
        (b"\x80\x00", MALFORMED_FRAME),  # a non-minimal varint
        (encode_uvarint(64 * 1024 * 1024), OVERSIZED_FRAME),  # announced, never sent
        # One write, hence one yamux frame, hence one read on the server.
        (encode_frame(b"one") + encode_frame(b"two"), TRAILING_BYTES),
    ],
)
async def test_garbage_request_stream_is_reset_and_reported(payload: bytes, reason: str) -> None:
    reports: Recorder[Misbehaviour] = Recorder()
    calls: list[bytes] = []

    async def handler(peer_id: str, request: bytes) -> bytes:
        calls.append(request)
        return b"ok"

    with trio.fail_after(TEST_TIMEOUT_S):
        async with P2PHost(seed(1), gossip=NO_GOSSIP, on_misbehaviour=reports) as a, \
                P2PHost(seed(2), gossip=NO_GOSSIP) as b:
            a.set_request_handler(RR, handler)
            await b.connect(a.listen_addrs()[0])
            stream = await raw_stream(b, a, RR)
            await stream.write(payload)
            await reports.wait_until(lambda items: len(items) >= 1)
            assert [(r.peer_id, r.protocol_id, r.reason) for r in reports.items] == [(b.peer_id, RR, reason)]
            await assert_stream_dropped(stream)
            assert calls == []
            assert await b.request(a.peer_id, RR, b"after") == b"ok"


async def test_garbage_on_message_stream_is_reset_and_reported() -> None:
    reports: Recorder[Misbehaviour] = Recorder()
    received: Recorder[bytes] = Recorder()

    async def on_message(peer_id: str, data: bytes) -> None:
        received(data)

    with trio.fail_after(TEST_TIMEOUT_S):
        async with P2PHost(seed(1), gossip=NO_GOSSIP, on_misbehaviour=reports) as a, \
                P2PHost(seed(2), gossip=NO_GOSSIP) as b:
            a.set_message_handler(MSG, on_message)
            await b.connect(a.listen_addrs()[0])

            stream = await raw_stream(b, a, MSG)
            await stream.write(encode_frame(b"valid first"))
            await received.wait_until(lambda items: items == [b"valid first"])
            await stream.write(b"\xff" * 16)
            await reports.wait_until(lambda items: len(items) >= 1)
            assert reports.items[0].reason == MALFORMED_FRAME
            await assert_stream_dropped(stream)

            oversized = await raw_stream(b, a, MSG)
            await oversized.write(encode_uvarint(StreamLimits().max_message_bytes + 1))
            await reports.wait_until(lambda items: len(items) >= 2)
            assert reports.items[1].reason == OVERSIZED_FRAME
            await assert_stream_dropped(oversized)

            # The host goes on serving the same peer on a fresh stream.
            await b.send(a.peer_id, MSG, b"after garbage")
            await received.wait_until(lambda items: items[-1:] == [b"after garbage"])
            assert a.misbehaviour_count(b.peer_id) == 2


async def test_gossipsub_three_hosts_deliver_every_message() -> None:
    count = 200
    publish_interval_s = 0.01  # ~100 msg/s in total: a moderate rate
    with trio.fail_after(TEST_TIMEOUT_S + 10):
        async with open_hosts(3) as hosts:
            received: dict[str, Recorder[tuple[str, str, bytes]]] = {}
            for host in hosts:
                recorder: Recorder[tuple[str, str, bytes]] = Recorder()
                received[host.peer_id] = recorder

                async def on_gossip(topic: str, origin: str, data: bytes, recorder=recorder) -> None:
                    recorder((topic, origin, data))

                host.set_gossip_handler(on_gossip)
            a, b, c = hosts
            await b.connect(a.listen_addrs()[0])
            await c.connect(a.listen_addrs()[0])
            await c.connect(b.listen_addrs()[0])
            for host in hosts:
                await host.join(TOPIC)
            for host in hosts:
                for other in hosts:
                    if other is not host:
                        await host.wait_gossip_mesh_peer(TOPIC, other.peer_id)

            sent: dict[str, set[bytes]] = {host.peer_id: set() for host in hosts}
            for n in range(count):
                publisher = hosts[n % len(hosts)]
                data = b"gossip %d" % n
                await publisher.publish(TOPIC, data)
                sent[publisher.peer_id].add(data)
                await trio.sleep(publish_interval_s)  # pacing the load, not waiting for a result

            for host in hosts:
                expected = {(TOPIC, origin, data) for origin, datas in sent.items()
                            if origin != host.peer_id for data in datas}
                await received[host.peer_id].wait_until(lambda items, e=expected: len(items) >= len(e))
                assert set(received[host.peer_id].items) == expected
                assert len(received[host.peer_id].items) == len(expected)  # no duplicates
                assert host.gossip_stats().inbox_dropped == 0


async def test_peer_down_when_a_host_closes() -> None:
    events: Recorder[PeerEvent] = Recorder()
    with trio.fail_after(TEST_TIMEOUT_S):
        async with P2PHost(seed(1), gossip=NO_GOSSIP, on_peer=events) as a:
            a.set_message_handler(MSG, ignore_message)
            async with P2PHost(seed(2), gossip=NO_GOSSIP) as b:
                await b.connect(a.listen_addrs()[0])
                await events.wait_until(lambda items: PeerEvent(b.peer_id, True) in items)
                await a.send(b.peer_id, MSG, b"opens an outbound stream")
                b_id = b.peer_id
            await events.wait_until(lambda items: PeerEvent(b_id, False) in items)
            assert a.peers() == frozenset()
            assert a.outbound_streams() == frozenset()


async def test_peer_down_when_a_host_is_cancelled() -> None:
    """Leaving under cancellation still closes the sockets, so peers notice."""
    events: Recorder[PeerEvent] = Recorder()
    with trio.fail_after(TEST_TIMEOUT_S):
        async with P2PHost(seed(1), gossip=NO_GOSSIP, on_peer=events) as a:
            b_id = peer_id_of_public_key(Identity.from_seed(seed(2)).public_key)
            with trio.CancelScope() as scope:
                async with P2PHost(seed(2)) as b:
                    await b.connect(a.listen_addrs()[0])
                    await events.wait_until(lambda items: PeerEvent(b_id, True) in items)
                    scope.cancel()
                    await trio.sleep_forever()
            await events.wait_until(lambda items: PeerEvent(b_id, False) in items)


async def test_clean_shutdown_with_work_in_flight() -> None:
    """Exit is prompt with a stalled handler, queued sends, gossip and a pending request."""
    handler_started = trio.Event()
    stop = trio.Event()
    stopped = trio.Event()
    request_failed = trio.Event()

    async def stalls(peer_id: str, request: bytes) -> bytes:
        handler_started.set()
        await trio.sleep_forever()
        return b""

    async def run_hosts(task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with open_hosts(2) as (a, b):
            a.set_request_handler(RR, stalls)
            a.set_message_handler(MSG, ignore_message)
            await b.connect(a.listen_addrs()[0])
            await a.join(TOPIC)
            await b.join(TOPIC)
            for n in range(100):
                await b.send(a.peer_id, MSG, b"%d" % n)
            task_status.started((a, b))
            await stop.wait()
        stopped.set()

    async def pending_request(b: P2PHost, server_id: str) -> None:
        with pytest.raises(RequestError):
            await b.request(server_id, RR, b"never answered", timeout_s=TEST_TIMEOUT_S)
        request_failed.set()

    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as outside:
            a, b = await outside.start(run_hosts)
            outside.start_soon(pending_request, b, a.peer_id)
            await handler_started.wait()
            stop.set()
            with trio.fail_after(SHUTDOWN_BOUND_S):
                await stopped.wait()
            # The requester saw its stream die with the hosts; it did not hang.
            await request_failed.wait()
    with pytest.raises(RuntimeError):
        await a.request(b.peer_id, RR, b"x")
