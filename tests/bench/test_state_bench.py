"""Benchmarks of topic state: resolution of a wide fork, and state along a long chain.

Not part of CI (`make bench` runs it). Figures go to bench-results/state.json.

1. Fork of N concurrent joins against one power levels change (N = 100, 1000,
   3000). Two shapes:
   - `two_states`: the N joins already merged on one side, the power levels
     change on the other (what a merge of two forks resolves);
   - `n_plus_one_states`: every join its own state (an upper bound: our events
     have at most 20 parents, so no single merge sees this many).
   Side by side in the same run, the cost of simply auth-checking the same
   N joins once against the state at the fork: resolution / that = the
   overhead of resolving. Synapse's figures for the same fork (about 7, 70 and
   210 ms, quoted in issue 4, not measured here) are stored as a reference.
2. A long chain with no conflicts, in a topic of 1000 members: events/s of
   computing the state after every event with a memo of "state after event"
   (a single parent's state is reused, a copy is made only when a state event
   changes it), against copying the state for every event, with and without
   the auth check.
3. The same inside a `Replica` (`receive`), authorization on vs off, and
4. state groups stored as deltas vs full maps (see the section below).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from node.core.event import KIND_CREATE, KIND_MESSAGE, Event, pack_payload
from node.core.identity import Identity, sign_event
from node.core.outcomes import AddStatus
from node.replica.replica import Replica, ReplicaConfig
from node.state import EventFields, Role, check_auth, resolve, select_auth_refs
from node.state.store import MAX_DELTA_CHAIN, StateGroups
from node.state.types import StateKey, state_key_of
from storage.lmdb_store import LmdbStore
from storage.memory import MemoryStore
from node.core.store import TABLE_STATE, Put

FORK_SIZES = (100, 1000, 3000)
SYNAPSE_REFERENCE_MS = {100: 7, 1000: 70, 3000: 210}
CHAIN_LENGTH = 20_000
CHAIN_STATE_EVERY = 100  # one topic change per this many messages
CHAIN_MEMBERS = 1000  # joined before the chain: copying state is not free
REPEATS = 5
RESULTS = Path(__file__).resolve().parents[2] / "bench-results" / "state.json"

State = dict[StateKey, bytes]


def identity(name: str) -> Identity:
    return Identity.from_seed(hashlib.sha256(b"megnode-bench-" + name.encode()).digest())


ALICE, BOB = identity("alice"), identity("bob")


class Topic:
    """Events of one topic with the state after each, built along a single line."""

    def __init__(self) -> None:
        self.source: dict[bytes, Event] = {}
        self.clock_ms = 0
        self.seq: dict[bytes, int] = {}
        create = self.sign(ALICE, KIND_CREATE, "", {}, parents=[], state={})
        self.topic_id = create.id
        self.head, self.state = create, {(KIND_CREATE, ""): create.id}

    def sign(self, who: Identity, kind: str, key: str | None, content: Mapping[str, Any],
             parents: list[bytes], state: State) -> Event:
        self.clock_ms += 1
        seq = self.seq.get(who.public_key, 0)
        self.seq[who.public_key] = seq + 1
        fields = EventFields(kind, who.public_key, key, content)
        event = sign_event(
            who, topic=b"" if not parents else self.topic_id, seq=seq, parents=parents,
            timestamp_ms=self.clock_ms, kind=kind, payload=pack_payload(dict(content)),
            state_key=key, auth=select_auth_refs(fields, state),
        )
        self.source[event.id] = event
        return event

    def append(
        self, who: Identity, kind: str, key: str | None, content: Mapping[str, Any]
    ) -> Event:
        event = self.sign(who, kind, key, content, [self.head.id], self.state)
        assert check_auth(event, self.state, self.source) is None
        if key is not None:
            self.state = {**self.state, (kind, key): event.id}
        self.head = event
        return event

    def beside(self, who: Identity, kind: str, key: str, content: Mapping[str, Any]) -> Event:
        """A state event on the current head that does not advance it (a fork)."""
        return self.sign(who, kind, key, content, [self.head.id], self.state)


def base_topic() -> Topic:
    topic = Topic()
    topic.append(ALICE, "m.room.member", ALICE.public_key.hex(), {"membership": "join"})
    topic.append(ALICE, "m.room.power_levels", "", {"users": {ALICE.public_key.hex(): 100}})
    topic.append(ALICE, "m.room.join_rules", "", {"join_rule": "public"})
    topic.append(BOB, "m.room.member", BOB.public_key.hex(), {"membership": "join"})
    return topic


def best_ms(run: Callable[[], object], repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times) * 1000


@pytest.fixture(scope="module")
def results() -> Iterator[dict[str, Any]]:
    figures: dict[str, Any] = {}
    yield figures
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    print(f"\nwrote {RESULTS}")


@pytest.mark.parametrize("n", FORK_SIZES)
def test_fork_of_concurrent_joins_against_a_power_change(n: int, results: dict[str, Any]) -> None:
    topic = base_topic()
    fork = topic.state
    joiners = [identity(f"joiner-{i}") for i in range(n)]
    joins = [topic.beside(j, "m.room.member", j.public_key.hex(), {"membership": "join"})
             for j in joiners]
    change = topic.beside(ALICE, "m.room.power_levels", "",
                          {"users": {ALICE.public_key.hex(): 100, BOB.public_key.hex(): 50}})
    merged: State = {**fork, **{state_key_of(j): j.id for j in joins}}  # type: ignore[misc]
    powered: State = {**fork, state_key_of(change): change.id}  # type: ignore[dict-item]
    singles: list[State] = [{**fork, state_key_of(j): j.id} for j in joins]  # type: ignore[misc]

    resolved = resolve([merged, powered], topic.source)
    assert all(resolved[state_key_of(j)] == j.id for j in joins)  # type: ignore[index]
    assert resolved[state_key_of(change)] == change.id  # type: ignore[index]
    assert resolve([*singles, powered], topic.source) == resolved

    repeats = REPEATS if n < 3000 else 3
    two_ms = best_ms(lambda: resolve([merged, powered], topic.source), repeats)
    wide_ms = best_ms(lambda: resolve([*singles, powered], topic.source), repeats)
    checks_ms = best_ms(lambda: [check_auth(j, fork, topic.source) for j in joins], repeats)
    figures = {
        "two_states_ms": round(two_ms, 2),
        "n_plus_one_states_ms": round(wide_ms, 2),
        "auth_checks_only_ms": round(checks_ms, 2),
        "two_states_over_auth_checks": round(two_ms / checks_ms, 2),
        "synapse_reference_ms": SYNAPSE_REFERENCE_MS[n],
        "two_states_over_synapse_reference": round(two_ms / SYNAPSE_REFERENCE_MS[n], 2),
    }
    results.setdefault("fork_of_joins", {})[str(n)] = figures
    print(f"\nfork of {n} joins: {figures}")


def test_long_chain_without_conflicts(results: dict[str, Any]) -> None:
    topic = base_topic()
    for i in range(CHAIN_MEMBERS):
        who = identity(f"member-{i}")
        topic.append(who, "m.room.member", who.public_key.hex(), {"membership": "join"})
    start_state = topic.state
    chain: list[Event] = []
    for i in range(CHAIN_LENGTH):
        if i % CHAIN_STATE_EVERY == 0:
            chain.append(topic.append(ALICE, "m.room.topic", "", {"topic": f"t{i}"}))
        else:
            chain.append(topic.append(BOB, KIND_MESSAGE, None, {"body": i}))

    def states(copy_always: bool, check: bool) -> dict[bytes, State]:
        after: dict[bytes, State] = {}
        state = start_state
        for event in chain:
            # A single parent: the state before is the parent's state, reused.
            before = after[event.parents[0]] if event.parents[0] in after else state
            if check and check_auth(event, before, topic.source) is not None:
                after[event.id] = before
                continue
            key = state_key_of(event)
            if key is not None:
                before = {**before, key: event.id}
            elif copy_always:
                before = dict(before)
            after[event.id] = before
        return after

    assert states(False, True)[chain[-1].id] == topic.state
    figures = {}
    for name, copy_always, check in (
        ("memo", False, False), ("memo_with_auth", False, True),
        ("copy_each", True, False), ("copy_each_with_auth", True, True),
    ):
        ms = best_ms(lambda: states(copy_always, check), 3)
        figures[f"{name}_events_per_s"] = round(CHAIN_LENGTH / (ms / 1000))
    figures["memo_over_copy_each_speedup"] = round(
        figures["memo_events_per_s"] / figures["copy_each_events_per_s"], 2)
    figures["chain_length"] = CHAIN_LENGTH
    figures["state_keys"] = len(start_state)
    results["long_chain"] = figures
    print(f"\nlong chain: {figures}")


# --- state tracking inside the Replica ----------------------------------------------------
#
# 3. Events/s through `Replica.receive` of a long chain with no state conflicts
#    (messages by a few writers, a topic change every CHAIN_STATE_EVERY events,
#    REPLICA_MEMBERS joined), authorization on vs off, side by side in one run,
#    on the in-memory store (CPU only) and on LMDB (what a node pays). The ratio
#    is what state tracking costs on top of decoding, signature checks and the
#    graph.
# 4. State groups as deltas vs full maps: a chain of REPLICA_JOINS joins (every
#    event a state change, the worst case for storage) with the delta chain
#    limit at 0 (every group a full map), 16 and 64: events/s, bytes written to
#    TABLE_STATE, and the time to load the last group cold (after a restart).

REPLICA_CHAIN = 10_000
REPLICA_MEMBERS = 200
REPLICA_WRITERS = 4
REPLICA_JOINS = 2_000
REPLICA_BATCH = 1_024  # events per group commit
DELTA_CHAINS = (0, 16, MAX_DELTA_CHAIN)
FAR_FUTURE_MS = 10**13


class CountingStore:
    """A MemoryStore that counts the bytes committed to TABLE_STATE."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.state_bytes = 0

    def get(self, table, key):
        return self.inner.get(table, key)

    def scan(self, table, prefix, **kwargs):
        return self.inner.scan(table, prefix, **kwargs)

    def apply(self, ops):
        self.state_bytes += sum(len(op.key) + len(op.value) for op in ops
                                if isinstance(op, Put) and op.table == TABLE_STATE)
        self.inner.apply(ops)

    def close(self):
        self.inner.close()


