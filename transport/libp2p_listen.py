"""Where a libp2p host listens and what it tells peers: the fixed-port check, real addresses.

Its own module because both guard against py-libp2p behaviours no caller would guess:

* Listeners bind with SO_REUSEPORT (for TCP hole punching), so a second node
  told to listen on a taken port binds it too, silently, and the kernel then
  splits incoming dials between two different nodes. The runtime probes
  before it starts a host (`check_ports_free`).
* A host bound to `0.0.0.0` or `::` advertises exactly that (identify, status,
  `megnode run`'s "started" line): an address nobody can dial. The host's
  `addrs_factory` is `advertised_addresses`, which replaces an unspecified
  address with this machine's interface addresses (ifaddr), re-read at most
  every INTERFACE_CACHE_S so a changed address (DHCP, Wi-Fi) is advertised.
  Link-local IPv6 addresses (fe80::/10) need a scope id a multiaddr cannot
  carry, so they are left out; loopback comes last (it only reaches this machine).
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Sequence

import multiaddr

INTERFACE_CACHE_S = 30.0  # interface addresses are re-read at most this often
MAX_ADVERTISED = 16  # addresses advertised per listener at most (a host with many interfaces)

_UNSPECIFIED = {"ip4": "0.0.0.0", "ip6": "::"}
_cache: tuple[float, tuple[str, ...], tuple[str, ...]] | None = None  # (read at, v4, v6)


def check_ports_free(addresses: Sequence[str]) -> None:
    """Raise OSError (EADDRINUSE) if a listen address's fixed port is already bound.

    A plain bind, without SO_REUSEPORT, fails on a port anyone holds; the
    probe is closed at once and the host binds for real. Port 0 (any free
    port) and names other than /ip4 and /ip6 are not probed.
    """
    for address in addresses:
        parsed = multiaddr.Multiaddr(address)
        names = [protocol.name for protocol in parsed.protocols()]
        if names[:2] not in (["ip4", "tcp"], ["ip6", "tcp"]):
            continue
        port = int(parsed.value_for_protocol("tcp"))
        if port == 0:
            continue
        family = socket.AF_INET if names[0] == "ip4" else socket.AF_INET6
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # A port left in TIME_WAIT by our own last run is free to reuse.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((parsed.value_for_protocol(names[0]), port))


def interface_addresses() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """This machine's IPv4 and IPv6 addresses (non-loopback first; no link-local IPv6)."""
    global _cache
    now = time.monotonic()
    if _cache is not None and now - _cache[0] < INTERFACE_CACHE_S:
        return _cache[1], _cache[2]
    import ifaddr  # only hosts bound to an unspecified address need it

    v4: list[str] = []
    v6: list[str] = []
    try:
        adapters = ifaddr.get_adapters()
    except OSError:
        adapters = []
    for adapter in adapters:
        for ip in adapter.ips:
            text = ip.ip if isinstance(ip.ip, str) else ip.ip[0]
            try:
                parsed = ipaddress.ip_address(text)
            except ValueError:
                continue
            if parsed.is_link_local or parsed.is_unspecified or parsed.is_multicast:
                continue
            (v4 if parsed.version == 4 else v6).append(str(parsed))

    def order(found: list[str]) -> tuple[str, ...]:
        unique = list(dict.fromkeys(found))
        return tuple(sorted(unique, key=lambda a: ipaddress.ip_address(a).is_loopback))

    _cache = (now, order(v4), order(v6))
    return _cache[1], _cache[2]


def advertised_addresses(bound: Sequence[multiaddr.Multiaddr]) -> list[multiaddr.Multiaddr]:
    """The host's `addrs_factory`: bound addresses, an unspecified one replaced by the
    interface addresses of its family (never 0.0.0.0 or ::)."""
    out: list[multiaddr.Multiaddr] = []
    for address in bound:
        text = str(address)
        parts = text.split("/")  # "", "ip4", "0.0.0.0", "tcp", "4001", ...
        if len(parts) < 3 or _UNSPECIFIED.get(parts[1]) != parts[2]:
            out.append(address)
            continue
        v4, v6 = interface_addresses()
        rest = "/".join(parts[3:])
        for ip in (v4 if parts[1] == "ip4" else v6)[:MAX_ADVERTISED]:
            out.append(multiaddr.Multiaddr(f"/{parts[1]}/{ip}/{rest}"))
    unique = {str(a): a for a in reversed(out)}  # first occurrence wins
    return [unique[k] for k in dict.fromkeys(str(a) for a in out)]


def is_unspecified(address: str) -> bool:
    """True for a multiaddr naming 0.0.0.0 or :: (what a peer may announce; never dialable)."""
    parts = address.split("/")
    return len(parts) >= 3 and _UNSPECIFIED.get(parts[1]) == parts[2]
