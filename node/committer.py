"""The node's one writer: every change to the store goes through this queue, one commit per step.

Why
---
Two properties need one writer.

* Ordering: an ack or a state event cites the events before it; if it could
  reach the disk before them, a crash would leave a store whose graph is not
  closed under parents. Here every write of the node — received frames,
  publishes, state actions, acks, joins, relayed submits, topic creation,
  the engine's periodic work (dummies) and the node's own topic records —
  is a unit of work on one queue, applied in the order it was queued, and
  committed by this module's step alone. Nothing else in a running node
  commits (the engine runs in driven mode: `Disseminator(commits=False)`).
* Throughput: an LMDB commit with fsync costs milliseconds (2.7 ms on the
  reference VM), applying a small event a fraction of that. DESIGN.md asks
  for group commit: many events per transaction, and an API call that
  accepts an event returns only once its transaction committed.

How
---
Stream handlers put frames on the queue (`receive`, fire and forget; a
catch-up page first asks the engine for the next one, `Disseminator.prefetch`,
which writes nothing, so the peer prepares it while this one is verified); the
rest of the node submits typed work (`submit`: `Author`, `Act`, `Create`,
`Drive`, `Records`, `Tick`) and waits until it is durable. One task, `run`, takes a batch off the
queue: the first item, then whatever else arrives until the queue has been
quiet for `idle_ms` (so a lone frame waits about a millisecond, not a whole
window; a batch of local work alone closes as soon as one scheduling round
brings nothing new, so a lone publisher pays no idle gap), the batch is
`window_ms` old, or it holds `max_frames` frames / `max_bytes` bytes /
`max_local` local items (which bounds how long one step keeps the event loop
busy). A full queue makes stream handlers wait: backpressure reaches the
sender through its transport window. Then one synchronous step:

1. local work is applied in queue order: authoring (`make`, e.g.
   `replica.publish`, a state action, a relay submit), topic creation,
   engine calls that only send (`Drive`: asking peers to let us join), the
   node's records;
2. the frames are handled (`Disseminator.on_message`), then the engine's
   periodic work (`Tick`: `Disseminator.tick`, then the node's duties such
   as acks and membership pursuit);
3. every topic's write-set and the node's records are committed in *one*
   transaction (`take_writes`, `merge_writes`, `commit_writes`): after a
   crash the store holds all of a step or none of it, so no event is
   durable without the events it cites;
4. only then are the effects carried out (`carry_out`: sends, log records,
   subscriber wake-ups) and the submitters woken with their results.

Local work goes before the frames so that a refused all-or-nothing publish
(which rolls its topic's uncommitted writes back) can only take earlier
local work of the same step with it, which is told so and may retry; it can
never drop a received frame's writes whose effects are about to be
carried out.

The invariant: nothing is acknowledged before it is durable. Because the
step never awaits, the graph holds uncommitted writes only inside it: no
other trio task (a subscriber reading `deliveries`, a status call) ever
observes them. The commit runs on the trio thread: a commit in a worker
thread would leave other tasks reading a store without the batch, and a
second writer could overtake it. With batching the fsync is one per step:
profiled on the ingest bench it was 15% of the step with a slow (~9 ms)
fsync and ~2% with a fast one.

If the commit fails (disk full, I/O error) every topic's uncommitted writes
are discarded (each graph reloads what the store holds), no effect is
carried out, and every submitter of the step gets `CommitError`; received
events are simply not acknowledged, and anti-entropy fetches them again.
The committer carries on: a full disk costs the batches that do not fit,
reads still work, and the next batch that fits commits (docs/store.md).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union

import trio

from node.core.event import Event
from node.core.pending import commit_writes, merge_writes, writes_of
from node.replica.replica import Replica
from node.core.store import DamagedTopicError, Op, Store, StoreError
from transport.dissemination import Disseminator
from transport.effects import Effect

logger = logging.getLogger("megnode.committer")

# The longest a received frame waits for its step's commit (NodeConfig's
# commit_interval_ms overrides it); only reached under sustained traffic.
COMMIT_WINDOW_MS = 20
# A batch closes early once no new work arrived for this long: a lone event
# (or a burst that ended) is committed at once instead of waiting the window.
COMMIT_IDLE_MS = 1
# Frames per commit. Applying a small event costs ~0.2-0.5 ms, so this bounds
# one step (the event loop is busy meanwhile) to tens of ms, while one fsync
# is spread over enough events to be a small part of it.
MAX_FRAMES_PER_COMMIT = 128
# Bytes of frames per step (a larger first frame is a step of its own). ~3,000
# events of ~350 bytes: a few hundred ms of verifying at most, one fsync among
# them. 8 MiB made a step of 20,000 catch-up events that kept the event loop
# (status, probes, the next page's offer) blocked for seconds on a loaded machine.
MAX_BATCH_BYTES = 1024 * 1024
MAX_LOCAL_PER_COMMIT = 256  # local work items (publishes, acks, ...) per commit
INGEST_QUEUE_CAPACITY = 1_024  # frames and local work waiting; a full queue makes senders wait
# Bytes of frames waiting. Frames may be 4 MiB each, so a count alone would let
# one fast peer park gigabytes here; past this, stream handlers wait (each
# stream has at most one frame in hand, so memory stays bounded).
MAX_QUEUED_BYTES = 16 * 1024 * 1024


class CommitError(Exception):
    """The step holding this work could not be committed; nothing of it was kept."""


# ---------------------------------------------------------------------- units of work


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame from a peer (its node id), for `Disseminator.on_message`.

    `accountable=False`: the peer is only the frame's claimed origin (gossip);
    its faults are not held against it.
    """

    peer: str
    data: bytes
    accountable: bool = True