def sign_on(origin: Replica, who: Identity, kind: str, key: str | None,
            content: Mapping[str, Any], now_ms: int) -> Event:
    """An event by `who` on all of origin's heads, auth refs from origin's state; applied there."""
    tracker = origin.tracker
    state = tracker.state(tracker.current_group())
    latest = origin.graph.author_latest_seq(who.public_key)
    event = sign_event(
        who, topic=origin.topic_id, seq=0 if latest is None else latest + 1,
        parents=origin.graph.extremities(), timestamp_ms=now_ms, kind=kind,
        payload=pack_payload(dict(content)), state_key=key,
        auth=select_auth_refs(EventFields(kind, who.public_key, key, content), state),
    )
    outcome = origin.receive(event.raw, FAR_FUTURE_MS)
    assert outcome.status is AddStatus.APPLIED and not outcome.unauthorized, outcome
    return event


def public_topic() -> tuple[Replica, list[Event]]:
    origin = Replica.create_topic(MemoryStore(), ALICE, 1_000, name="bench", authorization=True,
                                  join_rule="public")
    return origin, [e for _, e in origin.graph.deliveries(limit=10)]


def join(origin: Replica, who: Identity, now_ms: int) -> Event:
    return sign_on(origin, who, "m.room.member", who.public_key.hex(), {"membership": "join"},
                   now_ms)


