"""`megnode analyze` is `python -m analytics analyze` in a process of its own.

The node never imports analytics (the import contract); the CLI hands the
arguments over and returns the child's exit status. Checked without Spark:
a missing log directory is refused before Spark starts, with the analytics
program's own message and status.
"""

from __future__ import annotations

import subprocess
import sys


def test_analyze_hands_its_arguments_to_the_analytics_program(tmp_path):
    args = ["analyze", str(tmp_path / "nowhere"), "--out", str(tmp_path / "report")]
    through_cli = subprocess.run([sys.executable, "-m", "node.cli", *args],
                                 capture_output=True, text=True, timeout=60)
    direct = subprocess.run([sys.executable, "-m", "analytics", *args],
                            capture_output=True, text=True, timeout=60)
    assert through_cli.returncode == direct.returncode == 2  # a user's mistake
    assert through_cli.stderr == direct.stderr
    assert "no such log path" in through_cli.stderr
    assert not (tmp_path / "report").exists()