@dataclass(frozen=True, slots=True)
class Author:
    """Local authoring on one topic: `make(now_ms)` adds uncommitted events to its replica.

    Publishes, state actions, relay submits. Raising refuses the work (the
    exception reaches the submitter). The result: the events, announced
    (`created` records, push) once durable.
    """

    topic: bytes
    make: Callable[[int], Sequence[Event]]


@dataclass(frozen=True, slots=True)
class Act:
    """Local work on topics known only once it runs (a relayed device's request, an ack round).

    `run(now_ms)` may author on any topic and returns the (topic, event)
    pairs to announce once durable; the result is that list. Raising
    refuses the work (the exception reaches the submitter).
    """

    run: Callable[[int], Sequence[tuple[bytes, Event]]]


@dataclass(frozen=True, slots=True)
class Create:
    """A new topic: `make(now_ms)` authors it (`Replica.create_topic(commit=False)`).

    `records` (the node's own records, e.g. "this node replicates it") commit
    in the same transaction, so a crash never keeps one without the other.
    The result: the replica, committed; the caller registers and announces it.
    """

    make: Callable[[int], Replica]
    records: Callable[[bytes], Sequence[Op]] = lambda topic_id: ()  # given the new topic's id


@dataclass(frozen=True, slots=True)
class Drive:
    """An engine call that writes nothing itself but changes the engine's tables and
    sends (e.g. `Disseminator.request_join`): `run(now_ms)` returns its effects,
    carried out once the step committed, as every other effect. Made inside a step
    so the engine is only ever driven from here. Raising refuses the work."""

    run: Callable[[int], Sequence[Effect]]


@dataclass(frozen=True, slots=True)
class Records:
    """The node's own records (TABLE_META puts and deletes: which topics it replicates)."""

    ops: tuple[Op, ...]


@dataclass(frozen=True, slots=True)
class Tick:
    """Periodic work: `Disseminator.tick` (offers, wants, dummies), then `duties(now_ms)`.

    `duties` is the node's own periodic authoring (acks, membership pursuit),
    as `Act.run`. It handles its own refusals: what it raises is a bug, and
    fails the whole step.
    """

    duties: Callable[[int], Sequence[tuple[bytes, Event]]] | None = None


Local = Union[Author, Act, Create, Drive, Records, Tick]


class _Pending:
    """Submitted local work waiting for its step: woken with a result or an error."""

    __slots__ = ("work", "done", "result", "error", "queued_ms")

    def __init__(self, work: Local, queued_ms: int) -> None:
        self.work = work
        self.queued_ms = queued_ms  # a Tick expires exchanges as of then (`_tick`)
        self.done = trio.Event()
        self.result: Any = None
        self.error: BaseException | None = None


_Queued = Union[Frame, _Pending]


