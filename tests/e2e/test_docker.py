"""deploy/Dockerfile: two targets, `node` (slim: the wheel without extras) and `analytics`
(the extra plus a Java runtime). Where a Docker daemon answers, the slim target builds
and its image's megnode answers --help (marked `packaging`: `make test-packaging`)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
BUILD_TIMEOUT_S = 900.0


def stages() -> dict[str, str]:
    """Each FROM ... AS name, with the text of its stage."""
    text = DOCKERFILE.read_text()
    parts = re.split(r"^FROM ", text, flags=re.MULTILINE)[1:]
    return {part.split(" AS ")[1].split()[0]: part for part in parts}


def test_two_targets_the_slim_one_without_spark_or_java() -> None:
    found = stages()
    assert {"node", "analytics"} <= set(found)
    node, analytics = found["node"], found["analytics"]
    assert "[analytics]" not in node and "jre" not in node and "pyspark" not in node
    assert analytics.startswith("node AS analytics")  # the same node, plus the extra
    assert "openjdk-17-jre-headless" in analytics and "[analytics]" in analytics
    assert "USER megnode" in node and "USER megnode" in analytics  # never runs as root


def docker_unavailable() -> str | None:
    if shutil.which("docker") is None:
        return "docker is not installed"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        return f"no Docker daemon answers: {(info.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


@pytest.mark.packaging
def test_the_slim_target_builds_and_runs_megnode() -> None:
    reason = docker_unavailable()
    if reason is not None:
        pytest.skip(reason)
    tag = "megnode-test:node"
    built = subprocess.run(["docker", "build", "-f", str(DOCKERFILE), "--target", "node",
                            "-t", tag, str(REPO)], capture_output=True, text=True,
                           timeout=BUILD_TIMEOUT_S)
    assert built.returncode == 0, built.stderr[-4000:]
    helped = subprocess.run(["docker", "run", "--rm", "--entrypoint", "megnode", tag, "--help"],
                            capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: megnode"), helped.stderr
    absent = subprocess.run(["docker", "run", "--rm", "--entrypoint", "python", tag, "-c",
                             "import importlib.util as u; print(u.find_spec('pyspark'))"],
                            capture_output=True, text=True, timeout=120)
    assert absent.stdout.strip() == "None", absent
