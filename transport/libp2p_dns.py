"""Resolving `/dns4`, `/dns6` and `/dns` peer addresses to dialable `/ip4` and `/ip6` ones.

py-libp2p's TCP transport dials only IP addresses: a `/dns4/host/tcp/4001/p2p/<id>`
bootstrap address used to fail, and silently. The node resolves such an
address itself each time it dials (a bootstrap, a redial), so a peer whose
name moved to another address is found at the new one. Resolution uses the
system resolver in trio's worker thread and is bounded by RESOLVE_TIMEOUT_S
and MAX_RESOLVED addresses.
"""

from __future__ import annotations

import socket

import trio

RESOLVE_TIMEOUT_S = 5.0
MAX_RESOLVED = 8  # addresses one name resolves to, at most (the first ones)

_FAMILIES = {"dns4": (socket.AF_INET,), "dns6": (socket.AF_INET6,),
             "dns": (socket.AF_INET, socket.AF_INET6)}


class ResolveError(Exception):
    """A name in an address could not be resolved; the message says why."""


def is_dns(address: str) -> bool:
    return address.split("/")[1:2] in (["dns4"], ["dns6"], ["dns"])


async def resolve(address: str) -> tuple[str, ...]:
    """`address` with its DNS name replaced by each address it resolves to (an
    address that names no DNS comes back as it is). Raises ResolveError."""
    parts = address.split("/")  # "", "dns4", "host", "tcp", "4001", "p2p", "<id>"
    if len(parts) < 3 or parts[1] not in _FAMILIES:
        return (address,)
    name, rest = parts[2], "/".join(parts[3:])
    found: list[str] = []
    with trio.move_on_after(RESOLVE_TIMEOUT_S) as scope:
        for family in _FAMILIES[parts[1]]:
            try:
                infos = await trio.socket.getaddrinfo(name, None, family, socket.SOCK_STREAM)
            except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
                if parts[1] != "dns":
                    raise ResolveError(f"cannot resolve {name}: {exc}") from None
                continue
            for info in infos:
                ip = str(info[4][0])
                protocol = "ip4" if info[0] == socket.AF_INET else "ip6"
                candidate = f"/{protocol}/{ip}/{rest}"
                if candidate not in found:
                    found.append(candidate)
    if scope.cancelled_caught:
        raise ResolveError(f"resolving {name} took over {RESOLVE_TIMEOUT_S} s")
    if not found:
        raise ResolveError(f"{name} has no {parts[1]} address")
    return tuple(found[:MAX_RESOLVED])