def ingest(events: list[Event], config: ReplicaConfig, store) -> float:
    """Seconds to receive `events` in order into a fresh replica, group-committing."""
    replica = Replica(store, events[0].id, identity("receiver"), config)
    start = time.perf_counter()
    for n, event in enumerate(events):
        replica.receive(event.raw, FAR_FUTURE_MS)
        if n % REPLICA_BATCH == REPLICA_BATCH - 1:
            replica.commit()
    replica.commit()
    elapsed = time.perf_counter() - start
    if config.authorization:
        assert replica.counters["unauthorized"] == 0
        assert replica.tracker.stats["resolutions"] == 0
    return elapsed


def ingest_lmdb(events: list[Event], config: ReplicaConfig, path: Path) -> float:
    store = LmdbStore(path)
    try:
        return ingest(events, config, store)
    finally:
        store.close()


def test_replica_chain_with_authorization_on_and_off(tmp_path: Path,
                                                     results: dict[str, Any]) -> None:
    origin, events = public_topic()
    now = 2_000
    for i in range(REPLICA_MEMBERS):
        now += 1
        events.append(join(origin, identity(f"member-{i}"), now))
    writers = [ALICE] + [identity(f"member-{i}") for i in range(REPLICA_WRITERS - 1)]
    for who in writers[1:]:
        now += 1
        made = origin.set_role(who.public_key, Role.WRITER, now, random.Random(0))
        events += [e for e, _ in made]
    for i in range(REPLICA_CHAIN):
        now += 1
        if i % CHAIN_STATE_EVERY == 0:
            events.append(sign_on(origin, ALICE, "m.room.topic", "", {"topic": f"t{i}"}, now))
        else:
            who = writers[i % len(writers)]
            events.append(sign_on(origin, who, KIND_MESSAGE, None, {"body": i}, now))
    on, off = ReplicaConfig(), ReplicaConfig(authorization=False)
    # Interleaved, best of REPEATS: a shared machine slows both sides alike.
    memory_on = memory_off = lmdb_on = lmdb_off = float("inf")
    for r in range(REPEATS):
        memory_on = min(memory_on, ingest(events, on, MemoryStore()))
        memory_off = min(memory_off, ingest(events, off, MemoryStore()))
        lmdb_on = min(lmdb_on, ingest_lmdb(events, on, tmp_path / f"on-{r}"))
        lmdb_off = min(lmdb_off, ingest_lmdb(events, off, tmp_path / f"off-{r}"))
    count = len(events)
    figures = {
        "events": count,
        "members": REPLICA_MEMBERS,
        "writers": REPLICA_WRITERS,
        "memory_on_events_per_s": round(count / memory_on),
        "memory_off_events_per_s": round(count / memory_off),
        "memory_on_over_off": round(memory_off / memory_on, 3),
        "memory_state_us_per_event": round((memory_on - memory_off) / count * 1e6, 2),
        "lmdb_on_events_per_s": round(count / lmdb_on),
        "lmdb_off_events_per_s": round(count / lmdb_off),
        "lmdb_on_over_off": round(lmdb_off / lmdb_on, 3),
    }
    results["replica_chain"] = figures
    print(f"\nreplica chain, authorization on vs off: {figures}")


