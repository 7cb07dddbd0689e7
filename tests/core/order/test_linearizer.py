"""The linearizer's contract: confirmed prefix, tentative tail, rewind, roles, relayed writers."""

import pytest

from node.core.order import Linearizer, OrderError, OrderNode

from .dag import feed, full, keys, names, node


def ack_rounds(linearizer: Linearizer, writers: str, rounds: int, heads: list[str]) -> list[str]:
    """Each round, every writer appends one node referencing all heads (concurrently)."""
    for r in range(rounds):
        made = [f"{w}{r}" for w in writers]
        for name in made:
            linearizer.add(node(name, *heads))
        heads = made
    return heads


def test_two_indexers_a0_is_confirmed_at_b0():
    linearizer = Linearizer(keys("a", "b"))
    first = linearizer.add(node("a0"))
    assert first.confirmed_appended == () and names(first.tentative) == ["a0"]
    update = linearizer.add(node("b0", "a0"))
    assert names(update.confirmed_appended) == ["a0"]
    assert names(update.tentative) == ["b0"] and update.rewind_to == 1


def test_non_indexer_nodes_wait_for_an_indexer_and_are_confirmed_with_it():
    linearizer = Linearizer(keys("a"))
    assert feed(linearizer, node("x0")).confirmed_appended == ()
    update = linearizer.add(node("x1", "x0"))
    assert update.confirmed_appended == () and names(update.tentative) == ["x0", "x1"]
    update = linearizer.add(node("a0", "x1"))
    assert names(update.confirmed_appended) == ["x0", "x1", "a0"]
    assert update.tentative == () and update.rewind_to == 2


def test_tentative_order_rewinds_to_the_shared_prefix():
    linearizer = Linearizer(keys("a"))  # a stays silent: nothing is confirmed
    assert linearizer.add(node("x0")).rewind_to == 0
    assert linearizer.add(node("y0")).rewind_to == 1  # [x0, y0]
    update = linearizer.add(node("w0"))  # w < x: goes first
    assert names(update.tentative) == ["w0", "x0", "y0"] and update.rewind_to == 0
    update = linearizer.add(node("x1", "x0", "w0"))
    assert names(update.tentative) == ["w0", "x0", "x1", "y0"] and update.rewind_to == 2


def test_concurrent_tails_seen_by_everyone_are_still_confirmed():
    # a0, b0, c0 concurrent; every later node sees all three. Their quorum
    # degrees rise together forever, so "two degrees ahead" never happens;
    # rounds and anchors still confirm them, in key order.
    linearizer = Linearizer(keys("a", "b", "c"))
    ack_rounds(linearizer, "abc", 4, [])
    assert names(linearizer.confirmed)[:3] == ["a0", "b0", "c0"]
    assert len(linearizer.confirmed) >= 6


def test_a_crashed_minority_of_indexers_does_not_stop_confirmation():
    linearizer = Linearizer(keys("a", "b", "c"))  # c never writes
    linearizer.add(node("x0"))
    ack_rounds(linearizer, "ab", 8, ["x0"])
    assert linearizer.is_confirmed(b"x0")
    assert {b"a0", b"b0", b"a3", b"b3"} <= set(linearizer.confirmed)


def test_a_role_change_takes_effect_right_after_the_batch_that_confirms_it():
    change = {b"a1": keys("a", "b")}
    linearizer = Linearizer(keys("a"), role_change=lambda n: change.get(n.id))
    feed(linearizer, node("a0"), node("a1", "a0"))
    assert linearizer.indexers == keys("a")  # a1 is not confirmed yet
    update = linearizer.add(node("a2", "a1"))
    assert names(update.confirmed_appended) == ["a1", "a2"]
    assert linearizer.indexers == keys("a", "b")
    # a alone no longer confirms anything: b has to reference it.
    assert linearizer.add(node("a3", "a2")).confirmed_appended == ()
    assert names(linearizer.add(node("b0", "a3")).confirmed_appended) == ["a3"]


def test_set_indexers_removing_a_silent_indexer_unblocks_at_once():
    linearizer = Linearizer(keys("a", "b"))  # b has gone silent
    feed(linearizer, node("x0"), node("a0", "x0"), node("a1", "a0"))
    assert linearizer.confirmed == ()
    update = linearizer.set_indexers(keys("a"))
    assert names(update.confirmed_appended) == ["x0", "a0"]
    assert names(update.tentative) == ["a1"] and update.rewind_to == 3  # same full order


def test_relayed_nodes_enter_the_order_only_when_referenced():
    linearizer = Linearizer(keys("a"))
    update = linearizer.add(node("r0"), relayed=True)
    assert update.tentative == () and update.rewind_to == 0 and b"r0" not in linearizer
    linearizer.add(node("r1", "r0"), relayed=True)  # a relayed chain
    linearizer.add(node("s0"), relayed=True)  # nobody will ever reference s0
    update = linearizer.add(node("x0", "r1"))
    assert names(update.tentative) == ["r0", "r1", "x0"] and update.rewind_to == 0
    update = linearizer.add(node("a0", "x0"))
    assert names(update.confirmed_appended) == ["r0", "r1", "x0", "a0"]
    feed(linearizer, node("a1", "a0"), node("a2", "a1"))
    assert b"s0" not in linearizer and b"s0" not in linearizer.confirmed + linearizer.tentative


def test_adding_a_node_twice_is_a_no_op_and_reusing_an_id_is_an_error():
    linearizer = Linearizer(keys("a", "b"))
    linearizer.add(node("a0"))
    again = linearizer.add(node("a0"))
    assert again.confirmed_appended == () and names(again.tentative) == ["a0"] and again.rewind_to == 1
    with pytest.raises(OrderError, match="reused"):
        linearizer.add(OrderNode(b"a0", b"a", 0, (b"x",)))
    with pytest.raises(OrderError, match="before its dependency"):
        linearizer.add(node("b0", "q9"))
    with pytest.raises(OrderError, match="without seq 1"):
        linearizer.add(node("a2", "a0"))
    assert full(linearizer) == ["a0"]  # failed adds left nothing behind


def test_shared_prefix_by_slices_matches_the_element_loop():
    import random

    from node.core.order.linearizer import common_prefix

    def loop(a, b):
        n = min(len(a), len(b))
        return next((i for i in range(n) if a[i] != b[i]), n)

    rng = random.Random(7)
    for _ in range(3_000):
        a = tuple(bytes([rng.randrange(3)]) for _ in range(rng.randrange(30)))
        b = a[:rng.randrange(len(a) + 1)] + tuple(bytes([rng.randrange(3)])
                                                  for _ in range(rng.randrange(10)))
        assert common_prefix(a, b) == loop(a, b) == common_prefix(b, a)