class Committer:
    """The node's only writer: batches work into one commit per step; see the module docstring."""

    def __init__(self, engine: Disseminator, carry_out: Callable[[Sequence[Effect]], None],
                 clock_ms: Callable[[], int], store: Store, *,
                 window_ms: int = COMMIT_WINDOW_MS, idle_ms: int = COMMIT_IDLE_MS,
                 max_frames: int = MAX_FRAMES_PER_COMMIT, max_bytes: int = MAX_BATCH_BYTES,
                 max_local: int = MAX_LOCAL_PER_COMMIT,
                 capacity: int = INGEST_QUEUE_CAPACITY,
                 max_queued_bytes: int = MAX_QUEUED_BYTES) -> None:
        if window_ms < 0 or idle_ms < 0:
            raise ValueError("window_ms and idle_ms must be >= 0")
        if min(max_frames, max_bytes, max_local, capacity, max_queued_bytes) < 1:
            raise ValueError("batch bounds and queue capacity must be >= 1")
        if engine.commits:
            raise ValueError("the committer is the only writer: drive a "
                             "Disseminator(commits=False)")
        self._engine = engine
        self._carry_out = carry_out
        self._clock_ms = clock_ms
        self._store = store
        self._window_s = window_ms / 1000
        self._idle_s = idle_ms / 1000
        self._max_frames = max_frames
        self._max_bytes = max_bytes
        self._max_local = max_local
        self._send, self._receive = trio.open_memory_channel[_Queued](capacity)
        self._max_queued_bytes = max_queued_bytes
        self._queued_bytes = 0
        self._drained = trio.Event()  # set (and replaced) when queued bytes fall below the bound
        # Since when stream handlers wait for space (None: they do not): frames the
        # peers sent since then are unread, so their exchanges are not timed out
        # past it (`_tick`).
        self._full_since: int | None = None
        self.stats: Counter[str] = Counter()
        # Told (after a failed step) which topic's stored records are damaged, so the
        # runtime stops serving that topic and the next steps carry the others again.
        self.on_damaged: Callable[[bytes, DamagedTopicError], None] | None = None
        self._damaged: list[tuple[bytes, DamagedTopicError]] = []  # found in this step

    # ------------------------------------------------------------------ producers

    async def receive(self, peer: str, data: bytes, accountable: bool = True) -> None:
        """Queue a frame from `peer`; waits only while the queue is full (backpressure)."""
        if accountable:
            # A catch-up page: ask for the next one now, while this one waits for
            # and goes through its step (`AntiEntropy.prefetch`; nothing is written).
            # Before waiting for space: a page held up by our own backlog is no
            # silence of the peer's (its exchange must not time out meanwhile).
            ahead = self._engine.prefetch(peer, data, self._clock_ms())
            if ahead:
                self._carry_out(ahead)
        while self._queued_bytes >= self._max_queued_bytes:
            self.stats["waits_for_space"] += 1
            if self._full_since is None:
                self._full_since = self._clock_ms()
            await self._drained.wait()
        self._queued_bytes += len(data)
        if self._full_since is None and self._queue_full():
            # Full by count (many small pushes): this handler waits below, and every
            # stream's frames behind it wait unread, as when full by bytes.
            self.stats["waits_for_space"] += 1
            self._full_since = self._clock_ms()
        await self._send.send(Frame(peer, data, accountable))

    def _queue_full(self) -> bool:
        stats = self._send.statistics()
        return stats.current_buffer_used >= stats.max_buffer_size

    async def submit(self, work: Local) -> Any:
        """Queue `work`; its result once its step committed and its effects were carried out.

        Re-raises what the work itself raised (a refused publish), or
        `CommitError` if the step's commit failed.
        """
        pending = _Pending(work, self._clock_ms())
        await self._send.send(pending)
        await pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return pending.result

    async def author(self, topic: bytes, make: Callable[[int], Sequence[Event]]) -> list[Event]:
        """`submit(Author(topic, make))`: the events, once durable and sent on."""
        return list(await self.submit(Author(topic, make)))

    # ------------------------------------------------------------------ the step loop

    async def run(self) -> None:
        """Take batches off the queue and apply each in one step, until cancelled."""
        while True:
            first = await self._receive.receive()
            batch = await self._collect(first)
            self._dequeued(batch)
            self.apply(batch)

    def _dequeued(self, batch: Sequence[_Queued]) -> None:
        self._queued_bytes -= sum(len(w.data) for w in batch if isinstance(w, Frame))
        if self._queued_bytes < self._max_queued_bytes:
            self._drained.set()
            self._drained = trio.Event()
            if not self._queue_full():
                self._full_since = None

    async def _collect(self, first: _Queued) -> list[_Queued]:
        batch = [first]
        frames = 1 if isinstance(first, Frame) else 0
        local = 1 - frames
        size = len(first.data) if isinstance(first, Frame) else 0
        deadline = trio.current_time() + self._window_s
        while frames < self._max_frames and size < self._max_bytes and local < self._max_local:
            try:
                item = self._receive.receive_nowait()
            except trio.WouldBlock:
                item = await self._next(deadline, frames > 0)
                if item is None:
                    break  # quiet for idle_ms, or the window is over
            batch.append(item)
            if isinstance(item, Frame):
                frames += 1
                size += len(item.data)
            else:
                local += 1
        return batch

    async def _next(self, deadline: float, frames: bool) -> _Queued | None:
        """The next item, or None once the batch should close.

        Frames come through libp2p's reader tasks a few scheduling rounds
        after they reach the socket, so a burst looks quiet for a moment
        between frames: wait up to the idle gap. Local submitters that call
        at the same time are all runnable already: one scheduling round finds
        them, and a lone publisher does not pay the idle gap.
        """
        if not frames:
            await trio.lowlevel.checkpoint()
            try:
                return self._receive.receive_nowait()
            except trio.WouldBlock:
                return None
        with trio.move_on_at(min(deadline, trio.current_time() + self._idle_s)):
            return await self._receive.receive()
        return None

    def apply(self, batch: Sequence[_Queued]) -> None:
        """One step: apply local work, frames and ticks, commit once, carry out, wake.

        Synchronous on purpose (module docstring): uncommitted writes never
        outlive this call.
        """
        now = self._clock_ms()
        local = [w for w in batch if isinstance(w, _Pending)]
        frames = [w for w in batch if isinstance(w, Frame)]
        try:
            effects: list[Effect] = []
            records: list[Op] = []
            created: list[Replica] = []
            self._engine.defer_orders()  # each topic feeds its order once per step
            try:
                for pending in local:
                    effects += self._apply_local(pending, local, now, records, created)
                    if isinstance(pending.work, Tick):
                        # Before the frames: answers to offers that waited in our sockets
                        # while we were stopped are given knowing we were away.
                        self._engine.note_due(pending.queued_ms)
                for frame in frames:
                    effects += self._engine.on_message(frame.peer, frame.data, now,
                                                       accountable=frame.accountable)
                for pending in local:
                    if isinstance(pending.work, Tick):
                        effects += self._tick(pending.work, now, pending.queued_ms)
                self._engine.flush_orders()
                self._commit(records, created)
            except Exception as exc:  # a failed commit (or a bug): acknowledge nothing
                logger.error("group commit of %d frames and %d local items failed: %s",
                             len(frames), len(local), exc)
                self.stats["failed_batches"] += 1
                self._discard_all(created)
                self._engine.flush_orders(feed=False)  # discarded with the step
                # A StoreError's message is for users already ("disk full: no space
                # left on X; the last batch was not stored; reads still work").
                reason = str(exc) if isinstance(exc, StoreError) else f"commit failed: {exc}"
                for pending in local:
                    if pending.error is None:
                        pending.error = CommitError(reason)
                self._note_damaged(exc)
                return
            self.stats["batches"] += 1
            self.stats["frames"] += len(frames)
            self.stats["publishes"] += sum(isinstance(p.work, Author) for p in local)
            try:
                self._carry_out(effects)
            except Exception:  # durable already; a failing effect must not stop ingest
                logger.exception("carrying out a step's effects failed")
                self.stats["failed_effects"] += 1
            # The step's offers leave now: their exchanges' timeouts count from here.
            self._engine.offers_sent_at(self._clock_ms())
        finally:
            for pending in local:
                pending.done.set()
            self._report_damaged()

    def _note_damaged(self, exc: BaseException) -> None:
        if isinstance(exc, DamagedTopicError) and exc.topic_id is not None:
            self._damaged.append((exc.topic_id, exc))

    def _report_damaged(self) -> None:
        """Hand the topics this step found damaged to the runtime (after the step: the
        step's writes and effects stay all or nothing, as for any refused work)."""
        damaged, self._damaged = self._damaged, []
        if self.on_damaged is not None:
            for topic_id, exc in damaged:
                self.on_damaged(topic_id, exc)

    # ------------------------------------------------------------------ inside the step

    def _apply_local(self, pending: _Pending, local: Sequence[_Pending], now: int,
                     records: list[Op], created: list[Replica]) -> list[Effect]:
        work = pending.work
        if isinstance(work, Author):
            events = self._author(pending, work, local, now)
            return self._engine.announce(work.topic, events, now) if events else []
        if isinstance(work, Act):
            try:
                made = list(work.run(now))
            except Exception as exc:
                pending.error = exc
                self._note_damaged(exc)
                return []
            pending.result = made
            return self._announce(made, now)
        if isinstance(work, Create):
            try:
                replica = work.make(now)
            except Exception as exc:
                pending.error = exc
                return []
            created.append(replica)
            records += work.records(replica.topic_id)
            pending.result = replica
        elif isinstance(work, Drive):
            try:
                return list(work.run(now))
            except Exception as exc:
                pending.error = exc
                self._note_damaged(exc)
        elif isinstance(work, Records):
            records += work.ops
        return []  # a Tick runs after the frames (`_tick`)

    def _author(self, pending: _Pending, work: Author, local: Sequence[_Pending],
                now: int) -> Sequence[Event]:
        try:
            graph = self._engine.replica(work.topic).graph
        except KeyError:
            pending.error = CommitError("this topic was left")
            return ()
        before = graph.pending_ops
        try:
            events = tuple(work.make(now))
        except Exception as exc:
            pending.error = exc
            if isinstance(exc, DamagedTopicError):
                self._damaged.append((exc.topic_id or work.topic, exc))
            if graph.pending_ops < before:
                # `make` rolled the topic's uncommitted writes back (an all-or-nothing
                # publish_many): that took the earlier authoring of this step with it.
                for earlier in local:
                    if earlier is pending:
                        break
                    if (isinstance(earlier.work, Author) and earlier.work.topic == work.topic
                            and earlier.error is None):
                        earlier.error = CommitError("rolled back with a refused publish; retry")
                        earlier.result = ()
            return ()
        pending.result = events
        return events

    def _tick(self, work: Tick, now: int, queued_ms: int) -> list[Effect]:
        # Exchanges expire by the peers' silence as of when the tick was queued:
        # answers that arrived before then were queued ahead of it and are applied.
        # While the queue is full, frames wait unread in the streams: as of then.
        due = queued_ms if self._full_since is None else min(queued_ms, self._full_since)
        effects = self._engine.tick(now, due_ms=due)
        if work.duties is not None:
            effects += self._announce(work.duties(now), now)
        return effects

    def _announce(self, made: Sequence[tuple[bytes, Event]], now: int) -> list[Effect]:
        effects: list[Effect] = []
        for topic, event in made:  # one push each, as the node always pushed these
            effects += self._engine.announce(topic, [event], now)
        return effects

    def _commit(self, records: Sequence[Op], created: Sequence[Replica]) -> None:
        """Every pending write of the step, in one transaction."""
        graphs = [self._engine.replica(t).graph for t in self._engine.topics]
        graphs += [r.graph for r in created]
        write_sets = [g.take_writes() for g in graphs if g.pending_ops]
        if records:
            write_sets.append(writes_of(records))
        writes = merge_writes(write_sets)
        if writes:
            commit_writes(self._store, writes)
            self.stats["commits"] += 1

    def _discard_all(self, created: Sequence[Replica]) -> None:
        # Every topic, pending writes or not: the failed commit has already
        # taken the write-sets, and the graphs' in-memory mirrors still count
        # the lost events until they are reloaded.
        for graph in [self._engine.replica(t).graph for t in self._engine.topics] + [
                r.graph for r in created]:
            try:
                graph.discard_pending()
            except Exception as exc:  # the store itself is gone: the node is failing anyway
                logger.error("cannot reload topic %s after a failed commit: %s",
                             graph.topic_id.hex(), exc)

