"""Background commits: a store's writer thread, and the handle that says when a write is durable.

Why: a group commit of a thousand events spends most of its wall time
waiting for the disk (LMDB writes its dirty pages, then fsyncs). py-lmdb
releases the GIL while it does, so a caller that hands the commit to a
thread can sign and apply the next batch in the meantime instead of
sleeping: a pipeline one commit deep.

Nothing about durability changes. A write handed over this way is durable
when its handle's `wait()` returns, exactly as a synchronous `apply_writes`
is when it returns; the caller acknowledges nothing of the batch before that
(`node.core.graph.Graph.begin_commit` / `wait_commit`). If the commit fails,
`wait()` raises and nothing of the batch is in the store (LMDB aborts the
whole transaction).

Only one background commit is in flight per store: the next write of any
kind waits for it first, so commits land in the order they were begun.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from node.core.store import StoreError

# One thread: commits must land in order, and LMDB allows one write transaction at a time.
WRITER_THREADS = 1


class PendingCommit:
    """A write-set being committed in the background; `wait()` returns once it is durable."""

    def __init__(self, settle: Callable[[], None], is_done: Callable[[], bool]) -> None:
        self._settle = settle
        self._is_done = is_done

    @property
    def done(self) -> bool:
        """True once the writer has finished with it: `wait()` will not sleep on the disk."""
        return self._is_done()

    def wait(self) -> None:
        """Block until the write-set is durable; raise StoreError if the commit failed.

        Repeat calls return at once (or raise the same error again).
        """
        self._settle()


def _nothing() -> None:
    return None


def completed_commit() -> PendingCommit:
    """A handle for a write that was already durable when it was handed over."""
    return PendingCommit(_nothing, lambda: True)


class BackgroundWriter:
    """The store's writer thread, started on first use."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._executor: ThreadPoolExecutor | None = None

    def submit(self, work: Callable[[], Any]) -> Future[Any]:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(WRITER_THREADS, thread_name_prefix=self._name)
        try:
            return self._executor.submit(work)
        except RuntimeError as exc:  # shut down (interpreter exit)
            raise StoreError(f"the store's writer thread is gone: {exc}") from exc

    def shutdown(self) -> None:
        """Wait for a commit in flight and stop the thread (close calls it)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