def test_state_groups_as_deltas_or_full_maps(results: dict[str, Any]) -> None:
    origin, events = public_topic()
    for i in range(REPLICA_JOINS):
        events.append(join(origin, identity(f"joiner-{i}"), 2_000 + i))
    figures: dict[str, Any] = {"joins": REPLICA_JOINS}
    for max_chain in DELTA_CHAINS:
        store = CountingStore()
        config = ReplicaConfig(state_delta_chain=max_chain)
        seconds = ingest(events, config, store)
        replica = Replica(store, origin.topic_id, identity("receiver"), config)
        last = replica.tracker.event_state(events[-1].id)
        assert last is not None
        groups = StateGroups(replica.graph.table(TABLE_STATE), max_chain)  # cold caches
        start = time.perf_counter()
        state = groups.load(last.after)
        cold_ms = (time.perf_counter() - start) * 1000
        assert len(state) == REPLICA_JOINS + 4  # create, alice, power levels, join rules
        figures[f"chain_{max_chain}"] = {
            "events_per_s": round(len(events) / seconds),
            "state_bytes_per_event": round(store.state_bytes / len(events)),
            "state_mib": round(store.state_bytes / 2**20, 2),
            "cold_load_last_group_ms": round(cold_ms, 2),
        }
    results["state_groups"] = figures
    print(f"\nstate groups, deltas vs full maps: {figures}")
