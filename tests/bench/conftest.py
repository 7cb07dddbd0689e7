"""Benchmarks write their figures here; `make bench` runs them (CI does not)."""

import json
import os
from pathlib import Path

import pytest

RESULTS_DIR = Path(os.environ.get("MEGNODE_BENCH_DIR", "bench-results"))


@pytest.fixture
def record_figures():
    """Call with (name, dict) to write bench-results/<name>.json and print the figures."""

    def write(name: str, figures: dict) -> Path:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        path = RESULTS_DIR / f"{name}.json"
        path.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
        print(f"\n{name}: {json.dumps(figures, indent=2, sort_keys=True)}")
        return path

    return write
