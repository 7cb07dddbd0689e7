"""The `store` fixture: every conformance test runs once per Store implementation.

The LMDB store runs with its production settings (sync on) in a fresh tmp dir,
so the suite exercises exactly what a node uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.lmdb_store import LmdbStore
from storage.memory import MemoryStore
from node.core.store import Store

STORE_KINDS = ("memory", "lmdb")


def open_store(kind: str, data_dir: Path) -> Store:
    if kind == "memory":
        return MemoryStore()
    return LmdbStore(data_dir / "store")


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    opened = open_store(request.param, tmp_path)
    yield opened
    opened.close()
