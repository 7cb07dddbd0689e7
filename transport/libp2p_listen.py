"""A check that a libp2p host's fixed listen ports are free (the default address: transport.defaults).

Its own module because the check guards against a py-libp2p behaviour that
no caller would guess: listeners bind with SO_REUSEPORT (for TCP hole
punching), so a second node told to listen on a taken port binds it too,
silently, and the kernel then splits incoming dials between two different
nodes. The runtime probes before it starts a host.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

import multiaddr


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
