"""Group commit on the node's ingest path: many frames and publishes, one LMDB commit.

Why
---
An LMDB commit with fsync costs milliseconds (2.7 ms on the reference VM),
while applying one small event costs a fraction of that. Committing after
every incoming frame, as the engine does for a single `on_message`, caps a
node at one fsync per frame (~250 events/s measured) and blocks the event
loop for each. DESIGN.md requires group commit: many events per transaction,
and an API call that accepts an event returns only once its transaction
committed.

How
---
Stream handlers (`receive`) and local publishers (`author`) put their work
on one bounded queue and return at once (a full queue makes the stream
handler wait: backpressure reaches the sender through its transport window).
One task, `run`, takes a batch off the queue: the first item, then whatever
else arrives until the queue has been quiet for `idle_ms` (so a lone frame
waits about a millisecond, not a whole window; a batch of publishes only
alone closes as soon as one scheduling round brings nothing new, so a lone
publisher pays no idle gap), the batch is `window_ms` old, or it holds
`max_frames` frames / `max_bytes` bytes (which bounds how long one batch
keeps the event loop busy). It then applies the batch in one synchronous
step:

1. local publishes are authored (`make`, e.g. `replica.publish`);
2. `Disseminator.on_batch` handles every frame with its commits deferred,
   commits each touched topic once and only then returns the effects;
3. the effects are carried out (`carry_out`: sends, log records, subscriber
   wake-ups), and only then are the publishers woken with their events.

The invariant: nothing is acknowledged before it is durable — no Send
advertises, no `delivered` record or subscriber sees, no publish returns an
event whose commit has not returned. Because the step never awaits, the
graph holds uncommitted writes only inside it: no other trio task (a
subscriber reading `deliveries`, the ticker, a status call) can ever observe
them. That is also why the commit runs on the trio thread rather than a
worker thread: `Graph.commit` hands its write-set to the store and forgets
it, so while a worker thread was committing, other tasks would read a store
that does not hold the batch yet (a read-your-writes gap), and a commit
made meanwhile on the trio thread (an ack, a state action) could reach the
disk before the batch its events build on. With batching the fsync is one
per batch: profiled on the ingest bench it was 15% of the step with a slow
(~9 ms) fsync and ~2% with a fast one. Moving it off-thread soundly needs the
write-set to stay readable until the store has it and commits ordered (a
change to node.core.pending / graph, not made here).

If the commit fails (disk full, I/O error) the batch's uncommitted writes are
discarded, no effect is carried out, and the publishers get `CommitError`;
received events are simply not acknowledged, and anti-entropy fetches them
again later.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import trio

from node.core.event import Event
from transport.dissemination import Disseminator, Effect

logger = logging.getLogger("megnode.committer")

# The longest a received frame waits for its batch's commit (NodeConfig's
# commit_interval_ms overrides it); only reached under sustained traffic.
COMMIT_WINDOW_MS = 20
# A batch closes early once no new work arrived for this long: a lone event
# (or a burst that ended) is committed at once instead of waiting the window.
COMMIT_IDLE_MS = 1
# Frames per commit. Applying a small event costs ~0.2-0.5 ms, so this bounds
# one batch's synchronous step (the event loop is busy meanwhile) to tens of
# ms, while one fsync is spread over enough events to be a small part of it.
MAX_FRAMES_PER_COMMIT = 128
MAX_BATCH_BYTES = 8 * 1024 * 1024  # two full-size frames: large replies commit in few batches
MAX_PUBLISHES_PER_COMMIT = 256  # local publish calls per commit
INGEST_QUEUE_CAPACITY = 1_024  # frames and publishes waiting; a full queue makes senders wait
# Bytes of frames waiting. Frames may be 4 MiB each, so a count alone would let
# one fast peer park gigabytes here; past this, stream handlers wait (each
# stream has at most one frame in hand, so memory stays bounded).
MAX_QUEUED_BYTES = 16 * 1024 * 1024


class CommitError(Exception):
    """The batch holding this publish could not be committed; nothing of it was kept."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame from a peer (its node id), for `Disseminator.on_message`.

    `accountable=False`: the peer is only the frame's claimed origin (gossip);
    its faults are not held against it.
    """

    peer: str
    data: bytes
    accountable: bool = True


class _Authoring:
    """A local publish waiting for its batch: `make(now_ms)` authors its events."""

    __slots__ = ("topic", "make", "done", "events", "error")

    def __init__(self, topic: bytes, make: Callable[[int], Sequence[Event]]) -> None:
        self.topic = topic
        self.make = make
        self.done = trio.Event()
        self.events: Sequence[Event] = ()
        self.error: BaseException | None = None


_Work = Frame | _Authoring


class Committer:
    """Batches frames and publishes into group commits; see the module docstring."""

    def __init__(self, engine: Disseminator, carry_out: Callable[[Sequence[Effect]], None],
                 clock_ms: Callable[[], int], *, window_ms: int = COMMIT_WINDOW_MS,
                 idle_ms: int = COMMIT_IDLE_MS, max_frames: int = MAX_FRAMES_PER_COMMIT,
                 max_bytes: int = MAX_BATCH_BYTES,
                 max_publishes: int = MAX_PUBLISHES_PER_COMMIT,
                 capacity: int = INGEST_QUEUE_CAPACITY,
                 max_queued_bytes: int = MAX_QUEUED_BYTES) -> None:
        if window_ms < 0 or idle_ms < 0:
            raise ValueError("window_ms and idle_ms must be >= 0")
        if min(max_frames, max_bytes, max_publishes, capacity, max_queued_bytes) < 1:
            raise ValueError("batch bounds and queue capacity must be >= 1")
        self._engine = engine
        self._carry_out = carry_out
        self._clock_ms = clock_ms
        self._window_s = window_ms / 1000
        self._idle_s = idle_ms / 1000
        self._max_frames = max_frames
        self._max_bytes = max_bytes
        self._max_publishes = max_publishes
        self._send, self._receive = trio.open_memory_channel[_Work](capacity)
        self._max_queued_bytes = max_queued_bytes
        self._queued_bytes = 0
        self._drained = trio.Event()  # set (and replaced) when queued bytes fall below the bound
        self.stats: Counter[str] = Counter()

    # ------------------------------------------------------------------ producers

    async def receive(self, peer: str, data: bytes, accountable: bool = True) -> None:
        """Queue a frame from `peer`; waits only while the queue is full (backpressure)."""
        while self._queued_bytes >= self._max_queued_bytes:
            self.stats["waits_for_space"] += 1
            await self._drained.wait()
        self._queued_bytes += len(data)
        await self._send.send(Frame(peer, data, accountable))

    async def author(self, topic: bytes, make: Callable[[int], Sequence[Event]]) -> list[Event]:
        """Author events in the next batch; returns them once committed and sent on.

        `make(now_ms)` runs inside the batch step and adds uncommitted events
        to the topic's replica (raising refuses the publish: the exception is
        re-raised here). `CommitError` if the batch's commit failed.
        """
        request = _Authoring(topic, make)
        await self._send.send(request)
        await request.done.wait()
        if request.error is not None:
            raise request.error
        return list(request.events)

    # ------------------------------------------------------------------ the batch loop

    async def run(self) -> None:
        """Take batches off the queue and apply each in one commit, until cancelled."""
        while True:
            first = await self._receive.receive()
            batch = await self._collect(first)
            self._dequeued(batch)
            self.apply(batch)

    def _dequeued(self, batch: Sequence[_Work]) -> None:
        self._queued_bytes -= sum(len(w.data) for w in batch if isinstance(w, Frame))
        if self._queued_bytes < self._max_queued_bytes:
            self._drained.set()
            self._drained = trio.Event()

    async def _collect(self, first: _Work) -> list[_Work]:
        batch = [first]
        frames = 1 if isinstance(first, Frame) else 0
        publishes = 1 - frames
        size = len(first.data) if isinstance(first, Frame) else 0
        deadline = trio.current_time() + self._window_s
        while (frames < self._max_frames and size < self._max_bytes
               and publishes < self._max_publishes):
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
                publishes += 1
        return batch

    async def _next(self, deadline: float, frames: bool) -> _Work | None:
        """The next item, or None once the batch should close.

        Frames come through libp2p's reader tasks a few scheduling rounds
        after they reach the socket, so a burst looks quiet for a moment
        between frames: wait up to the idle gap. Publishers that call at the
        same time are all runnable already: one scheduling round finds them,
        and a lone publisher does not pay the idle gap.
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

    def apply(self, batch: Sequence[_Work]) -> None:
        """Apply one batch: author, ingest, commit once, carry out effects, wake publishers.

        Synchronous on purpose (module docstring): uncommitted writes never
        outlive this call.
        """
        now = self._clock_ms()
        requests = [w for w in batch if isinstance(w, _Authoring)]
        frames = [(w.peer, w.data, w.accountable) for w in batch if isinstance(w, Frame)]
        try:
            for request in requests:
                self._author_one(request, requests, now)
            published = [(r.topic, r.events) for r in requests if r.error is None and r.events]
            try:
                effects = self._engine.on_batch(frames, now, published)
            except Exception as exc:  # a failed commit (or a bug): acknowledge nothing
                logger.error("group commit of %d frames and %d publishes failed: %s",
                             len(frames), len(requests), exc)
                self.stats["failed_batches"] += 1
                self._discard_all()
                for request in requests:
                    if request.error is None:
                        request.error = CommitError(f"commit failed: {exc}")
                return
            self.stats["batches"] += 1
            self.stats["frames"] += len(frames)
            self.stats["publishes"] += len(requests)
            try:
                self._carry_out(effects)
            except Exception:  # durable already; a failing effect must not stop ingest
                logger.exception("carrying out a batch's effects failed")
                self.stats["failed_effects"] += 1
        finally:
            for request in requests:
                request.done.set()

    def _author_one(self, request: _Authoring, requests: Sequence[_Authoring], now: int) -> None:
        try:
            graph = self._engine.replica(request.topic).graph
        except KeyError:
            request.error = CommitError("this topic was left")
            return
        before = graph.pending_ops
        try:
            request.events = tuple(request.make(now))
        except Exception as exc:
            request.error = exc
            if graph.pending_ops < before:
                # `make` rolled the topic's uncommitted writes back (an all-or-nothing
                # publish_many): that took the earlier publishes of this batch with it.
                for earlier in requests:
                    if earlier is request:
                        break
                    if earlier.topic == request.topic and earlier.error is None:
                        earlier.error = CommitError("rolled back with a refused publish; retry")
                        earlier.events = ()

    def _discard_all(self) -> None:
        # Every topic, pending writes or not: a commit that failed inside the
        # store has already taken its write-set, and the graph's in-memory
        # mirrors still count the lost events until they are reloaded.
        for topic in self._engine.topics:
            try:
                self._engine.replica(topic).graph.discard_pending()
            except Exception as exc:  # the store itself is gone: the node is failing anyway
                logger.error("cannot reload topic %s after a failed commit: %s", topic.hex(), exc)
