"""Readiness for systemd (`Type=notify`): "READY=1" once the node listens, "STOPPING=1" on stop.

A few lines over $NOTIFY_SOCKET rather than the `sdnotify` package: the
protocol is one datagram of text to a unix socket (sd_notify(3)), and a
dependency for that is more to install on a small device than to maintain
here. Without $NOTIFY_SOCKET (not under systemd) every call does nothing. A
socket name starting with "@" is in the abstract namespace. Failing to notify
never stops the node: systemd then times the start out, which says more than
a crash would.
"""

from __future__ import annotations

import os
import socket
from enum import Enum

NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"
NOTIFY_TIMEOUT_S = 1.0  # a datagram to a local socket; systemd reads it at once


class Notice(Enum):
    READY = "READY=1"
    STOPPING = "STOPPING=1"


def notify(notice: Notice, status: str | None = None) -> bool:
    """Send `notice` (and a STATUS= line) to systemd; True if a notify socket took it."""
    address = os.environ.get(NOTIFY_SOCKET_ENV)
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    message = notice.value if status is None else f"{notice.value}\nSTATUS={status}"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.settimeout(NOTIFY_TIMEOUT_S)
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError:
        return False
    return True
