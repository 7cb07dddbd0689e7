"""Addresses that work: real interface addresses for 0.0.0.0, DNS bootstraps, bootstrap state."""

from __future__ import annotations

import logging

import multiaddr
import pytest
import trio

from node.config import RUN_DEFAULTS, load_config
from node.runtime import Node
from transport.defaults import DEFAULT_RUN_LISTEN
from transport.libp2p_dns import ResolveError, is_dns, resolve
from transport.libp2p_gossip import GossipConfig
from transport.libp2p_host import P2PHost
from transport.libp2p_listen import advertised_addresses, interface_addresses, is_unspecified

WAIT_S = 10.0
POLL_S = 0.05


def test_unspecified_addresses_become_interface_addresses() -> None:
    v4, _ = interface_addresses()
    assert "127.0.0.1" in v4 and v4[-1] == "127.0.0.1"  # loopback last
    out = [str(a) for a in advertised_addresses(
        [multiaddr.Multiaddr("/ip4/0.0.0.0/tcp/4001"), multiaddr.Multiaddr("/ip4/10.1.2.3/tcp/5")])]
    assert not any(is_unspecified(a) for a in out)
    assert out[:len(v4)] == [f"/ip4/{ip}/tcp/4001" for ip in v4]
    assert "/ip4/10.1.2.3/tcp/5" in out
    assert is_unspecified("/ip6/::/tcp/1") and not is_unspecified("/ip6/::1/tcp/1")


def test_run_listens_on_every_interface_by_default(tmp_path) -> None:
    assert RUN_DEFAULTS.listen == (DEFAULT_RUN_LISTEN,) == ("/ip4/0.0.0.0/tcp/4001",)
    assert load_config(None, RUN_DEFAULTS).listen == RUN_DEFAULTS.listen
    config = tmp_path / "node.toml"
    config.write_text('listen = ["/ip4/127.0.0.1/tcp/0"]\n')
    assert load_config(config, RUN_DEFAULTS).listen == ("/ip4/127.0.0.1/tcp/0",)
    assert load_config(config).listen == ("/ip4/127.0.0.1/tcp/0",)


async def test_host_on_all_interfaces_advertises_real_addresses() -> None:
    async with P2PHost(bytes([1]) * 32, ["/ip4/0.0.0.0/tcp/0"],
                       gossip=GossipConfig(enabled=False)) as a, \
            P2PHost(bytes([2]) * 32, gossip=GossipConfig(enabled=False)) as b:
        addresses = a.listen_addrs()
        assert addresses and not any("0.0.0.0" in x for x in addresses)
        loopback = next(x for x in addresses if x.startswith("/ip4/127.0.0.1/"))
        await b.connect(loopback)
        # identify told b our real addresses, never 0.0.0.0
        with trio.fail_after(WAIT_S):
            while not b.peer_addresses(a.peer_id) or len(b.peer_addresses(a.peer_id)) < 2:
                await trio.sleep(POLL_S)
        assert not any("0.0.0.0" in x for x in b.peer_addresses(a.peer_id))


async def test_dns_addresses_resolve() -> None:
    assert is_dns("/dns4/localhost/tcp/1/p2p/x") and not is_dns("/ip4/1.2.3.4/tcp/1")
    assert await resolve("/dns4/localhost/tcp/7/p2p/abc") == ("/ip4/127.0.0.1/tcp/7/p2p/abc",)
    assert await resolve("/ip4/1.2.3.4/tcp/1") == ("/ip4/1.2.3.4/tcp/1",)
    with pytest.raises(ResolveError):
        await resolve("/dns4/no-such-host.invalid/tcp/1")


async def test_dns_bootstrap_connects_and_a_bad_one_is_a_warning(tmp_path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="megnode")
    async with Node.open(tmp_path / "a", seed=1) as a:
        port = a.addresses[0].split("/tcp/")[1].split("/")[0]
        by_name = f"/dns4/localhost/tcp/{port}/p2p/{a.host.peer_id}"
        bad = f"/dns4/no-such-host.invalid/tcp/1/p2p/{a.host.peer_id}"
        async with Node.open(tmp_path / "b", bootstrap=[by_name, bad], seed=2) as b:
            # Wait for the dial's own state, not only the connection: the swarm lists
            # the peer a moment before the dial returns and marks it connected (CI
            # saw "dialling" there once).
            with trio.fail_after(WAIT_S):
                while True:
                    states = {x["address"]: x for x in b.status()["bootstrap"]}
                    if states.get(by_name, {}).get("state") == "connected" \
                            and states.get(bad, {}).get("attempts"):
                        break
                    await trio.sleep(POLL_S)
            assert a.host.peer_id in b.host.peers()
            assert states[by_name]["peer_id"] == a.host.peer_id
            with trio.fail_after(WAIT_S):
                while states[bad]["state"] != "retrying":
                    await trio.sleep(POLL_S)
                    states = {x["address"]: x for x in b.status()["bootstrap"]}
            assert "no-such-host.invalid" in states[bad]["error"]
    assert any(r.levelno == logging.WARNING and "bootstrap" in r.getMessage()
               and "no-such-host" in r.getMessage() for r in caplog.records)
