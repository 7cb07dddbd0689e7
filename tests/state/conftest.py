"""The base chain every state scenario starts from, as in Synapse's test_v2.py.

    CREATE(alice) <- IMA alice joins <- IPOWER power levels {alice: 100}
      <- IJR join rules public <- IMB bob joins <- IMC charlie joins
      <- IMZ zara joins <- START

Scenarios hang their events off START (and each other) and merge at END, a
message by zara. `build_topic(events, chains)` builds base + scenario.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from tests.state.builder import Graph, Node, build, create, join_rules, member, message, power

INITIAL_NODES: tuple[Node, ...] = (
    create("CREATE", "alice", d_max=8),
    member("IMA", "alice", "alice", "join"),
    power("IPOWER", "alice", {"alice": 100}),
    join_rules("IJR", "alice", "public"),
    member("IMB", "bob", "bob", "join"),
    member("IMC", "charlie", "charlie", "join"),
    member("IMZ", "zara", "zara", "join"),
    message("START", "zara"),
    message("END", "zara"),
)
INITIAL_CHAIN: tuple[str, ...] = ("CREATE", "IMA", "IPOWER", "IJR", "IMB", "IMC", "IMZ", "START")

BuildTopic = Callable[[Sequence[Node], Sequence[Sequence[str]]], Graph]


def build_topic(events: Sequence[Node], chains: Sequence[Sequence[str]], tick_ms: int = 1) -> Graph:
    return build([*INITIAL_NODES, *events], [INITIAL_CHAIN, *chains], tick_ms)


@pytest.fixture
def base() -> Graph:
    """The base chain alone (END is left out: nothing merges)."""
    return build(INITIAL_NODES[:-1], [INITIAL_CHAIN])


@pytest.fixture
def topic_builder() -> BuildTopic:
    return build_topic
