"""State resolution v2: the seven scenarios of Synapse's tests/state/test_v2.py.

Each scenario hangs events off the base chain (conftest) and merges its
branches at END. As in Synapse's tests, the expected state at END is given as
the winning events; the check compares END's state on those keys and on every
key that changed since START, so an unexpected extra change (evelyn slipping
in, say) fails too. Every scenario event passes the auth rules on its own
branch: the conflicts are only decided at the merge.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from node.state import resolve
from node.state.auth_chain import AuthChainTooLarge, auth_chain_difference
from node.state.resolution import split
from tests.state.builder import Graph, join_rules, member, message, power, topic, uid
from tests.state.conftest import BuildTopic


def assert_state_at_end(graph: Graph, expected: Sequence[str]) -> None:
    assert graph.rejected == {}, "a scenario event failed auth on its own branch"
    wanted = {graph.key(name): graph.id(name) for name in expected}
    start, end = graph.state_after["START"], graph.state_after["END"]
    changed = {k: v for k, v in end.items() if k in wanted or start.get(k) != v}
    names = {e.id: n for n, e in graph.events.items()}
    assert {k: names[v] for k, v in changed.items()} == {k: names[v] for k, v in wanted.items()}


def test_ban_vs_pl(topic_builder: BuildTopic) -> None:
    # Alice bans bob in one branch; bob re-sends his power levels in the other.
    # The ban is a power event by the more powerful sender: it wins.
    events = [
        power("PA", "alice", {"alice": 100, "bob": 50}),
        member("MA", "alice", "alice", "join"),
        member("MB", "alice", "bob", "ban"),
        power("PB", "bob", {"alice": 100, "bob": 50}),
    ]
    chains = [["START", "PA", "MA", "MB", "END"], ["PA", "PB", "END"]]
    assert_state_at_end(topic_builder(events, chains), ["PA", "MA", "MB"])


def test_join_rule_evasion(topic_builder: BuildTopic) -> None:
    # Evelyn joins while alice concurrently makes the topic invite-only: the
    # join rule is applied first and evelyn's join no longer passes.
    events = [join_rules("JR", "alice", "invite"), member("ME", "evelyn", "evelyn", "join")]
    chains = [["START", "JR", "END"], ["START", "ME", "END"]]
    graph = topic_builder(events, chains)
    assert_state_at_end(graph, ["JR"])
    assert ("m.room.member", uid("evelyn")) not in graph.state_after["END"]


def test_offtopic_pl(topic_builder: BuildTopic) -> None:
    # A chain of power levels PA <- PB <- PC against PA alone: PC, the latest
    # authorised change, wins.
    events = [
        power("PA", "alice", {"alice": 100, "bob": 50}),
        power("PB", "bob", {"alice": 100, "bob": 50, "charlie": 50}),
        power("PC", "charlie", {"alice": 100, "bob": 50, "charlie": 0}),
    ]
    chains = [["START", "PA", "PB", "PC", "END"], ["PA", "END"]]
    assert_state_at_end(topic_builder(events, chains), ["PC"])


def test_topic_basic(topic_builder: BuildTopic) -> None:
    # Alice demotes bob (PA2) while bob re-asserts his level (PB) and sets a
    # topic (T3): PA2 wins, T3 loses its authority, T2 stays.
    events = [
        topic("T1", "alice"),
        power("PA1", "alice", {"alice": 100, "bob": 50}),
        topic("T2", "alice"),
        power("PA2", "alice", {"alice": 100, "bob": 0}),
        power("PB", "bob", {"alice": 100, "bob": 50}),
        topic("T3", "bob"),
    ]
    chains = [["START", "T1", "PA1", "T2", "PA2", "END"], ["PA1", "PB", "T3", "END"]]
    assert_state_at_end(topic_builder(events, chains), ["PA2", "T2"])


def test_topic_reset(topic_builder: BuildTopic) -> None:
    # Bob sets a topic, then alice bans him; merged with a branch that only
    # knows T1, bob's topic no longer passes and the topic goes back to T1.
    events = [
        topic("T1", "alice"),
        power("PA", "alice", {"alice": 100, "bob": 50}),
        topic("T2", "bob"),
        member("MB", "alice", "bob", "ban"),
    ]
    chains = [["START", "T1", "PA", "T2", "MB", "END"], ["T1", "END"]]
    assert_state_at_end(topic_builder(events, chains), ["T1", "MB", "PA"])


def test_topic(topic_builder: BuildTopic) -> None:
    # topic_basic, then zara's message MZ1 merges both branches and alice sets
    # T4 on top of it. (Synapse also links END to MZ1 directly; our parents
    # must be an antichain, and MZ1 is an ancestor of T4, so END has one parent.)
    events = [
        topic("T1", "alice"),
        power("PA1", "alice", {"alice": 100, "bob": 50}),
        topic("T2", "alice"),
        power("PA2", "alice", {"alice": 100, "bob": 0}),
        power("PB", "bob", {"alice": 100, "bob": 50}),
        topic("T3", "bob"),
        message("MZ1", "zara"),
        topic("T4", "alice"),
    ]
    chains = [
        ["START", "T1", "PA1", "T2", "PA2", "MZ1", "T4", "END"],
        ["PA1", "PB", "T3", "MZ1"],
    ]
    assert_state_at_end(topic_builder(events, chains), ["T4", "PA2"])


def test_mainline_sort(topic_builder: BuildTopic) -> None:
    # T3 (bob) is sent under the newer power levels PA2, T4 (alice) under the
    # older PB: mainline order puts T4 first, so T3 wins although T4 is later
    # by timestamp.
    events = [
        topic("T1", "alice"),
        power("PA1", "alice", {"alice": 100, "bob": 50}),
        topic("T2", "alice"),
        power("PA2", "alice", {"alice": 100, "bob": 50},
              events={"m.room.power_levels": 100}),
        power("PB", "bob", {"alice": 100, "bob": 50}),
        topic("T3", "bob"),
        topic("T4", "alice"),
    ]
    chains = [["START", "T1", "PA1", "T2", "PA2", "T3", "END"], ["PA1", "PB", "T4", "END"]]
    graph = topic_builder(events, chains)
    assert graph.events["T4"].timestamp_ms > graph.events["T3"].timestamp_ms
    assert_state_at_end(graph, ["T3", "PA2"])


# --- beyond Synapse's scenarios ------------------------------------------------------


def test_banned_writer_cannot_write_after_merge(topic_builder: BuildTopic) -> None:
    events = [
        power("PA", "alice", {"alice": 100, "bob": 50}),
        member("MA", "alice", "alice", "join"),
        member("MB", "alice", "bob", "ban"),
        power("PB", "bob", {"alice": 100, "bob": 50}),
    ]
    graph = topic_builder(events, [["START", "PA", "MA", "MB", "END"], ["PA", "PB", "END"]])
    after = graph.make(message("BOB1", "bob"), ["END"])
    assert graph.check(after, ["END"]) == "sender_not_joined"


def test_demoted_writer_cannot_write_after_merge(topic_builder: BuildTopic) -> None:
    # Alice raises events_default above bob's level in one branch while bob
    # keeps writing in the other: after the merge bob may no longer write.
    events = [
        power("PA", "alice", {"alice": 100, "charlie": 10, "zara": 10}, events_default=10),
        message("MB1", "bob"),
    ]
    graph = topic_builder(events, [["START", "PA", "END"], ["START", "MB1", "END"]])
    assert graph.rejected == {}
    assert graph.check(graph.make(message("BOB2", "bob"), ["END"]), ["END"]) == "insufficient_power"
    assert graph.check(graph.make(message("CH1", "charlie"), ["END"]), ["END"]) is None


def test_single_and_identical_states_resolve_to_themselves(base: Graph) -> None:
    state = base.state_after["START"]
    assert resolve([state], base.source) == state
    assert resolve([state, dict(state), state], base.source) == state
    assert resolve([], base.source) == {}


def test_split_separates_agreeing_keys_from_the_rest(base: Graph) -> None:
    at_imb, at_start = base.state_after["IMB"], base.state_after["START"]
    unconflicted, conflicted = split([at_imb, at_start])
    assert unconflicted == at_imb  # everything up to bob's join agrees
    assert conflicted == {base.id("IMC"), base.id("IMZ")}  # present in one state only


def test_auth_chain_difference_includes_the_forks_own_events(base: Graph) -> None:
    # Synapse's definition: a fork's events count in its own auth chain.
    at_ijr, at_imc = base.state_after["IJR"], base.state_after["IMC"]
    common = set(split([at_ijr, at_imc])[0].values())
    assert auth_chain_difference([at_ijr, at_imc], common, base.source) == {
        base.id("IMB"), base.id("IMC"),
    }


def test_auth_chain_walk_is_bounded(base: Graph) -> None:
    states = [base.state_after["IJR"], base.state_after["START"]]
    with pytest.raises(AuthChainTooLarge):
        auth_chain_difference(states, set(), base.source, limit=3)


def test_resolution_ignores_events_missing_from_the_source(topic_builder: BuildTopic) -> None:
    events = [topic("T1", "alice"), topic("T2", "alice")]
    graph = topic_builder(events, [["START", "T1", "END"], ["START", "T2", "END"]])
    source = dict(graph.source)
    del source[graph.id("T1")]
    resolved = resolve([graph.state_after["T1"], graph.state_after["T2"]], source)
    assert resolved[graph.key("T2")] == graph.id("T2")


def test_iterative_checks_start_from_the_unconflicted_state(topic_builder: BuildTopic) -> None:
    # Bob's two topics conflict; both forks agree that bob is banned. The
    # topics cite bob's join in their auth refs, but the unconflicted ban is
    # what the checks see (v2; v2.1 would start empty and let one through).
    events = [
        power("PA", "alice", {"alice": 100, "bob": 50}),
        topic("T1", "bob"), topic("T2", "bob"),
        member("MB", "alice", "bob", "ban"),
    ]
    graph = topic_builder(events, [["START", "PA", "T1"], ["PA", "T2"], ["PA", "MB"]])
    ban = {graph.key("MB"): graph.id("MB")}
    states = [{**graph.state_after["T1"], **ban}, {**graph.state_after["T2"], **ban}]
    resolved = resolve(states, graph.source)
    assert graph.key("T1") not in resolved
    assert resolved[graph.key("MB")] == graph.id("MB")
