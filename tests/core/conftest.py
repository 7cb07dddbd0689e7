"""Store fixtures: the core runs against the in-memory store and the real LMDB store."""

import pytest

from storage.memory import MemoryStore

try:
    from storage.lmdb_store import LmdbStore
except ImportError:  # pragma: no cover - only while the LMDB store is being written
    LmdbStore = None

STORE_KINDS = ["memory", "lmdb"] if LmdbStore is not None else ["memory"]


@pytest.fixture(params=STORE_KINDS)
def store_factory(request, tmp_path):
    """Returns a function making a fresh store (or reopening one by name, for restart tests)."""
    opened = []

    def make(name: str = "store"):
        if request.param == "memory":
            store = MemoryStore()
        else:
            store = LmdbStore(tmp_path / name)
        opened.append(store)
        return store

    make.kind = request.param
    yield make
    for store in opened:
        try:
            store.close()
        except Exception:
            pass
