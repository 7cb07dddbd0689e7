"""deploy/megnode.service: its command line signals readiness (Type=notify) once the node
listens, it keeps its state in StateDirectory= and it is hardened; `systemd-analyze verify`
accepts it where systemd is installed (issue 13)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.cluster import megnode_command
from node.sd_notify import Notice, notify

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "megnode.service"
INSTALLED_MEGNODE = "/usr/local/bin/megnode"
STATE_DIR = "/var/lib/megnode"
CONFIG = "/etc/megnode/node.toml"
WAIT_S = 30.0


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_the_unit_is_a_hardened_notify_service_with_a_state_directory() -> None:
    settings = unit_settings()
    assert settings["Type"] == ["notify"] and settings["NotifyAccess"] == ["main"]
    assert settings["StateDirectory"] == ["megnode"] and settings["StateDirectoryMode"] == ["0700"]
    for key, value in {"ProtectSystem": "strict", "NoNewPrivileges": "yes", "ProtectHome": "yes",
                       "PrivateTmp": "yes", "PrivateDevices": "yes", "RestrictSUIDSGID": "yes",
                       "CapabilityBoundingSet": ""}.items():
        assert settings[key] == [value], key
    (command,) = settings["ExecStart"]
    assert f"--data-dir {STATE_DIR}" in command  # the StateDirectory= systemd makes


def test_the_units_command_line_signals_ready_once_the_node_listens(tmp_path: Path) -> None:
    """Run ExecStart as written (paths moved into tmp) under a fake $NOTIFY_SOCKET."""
    (command,) = unit_settings()["ExecStart"]
    config = tmp_path / "node.toml"
    shutil.copy(REPO / "deploy" / "examples" / "node.toml", config)
    words = shlex.split(command)
    assert words[0] == INSTALLED_MEGNODE
    words = [{STATE_DIR: str(tmp_path / "state"), CONFIG: str(config)}.get(w, w) for w in words[1:]]
    # The example config listens on 0.0.0.0:4001; a test machine may have that taken.
    argv = megnode_command(*words, "--listen", "/ip4/127.0.0.1/tcp/0")
    name = f"@megnode-test-notify-{os.getpid()}"  # abstract namespace: no path length limit
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind("\0" + name[1:])
        listener.settimeout(WAIT_S)
        daemon = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env={**os.environ, "NOTIFY_SOCKET": name})
        try:
            ready = listener.recv(4096).decode()
            assert ready.splitlines()[0] == "READY=1", ready
            assert daemon.stdout is not None
            started = json.loads(daemon.stdout.readline())
            assert started["event"] == "started"
            # Ready means listening: its address takes a TCP connection now.
            host, port = started["addresses"][0].split("/")[2], started["addresses"][0].split("/")[4]
            assert f"STATUS=listening on {started['addresses'][0]}" in ready
            socket.create_connection((host, int(port)), timeout=WAIT_S).close()
            daemon.send_signal(signal.SIGTERM)
            assert listener.recv(4096).decode() == Notice.STOPPING.value  # READY came once
            _, err = daemon.communicate(timeout=WAIT_S)
            assert daemon.returncode == 0, err
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait()


def test_without_a_notify_socket_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify(Notice.READY) is False
    monkeypatch.setenv("NOTIFY_SOCKET", "/nonexistent/notify")
    assert notify(Notice.READY) is False  # never raises: the node runs on


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    # verify checks that ExecStart's program exists: point it at this environment's megnode.
    megnode = Path(sys.executable).parent / "megnode"
    if not megnode.exists():
        pytest.skip(f"no megnode script beside {sys.executable}")
    unit = tmp_path / "megnode.service"
    unit.write_text(UNIT.read_text().replace(INSTALLED_MEGNODE, str(megnode)))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Unknown" not in result.stderr and "ignoring" not in result.stderr, result.stderr
