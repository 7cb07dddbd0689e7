"""The engine's CPU per received event: against the frames per step, the unconfirmed tail, and merges.

Not part of `make test` (`make bench`). Figures go to bench-results/engine_steps.json.

Why: a daemon spends 1-9 ms of CPU per node and event on the bench's machine
(docs/anti-entropy.md, "What the bench's machine sustains"); this bench says
how much of that the engine's own step is, with no network, trio or
processes around it, so a change to the step can be measured without the
cluster's noise. One `Disseminator` with a real topic replica (auth rules
and total order on) takes pushes of one event each through `on_batch`, as
the node's committer hands it the frames of one step; `time.process_time`
counts its CPU.

* `per_step`: FRAMES_PER_STEP frames per step, an LMDB store with fsync (one
  commit per step). The creator writes every event, so as the topic's lone
  indexer its own events confirm each other: the tail stays short.
* `unconfirmed_tail`: a writer that is not an indexer writes TAIL_EVENTS
  events and no indexer acknowledges them (the indexers' devices are away),
  so the tentative tail grows by one per event; memory store, at
  TAIL_FRAMES_PER_STEP frames per step. The CPU per event over each
  TAIL_WINDOW events, and its growth per 1,000 unconfirmed events. It
  grew linearly (each feed copied and compared the whole tail: 1.41 ms per
  event at 20,000 against 0.29 at none); the order's parts now pass the
  shared prefix along and share the tail's blocks (`topolist.TailView`),
  so it stays flat (docs/anti-entropy.md, s19).
* `concurrent_writers`: CONCURRENT_WRITERS writers (the cluster bench's ten
  nodes) each publish on its own head and merge every MERGE_EVERY rounds, so
  most events have several parents and the antichain check runs, as in the
  cluster; memory store, at each FRAMES_PER_STEP. The single writer above
  never merges.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from node.core.event import Event
from node.replica.replica import Replica, ReplicaConfig
from storage.lmdb_store import LmdbStore
from storage.memory import MemoryStore
from tests.helpers import joined_writer, sync
from tests.transport.pair import PAIR_NOW_MS, identity
from transport.dissemination import Disseminator
from transport.dissemination_config import DisseminationConfig
from transport.messages import Push, encode

STEP_EVENTS = 2_000
FRAMES_PER_STEP = (1, 4, 16)
TAIL_EVENTS = 8_000
TAIL_WINDOW = 1_000
TAIL_FRAMES_PER_STEP = (1, 16)
CONCURRENT_WRITERS = 10  # the cluster bench's nodes, all writing
CONCURRENT_EVENTS = 3_000
MERGE_EVERY = 3  # rounds each writer publishes on its own head before the heads merge
PAYLOAD = b"x" * 100  # the cluster benches' 100-byte readings
FRAME_GAP_MS = 5  # the clock moves on per frame, so the peer's intake budget refills


def pushes(topic: bytes, events: list[Event]) -> list[bytes]:
    return [encode(Push(topic, (event.raw,))) for event in events]


def engine_for(replica: Replica) -> Disseminator:
    engine = Disseminator("00", random.Random(1),
                          DisseminationConfig(sync_on_connect=False, log=False))
    engine.add_topic(replica)
    engine.on_peer_up("p0", PAIR_NOW_MS)
    return engine


def feed(engine: Disseminator, frames: list[bytes], per_step: int, start: int) -> float:
    """CPU seconds to hand `frames` over, `per_step` per `on_batch`."""
    began = time.process_time()
    for i in range(0, len(frames), per_step):
        now = PAIR_NOW_MS + (start + i) * FRAME_GAP_MS
        engine.on_batch([("p0", f) for f in frames[i:i + per_step]], now)
    return time.process_time() - began


def per_step_figures(tmp: Path) -> dict[str, object]:
    rng = random.Random(4)
    source = Replica.create_topic(MemoryStore(), identity("author"), PAIR_NOW_MS,
                                  authorization=True)
    for _ in range(STEP_EVENTS):
        source.publish(PAYLOAD, PAIR_NOW_MS, rng)
    source.commit()
    events = [event for _, event in source.graph.deliveries(0, limit=STEP_EVENTS + 1)]
    frames = pushes(source.topic_id, events)
    out: dict[str, object] = {"events": STEP_EVENTS}
    for per_step in FRAMES_PER_STEP:
        with LmdbStore(tmp / f"k{per_step}") as store:
            replica = Replica(store, source.topic_id, identity("relay"), ReplicaConfig())
            engine = engine_for(replica)
            feed(engine, frames[:1], 1, 0)  # the create event: the topic becomes ready
            wall = time.perf_counter()
            cpu = feed(engine, frames[1:], per_step, 1)
            wall = time.perf_counter() - wall
            assert replica.graph.delivered_count == len(events)
            out[f"frames_per_step_{per_step}"] = {
                "cpu_ms_per_event": round(1000 * cpu / STEP_EVENTS, 3),
                "wall_ms_per_event": round(1000 * wall / STEP_EVENTS, 3)}
    return out


def concurrent_writes() -> tuple[bytes, list[bytes]]:
    """CONCURRENT_WRITERS writers each publishing on its own head, merged every
    MERGE_EVERY rounds (each then names every writer's head): one push frame per
    event, in the order the hub that collects them applied them."""
    rng = random.Random(4)
    creator = Replica.create_topic(MemoryStore(), identity("alice"), PAIR_NOW_MS,
                                   authorization=True)
    writers = [joined_writer(creator, f"w{i}", rng, PAIR_NOW_MS)
               for i in range(CONCURRENT_WRITERS)]

    def merge() -> None:  # the hub gathers every writer's events, then hands them round
        for writer in writers:
            writer.commit()
            sync(writer, creator, PAIR_NOW_MS)
        creator.commit()
        for writer in writers:
            sync(creator, writer, PAIR_NOW_MS)

    merge()  # every writer holds every join
    rounds = CONCURRENT_EVENTS // CONCURRENT_WRITERS
    for round_ in range(rounds):
        for writer in writers:
            writer.publish(PAYLOAD, PAIR_NOW_MS, rng)
        if round_ % MERGE_EVERY == MERGE_EVERY - 1 or round_ == rounds - 1:
            merge()
    events = [e for _, e in creator.graph.deliveries(0, limit=10 * CONCURRENT_EVENTS)]
    return creator.topic_id, pushes(creator.topic_id, events)


def concurrent_figures() -> dict[str, object]:
    topic, frames = concurrent_writes()
    out: dict[str, object] = {"writers": CONCURRENT_WRITERS, "merge_every": MERGE_EVERY,
                              "events": len(frames)}
    for per_step in FRAMES_PER_STEP:
        replica = Replica(MemoryStore(), topic, identity("relay"), ReplicaConfig())
        engine = engine_for(replica)
        cpu = feed(engine, frames, per_step, 0)
        assert replica.graph.delivered_count == len(frames)
        out[f"frames_per_step_{per_step}"] = {
            "cpu_ms_per_event": round(1000 * cpu / len(frames), 3),
            "antichain_walks_exhausted": replica.graph.antichain_searches_exhausted}
    return out


def tail_figures() -> dict[str, object]:
    topic, frames = unacknowledged_writes()
    return {f"frames_per_step_{k}": tail_growth(topic, frames, k) for k in TAIL_FRAMES_PER_STEP}


def unacknowledged_writes() -> tuple[bytes, list[bytes]]:
    """A topic whose writer is no indexer: the creation, invite and join, then its
    TAIL_EVENTS events, which nobody acknowledges (one push frame each)."""
    rng = random.Random(4)
    creator = Replica.create_topic(MemoryStore(), identity("alice"), PAIR_NOW_MS,
                                   authorization=True)
    writer = joined_writer(creator, "writer", rng, PAIR_NOW_MS)
    for _ in range(TAIL_EVENTS):
        writer.publish(PAYLOAD, PAIR_NOW_MS, rng)
    writer.commit()
    events = [e for _, e in writer.graph.deliveries(0, limit=TAIL_EVENTS + 100)]
    return creator.topic_id, pushes(creator.topic_id, events)


def tail_growth(topic: bytes, frames: list[bytes], per_step: int) -> dict[str, object]:
    before = len(frames) - TAIL_EVENTS  # the creation, the invite, the join
    replica = Replica(MemoryStore(), topic, identity("relay"), ReplicaConfig())
    engine = engine_for(replica)
    feed(engine, frames[:before], 1, 0)
    cpu_ms: list[float] = []
    for start in range(before, len(frames), TAIL_WINDOW):
        window = frames[start:start + TAIL_WINDOW]
        cpu_ms.append(1000 * feed(engine, window, per_step, start) / len(window))
    status = replica.order_status()
    assert status is not None and replica.graph.delivered_count == len(frames)
    assert status.tentative_length >= TAIL_EVENTS  # nothing of the writer's was confirmed
    windows = len(cpu_ms)
    growth = (cpu_ms[-1] - cpu_ms[0]) / ((windows - 1) * TAIL_WINDOW / 1000)
    return {"events": TAIL_EVENTS, "tentative_at_end": status.tentative_length,
            "cpu_ms_per_event_first_window": round(cpu_ms[0], 3),
            "cpu_ms_per_event_last_window": round(cpu_ms[-1], 3),
            "cpu_ms_per_event_by_window": [round(c, 3) for c in cpu_ms],
            "growth_ms_per_1000_unconfirmed": round(growth, 4)}


def test_engine_cpu_per_event(tmp_path, record_figures) -> None:
    figures = {"per_step": per_step_figures(tmp_path), "unconfirmed_tail": tail_figures(),
               "concurrent_writers": concurrent_figures()}
    record_figures("engine_steps", figures)
