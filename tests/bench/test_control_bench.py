"""Control-socket attacks against a real `megnode run` daemon (issue 16).

Attacks: one deeply nested JSON line; 64 subscribers (twice MAX_SUBSCRIBERS)
that never read; 300 idle connections (more than MAX_CONTROL_CONNECTIONS).
Figures: whether the daemon is still running, its answer to the attack line,
and how long `status` takes during each attack (issue 16 asks for < 1 s).
Before the hardening: the deep line made the daemon exit 1, 64 subscribers
locked `status` out (no answer in 35 s) and 100 idle clients delayed it 29.8 s.

Writes bench-results/control.json. Not part of `make test`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

STATUS_BOUND_S = 1.0
ANSWER_BOUND_S = 35.0  # past the old idle timeout, so a "before" run shows its delay
SUBSCRIBERS = 64
IDLE_CLIENTS = 300
DEEP = 5_000


def start_daemon(data_dir: Path) -> subprocess.Popen:
    daemon = subprocess.Popen([sys.executable, "-m", "node.cli", "run", "--data-dir",
                               str(data_dir), "--listen", "/ip4/127.0.0.1/tcp/0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = daemon.stdout.readline()
    assert "started" in line, line
    return daemon


def connect(path: Path, timeout_s: float = ANSWER_BOUND_S) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:  # a full accept queue refuses at once (EAGAIN): retry, as a client must
        try:
            sock.connect(str(path))
            return sock
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def answer(sock: socket.socket, line: bytes) -> bytes | None:
    sock.sendall(line + b"\n")
    buffer = b""
    while b"\n" not in buffer:
        chunk = sock.recv(65_536)
        if not chunk:
            return None
        buffer += chunk
    return buffer.partition(b"\n")[0]


def status_seconds(path: Path) -> float | None:
    """Seconds for one `status` round trip; None if no answer within ANSWER_BOUND_S."""
    start = time.monotonic()
    try:
        with connect(path) as sock:
            reply = answer(sock, b'{"op":"status"}')
    except OSError:
        return None
    return round(time.monotonic() - start, 4) if reply and b'"ok":true' in reply else None


def test_control_socket_attacks(tmp_path, record_figures):
    figures: dict[str, object] = {}
    daemon = start_daemon(tmp_path / "n")
    path = tmp_path / "n" / "control.sock"
    try:
        with connect(path) as sock:
            reply = answer(sock, b"[" * DEEP + b"]" * DEEP)
        figures["deep_json_answer"] = None if reply is None else reply.decode()
        figures["deep_json_daemon_running"] = daemon.poll() is None
        figures["deep_json_status_after_s"] = status_seconds(path)

        with connect(path) as sock:
            topic = json.loads(answer(sock, b'{"op":"topic_create","name":"bench"}'))["topic"]
        subscribers = [connect(path) for _ in range(SUBSCRIBERS)]
        for sock in subscribers:
            sock.sendall(json.dumps({"op": "subscribe", "topic": topic}).encode() + b"\n")
        figures["status_with_subscribers_s"] = status_seconds(path)
        for sock in subscribers:
            sock.close()
        figures["status_after_subscribers_hung_up_s"] = status_seconds(path)

        idle = [connect(path) for _ in range(IDLE_CLIENTS)]
        figures["status_with_idle_clients_s"] = status_seconds(path)
        for sock in idle:
            sock.close()
        figures["daemon_running_at_end"] = daemon.poll() is None
    finally:
        daemon.terminate()
        daemon.wait(30)
    figures |= {"subscribers": SUBSCRIBERS, "idle_clients": IDLE_CLIENTS, "deep_levels": DEEP,
                "cpus": os.cpu_count()}
    record_figures("control", figures)
    assert figures["deep_json_daemon_running"] and figures["daemon_running_at_end"]
    for key in ("deep_json_status_after_s", "status_with_subscribers_s",
                "status_after_subscribers_hung_up_s", "status_with_idle_clients_s"):
        assert figures[key] is not None and figures[key] < STATUS_BOUND_S, (key, figures[key])
