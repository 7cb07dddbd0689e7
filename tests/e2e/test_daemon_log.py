"""`megnode run --log-file F`: every logger of the daemon, py-libp2p's included, writes to F
in the node's format, nothing to stderr; `-v` counts open the same scale for everyone
(node.daemon_log). Before, py-libp2p's warnings bypassed the file (issue 13)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

from deploy.cluster import LocalCluster
from node.daemon_log import levels

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                  r"[\w.]+: ")


def test_a_daemon_with_a_log_file_writes_libp2p_lines_there_and_none_on_stderr(tmp_path: Path
                                                                               ) -> None:
    log_file = tmp_path / "daemon.log"
    with LocalCluster(tmp_path / "c", 1, extra_args=("-vvv", "--log-file", str(log_file))
                      ) as cluster:
        node = cluster.nodes[0]
        assert node.process is not None
        node.process.send_signal(signal.SIGTERM)
        node.process.communicate(timeout=60)
        assert node.process.returncode == 0, node.stderr_tail()
    lines = log_file.read_text().splitlines()
    libp2p = [line for line in lines if " libp2p." in line or " libp2p:" in line]
    assert libp2p, lines[:20]
    records = [line for line in lines if LINE.match(line)]
    assert any(" megnode: started node " in line for line in records)
    assert all(LINE.match(line) for line in libp2p)  # the node's format, not py-libp2p's
    assert (node.data_dir / "stderr.log").read_text() == ""


def test_library_warnings_reach_the_file_and_verbosity_filters_everyone_alike(tmp_path: Path
                                                                              ) -> None:
    """The bug itself: py-libp2p's logger does not propagate, so its warnings went to stderr."""
    log_file = tmp_path / "d.log"
    script = (
        "import logging, warnings, libp2p\n"
        "from node.daemon_log import setup_daemon_log\n"
        f"setup_daemon_log({str(log_file)!r}, 0)\n"
        "logging.getLogger('libp2p.network.swarm').warning('a libp2p warning')\n"
        "logging.getLogger('libp2p.network.auto_connector').info('an info line, hidden')\n"
        "logging.getLogger('megnode').info('the node info, hidden without -v')\n"
        "logging.getLogger('megnode.control').warning('a node warning')\n"
        "warnings.warn('a library warning', DeprecationWarning)\n")
    result = subprocess.run([sys.executable, "-W", "always", "-c", script], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    text = log_file.read_text()
    assert "WARNING libp2p.network.swarm: a libp2p warning" in text
    assert "WARNING megnode.control: a node warning" in text
    assert "WARNING py.warnings:" in text and "a library warning" in text
    assert "hidden" not in text


def test_each_v_opens_the_node_first_then_the_libraries() -> None:
    assert [levels(v) for v in range(5)] == [(30, 30), (20, 30), (10, 20), (10, 10), (10, 10)]
