"""Connections that stall or die: the py-libp2p write-path fixes, stale detection, redial.

The peer that stalls is a real P2PHost in a child process, stopped with
SIGSTOP and resumed with SIGCONT, as a stopped or hung megnode would be. It
reports what it received as JSON lines on stdout. The stall bound is
shortened for the test (`StreamLimits.write_stall_timeout_s`, which the host applies to `libp2p_patches`); everything
else runs with the production values. Every wait is bounded and polls a
condition.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
from libp2p.custom_types import TProtocol

from transport.framing import encode_frame
from transport.libp2p_gossip import MAX_GOSSIP_MESSAGE_BYTES, GossipConfig, gossip_chunks
from transport.libp2p_host import ConnectError, P2PHost
from transport.libp2p_liveness import PeerEvent
from transport.libp2p_messages import SendError
from transport.libp2p_redial import MAX_ADDRESSES_PER_PEER
from transport.libp2p_streams import (
    MALFORMED_FRAME,
    OVERSIZED_FRAME,
    TRUNCATED_FRAME,
    Misbehaviour,
    StreamLimits,
    close_quietly,
    parse_peer_id,
)
from transport.messages import MAX_EVENTS_PER_MESSAGE, Push, decode, encode

MSG = "/megnode-test/msg/1"
NO_GOSSIP = GossipConfig(enabled=False)
TEST_STALL_TIMEOUT_S = 2.0
CHILD_START_TIMEOUT_S = 20.0
RECOVERY_TIMEOUT_S = 30.0
PAYLOAD = b"x" * 300
POLL_S = 0.05
CHILD_SEED = bytes([9]) * 32
CANCELLED_WRITES = 5
CANCEL_AFTER_S = 0.3
PAUSE_S = 1.5  # well inside the stall bound: the peer is slow, not dead
# A stopped process never answers: any bound shows that a probe or dial gives up.
DEAD_PROBE_TIMEOUT_S = 0.5
DEAD_CONNECT_TIMEOUT_S = 1.0

# The stalling peer: counts messages, reports count, peers and misbehaviour.
CHILD = f"""
import json, sys, trio
sys.path.insert(0, {os.getcwd()!r})
from transport.libp2p_host import P2PHost
from transport.libp2p_gossip import GossipConfig

async def main():
    received = [0]
    faults = []
    async def handler(peer, data):
        received[0] += 1
    async with P2PHost({CHILD_SEED!r}, gossip=GossipConfig(enabled=False),
                       on_misbehaviour=lambda m: faults.append(m.reason)) as host:
        host.set_message_handler({MSG!r}, handler)
        print(json.dumps({{"address": host.listen_addrs()[0]}}), flush=True)
        while True:
            print(json.dumps({{"received": received[0], "peers": len(host.peers()),
                               "faults": faults}}), flush=True)
            await trio.sleep(0.2)

