"""The README's embedding example runs as written (issue 13).

The Python block under "Embedding the node" is taken from README.md verbatim and
run as a program of its own in an empty directory: it must exit 0 and print the
one message it published, without its state or ack events.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Embedding the node"
RUN_TIMEOUT_S = 60.0


def embedding_example() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index(SECTION):]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "no python block under the embedding section"
    return match.group(1)


def test_the_embedding_example_runs_as_written(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(embedding_example(), encoding="utf-8")
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=RUN_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and lines[0].endswith(" 21.5C"), result.stdout
    assert (tmp_path / "data" / "store").is_dir()
