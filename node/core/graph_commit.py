"""The hand-over of a graph's writes to the store: commit, or take them for the committer.

`GraphCommit` is a mixin of `node.core.graph.Graph`. The graph's writes
collect in a PendingWrites set that reads see (`node.core.pending`); they
become durable in one store transaction, made here (`commit`, standalone
and in tests) or by the node's committer, the only writer in a running node,
which takes the write-sets of several topics (`take_writes`) and commits
them together. Nothing of a batch may be acknowledged before that commit
returned; after a failed one the graph forgets the batch
(`Graph.discard_pending`).

Two writes are deferred to the hand-over rather than made per applied event
(`_seal_batch`): the forward extremities table, written as the difference
from what the store holds (a chain of a thousand events would otherwise add
and remove a thousand keys), and the delivered counter. docs/graph.md has
the whole theory of operation.
"""

from __future__ import annotations

from node.core.pending import PendingWrites, Writes, commit_writes
from node.core.store import TABLE_EXTREMITIES, TABLE_META, Store

META_DELIVERED = b"delivered"  # T|"delivered" in the meta table: applied events, 8 bytes BE


class GraphCommit:
    """Commit and write-set hand-over; a mixin of `Graph` (module docstring)."""

    # The graph's state the hand-over reads and writes (set by `Graph.__init__`).
    _store: Store
    _w: PendingWrites
    _t: bytes
    _extremities: set[bytes]
    _stored_extremities: set[bytes]  # the extremities as the store holds them
    _delivered: int | None  # applied events (None: not read from the store yet)
    _delivered_saved: int | None  # the count last handed to the store

    def commit(self) -> int:
        """Make every pending write durable in one transaction; returns the write count.

        If the store raises, nothing of the batch is in it, but the graph still
        shows the lost writes: call `discard_pending()`.
        """
        return commit_writes(self._store, self.take_writes())

    def take_writes(self) -> Writes:
        """Every pending write as a write-set, for a caller that commits it; empties the set.

        The caller must commit it (`node.core.pending.commit_writes`) before
        anything of it is acknowledged, and call `discard_pending()` if that
        fails. Reads see the taken writes no more: take them only right
        before the commit, with nothing read in between.
        """
        self._seal_batch()
        return self._w.take_writes()

    def _seal_batch(self) -> None:
        """What every commit does before handing the write-set over: the deferred writes."""
        live, stored = self._extremities, self._stored_extremities
        if live != stored:
            t, w = self._t, self._w
            for gone in stored - live:
                w.delete(TABLE_EXTREMITIES, t + gone)
            for new in live - stored:
                w.put(TABLE_EXTREMITIES, t + new, b"")
            self._stored_extremities = set(live)
        if self._delivered is not None and self._delivered != self._delivered_saved:
            # One counter write per commit rather than one per applied event.
            self._w.put(TABLE_META, self._t + META_DELIVERED, self._delivered.to_bytes(8, "big"))
            self._delivered_saved = self._delivered

    @property
    def pending_ops(self) -> int:
        return len(self._w)
