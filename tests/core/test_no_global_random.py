"""The pure floors draw randomness only from an injected `random.Random`.

The import contract (pyproject.toml, `lint-imports`) keeps clocks, I/O and
concurrency out of node/core, node/state and node/replica, but it cannot see
*how* `random` is used: importing it for the `random.Random` type is fine,
calling the module's global functions is not (a seed would no longer replay a
run). This test reads the source and refuses any `random.<function>(...)` call
or `from random import <function>` other than `Random`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE_PACKAGES = ("node/core", "node/state", "node/replica")
ALLOWED = {"Random"}


def pure_modules() -> list[Path]:
    return sorted(p for package in PURE_PACKAGES for p in (ROOT / package).rglob("*.py"))


def global_random_uses(source: str) -> list[str]:
    uses = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "random"
                and node.func.attr not in ALLOWED):
            uses.append(f"line {node.lineno}: random.{node.func.attr}(...)")
        if isinstance(node, ast.ImportFrom) and node.module == "random":
            uses += [f"line {node.lineno}: from random import {a.name}"
                     for a in node.names if a.name not in ALLOWED]
    return uses


def test_the_scan_finds_what_it_must_refuse() -> None:
    assert global_random_uses("import random\nx = random.choice([1])\n") == [
        "line 2: random.choice(...)"]
    assert global_random_uses("from random import shuffle\n") == [
        "line 1: from random import shuffle"]
    assert global_random_uses("import random\nrng = random.Random(7)\n") == []


@pytest.mark.parametrize("path", pure_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_modules_use_no_global_random(path: Path) -> None:
    assert global_random_uses(path.read_text()) == []
