"""The seven scenarios of Synapse's tests/state/test_v2.py, as our events: one definition.

Each builder hangs events off the base chain (conftest) and returns the built
graph and the expected winners at END. `test_resolution` checks them on the
resolution algorithm alone; `test_tracker` replays them through a Replica,
where a merge's parents must be an antichain: `topic_reset` and
`offtopic_pl` merge END with one of its own ancestors in Synapse, so the
Replica runs their `_meg` variants, where a message on that ancestor (MT1,
MPA: zara's, as END is) takes its place. A message changes no state, so END
resolves exactly the two states Synapse's END does and the winners are
Synapse's (timestamps after the sibling shift by one tick, all alike: their
relative order is Synapse's). `topic` needs no variant: Synapse also links
END to MZ1, an ancestor of T4 here, so END has one parent.
"""

from __future__ import annotations

from collections.abc import Callable

from tests.state.builder import Graph, join_rules, member, message, power, topic
from tests.state.conftest import BuildTopic

Scenario = Callable[[BuildTopic], tuple[Graph, list[str]]]


def ban_vs_pl(build: BuildTopic) -> tuple[Graph, list[str]]:
    """Alice bans bob in one branch; bob re-sends his power levels in the other.
    The ban is a power event by the more powerful sender: it wins."""
    events = [
        power("PA", "alice", {"alice": 100, "bob": 50}),
        member("MA", "alice", "alice", "join"),
        member("MB", "alice", "bob", "ban"),
        power("PB", "bob", {"alice": 100, "bob": 50}),
    ]
    chains = [["START", "PA", "MA", "MB", "END"], ["PA", "PB", "END"]]
    return build(events, chains), ["PA", "MA", "MB"]


def join_rule_evasion(build: BuildTopic) -> tuple[Graph, list[str]]:
    """Evelyn joins while alice concurrently makes the topic invite-only: the
    join rule is applied first and evelyn's join no longer passes."""
    events = [join_rules("JR", "alice", "invite"), member("ME", "evelyn", "evelyn", "join")]
    chains = [["START", "JR", "END"], ["START", "ME", "END"]]
    return build(events, chains), ["JR"]


_OFFTOPIC_PL = [
    power("PA", "alice", {"alice": 100, "bob": 50}),
    power("PB", "bob", {"alice": 100, "bob": 50, "charlie": 50}),
    power("PC", "charlie", {"alice": 100, "bob": 50, "charlie": 0}),
]


def offtopic_pl(build: BuildTopic) -> tuple[Graph, list[str]]:
    """A chain of power levels PA <- PB <- PC against PA alone: PC, the latest
    authorised change, wins."""
    chains = [["START", "PA", "PB", "PC", "END"], ["PA", "END"]]
    return build(list(_OFFTOPIC_PL), chains), ["PC"]


def offtopic_pl_meg(build: BuildTopic) -> tuple[Graph, list[str]]:
    chains = [["START", "PA", "PB", "PC", "END"], ["PA", "MPA", "END"]]
    return build([*_OFFTOPIC_PL, message("MPA", "zara")], chains), ["PC"]


_TOPIC_BASIC = [
    topic("T1", "alice"),
    power("PA1", "alice", {"alice": 100, "bob": 50}),
    topic("T2", "alice"),
    power("PA2", "alice", {"alice": 100, "bob": 0}),
    power("PB", "bob", {"alice": 100, "bob": 50}),
    topic("T3", "bob"),
]


def topic_basic(build: BuildTopic) -> tuple[Graph, list[str]]:
    """Alice demotes bob (PA2) while bob re-asserts his level (PB) and sets a
    topic (T3): PA2 wins, T3 loses its authority, T2 stays."""
    chains = [["START", "T1", "PA1", "T2", "PA2", "END"], ["PA1", "PB", "T3", "END"]]
    return build(list(_TOPIC_BASIC), chains), ["PA2", "T2"]


_TOPIC_RESET = [
    topic("T1", "alice"),
    power("PA", "alice", {"alice": 100, "bob": 50}),
    topic("T2", "bob"),
    member("MB", "alice", "bob", "ban"),
]


def topic_reset(build: BuildTopic) -> tuple[Graph, list[str]]:
    """Bob sets a topic, then alice bans him; merged with a branch that only
    knows T1, bob's topic no longer passes and the topic goes back to T1."""
    chains = [["START", "T1", "PA", "T2", "MB", "END"], ["T1", "END"]]
    return build(list(_TOPIC_RESET), chains), ["T1", "MB", "PA"]


def topic_reset_meg(build: BuildTopic) -> tuple[Graph, list[str]]:
    chains = [["START", "T1", "PA", "T2", "MB", "END"], ["T1", "MT1", "END"]]
    return build([*_TOPIC_RESET, message("MT1", "zara")], chains), ["T1", "MB", "PA"]


def topic_scenario(build: BuildTopic) -> tuple[Graph, list[str]]:
    """topic_basic, then zara's message MZ1 merges both branches and alice sets
    T4 on top of it."""
    events = [*_TOPIC_BASIC, message("MZ1", "zara"), topic("T4", "alice")]
    chains = [
        ["START", "T1", "PA1", "T2", "PA2", "MZ1", "T4", "END"],
        ["PA1", "PB", "T3", "MZ1"],
    ]
    return build(events, chains), ["T4", "PA2"]


def mainline_sort(build: BuildTopic) -> tuple[Graph, list[str]]:
    """T3 (bob) is sent under the newer power levels PA2, T4 (alice) under the
    older PB: mainline order puts T4 first, so T3 wins although T4 is later
    by timestamp."""
    events = [
        topic("T1", "alice"),
        power("PA1", "alice", {"alice": 100, "bob": 50}),
        topic("T2", "alice"),
        power("PA2", "alice", {"alice": 100, "bob": 50}, events={"m.room.power_levels": 100}),
        power("PB", "bob", {"alice": 100, "bob": 50}),
        topic("T3", "bob"),
        topic("T4", "alice"),
    ]
    chains = [["START", "T1", "PA1", "T2", "PA2", "T3", "END"], ["PA1", "PB", "T4", "END"]]
    return build(events, chains), ["T3", "PA2"]


# As Synapse writes them (resolution alone), and as a Replica can hold them.
SYNAPSE: dict[str, Scenario] = {
    "ban_vs_pl": ban_vs_pl, "join_rule_evasion": join_rule_evasion, "offtopic_pl": offtopic_pl,
    "topic_basic": topic_basic, "topic_reset": topic_reset, "topic": topic_scenario,
    "mainline_sort": mainline_sort,
}
MEG: dict[str, Scenario] = {**SYNAPSE, "offtopic_pl": offtopic_pl_meg,
                            "topic_reset": topic_reset_meg}
# The sibling message stands in for the ancestor: same state, so same resolution input.
SIBLINGS = {"topic_reset": ("MT1", "T1"), "offtopic_pl": ("MPA", "PA")}
