"""`python -m deploy.cluster`: SIGTERM or Ctrl-C is forwarded to its daemons and waited for
(none is orphaned), and it writes into the directory named, by default a new one under the
temp dir, never into the current directory (issue 13)."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

WAIT_S = 60.0


def read_until(process: subprocess.Popen, marker: bytes, timeout_s: float) -> list[str]:
    """stdout lines up to the one containing `marker`, waiting at most `timeout_s`.

    Raw reads of the pipe: a buffered readline would keep lines select() cannot see.
    """
    assert process.stdout is not None
    fd = process.stdout.fileno()
    buffer = b""
    deadline = time.monotonic() + timeout_s
    while marker not in buffer and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            buffer += chunk
        elif process.poll() is not None:
            break
    if marker not in buffer:
        raise AssertionError(f"no {marker!r} within {timeout_s} s; got {buffer!r}")
    return buffer.decode().splitlines()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"  # exited, not yet reaped


@pytest.mark.parametrize(("sig", "nodes"), [(signal.SIGTERM, 2), (signal.SIGINT, 1)],
                         ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_stops_every_daemon_and_nothing_lands_in_the_cwd(
        tmp_path: Path, sig: signal.Signals, nodes: int) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    # A short temp dir: the daemons' control sockets must fit AF_UNIX's ~100 bytes.
    temp = Path(tempfile.mkdtemp(prefix="mc-"))
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TMPDIR": str(temp),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    cluster = subprocess.Popen([sys.executable, "-m", "deploy.cluster", "--nodes", str(nodes)],
                               cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        lines = read_until(cluster, b"all connected", WAIT_S)
        base = Path(lines[0].removeprefix("cluster dir: "))
        assert lines[0].startswith("cluster dir: ") and base.parent == temp, lines
        pids = [int(line.split("(pid ")[1].split(",")[0]) for line in lines if "(pid " in line]
        assert len(pids) == nodes and not any(gone(pid) for pid in pids)
        cluster.send_signal(sig)
        out, err = (text.decode() for text in cluster.communicate(timeout=WAIT_S))
        assert cluster.returncode == 0, err
        assert f"{sig.name}: stopped {nodes} daemon(s)" in out and "unclean" not in out, out
        assert all(gone(pid) for pid in pids)  # forwarded and waited for: no orphan
        assert list(cwd.iterdir()) == []
        assert sorted(p.name for p in base.iterdir()) == [f"node{i}" for i in range(nodes)]
        for i in range(nodes):  # each daemon stopped cleanly, in its own words
            assert "Traceback" not in (base / f"node{i}" / "stderr.log").read_text()
    finally:
        if cluster.poll() is None:
            cluster.kill()
            cluster.wait()
        shutil.rmtree(temp, ignore_errors=True)
