"""The connection manager: node-wide and per-IP limits, water marks, which peers are trimmed."""

from __future__ import annotations

import pytest
import trio

from node import config as node_config
from node.config import ConfigError, NodeConfig
from node.core import connection_manager as cm
from node.core.connection_manager import (GRACE_MS, Connection, Limits, Refusal, admit,
                                          needs_more, to_trim, wants_more)
from node.runtime import Node

WAIT_S = 15.0
POLL_S = 0.05


def conns(n: int, ip: str = "10.0.0.1", since: int = 0, shares: bool = False) -> list[Connection]:
    return [Connection(f"{ip}-{i}", ip, since, shares) for i in range(n)]


def test_the_defaults_agree_with_the_settings() -> None:
    assert NodeConfig().connection_limits() == Limits()
    assert (node_config.DEFAULT_CONNECTIONS_LOW, node_config.DEFAULT_CONNECTIONS_HIGH,
            node_config.DEFAULT_MAX_CONNECTIONS, node_config.DEFAULT_MAX_CONNECTIONS_PER_IP) == (
        cm.LOW_WATER, cm.HIGH_WATER, cm.MAX_CONNECTIONS, cm.MAX_CONNECTIONS_PER_IP)
    with pytest.raises(ConfigError):
        NodeConfig().with_overrides(connections_low=50, connections_high=10)
    with pytest.raises(ConfigError):
        NodeConfig().with_overrides(max_connections_per_ip=0)


def test_node_wide_and_per_ip_limits() -> None:
    limits = Limits(low_water=2, high_water=4, max_connections=6, max_per_ip=2)
    new = Connection("new", "10.0.0.1", 0)
    assert admit(new, conns(1), limits) is None
    assert admit(new, conns(2), limits) == Refusal.IP_LIMIT
    assert admit(new, conns(2, ip="10.0.0.2"), limits) is None
    assert admit(Connection("l", "127.0.0.1", 0), conns(5, ip="127.0.0.1"), limits) is None
    assert admit(Connection("l", "127.0.0.1", 0), conns(6, ip="127.0.0.1"), limits) == \
        Refusal.NODE_LIMIT
    assert admit(Connection("u", None, 0), conns(2), limits) is None  # unknown IP: node-wide only


def test_above_the_high_water_mark_the_least_wanted_go_down_to_the_trim_point() -> None:
    limits = Limits(low_water=2, high_water=6, max_connections=10, max_per_ip=10)
    assert limits.trim_to == 4  # half way between the marks (TRIM_POINT)
    now = 10 * GRACE_MS
    sharing = [Connection(f"s{i}", None, i, True) for i in range(2)]
    strangers = [Connection(f"x{i}", None, 100 + i) for i in range(5)]
    assert to_trim(sharing + strangers[:4], now, limits) == []  # at the high water mark
    trimmed = to_trim(sharing + strangers, now, limits)
    assert sorted(trimmed) == ["x2", "x3", "x4"]  # down to 4, newest first; topic peers stay
    fresh = [Connection("new", None, now - 1)]
    assert "new" not in to_trim(sharing + strangers + fresh, now, limits)  # grace period
    assert wants_more(3, limits) and not wants_more(4, limits)  # discovery: below the point
    assert needs_more(1, limits) and not needs_more(2, limits)
    assert Limits(low_water=16, high_water=48).trim_to == 32


def test_an_old_peer_is_not_trimmed_while_newer_strangers_wait_out_their_grace() -> None:
    # issue 16's connection flood: the honest peer (old, its topics maybe not told yet)
    # must outlast a crowd of newer strangers, some still in their grace period.
    limits = Limits(low_water=2, high_water=4, max_connections=10, max_per_ip=10)
    assert limits.trim_to == 3
    now = 10 * GRACE_MS
    honest = Connection("honest", None, 0)
    past_grace = [Connection(f"old{i}", None, now - GRACE_MS - 10 + i) for i in range(3)]
    in_grace = [Connection(f"new{i}", None, now - i - 1) for i in range(4)]
    trimmed = to_trim([honest] + past_grace + in_grace, now, limits)
    assert "honest" not in trimmed and not any(p.startswith("new") for p in trimmed)
    assert trimmed == ["old2"]  # the newest past its grace; the others wait for the new ones
    sharing = Connection("member", None, now - GRACE_MS - 100, True)
    assert "member" not in to_trim([sharing] + past_grace + in_grace, now, limits)


async def test_a_connection_past_the_node_limit_is_closed(tmp_path) -> None:
    limited = NodeConfig().with_overrides(connections_low=0, connections_high=1,
                                          max_connections=1)
    async with Node.open(tmp_path / "hub", config=limited, seed=1) as hub, \
            Node.open(tmp_path / "a", seed=2) as a, Node.open(tmp_path / "b", seed=3) as b:
        await a.connect(hub.addresses[0])
        with trio.fail_after(WAIT_S):
            while a.host.peer_id not in hub.host.peers():
                await trio.sleep(POLL_S)
        try:
            await b.connect(hub.addresses[0])
        except Exception:
            pass  # closed while it was being set up: as good
        with trio.fail_after(WAIT_S):
            while hub.stats["connections_refused"] < 1 or b.host.peer_id in hub.host.peers():
                await trio.sleep(POLL_S)
        assert a.host.peer_id in hub.host.peers()
        assert hub.status()["connections"]["max"] == 1
        assert b.node_id not in hub.peer_policy.redialling()  # refused: never redialled


def test_only_a_refusal_at_the_node_limit_lingers_and_only_so_many() -> None:
    assert cm.lingers(Refusal.NODE_LIMIT, 0)
    assert not cm.lingers(Refusal.NODE_LIMIT, cm.MAX_LINGERING)
    assert not cm.lingers(Refusal.IP_LIMIT, 0)  # a flood from one address: closed at once


async def test_a_joiner_a_full_node_refuses_hears_of_its_peers_first(tmp_path) -> None:
    """The hub holds its one allowed connection (a); b, restarted knowing only the hub,
    is refused but still gets the hub's peer-exchange answer before the close, and
    connects to a: a node that only ever reached a full bootstrap is not lost with it."""
    limited = NodeConfig().with_overrides(connections_low=0, connections_high=1,
                                          max_connections=1)
    async with Node.open(tmp_path / "hub", config=limited, seed=1) as hub:
        topic = await hub.create_topic("fleet")
        async with Node.open(tmp_path / "b", seed=3) as b:  # b gets the topic, then stops
            await b.connect(hub.addresses[0])
            await b.join(topic.topic_id)
            await b._book_keeper.flush()  # the hub's entry, for the restart
        with trio.fail_after(WAIT_S):
            while hub.host.peers():
                await trio.sleep(POLL_S)
        async with Node.open(tmp_path / "a", seed=2) as a:
            await a.connect(hub.addresses[0])
            await a.join(topic.topic_id)
            with trio.fail_after(WAIT_S):  # a asked the hub: the hub knows a serves the topic
                while (entry := hub.peer_book.get(a.host.peer_id)) is None or not entry.topics:
                    await trio.sleep(POLL_S)
            # b restarts; its book holds the hub alone, which is full
            async with Node.open(tmp_path / "b", seed=3) as b:
                with trio.fail_after(WAIT_S):
                    while a.host.peer_id not in b.host.peers():
                        await trio.sleep(POLL_S)
                with trio.fail_after(WAIT_S):  # the hub closed b's connection after answering
                    while b.host.peer_id in hub.host.peers():
                        await trio.sleep(POLL_S)
                assert hub.stats["connections_refused"] >= 1
                assert a.host.peer_id in hub.host.peers()
