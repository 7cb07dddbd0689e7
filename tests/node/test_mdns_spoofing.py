"""Spoofed mDNS announcements (issue 16): the dials they cause are bounded, in total.

Anyone on a LAN can announce any peer id with any addresses. Before, each
fake id cost DIAL_ATTEMPTS rounds over up to MAX_ADDRESSES_PER_PEER
addresses, with no bound on ids (38,400 dials a minute at 20 fake ids a
second). `DiscoveryBudget` is tested sans-IO; the dialler's discovery
handler is fed fake announcements in place of zeroconf, under trio's mock
clock, with a host whose every dial fails and is counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from node import mdns
from node.dialer import Dialer
from node.mdns import (
    DIAL_WINDOW_MS,
    MAX_DISCOVERED_PEERS,
    MAX_DISCOVERY_DIALS_PER_MIN,
    Discovered,
    DiscoveryBudget,
)
from transport.libp2p_host import ConnectError

SPOOF_IDS_PER_S = 20
SPOOF_MINUTES = 4
ADDRESSES = mdns.MAX_ADDRESSES_PER_PEER


def test_the_budget_counts_dials_of_all_peers_in_a_sliding_minute() -> None:
    budget = DiscoveryBudget(dials_per_min=3, max_peers=2)
    assert [budget.dial_delay_ms(t) for t in (0, 10, 20)] == [0, 0, 0]
    assert budget.dial_delay_ms(30) == DIAL_WINDOW_MS - 30  # until the first leaves the window
    assert budget.dial_delay_ms(DIAL_WINDOW_MS) == 0


def test_the_discovered_peer_table_is_bounded() -> None:
    budget = DiscoveryBudget(dials_per_min=3, max_peers=2)
    assert budget.admit("a") and not budget.admit("a")  # one dialler per peer
    assert budget.admit("b") and not budget.admit("c")  # full: dropped
    assert budget.dropped == 1
    budget.release("a")
    assert budget.admit("c")


class UnreachableHost:
    """Every dial fails; dials are counted per minute of the (mock) clock."""

    peer_id = "Qm" + "z" * 44  # larger than every fake id: no deferred dial
    libp2p = None

    def __init__(self) -> None:
        self.dials_by_minute: Counter[int] = Counter()
        self.in_flight = 0

    def peers(self) -> frozenset[str]:
        return frozenset()

    def listen_addrs(self) -> tuple[str, ...]:
        return ()

    async def connect(self, address: str) -> str:
        self.dials_by_minute[int(trio.current_time() // 60)] += 1
        raise ConnectError("unreachable")


def test_a_spoofer_cannot_push_dials_past_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    host = UnreachableHost()
    most_tasks = [0]

    @asynccontextmanager
    async def spoofed(_host: object, _listen: object) -> AsyncIterator[trio.MemoryReceiveChannel]:
        send, receive = trio.open_memory_channel[Discovered](mdns.DISCOVERED_CAPACITY)

        async def spoof() -> None:
            for n in range(SPOOF_IDS_PER_S * 60 * SPOOF_MINUTES):
                peer = f"Qm{n:044d}"
                try:
                    send.send_nowait(Discovered(peer, tuple(
                        f"/ip4/10.9.{i}.1/tcp/4001/p2p/{peer}" for i in range(ADDRESSES))))
                except trio.WouldBlock:
                    pass
                stats = trio.lowlevel.current_statistics()
                most_tasks[0] = max(most_tasks[0], stats.tasks_living)
                await trio.sleep(1 / SPOOF_IDS_PER_S)
            await send.aclose()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(spoof)
            yield receive

    monkeypatch.setattr(mdns, "mdns_discovery", spoofed)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await Dialer(host, None, nursery).discover_on_lan()  # type: ignore[arg-type]
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    per_minute = [host.dials_by_minute[m] for m in range(SPOOF_MINUTES)]
    assert all(count <= MAX_DISCOVERY_DIALS_PER_MIN for count in per_minute), per_minute
    assert sum(per_minute) >= MAX_DISCOVERY_DIALS_PER_MIN  # discovery still dials
    assert most_tasks[0] <= MAX_DISCOVERED_PEERS + 10  # one dialler per admitted peer, bounded
