"""What a node announces on the LAN: addresses peers there can dial."""

from node.mdns import _port_of, advertised_addresses

PEER = "12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"


def test_a_specific_listen_address_is_announced_as_is_without_the_peer_id():
    assert advertised_addresses([f"/ip4/10.77.1.10/tcp/4001/p2p/{PEER}"]) == [
        "/ip4/10.77.1.10/tcp/4001"]


def test_a_wildcard_address_becomes_interface_addresses_never_loopback_or_wildcard():
    announced = advertised_addresses(["/ip4/0.0.0.0/tcp/4001"])
    assert all(a.endswith("/tcp/4001") for a in announced)
    assert not any(a.startswith(("/ip4/0.0.0.0/", "/ip4/127.")) for a in announced)


def test_the_announced_port_is_the_first_tcp_port():
    assert _port_of(["/ip4/10.0.0.1/tcp/4001", "/ip4/10.0.0.2/tcp/4002"]) == 4001
    assert _port_of([]) == 0
