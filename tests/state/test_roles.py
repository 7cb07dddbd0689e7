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


def test_indexers_read_only_listed_users_as_every_member_would() -> None:
    # The shortcut (only users listed at or above indexer_level are candidates) against
    # the definition (every member's role), on the states of seeded random topics.
    import random

    from node.state.types import TYPE_MEMBER, is_user_id
    from node.state.view import StateView
    from tests.state.test_resolution_properties import build_forks, random_plan

    rng = random.Random(11)
    for _ in range(40):
        graph = build_forks(random_plan(rng), tick_ms=0)
        for state in graph.state_after.values():
            users = {k for (kind, k) in state if kind == TYPE_MEMBER and is_user_id(k)}
            creator = StateView(state, graph.source).creator()
            users |= {creator} if creator is not None else set()
            expected = frozenset(bytes.fromhex(u) for u in users
                                 if role_of(bytes.fromhex(u), state, graph.source) is Role.INDEXER)
            assert indexers(state, graph.source) == expected
