"""Writer roles read from topic state: indexer, writer, relayed writer, none."""

from __future__ import annotations

from node.state import Role, indexers, role_of
from tests.state.builder import CAST, Graph, member, on_top, power


def roles_at(graph: Graph, head: str) -> dict[str, Role]:
    state = graph.state_after[head]
    return {name: role_of(key.public_key, state, graph.source) for name, key in CAST.items()}


def test_the_creator_is_the_first_indexer(base: Graph) -> None:
    state = base.state_after["CREATE"]
    assert indexers(state, base.source) == {CAST["alice"].public_key}
    assert roles_at(base, "CREATE")["bob"] is Role.NONE


def test_joined_members_write_and_the_powerful_index(base: Graph) -> None:
    assert roles_at(base, "START") == {
        "alice": Role.INDEXER, "bob": Role.WRITER, "charlie": Role.WRITER,
        "zara": Role.WRITER, "evelyn": Role.NONE,
    }
    assert indexers(base.state_after["START"], base.source) == {CAST["alice"].public_key}


def test_indexer_level_comes_from_power_levels(base: Graph) -> None:
    [head] = on_top(base, power("PA", "alice", {"alice": 100, "bob": 50}, indexer_level=50))
    assert roles_at(base, head)["bob"] is Role.INDEXER
    assert indexers(base.state_after[head], base.source) == {
        CAST["alice"].public_key, CAST["bob"].public_key,
    }


def test_writers_need_the_message_level(base: Graph) -> None:
    [head] = on_top(base, power("PA", "alice", {"alice": 100, "bob": 10}, events_default=10))
    roles = roles_at(base, head)
    assert (roles["bob"], roles["zara"]) == (Role.WRITER, Role.NONE)


def test_relayed_members_are_relayed_writers_never_indexers(base: Graph) -> None:
    [head] = on_top(
        base,
        power("PA", "alice", {"alice": 100, "charlie": 100}),
        member("MC", "charlie", "charlie", "join", relayed=True),
    )
    assert roles_at(base, head)["charlie"] is Role.RELAYED
    assert CAST["charlie"].public_key not in indexers(base.state_after[head], base.source)


def test_banned_and_departed_members_hold_no_role(base: Graph) -> None:
    [head] = on_top(
        base, member("B", "alice", "bob", "ban"), member("L", "alice", "alice", "leave")
    )
    roles = roles_at(base, head)
    assert (roles["bob"], roles["alice"]) == (Role.NONE, Role.NONE)
    assert indexers(base.state_after[head], base.source) == frozenset()
