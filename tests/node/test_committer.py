"""The group-commit window (node.committer) over a real LMDB store and the real engine.

The property that matters: nothing is acknowledged before it is durable. A
Send that carries or forwards an event, a `delivered` log record, a reader of
the delivery table and a returning publish may only ever see events whose
commit has returned — checked against the store itself (`store.get` reads
committed data only, never the graph's pending write-set), and for publishes
against a freshly reopened store. Then the point of it: frames that arrive
together share one commit, a lone frame is not held for the whole window,
and a sustained stream is cut at the window. Timing runs on trio's mock
clock, so the window assertions are exact and the tests never sleep.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio
import trio.testing

from node.committer import Committer, Drive
from node.core.event import Event, event_id_of
from node.core.identity import Identity
from node.replica.replica import Replica, ReplicaConfig
from storage.lmdb_store import LmdbStore
from storage.memory import MemoryStore
from node.core.store import TABLE_EVENTS
from transport.dissemination import Disseminator
from transport.dissemination_config import DisseminationConfig
from transport.effects import Effect, Log, Send
from transport.messages import Events, Push, Reply, decode, encode

NOW_MS = 1_000_000
EVENTS = 40
PURE_MEG = ReplicaConfig(authorization=False)
PEERS = ("p1", "p2", "p3")
SENDER = "p0"
READER_POLL_S = 0.0001  # finer than the frames' spacing: reads land between batches
TEST_TIMEOUT_S = 60.0  # virtual seconds (mock clock); a hang fails instead of stalling


def authored(count: int) -> tuple[bytes, list[Event]]:
    """A pure-MEG topic authored elsewhere: its create event then `count` events."""
    author = Replica.create_topic(MemoryStore(), Identity.generate(), NOW_MS, name="t",
                                  config=PURE_MEG)
    rng = random.Random(3)
    for _ in range(count):
        author.publish(b"payload", NOW_MS, rng)
    author.commit()
    return author.topic_id, [e for _, e in author.graph.deliveries(0, limit=count + 1)]


class Harness:
    """A receiving replica on LMDB, its engine, a committer, and every effect checked."""

    def __init__(self, tmp: Path, topic: bytes, **committer_args: int) -> None:
        self.path = tmp / "store"
        self.store = LmdbStore(self.path)
        self.topic = topic
        self.replica = Replica(self.store, topic, Identity.generate(), PURE_MEG)
        self.engine = Disseminator("00", random.Random(1),
                                   DisseminationConfig(log=True, sync_on_connect=False),
                                   commits=False)
        self.engine.add_topic(self.replica)
        for peer in PEERS:
            self.engine.on_peer_up(peer, NOW_MS)
        self.committer = Committer(self.engine, self.carry_out, lambda: NOW_MS, self.store,
                                   **committer_args)
        self.effects: list[Effect] = []
        self.batches: list[tuple[float, int]] = []  # (carried out at, frames so far)
        self.frames_sent = 0
        self.changed = trio.Event()

    def durable(self, event_id: bytes) -> bool:
        return self.store.get(TABLE_EVENTS, self.topic + event_id) is not None

    def carry_out(self, effects: list[Effect]) -> None:
        assert self.replica.graph.pending_ops == 0, "effects carried out before the commit"
        for effect in effects:
            if isinstance(effect, Send):
                message = decode(effect.data)
                if isinstance(message, (Push, Reply, Events)):
                    for raw in message.events:
                        assert self.durable(event_id_of(raw)), "sent before durable"
            elif isinstance(effect, Log) and effect.record["type"] == "delivered":
                assert self.durable(bytes.fromhex(effect.record["event"])), \
                    "delivered before durable"
        self.effects += effects
        self.batches.append((trio.current_time(), self.committer.stats["frames"]))
        self.changed.set()
        self.changed = trio.Event()

    async def frame(self, event: Event) -> None:
        self.frames_sent += 1
        await self.committer.receive(SENDER, encode(Push(self.topic, (event.raw,))))

    async def wait_delivered(self, count: int) -> None:
        with trio.fail_after(TEST_TIMEOUT_S):
            while self.replica.graph.delivered_count < count:
                await self.changed.wait()


def test_frames_that_arrive_together_share_one_commit(tmp_path: Path) -> None:
    topic, events = authored(EVENTS)

    async def main() -> None:
        h = Harness(tmp_path, topic)
        for event in events:  # all queued before the committer runs
            await h.frame(event)
        before = h.store.last_txn_id
        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.committer.run)
            await h.wait_delivered(len(events))
            nursery.cancel_scope.cancel()
        assert h.store.last_txn_id - before == 1  # one transaction, one fsync
        assert h.committer.stats["batches"] == 1
        assert all(h.durable(e.id) for e in events)
        forwarded = [e for e in h.effects if isinstance(e, Send)]
        assert forwarded and all(s.peer != SENDER for s in forwarded)
        h.store.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_readers_between_batches_never_see_an_uncommitted_event(tmp_path: Path) -> None:
    topic, events = authored(EVENTS)

    async def main() -> None:
        h = Harness(tmp_path, topic, max_frames=7)
        seen = 0

        async def reader() -> None:  # a subscriber polling at every scheduling point
            nonlocal seen
            while True:
                for _, event in h.replica.deliveries(since=0, limit=len(events) + 1):
                    assert h.durable(event.id), "a reader saw an uncommitted event"
                seen = h.replica.graph.delivered_count
                await trio.sleep(READER_POLL_S)  # (a bare checkpoint would stop the mock clock)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.committer.run)
            nursery.start_soon(reader)
            for event in events:  # trickled in, so batches close while frames wait
                await h.frame(event)
                await trio.sleep(0.0003)
            await h.wait_delivered(len(events))
            await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        assert seen == len(events)
        assert 1 < h.committer.stats["batches"] < len(events)
        h.store.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_publish_returns_once_its_event_is_in_a_reopened_store(tmp_path: Path) -> None:
    async def main() -> list[bytes]:
        store = LmdbStore(tmp_path / "store")
        replica = Replica.create_topic(store, Identity.generate(), NOW_MS, config=PURE_MEG)
        engine = Disseminator("00", random.Random(1), DisseminationConfig(log=False),
                              commits=False)
        engine.add_topic(replica)
        carried: list[Effect] = []
        committer = Committer(engine, carried.extend, lambda: NOW_MS, store)
        rng = random.Random(5)
        ids: list[bytes] = []
        before = store.last_txn_id

        async def publisher(n: int) -> None:
            made = await committer.author(
                replica.topic_id, lambda now: [replica.publish(b"m%d" % n, now, rng)[0]])
            ids.append(made[0].id)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(committer.run)
            async with trio.open_nursery() as publishers:
                for n in range(20):
                    publishers.start_soon(publisher, n)
            nursery.cancel_scope.cancel()
        assert store.last_txn_id - before < 20  # concurrent publishes shared commits
        ids.append(replica.topic_id)
        store.close()  # pending writes, if any were left, die here
        return ids

    ids = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    topic = ids.pop()
    with LmdbStore(tmp_path / "store") as reopened:
        assert len(ids) == 20
        assert all(reopened.get(TABLE_EVENTS, topic + event_id) is not None for event_id in ids)


def test_a_refused_publish_fails_alone(tmp_path: Path) -> None:
    async def main() -> None:
        store = LmdbStore(tmp_path / "store")
        replica = Replica.create_topic(store, Identity.generate(), NOW_MS, config=PURE_MEG)
        engine = Disseminator("00", random.Random(1), DisseminationConfig(log=False),
                              commits=False)
        engine.add_topic(replica)
        committer = Committer(engine, lambda effects: None, lambda: NOW_MS, store)
        rng = random.Random(5)
        results: dict[str, object] = {}

        def refuse(now: int) -> list[Event]:
            raise PermissionError("not allowed")

        async def call(name: str, make) -> None:
            try:
                results[name] = await committer.author(replica.topic_id, make)
            except PermissionError as exc:
                results[name] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(committer.run)
            async with trio.open_nursery() as callers:
                callers.start_soon(call, "ok1", lambda now: [replica.publish(b"a", now, rng)[0]])
                callers.start_soon(call, "refused", refuse)
                callers.start_soon(call, "ok2", lambda now: [replica.publish(b"b", now, rng)[0]])
            nursery.cancel_scope.cancel()
        assert isinstance(results["refused"], PermissionError)
        for name in ("ok1", "ok2"):
            [event] = results[name]
            assert store.get(TABLE_EVENTS, replica.topic_id + event.id) is not None
        assert committer.stats["batches"] == 1
        store.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.parametrize("window_ms", [20, 1_000])
def test_a_lone_frame_waits_the_idle_gap_not_the_window(tmp_path: Path, window_ms: int) -> None:
    topic, events = authored(1)

    async def main() -> None:
        h = Harness(tmp_path, topic, window_ms=window_ms, idle_ms=1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.committer.run)
            await trio.sleep(1)
            sent_at = trio.current_time()
            await h.frame(events[0])
            await h.frame(events[1])
            await h.wait_delivered(2)
            assert h.batches[-1][0] - sent_at == pytest.approx(0.001)
            nursery.cancel_scope.cancel()
        h.store.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_sustained_stream_is_cut_at_the_window(tmp_path: Path) -> None:
    topic, events = authored(EVENTS)
    window_ms, gap_s = 10, 0.0005  # a frame every 0.5 ms: never idle for 1 ms

    async def main() -> None:
        h = Harness(tmp_path, topic, window_ms=window_ms, idle_ms=1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.committer.run)
            for event in events:
                await h.frame(event)
                await trio.sleep(gap_s)
            await h.wait_delivered(len(events))
            nursery.cancel_scope.cancel()
        sizes = [b - a for (_, a), (_, b) in zip([(0, 0)] + h.batches, h.batches)]
        # A batch spans at most the window: window / gap frames plus the first.
        assert max(sizes) <= window_ms / 1000 / gap_s + 1
        assert len(sizes) < len(events) / 5  # and still groups many frames
        h.store.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_full_batch_commits_at_max_frames(tmp_path: Path) -> None:
    topic, events = authored(EVENTS)

    async def main() -> None:
        h = Harness(tmp_path, topic, max_frames=8)
        for event in events:
            await h.frame(event)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(h.committer.run)
            await h.wait_delivered(len(events))
            nursery.cancel_scope.cancel()
        assert h.committer.stats["batches"] == -(-len(events) // 8)
        h.store.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_lone_publish_pays_no_idle_gap(tmp_path: Path) -> None:
    async def main() -> None:
        store = LmdbStore(tmp_path / "store")
        replica = Replica.create_topic(store, Identity.generate(), NOW_MS, config=PURE_MEG)
        engine = Disseminator("00", random.Random(1), DisseminationConfig(log=False),
                              commits=False)
        engine.add_topic(replica)
        committer = Committer(engine, lambda effects: None, lambda: NOW_MS, store,
                              window_ms=1_000, idle_ms=50)
        rng = random.Random(5)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(committer.run)
            await trio.sleep(1)
            began = trio.current_time()
            await committer.author(replica.topic_id,
                                   lambda now: [replica.publish(b"alone", now, rng)[0]])
            assert trio.current_time() == began  # no timed wait on the way
            nursery.cancel_scope.cancel()
        store.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_an_engine_call_sends_after_the_step_commits_and_its_refusal_reaches_the_caller(
        tmp_path: Path) -> None:
    """`Drive`: an engine call made inside a step; its effects go out after that step's
    commit, with the step's other work; what it raises reaches its submitter alone."""

    async def main() -> None:
        store = LmdbStore(tmp_path / "store")
        replica = Replica.create_topic(store, Identity.generate(), NOW_MS, config=PURE_MEG)
        engine = Disseminator("00", random.Random(1), DisseminationConfig(log=False),
                              commits=False)
        engine.add_topic(replica)
        carried: list[list[Effect]] = []
        committer = Committer(engine, lambda effects: carried.append(list(effects)),
                              lambda: NOW_MS, store)
        rng = random.Random(5)
        sent = Send("p1", b"hello")

        def engine_call(now: int) -> list[Effect]:
            assert now == NOW_MS
            return [sent]

        def refused(now: int) -> list[Effect]:
            raise KeyError("no such topic")

        results: dict[str, object] = {}

        async def call(name: str, work) -> None:
            try:
                results[name] = await committer.submit(work)
            except KeyError as exc:
                results[name] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(committer.run)
            async with trio.open_nursery() as callers:
                callers.start_soon(call, "drive", Drive(engine_call))
                callers.start_soon(call, "refused", Drive(refused))
                callers.start_soon(committer.author, replica.topic_id,
                                   lambda now: [replica.publish(b"a", now, rng)[0]])
            nursery.cancel_scope.cancel()
        assert results["drive"] is None and isinstance(results["refused"], KeyError)
        assert committer.stats["batches"] == 1 and sent in carried[0]
        store.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_queued_bytes_are_bounded(tmp_path: Path) -> None:
    topic, events = authored(EVENTS)
    frame_bytes = len(encode(Push(topic, (events[1].raw,))))

    async def main() -> None:
        h = Harness(tmp_path, topic, max_queued_bytes=4 * frame_bytes)
        queued = 0

        async def producer() -> None:
            nonlocal queued
            for event in events:
                await h.frame(event)
                queued += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer)
            await trio.sleep(1)  # the committer is not running: the producer must stall
            assert queued <= 5  # admitted while under the bound: at most one frame past it
            nursery.start_soon(h.committer.run)
            await h.wait_delivered(len(events))
            nursery.cancel_scope.cancel()
        assert queued == len(events)
        h.store.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_queue_full_by_count_stops_the_silence_clock(tmp_path: Path) -> None:
    # Many small frames (pushes) fill the queue's slots long before its bytes: the
    # frames behind them wait unread in their streams, as when full by bytes, so the
    # exchanges whose answers may be among them do not time out meanwhile (`_tick`).
    topic, events = authored(EVENTS)

    async def main() -> None:
        h = Harness(tmp_path, topic, capacity=4)

        async def producer() -> None:
            for event in events:
                await h.frame(event)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer)
            await trio.sleep(1)  # the committer is not running: the queue fills by count
            assert h.committer._full_since is not None
            assert h.committer.stats["waits_for_space"] >= 1
            nursery.start_soon(h.committer.run)
            await h.wait_delivered(len(events))
            nursery.cancel_scope.cancel()
        assert h.committer._full_since is None  # drained: the clock runs again
        h.store.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
