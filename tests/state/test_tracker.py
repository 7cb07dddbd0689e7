"""Topic state inside a real Replica: state at every event, rejection, persistence.

The scenarios of tests/state (Synapse's test_v2.py, re-expressed) are fed to a
`Replica` through `receive`, in several arrival orders - parents first,
children first (everything buffers until the root arrives) and shuffled - and
the replica's own tracker must reach what the reference builder computes:
the same winners at END, the same state after every event, the same events
rejected.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.core.outcomes import AddStatus, RejectReason
import node.state.tracker as tracker_module
from node.core.event import Event, pack_payload
from node.core.graph import Graph as CoreGraph
from node.core.identity import sign_event
from node.replica.replica import NotAuthorizedError, Replica, ReplicaConfig, StateDisabledError
from node.state import resolve
from node.state.auth_rules import EventFields, select_auth_refs
from node.state.store import MAX_ENTRIES_PER_RECORD, StateGroups
from node.state.auth_chain import AuthChainTooLarge
from node.state import resolution_memo
from node.state.resolution_memo import ResolutionMemo
from node.state.tracker import StateResolutionError
from node.state.types import AuthReason, StateKey
from storage.lmdb_store import LmdbStore
from storage.memory import MemoryStore
from node.core.store import TABLE_STATE
from tests.helpers import authorized_topic, identity, new_topic
from tests.state import scenarios
from tests.state.builder import CAST, Graph, join_rules, member, message, power, topic, uid
from tests.state.conftest import BuildTopic
from tests.state.test_resolution_properties import MAX_EVENTS, build_forks, steps

NOW_MS = 10**12  # far after every scenario timestamp: nothing is "from the future"

Order = Callable[[list[Event], random.Random], list[Event]]


def parents_first(events: list[Event], rng: random.Random) -> list[Event]:
    return list(events)


def children_first(events: list[Event], rng: random.Random) -> list[Event]:
    return list(reversed(events))


def shuffled(events: list[Event], rng: random.Random) -> list[Event]:
    out = list(events)
    rng.shuffle(out)
    return out


ORDERS = {"parents_first": parents_first, "children_first": children_first, "shuffled": shuffled}


def replica_of(graph: Graph, order: Order, seed: int = 0, strict: bool = True) -> Replica:
    """A replica (as a bystander identity) fed every event of `graph` in `order`.

    `strict`: every event must become a vertex or be refused by the auth rules (the
    event itself, or a descendant of such an event). Random forks may give an event
    parents that are not an antichain, which the graph refuses (and whose
    descendants then wait in the buffer); the property test allows that.
    """
    replica = Replica(MemoryStore(), graph.topic_id, identity("observer"))
    events = [e for e in graph.events.values() if e.parents or e.is_create]  # no orphan END
    for n, event in enumerate(order(events, random.Random(seed))):
        outcome = replica.receive(event.raw, NOW_MS)
        assert not strict or outcome.status in (AddStatus.APPLIED, AddStatus.BUFFERED) or (
            outcome.unauthorized or outcome.reason == RejectReason.PARENT_REJECTED), outcome
        if n % 5 == 4:
            replica.commit()
    replica.commit()
    assert not strict or replica.graph.buffered_count == 0
    return replica


def state_after(replica: Replica, event_id: bytes) -> dict[StateKey, bytes]:
    record = replica.tracker.event_state(event_id)
    assert record is not None
    return dict(replica.tracker.state(record.after))


def rejected_names(replica: Replica, graph: Graph) -> dict[str, str]:
    names = {e.id: n for n, e in graph.events.items()}
    return {names[i]: replica.rejection_reason(i) for i in replica.rejected_events()}


def winners(replica: Replica, graph: Graph, keys: Sequence[StateKey]) -> dict[StateKey, str]:
    names = {e.id: n for n, e in graph.events.items()}
    state = replica.state()
    return {key: names[state[key].id] for key in keys}


# ------------------------------------------------------------- scenarios, via Replica


# All seven scenarios of Synapse's test_v2.py (tests/state/scenarios.py), as a
# Replica can hold them.
SCENARIOS = scenarios.MEG
SIBLINGS = scenarios.SIBLINGS


@pytest.mark.parametrize("order", sorted(ORDERS))
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_scenarios_resolve_in_the_replica_as_in_synapse(
    scenario: str, order: str, topic_builder: BuildTopic
) -> None:
    graph, expected = SCENARIOS[scenario](topic_builder)
    if scenario in SIBLINGS:
        sibling, ancestor = SIBLINGS[scenario]
        assert graph.state_after[sibling] == graph.state_after[ancestor]
    replica = replica_of(graph, ORDERS[order], seed=len(scenario))
    keys = [graph.key(name) for name in expected]
    assert winners(replica, graph, keys) == {graph.key(n): n for n in expected}
    # Not only END: the state after every event is the reference one.
    for name, event in graph.events.items():
        assert state_after(replica, event.id) == graph.state_after[name], name
    assert graph.rejected == {} and replica.rejected_events() == []
    assert replica.graph.extremities() == [graph.id("END")]
    if scenario == "join_rule_evasion":  # evelyn's join lost at the merge, not rejected
        assert ("m.room.member", uid("evelyn")) not in {k for k in replica.state()}


# ------------------------------------------------- demoted / banned in a branch


def writers_topic(build: BuildTopic, demotion: str) -> Graph:
    """Bob may write (events_default 10) until alice, in one branch, demotes or bans him.

    In the other branch bob keeps writing (accepted: he could, there). After the
    merge at END (zara's, a writer too), bob writes again (B2) and alice answers
    on top of it (A3).
    """
    writing = {"events_default": 10}
    take_away = (power("CUT", "alice", {"alice": 100, "bob": 0, "zara": 10}, **writing)
                 if demotion == "demote" else member("CUT", "alice", "bob", "ban"))
    events = [
        power("PW", "alice", {"alice": 100, "bob": 10, "zara": 10}, **writing),
        take_away,
        message("B1", "bob"),
        message("B2", "bob"),
        message("A3", "alice"),
    ]
    chains = [["START", "PW", "CUT", "END"], ["PW", "B1", "END"], ["END", "B2", "A3"]]
    return build(events, chains)


@pytest.mark.parametrize("demotion", ["demote", "ban"])
def test_writer_cut_off_in_a_branch_is_rejected_after_the_merge(
    demotion: str, topic_builder: BuildTopic
) -> None:
    graph = writers_topic(topic_builder, demotion)
    expected_reason = (AuthReason.INSUFFICIENT_POWER if demotion == "demote"
                       else AuthReason.SENDER_NOT_JOINED)
    assert graph.rejected == {"B2": expected_reason}  # the reference agrees
    for order in ORDERS.values():
        replica = replica_of(graph, order, seed=3)
        assert rejected_names(replica, graph) == {"B2": expected_reason}
        assert replica.counters[f"rejected.{expected_reason}"] == 1
        assert replica.counters["unauthorized"] == 1
        delivered = [e.id for _, e in replica.deliveries(limit=10_000)]
        # Concurrent with the cut, B1 is authorised (not rejected). Whether it is delivered
        # depends on arrival: applied after the cut, soft fail holds it back (docs/state.md).
        assert (graph.id("B1") in delivered) != replica.is_soft_failed(graph.id("B1"))
        # The rejected event never becomes a vertex, and neither does its child: the
        # graph remembers both refusals (docs/state.md, "Rejected events").
        for name in ("B2", "A3"):
            assert not replica.graph.has(graph.id(name))
            assert graph.id(name) not in delivered
        assert replica.graph.rejected_reason(graph.id("A3")) == RejectReason.PARENT_REJECTED
        assert graph.id("B2") not in replica.graph.extremities()
        everything = [e.id for _, e in replica.deliveries(limit=10_000, include_rejected=True)]
        assert everything == [e.id for _, e in replica.graph.deliveries(limit=10_000)]
        assert set(everything) - set(delivered) <= {graph.id("B1")}  # soft fail, no more


def test_unauthorized_events_are_reported_by_receive(topic_builder: BuildTopic) -> None:
    graph = writers_topic(topic_builder, "ban")
    replica = replica_of(graph, parents_first)
    again = Replica(MemoryStore(), graph.topic_id, identity("again"))
    outcomes = {n: again.receive(e.raw, NOW_MS) for n, e in graph.events.items()}
    assert outcomes["B2"].status is AddStatus.REJECTED  # never a vertex, never gossiped on
    assert outcomes["B2"].unauthorized == ((graph.id("B2"), AuthReason.SENDER_NOT_JOINED),)
    assert outcomes["A3"].reason == RejectReason.PARENT_REJECTED  # built on it
    assert all(not o.unauthorized for n, o in outcomes.items() if n != "B2")
    assert again.state() == replica.state()


def test_stale_auth_refs_are_rejected(topic_builder: BuildTopic) -> None:
    """Bob signs after the merge but cites his own branch's auth refs: not the selection."""
    graph = writers_topic(topic_builder, "demote")
    replica = replica_of(graph, parents_first)
    bob = CAST["bob"]
    stale = graph.state_after["B1"]
    fields = EventFields("message", bob.public_key)
    # (on the heads here: A3, built on the rejected B2, is not in the graph)
    forged = sign_event(bob, topic=graph.topic_id, seq=99, parents=replica.graph.extremities(),
                        timestamp_ms=500, kind="message", payload=b"",
                        auth=select_auth_refs(fields, stale))
    outcome = replica.receive(forged.raw, NOW_MS)
    assert outcome.unauthorized == ((forged.id, AuthReason.AUTH_REFS_NOT_SELECTED),)


# ------------------------------------------------------------ malformed content


def test_control_events_without_map_content_are_refused() -> None:
    origin = authorized_topic()
    levels = origin.state()[("m.room.power_levels", "")]
    rng = random.Random(0)
    with pytest.raises(NotAuthorizedError) as refused:  # the creator, at 100: content only
        origin.publish(pack_payload([0]), 2_000, rng, kind="m.room.power_levels", state_key="")
    assert refused.value.reason == AuthReason.BAD_CONTENT
    # Signed anyway and received: refused, never a vertex; the levels stay.
    alice = identity("alice")
    state = origin.tracker.state(origin.tracker.current_group())
    seq = origin.graph.author_latest_seq(alice.public_key) + 1
    garbled = sign_event(alice, topic=origin.topic_id, seq=seq,
                         parents=origin.graph.extremities(), timestamp_ms=2_000,
                         kind="m.room.power_levels", payload=b"\xc1", state_key="",
                         auth=select_auth_refs(EventFields("m.room.power_levels",
                                                           alice.public_key, ""), state))
    outcome = origin.receive(garbled.raw, NOW_MS)
    assert outcome.status is AddStatus.REJECTED and not origin.graph.has(garbled.id)
    assert outcome.unauthorized == ((garbled.id, AuthReason.BAD_CONTENT),)
    assert origin.state()[("m.room.power_levels", "")] == levels
    # The verdict of a non-state join rules event reads its content: not cached
    # per (state, author, kind, auth refs), or the second would pass as the first.
    origin.publish(pack_payload({"join_rule": "public"}), 2_001, rng, kind="m.room.join_rules")
    with pytest.raises(NotAuthorizedError, match="bad_content"):
        origin.publish(b"\xc1", 2_002, rng, kind="m.room.join_rules")


# ------------------------------------------------------------ unresolvable forks


def test_unresolvable_forks_are_read_as_the_greatest_heads_state_and_tried_once(
    topic_builder: BuildTopic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads fall back as `_process` does; a refused input set is not resolved again."""
    graph, _ = scenarios.ban_vs_pl(topic_builder)
    # Resolutions other tests made of these same states are remembered process-wide.
    monkeypatch.setattr(resolution_memo, "SHARED", ResolutionMemo())
    # Soft fail off: it reads the current state on receipt, which would resolve
    # the heads before the test refuses resolution.
    replica = Replica(MemoryStore(), graph.topic_id, identity("observer"),
                      ReplicaConfig(soft_fail=False))
    for name, event in graph.events.items():
        if name != "END":
            replica.receive(event.raw, NOW_MS)
    calls: list[int] = []

    def refusing_resolve(*args, **kwargs):
        calls.append(1)
        raise AuthChainTooLarge("refused by the test")

    monkeypatch.setattr(tracker_module, "resolve", refusing_resolve)
    tracker = replica.tracker
    heads = replica.graph.extremities()
    assert len(heads) == 2  # MB and PB
    fallback = state_after(replica, max(heads))
    # Reads do not raise: the state after the greatest head, on every replica.
    assert {k: e.id for k, e in replica.state().items()} == fallback
    assert replica.role_of(CAST["alice"].public_key).value == "indexer"
    assert tracker.stats["unresolvable_reads"] == 1 and calls == [1]
    # The primitive still raises, but from the memo: no second walk.
    for _ in range(3):
        with pytest.raises(StateResolutionError, match="refused by the test"):
            tracker.group_before(heads)
    assert calls == [1] and tracker.stats["unresolvable_memo_hits"] == 3
    # END merges the same heads: refused (never a vertex), without a second walk.
    outcome = replica.receive(graph.events["END"].raw, NOW_MS)
    assert outcome.unauthorized == ((graph.id("END"), AuthReason.STATE_UNRESOLVABLE),)
    assert not replica.graph.has(graph.id("END")) and calls == [1]
    # Gids die with discarded writes, so the memo of refusals goes with the caches.
    tracker.clear_caches()
    with pytest.raises(StateResolutionError):
        tracker.group_before(heads)
    assert calls == [1, 1]
    # A local event on those heads is refused with a reason, not a crash.
    member = Replica(MemoryStore(), graph.topic_id, CAST["alice"])
    for name, event in graph.events.items():
        if name != "END":
            member.receive(event.raw, NOW_MS)
    with pytest.raises(NotAuthorizedError, match="cannot be resolved") as refused:
        member.publish(b"hello", NOW_MS, random.Random(1))
    assert refused.value.reason == AuthReason.STATE_UNRESOLVABLE


# ---------------------------------------------------------------- persistence


def test_state_groups_survive_a_restart_without_recomputation(
    tmp_path, topic_builder: BuildTopic, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph, expected = scenarios.ban_vs_pl(topic_builder)
    before_end = [e for n, e in graph.events.items() if n != "END"]
    store = LmdbStore(tmp_path / "replica")
    replica = Replica(store, graph.topic_id, identity("observer"))
    for event in before_end:
        replica.receive(event.raw, NOW_MS)
    assert len(replica.graph.extremities()) == 2  # MB and PB: a fork
    at_fork = replica.state()  # resolves the fork once, and remembers it
    assert replica.tracker.stats["resolutions"] >= 1
    records = {e.id: replica.tracker.event_state(e.id) for e in before_end}
    replica.commit()
    store.close()

    calls: list[int] = []

    def counting_resolve(*args, **kwargs):
        calls.append(1)
        return resolve(*args, **kwargs)

    monkeypatch.setattr(tracker_module, "resolve", counting_resolve)
    store = LmdbStore(tmp_path / "replica")
    replica = Replica(store, graph.topic_id, identity("observer"))
    assert {i: replica.tracker.event_state(i) for i in records} == records
    assert replica.state() == at_fork
    # END merges the same two states: the memo answers, on disk since the last run.
    outcome = replica.receive(graph.events["END"].raw, NOW_MS)
    assert outcome.status is AddStatus.APPLIED and not outcome.unauthorized
    assert winners(replica, graph, [graph.key(n) for n in expected]) == {
        graph.key(n): n for n in expected}
    assert calls == [] and replica.tracker.stats["resolutions"] == 0
    assert replica.tracker.stats["caught_up"] == 0
    store.close()


def test_a_store_filled_without_state_catches_up_once(topic_builder: BuildTopic) -> None:
    """Events stored while authorization was off get their states when it is turned on."""
    graph, expected = scenarios.topic_basic(topic_builder)
    store = MemoryStore()
    blind = Replica(store, graph.topic_id, identity("observer"), ReplicaConfig(authorization=False))
    for event in graph.events.values():
        blind.receive(event.raw, NOW_MS)
    blind.commit()
    with pytest.raises(StateDisabledError):
        blind.state()
    replica = Replica(store, graph.topic_id, identity("observer"))
    assert winners(replica, graph, [graph.key(n) for n in expected]) == {
        graph.key(n): n for n in expected}
    assert replica.tracker.stats["caught_up"] == len(graph.events)


def test_a_long_chain_without_state_changes_writes_no_group() -> None:
    origin = authorized_topic()
    origin.commit()
    groups_before = len(origin.graph.table(TABLE_STATE).scan(b"g"))
    rng = random.Random(1)
    for n in range(500):
        origin.publish(b"tick", 2_000 + n, rng)
    origin.commit()
    tracker = origin.tracker
    assert len(origin.graph.table(TABLE_STATE).scan(b"g")) == groups_before
    heads = origin.graph.extremities()
    assert tracker.event_state(heads[0]).after == tracker.current_group()
    assert tracker.stats["resolutions"] == 0
    assert tracker.stats["verdict_cache_hits"] >= 498  # one real check for the whole chain


# ---------------------------------------------------------------- state groups


def fresh_groups(max_chain: int) -> tuple[StateGroups, CoreGraph]:
    graph = CoreGraph(MemoryStore(), b"\x07" * 32)
    return StateGroups(graph.table(TABLE_STATE), max_chain), graph


@pytest.mark.parametrize("max_chain", [0, 1, 16])
def test_delta_chains_stay_bounded_and_reload_exactly(max_chain: int) -> None:
    groups, graph = fresh_groups(max_chain)
    rng = random.Random(max_chain)
    expected: dict[StateKey, bytes] = {}
    gid = 0
    history = []
    for n in range(200):
        key = ("app", str(rng.randrange(40)))
        if expected and rng.random() < 0.1:  # a resolution can drop a key: deltas record it
            dropped = rng.choice(sorted(expected))
            expected.pop(dropped)
            gid = groups.store_state(dict(expected), [gid])
        else:
            expected[key] = bytes([n % 256]) * 32
            gid = groups.derive(gid, {key: expected[key]})
        history.append((gid, dict(expected)))
    graph.commit()
    reopened = StateGroups(graph.table(TABLE_STATE), max_chain)
    for gid, state in history:
        assert reopened.load(gid) == state
        assert reopened._load(gid)[1] <= max_chain


def test_a_state_larger_than_one_record_is_chunked() -> None:
    groups, graph = fresh_groups(4)
    big = {("m.room.member", f"{n:064x}"): n.to_bytes(32, "big")
           for n in range(2 * MAX_ENTRIES_PER_RECORD + 5)}
    gid = groups.store_state(big, [])
    graph.commit()
    reopened = StateGroups(graph.table(TABLE_STATE), 4)
    assert reopened.load(gid) == big


def test_equal_resolutions_reuse_a_group() -> None:
    groups, _ = fresh_groups(8)
    first = groups.derive(0, {("a", ""): b"\x01" * 32})
    assert groups.store_state({("a", ""): b"\x01" * 32}, [first]) == first


# ------------------------------------------------------------ order independence


settings_replicas = settings(max_examples=30, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow,
                                                    HealthCheck.data_too_large])


@settings_replicas
@given(plan=st.lists(steps, min_size=2, max_size=MAX_EVENTS), seeds=st.tuples(
    st.integers(0, 2**32), st.integers(0, 2**32)), tick_ms=st.sampled_from([0, 1]))
def test_state_does_not_depend_on_arrival_order_or_replica(plan, seeds, tick_ms) -> None:
    graph = build_forks(plan, tick_ms)
    replicas = [replica_of(graph, shuffled, seed, strict=False) for seed in seeds]
    heads = replicas[0].graph.extremities()
    names = {e.id: n for n, e in graph.events.items()}
    applied = {names[e.id] for _, e in replicas[0].graph.deliveries(limit=10_000)}
    reference = resolve([graph.state_after[names[h]] for h in heads], graph.source)
    for replica in replicas:
        assert replica.graph.extremities() == heads
        assert {k: e.id for k, e in replica.state().items()} == reference
        # Refused events never become vertices: the ones judged are those whose
        # parents were all applied (a descendant of a refused one is refused unjudged).
        assert rejected_names(replica, graph) == {
            n: r for n, r in graph.rejected.items()
            if graph.events[n].parents
            and all(names[p] in applied for p in graph.events[n].parents)
            and not isinstance(replica.graph.rejected_reason(graph.id(n)), RejectReason)}
        for name in applied:
            assert state_after(replica, graph.id(name)) == graph.state_after[name]
        delivered = {names[e.id] for _, e in replica.deliveries(limit=10_000)}
        # Soft fail (node.state.soft_fail) is per replica: it reads the state at the
        # time of arrival. What it keeps out of the causal view is all it changes.
        soft = {n for n in applied if replica.is_soft_failed(graph.id(n))}
        assert not soft & set(graph.rejected)
        assert delivered == applied - set(graph.rejected) - soft


def test_pure_meg_topics_have_no_state() -> None:
    origin = new_topic()
    assert not origin.authorizing and origin.rejected_events() == []
    with pytest.raises(StateDisabledError, match="not authorized"):
        origin.state()
