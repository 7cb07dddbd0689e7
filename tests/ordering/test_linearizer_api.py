"""The small additions to the linearizer that `node.replica.ordering` relies on."""

from __future__ import annotations

from node.core.order import Linearizer
from tests.core.order.dag import feed, keys, names, node


def test_extend_takes_the_ids_of_the_relayed_nodes_of_a_mixed_batch() -> None:
    linearizer = Linearizer(keys("a"))
    update = linearizer.extend([node("r0"), node("x0"), node("s0")], relayed={b"r0", b"s0"})
    assert names(update.tentative) == ["x0"]
    assert linearizer.is_aside(b"r0") and linearizer.is_aside(b"s0")
    update = linearizer.add(node("a0", "x0", "r0"))
    assert names(update.confirmed_appended) == ["r0", "x0", "a0"]
    assert not linearizer.is_aside(b"r0") and linearizer.is_aside(b"s0")


def test_causal_queries() -> None:
    linearizer = Linearizer(keys("a", "b"))
    feed(linearizer, node("a0"), node("b0"), node("a1", "a0", "b0"), node("b1", "b0"))
    assert linearizer.sees(b"a1", b"b0") and not linearizer.sees(b"b1", b"a1")
    assert linearizer.latest_seen(b"a1", b"b") == 0
    assert linearizer.latest_seen(b"b1", b"a") == -1
    assert linearizer.latest_seen(b"b1", b"b") == 1


def test_last_confirmed_is_the_anchor_while_role_change_is_asked() -> None:
    asked: list[tuple[bytes, bytes | None, int]] = []

    def hook(n):
        asked.append((n.id, linearizer.last_confirmed, linearizer.confirmed_length))
        return None

    linearizer = Linearizer(keys("a"), role_change=hook)
    feed(linearizer, node("x0"), node("a0", "x0"))
    assert asked == [(b"x0", b"a0", 2), (b"a0", b"a0", 2)]


def test_forks_are_reported() -> None:
    linearizer = Linearizer(keys("a", "b"))
    linearizer.extend([node("a0"), node("a1", "a0"), node("a1'", "a0")])
    assert linearizer.forks == {b"a": 1}
