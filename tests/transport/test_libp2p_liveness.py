"""`PeerTracker`: py-libp2p's per-connection notifications become one up and one down per peer.

Fakes, not real hosts: what matters is the counting (a second connection to
a peer is no new "up", only its last close is a "down", a close never
counted is ignored), the order on a down (`on_down` before the owner's
callback) and that a failing callback cannot break py-libp2p's notifee task.
The real-host tests (`test_libp2p_host.py`) check the same edges end to end.
"""

from __future__ import annotations

from dataclasses import dataclass

from transport.libp2p_liveness import PeerEvent, PeerTracker


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
