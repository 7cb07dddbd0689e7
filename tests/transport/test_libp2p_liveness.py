"""`PeerTracker`: py-libp2p's per-connection notifications become one up and one down per peer.

Fakes, not real hosts: what matters is the counting (a second connection to
a peer is no new "up", only its last close is a "down", a close never
counted is ignored), the order on a down (`on_down` before the owner's
callback) and that a failing callback cannot break py-libp2p's notifee task.
The real-host tests (`test_libp2p_host.py`) check the same edges end to end.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import trio

from transport.libp2p_liveness import PeerEvent, PeerTracker
from transport.libp2p_messages import MessageStreams, _Outbound
from transport.libp2p_streams import StreamLimits


@dataclass
class FakePeerId:
    name: str

    def to_base58(self) -> str:
        return self.name


@dataclass
class FakeMuxed:
    peer_id: FakePeerId


@dataclass
class FakeConn:
    muxed_conn: FakeMuxed


def conn(peer: str) -> FakeConn:
    return FakeConn(FakeMuxed(FakePeerId(peer)))


async def test_one_up_per_first_connection_one_down_per_last() -> None:
    log: list[object] = []
    tracker = PeerTracker(log.append, lambda peer: log.append(("down", peer)))
    first, second = conn("a"), conn("a")
    await tracker.connected(None, first)  # type: ignore[arg-type]
    await tracker.connected(None, second)  # type: ignore[arg-type]
    assert log == [PeerEvent("a", up=True)] and tracker.connections == {"a": 2}
    # One of two closes: the peer stays up, and the owner hears that a link was lost.
    await tracker.disconnected(None, first)  # type: ignore[arg-type]
    lost = PeerEvent("a", up=True, link_lost=True)
    assert log == [PeerEvent("a", up=True), lost] and tracker.connections == {"a": 1}
    await tracker.disconnected(None, second)  # type: ignore[arg-type]
    assert log == [PeerEvent("a", up=True), lost, ("down", "a"), PeerEvent("a", up=False)]
    assert tracker.connections == {}


async def test_a_lost_link_is_told_with_its_connection_before_the_event() -> None:
    log: list[object] = []
    tracker = PeerTracker(log.append, lambda peer: log.append(("down", peer)),
                          on_link_lost=lambda peer, muxed: log.append(("lost", peer, muxed)))
    old, new = conn("a"), conn("a")
    await tracker.connected(None, old)  # type: ignore[arg-type]
    await tracker.connected(None, new)  # type: ignore[arg-type]
    await tracker.disconnected(None, old)  # type: ignore[arg-type]
    assert log == [PeerEvent("a", up=True), ("lost", "a", old.muxed_conn),
                   PeerEvent("a", up=True, link_lost=True)]


async def test_the_message_streams_on_a_lost_connection_are_forgotten_at_once() -> None:
    """`MessageStreams.close_on`: the streams to the peer that ran on the closed
    connection stop and are forgotten, so the next message opens one on a live
    connection; a stream on another connection, or to another peer, stays."""
    old, new = conn("a").muxed_conn, conn("a").muxed_conn
    async with trio.open_nursery() as nursery:
        streams = MessageStreams(None, nursery, StreamLimits(), lambda report: None)  # type: ignore[arg-type]
        outbound = {}
        for key, connection in ((("a", "/p/1"), old), (("a", "/p/2"), new), (("b", "/p/1"), old)):
            send, _ = trio.open_memory_channel[bytes](1)
            outbound[key] = _Outbound(send, trio.CancelScope(), connection)
            streams._outbound[key] = outbound[key]
        assert streams.close_on("a", old) == 1
        assert set(streams._outbound) == {("a", "/p/2"), ("b", "/p/1")}
        assert outbound[("a", "/p/1")].cancel_scope.cancel_called
        with pytest.raises(trio.ClosedResourceError):
            outbound[("a", "/p/1")].send.send_nowait(b"x")
        assert streams.closed_with_connection == 1


async def test_a_close_never_counted_is_ignored() -> None:
    log: list[object] = []
    tracker = PeerTracker(log.append, lambda peer: log.append(("down", peer)))
    await tracker.disconnected(None, conn("b"))  # type: ignore[arg-type]
    assert log == [] and tracker.connections == {}


async def test_a_failing_callback_does_not_escape_and_counting_goes_on() -> None:
    def explode(event: PeerEvent) -> None:
        raise RuntimeError("owner bug")

    downs: list[str] = []
    tracker = PeerTracker(explode, downs.append)
    await tracker.connected(None, conn("c"))  # type: ignore[arg-type]
    await tracker.disconnected(None, conn("c"))  # type: ignore[arg-type]
    assert downs == ["c"] and tracker.connections == {}


@dataclass(eq=False)  # hashable by identity, as py-libp2p's connections are
class ClosableConn:
    muxed_conn: FakeMuxed
    closed: bool = False

    async def close(self) -> None:
        self.closed = True


async def test_a_refused_connection_is_closed_never_counted_and_its_close_ignored() -> None:
    """The connection gate: a banned peer's redial, arriving while its old connection is
    still counted, is closed at once and leaves the old connection's count alone."""
    log: list[object] = []
    banned: set[str] = set()
    tracker = PeerTracker(log.append, lambda peer: log.append(("down", peer)),
                          refuse=lambda peer: peer in banned)
    old = ClosableConn(FakeMuxed(FakePeerId("d")))
    await tracker.connected(None, old)  # type: ignore[arg-type]
    banned.add("d")
    redial = ClosableConn(FakeMuxed(FakePeerId("d")))
    await tracker.connected(None, redial)  # type: ignore[arg-type]
    assert redial.closed and not old.closed and tracker.refused == 1
    assert tracker.connections == {"d": 1} and log == [PeerEvent("d", up=True)]
    await tracker.disconnected(None, redial)  # type: ignore[arg-type]
    assert tracker.connections == {"d": 1}  # the refused one was never counted
    await tracker.disconnected(None, old)  # type: ignore[arg-type]
    assert log[-1] == PeerEvent("d", up=False) and tracker.connections == {}
