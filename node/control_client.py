"""A small, dependency-free client for a daemon's control socket (see node.control).

The CLI runs one of these per command, so it imports only the standard
library: `megnode status` answers in a blink instead of first loading
libp2p and trio.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The daemon's control socket, inside its data dir (mode 0600); the one place this name lives.
CONTROL_SOCKET = "control.sock"
MAX_REPLY_LINE_BYTES = 16 << 20
RECEIVE_CHUNK = 65_536
CONNECT_RETRY_S = 0.005  # between connects while the daemon's accept queue is full


# ControlError.code for a daemon that is not there or went away (the others are
# the daemon's own refusal codes, node.errors).
DAEMON_GONE = "daemon_gone"


class ControlError(Exception):
    """No daemon, a refused request or a broken connection; the message says which.

    `code` names the kind (the daemon's refusal code, or DAEMON_GONE); `sent` says
    whether the whole request reached the daemon (so whether it may have acted).
    """

    def __init__(self, message: str, code: str = "error", sent: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.sent = sent


def _connect(sock: socket.socket, path: Path, timeout_s: float | None) -> None:
    """Connect, retrying while the daemon's accept queue is full (a burst of clients).

    A Unix socket with a timeout does not wait for room in the listen backlog:
    connect fails at once with EAGAIN. The daemon accepts (and sheds idle
    clients) quickly, so a retry within the timeout gets in.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        try:
            sock.connect(str(path))
            return
        except BlockingIOError:
            if deadline is not None and time.monotonic() >= deadline:
                raise ControlError("the daemon did not accept the connection in time",
                                   DAEMON_GONE) from None
            time.sleep(CONNECT_RETRY_S)


def control_lines(path: Path, request: dict[str, Any], timeout_s: float | None = 30.0
                  ) -> Iterator[dict[str, Any]]:
    """Send `request`; yield each JSON reply line until the daemon closes the connection."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        _connect(sock, path, timeout_s)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        raise ControlError(f"no megnode daemon is running on {path.parent} "
                           f"(start one with `megnode run --data-dir {path.parent}`)",
                           DAEMON_GONE) from None
    except PermissionError:
        sock.close()
        raise ControlError(f"not allowed to use the control socket {path}") from None
    except OSError as exc:
        sock.close()
        raise ControlError(f"cannot reach the daemon at {path}: {exc.strerror or exc}",
                           DAEMON_GONE) from None
    with sock:
        try:
            sock.sendall(json.dumps(request, separators=(",", ":")).encode() + b"\n")
        except OSError as exc:  # it went away between accepting and reading
            raise ControlError(f"the daemon went away: {exc.strerror or exc}", DAEMON_GONE
                               ) from None
        buffer = b""
        while True:
            while b"\n" not in buffer:
                try:
                    chunk = sock.recv(RECEIVE_CHUNK)
                except socket.timeout:
                    raise ControlError("the daemon did not answer in time", sent=True) from None
                except OSError as exc:  # reset: the daemon died
                    raise ControlError(f"the daemon went away: {exc.strerror or exc}",
                                       DAEMON_GONE, sent=True) from None
                if not chunk:
                    return
                buffer += chunk
                if len(buffer) > MAX_REPLY_LINE_BYTES:
                    raise ControlError("reply line too long")
            line, _, buffer = buffer.partition(b"\n")
            yield json.loads(line)


def control_call(path: Path, request: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
    """One request, one reply; raises ControlError with the daemon's message if refused."""
    for reply in control_lines(path, request, timeout_s):
        if not reply.get("ok"):
            raise ControlError(reply.get("error", "the daemon refused the request"),
                               str(reply.get("code", "error")), sent=True)
        return reply
    raise ControlError("the daemon went away (it closed the connection without answering)",
                       DAEMON_GONE, sent=True)