trio.run(main)
"""


@dataclass
class Child:
    process: subprocess.Popen
    address: str = ""
    state: dict[str, Any] = field(default_factory=dict)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    async def wait_for(self, predicate: Callable[[dict[str, Any]], bool]) -> None:
        while not predicate(self.state):
            await trio.sleep(POLL_S)


@asynccontextmanager
async def stalling_peer() -> AsyncIterator[Child]:
    process = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    child = Child(process)

    async def read_reports() -> None:
        assert process.stdout is not None
        while True:
            line = await trio.to_thread.run_sync(process.stdout.readline, abandon_on_cancel=True)
            if not line:
                return
            report = json.loads(line)
            if "address" in report:
                child.address = report["address"]
            else:
                child.state = report

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_reports)
            with trio.fail_after(CHILD_START_TIMEOUT_S):
                while not child.address:
                    await trio.sleep(POLL_S)
            yield child
            nursery.cancel_scope.cancel()
    finally:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


@pytest.fixture
def short_stall() -> StreamLimits:
    """Limits whose write-stall bound is short (the host applies it to the write path)."""
    return StreamLimits(write_stall_timeout_s=TEST_STALL_TIMEOUT_S)


async def send_for(host: P2PHost, peer_id: str, seconds: float) -> None:
    """Offer messages as fast as the queue takes them (drops when full, like the node)."""
    deadline = trio.current_time() + seconds
    while trio.current_time() < deadline:
        try:
            host.send_nowait(peer_id, MSG, PAYLOAD)
        except SendError:
            pass
        await trio.sleep(0)


async def test_a_stopped_peer_is_dropped_and_reached_again_once_resumed(
        short_stall: StreamLimits) -> None:
    """Writes to a stopped peer stall; its connection is aborted whole (never left with
    half a message on the wire), and once resumed the same peer receives again."""
    events: list[PeerEvent] = []
    faults: list[Misbehaviour] = []
    with trio.fail_after(RECOVERY_TIMEOUT_S * 2):
        async with stalling_peer() as child, \
                P2PHost(bytes([3]) * 32, gossip=NO_GOSSIP, on_peer=events.append,
                        on_misbehaviour=faults.append, limits=short_stall) as host:
            peer_id = await host.connect(child.address)
            await send_for(host, peer_id, 0.5)
            await child.wait_for(lambda s: s.get("received", 0) > 0)
            child.stop()
            with trio.fail_after(RECOVERY_TIMEOUT_S):  # the stalled write aborts it
                while not any(not e.up for e in events):
                    await send_for(host, peer_id, 0.2)
            assert peer_id not in host.peers()
            before = child.state["received"]
            child.resume()
            with trio.fail_after(RECOVERY_TIMEOUT_S):  # `send` dials the peer again
                while child.state.get("received", 0) < before + 1_000:
                    await send_for(host, peer_id, 0.2)
            # Nothing it received was garbage: at most streams cut by the abort.
            assert all(reason == TRUNCATED_FRAME for reason in child.state["faults"])
            assert [f for f in faults if f.is_protocol_fault] == []


async def resume_after(child: Child, seconds: float) -> None:
    await trio.sleep(seconds)
    child.resume()


async def test_writes_cancelled_mid_message_leave_the_connection_intact() -> None:
    """The root cause of issue #6: cancelling a write to a peer that reads slowly must
    not leave half a Noise message on the wire. The peer pauses (shorter than the
    stall bound) while we cancel one big write after another, as our timeouts do;
    afterwards the same connection carries messages and the peer saw no garbage."""
    events: list[PeerEvent] = []
    big = encode_frame(PAYLOAD) * 4_000  # ~1.2 MB: more than the socket buffers take
    with trio.fail_after(RECOVERY_TIMEOUT_S * 2):
        async with stalling_peer() as child, \
                P2PHost(bytes([3]) * 32, gossip=NO_GOSSIP, on_peer=events.append) as host:
            peer_id = await host.connect(child.address)
            # Opened first: opening a stream needs an answer from the peer.
            streams = [await host.libp2p.new_stream(parse_peer_id(peer_id), [TProtocol(MSG)])
                       for _ in range(CANCELLED_WRITES)]
            cancelled = 0
            async with trio.open_nursery() as nursery:
                child.stop()
                nursery.start_soon(resume_after, child, PAUSE_S)
                for stream in streams:
                    with trio.move_on_after(CANCEL_AFTER_S) as scope:
                        await stream.write(big)
                    cancelled += scope.cancelled_caught
                    # As our writer does: a stream cut mid-frame is reset, never closed.
                    await close_quietly(stream, reset=scope.cancelled_caught)
            assert cancelled > 0
            before = child.state.get("received", 0)
            with trio.fail_after(RECOVERY_TIMEOUT_S):
                while child.state.get("received", 0) < before + 1_000:
                    await send_for(host, peer_id, 0.2)
            assert [e for e in events if not e.up] == []  # the one connection survived
            # No garbage arrived; a reset stream may look cut (a breakage, not a fault).
            assert set(child.state["faults"]) <= {TRUNCATED_FRAME}


async def test_connect_does_not_trust_a_dead_connection(short_stall: StreamLimits) -> None:
    with trio.fail_after(RECOVERY_TIMEOUT_S * 2):
        async with stalling_peer() as child, \
                P2PHost(bytes([3]) * 32, gossip=NO_GOSSIP, limits=short_stall) as host:
            peer_id = await host.connect(child.address)
            assert await host.is_alive(peer_id)
            child.stop()
            assert not await host.is_alive(peer_id, timeout_s=DEAD_PROBE_TIMEOUT_S)
            # py-libp2p alone would return at once: the connection is still "open".
            with pytest.raises(ConnectError):
                await host.connect(child.address, timeout_s=DEAD_CONNECT_TIMEOUT_S)
            assert peer_id not in host.peers()
            child.resume()
            assert await host.connect(child.address) == peer_id
            assert await host.is_alive(peer_id)


def test_breakages_are_not_protocol_faults() -> None:
    def report(reason: str) -> Misbehaviour:
        return Misbehaviour("peer", MSG, reason)

    assert not report(TRUNCATED_FRAME).is_protocol_fault
    assert report(OVERSIZED_FRAME).is_protocol_fault
    assert report(MALFORMED_FRAME).is_protocol_fault


def test_gossip_chunks_fit_one_push_each_and_keep_order() -> None:
    topic = bytes(32)
    raws = [bytes([n % 256]) * (100 + (n * 37) % 3_000) for n in range(3_000)]
    chunks = list(gossip_chunks(raws))
    assert [raw for chunk in chunks for raw in chunk] == raws
    assert len(chunks) < len(raws) // 100  # batched, not one message per event
    for chunk in chunks:
        assert len(chunk) <= MAX_EVENTS_PER_MESSAGE
        frame = encode(Push(topic, tuple(chunk)))
        assert len(frame) <= MAX_GOSSIP_MESSAGE_BYTES
        assert decode(frame) == Push(topic, tuple(chunk))
    many_small = list(gossip_chunks([b"e"] * (MAX_EVENTS_PER_MESSAGE * 2 + 1)))
    assert [len(c) for c in many_small] == [MAX_EVENTS_PER_MESSAGE, MAX_EVENTS_PER_MESSAGE, 1]
    assert list(gossip_chunks([])) == []


async def test_redialer_remembers_a_bounded_number_of_addresses() -> None:
    from transport.libp2p_redial import Redialer

    async with P2PHost(bytes([4]) * 32, gossip=NO_GOSSIP) as host, trio.open_nursery() as nursery:
        redialer = Redialer(host)
        addresses = [f"/ip4/127.0.0.1/tcp/{4000 + n}/p2p/{host.peer_id}" for n in range(20)]
        redialer.remember("peer", addresses)
        redialer.remember("peer", [addresses[0]])
        assert redialer.addresses("peer")[0] == addresses[0]
        assert len(redialer.addresses("peer")) == MAX_ADDRESSES_PER_PEER
        nursery.cancel_scope.cancel()
