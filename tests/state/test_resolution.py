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
from node.state.types import AuthReason
from tests.state import scenarios
from tests.state.builder import Graph, member, message, power, topic, uid
from tests.state.conftest import BuildTopic


def assert_state_at_end(graph: Graph, expected: Sequence[str]) -> None:
    assert graph.rejected == {}, "a scenario event failed auth on its own branch"
    wanted = {graph.key(name): graph.id(name) for name in expected}
    start, end = graph.state_after["START"], graph.state_after["END"]
    changed = {k: v for k, v in end.items() if k in wanted or start.get(k) != v}
    names = {e.id: n for n, e in graph.events.items()}
    assert {k: names[v] for k, v in changed.items()} == {k: names[v] for k, v in wanted.items()}


@pytest.mark.parametrize("name", sorted(scenarios.SYNAPSE))
def test_synapse_scenario(name: str, topic_builder: BuildTopic) -> None:
    """Each scenario's docstring (tests/state/scenarios.py) says who wins and why."""
    graph, expected = scenarios.SYNAPSE[name](topic_builder)
    assert_state_at_end(graph, expected)
    if name == "join_rule_evasion":  # the join rule went first: evelyn is not joined
        assert ("m.room.member", uid("evelyn")) not in graph.state_after["END"]
    if name == "mainline_sort":  # T3 wins although T4 is later by timestamp
        assert graph.events["T4"].timestamp_ms > graph.events["T3"].timestamp_ms



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
    assert graph.check(after, ["END"]) == AuthReason.SENDER_NOT_JOINED


def test_demoted_writer_cannot_write_after_merge(topic_builder: BuildTopic) -> None:
    # Alice raises events_default above bob's level in one branch while bob
    # keeps writing in the other: after the merge bob may no longer write.
    events = [
        power("PA", "alice", {"alice": 100, "charlie": 10, "zara": 10}, events_default=10),
        message("MB1", "bob"),
    ]
    graph = topic_builder(events, [["START", "PA", "END"], ["START", "MB1", "END"]])
    assert graph.rejected == {}
    bob2 = graph.make(message("BOB2", "bob"), ["END"])
    assert graph.check(bob2, ["END"]) == AuthReason.INSUFFICIENT_POWER
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
