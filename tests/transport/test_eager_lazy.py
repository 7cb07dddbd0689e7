"""The tree fast path (transport.eager_lazy): its links, its messages, and seeded worlds.

Unit tests of `TopicTree` (the parent from the root's first copies, what is
told to whom, announcements batched and struck where the peer holds the id,
fetches and grafts after the timeout, one announcer after another), the wire form of IHave/Graft/Prune, and seeded
simulations: the tree converges with loss and a partition (the same checkers
as every world: SEC, order, convergence) and costs a fraction of random push.
"""

from __future__ import annotations

from dataclasses import replace

import msgpack
import pytest

from node.core.parents import DepletionPolicy
from transport.dissemination_config import DisseminationConfig
from transport.eager_lazy import (
    FRESH_LINK_MS,
    GRAFT_TIMEOUT_MS,
    IHAVE_FLUSH_MS,
    MAX_IHAVE_IDS,
    MAX_SOURCES,
    FORMER_PARENT_GRACE_MS,
    PARENT_SILENT_MS,
    PRUNE_AFTER_DUPLICATES,
    PRUNE_RETELL_MS,
    ROOT_ACTIVE_MS,
    ROOT_GAP_MS,
    ROOT_MIN_STREAK,
    ORDER_EVENT_EXTRA_LINKS,
    ROOT_SETTLE_MS,
    SOURCES_SLACK,
    TopicTree,
)
from node.core.event import event_id_of
from node.replica.ordering import KIND_ACK
from transport.messages import (TAG_PRUNE, WIRE_VERSION, Graft, IHave, MessageError, Prune, Push,
                                decode, encode)
from transport.sim import Cluster
from transport.sim.cli import build_parser, scenario_from_args
from transport.sim.fast_paths import compare
from transport.sim.latency_world import read_writes
from transport.sim.scenario import Scenario
from transport.sim.world import run_scenario

TOPIC = b"t" * 32
NEVER_MS = 10**9


def ids(*names: str) -> list[bytes]:
    return [name.encode().ljust(32, b".") for name in names]


def never_held(_: bytes) -> bool:
    return False


# ------------------------------------------------------------------ TopicTree


S = b"s" * 32  # a source (an author key)
T = b"t" * 32  # another, greater: S is the root while both are active
NOW = 1_000
# The unit tests below but the settling ones declare at once: a tree whose root
# just changed waits ROOT_SETTLE_MS first (`test_nothing_is_declared_until_the_root_settles`).


def placed(parent: str = "p", peers: tuple[str, ...] = ("p", "a", "b")) -> TopicTree:
    """A tree whose root S's first copy came by `parent`, its declarations made."""
    tree = TopicTree(settle_ms=0)
    tree.saw(S, NOW)
    tree.first_copy_from(parent, [S], NOW)
    tree.news_from(parent, NOW)
    tree.declarations(peers, NOW)
    return tree


def test_new_links_are_eager_until_the_peer_says_it_is_not_our_child():
    tree = TopicTree(settle_ms=0)
    tree.saw(S, NOW)
    assert tree.eager_of(["a", "b"]) == ["a", "b"] and tree.lazy_of(["a", "b"]) == []
    assert tree.child_left("a") is False  # it was never our child
    assert tree.eager_of(["a", "b"]) == ["b"] and tree.is_lazy("a")
    assert tree.child_joined("a") and tree.eager_of(["a"]) == ["a"]  # it named us its parent
    assert tree.is_child("a") and tree.child_left("a") and tree.is_lazy("a")


def test_the_root_first_copy_picks_the_parent_and_everyone_is_told_once():
    """Nothing is told before we have a place: every link stays eager at the other end,
    so the first root event reaches us by the fastest path."""
    tree = TopicTree(settle_ms=0)
    tree.saw(S, NOW)
    assert tree.declarations(["p", "a"], NOW) == []
    tree.first_copy_from("p", [T], NOW)  # not the root's: no parent
    assert tree.declarations(["p", "a"], NOW) == []
    tree.first_copy_from("p", [S], NOW)
    assert tree.is_parent("p")
    assert tree.declarations(["p", "a"], NOW) == [("p", True), ("a", False)]
    assert tree.declarations(["p", "a", "b"], NOW) == [("b", False)]  # a new link only
    tree.child_left("p")  # our parent is not our child: it stays eager here
    assert tree.eager_of(["p", "a", "b"]) == ["p", "a", "b"]  # a and b have not answered
    tree.child_left("a")
    tree.child_left("b")
    assert tree.eager_of(["p", "a", "b"]) == ["p"]


def test_a_steady_writer_is_the_root_rather_than_a_rare_one_with_a_lesser_key():
    """A rare writer as the root moved every parent each time it wrote or fell quiet."""
    tree = TopicTree(settle_ms=0)
    tree.saw(S, NOW)  # rare: one event
    step = ROOT_GAP_MS // 2
    for i in range(ROOT_MIN_STREAK - 1):
        tree.saw(T, NOW + i * step)
        assert tree.root(NOW + i * step) == S  # T not steady yet: the least active key
    steady_at = NOW + (ROOT_MIN_STREAK - 1) * step
    tree.saw(T, steady_at)
    assert tree.root(steady_at) == T
    paused = steady_at + ROOT_GAP_MS + 1
    tree.saw(T, paused)  # T paused and starts again: still the root (a burst writer)
    assert tree.root(paused) == T
    quiet = paused + ROOT_ACTIVE_MS + 1
    tree.saw(S, quiet)
    assert tree.root(quiet) == S  # T fell quiet: the least active key again


def test_the_root_is_us_then_we_have_no_parent_and_are_never_broken():
    tree = TopicTree(me=S, settle_ms=0)
    tree.saw(S, NOW)
    assert not tree.broken(NOW)
    tree.first_copy_from("p", [S], NOW)  # (our own events do not come back; if they did)
    assert not tree.is_parent("p")
    assert tree.declarations(["p", "a"], NOW) == [("p", False), ("a", False)]


def test_a_node_that_becomes_the_root_tells_its_old_parent_only_after_the_grace():
    """The root of its own view for a moment (its streak turned steady first): its old
    parent keeps it as a child meanwhile, so if the root moves on and it takes that
    parent again, nothing was cut and nothing needs telling."""
    tree = TopicTree(me=T, settle_ms=0)
    tree.saw(S, NOW)
    tree.first_copy_from("p", [S], NOW)
    tree.news_from("p", NOW)
    assert tree.declarations(["p", "a"], NOW) == [("p", True), ("a", False)]
    quiet = NOW + ROOT_ACTIVE_MS + 1  # S is no longer active: T, ourselves, is the root
    tree.saw(T, quiet)
    assert tree.root(quiet) == T
    assert tree.declarations(["p", "a"], quiet) == []  # p not told yet: still its child
    assert tree.eager_of(["p"]) == ["p"]  # and we keep pushing to it
    assert tree.declarations(["p", "a"], quiet + FORMER_PARENT_GRACE_MS) == [("p", False)]


def test_the_tree_is_broken_above_us_only_without_a_parent_that_brings_news():
    """Then an overdue id is grafted (its announcer our parent from then on); otherwise
    it is late and fetched by a want (transport.dissemination `_tree_tick`)."""
    tree = TopicTree(settle_ms=0)
    tree.saw(S, NOW)
    assert tree.broken(NOW)  # no parent yet
    tree.first_copy_from("p", [S], NOW)
    tree.news_from("p", NOW)
    assert not tree.broken(NOW + PARENT_SILENT_MS)
    assert tree.broken(NOW + PARENT_SILENT_MS + 1)  # silent
    tree.news_from("p", NOW + PARENT_SILENT_MS + 1)
    assert not tree.broken(NOW + PARENT_SILENT_MS + 1)
    tree.news_from("q", NOW + 2 * PARENT_SILENT_MS)  # news by another link does not count
    assert tree.broken(NOW + 2 * PARENT_SILENT_MS + 2)
    tree.news_from("p", NOW + 2 * PARENT_SILENT_MS + 2)
    tree.forget_peer("p")  # the parent's link closed
    assert tree.broken(NOW + 2 * PARENT_SILENT_MS + 2)


def test_with_a_steady_root_only_its_copies_by_the_parent_say_the_tree_is_whole():
    """Two nodes each the other's parent (cut off with a third) still hear each other's
    news: under a steady root that is not enough, or they fetch every event for good."""
    tree = TopicTree(settle_ms=0)
    at = NOW
    for _ in range(ROOT_MIN_STREAK):
        tree.saw(S, at)
        at += ROOT_GAP_MS // 2
    tree.first_copy_from("p", [S], at)
    assert not tree.broken(at + PARENT_SILENT_MS)
    for step in range(1, 5):  # the root still writes (its events come another way)
        tree.saw(S, at + step * PARENT_SILENT_MS // 4)
    tree.news_from("p", at + PARENT_SILENT_MS)  # news by the parent, of another source
    assert tree.broken(at + PARENT_SILENT_MS + 1)
    tree.first_copy_from("p", [S], at + PARENT_SILENT_MS + 1)
    assert not tree.broken(at + PARENT_SILENT_MS + 1)


def test_a_parent_that_named_us_its_parent_is_a_cycle_cut_off_from_the_root():
    """Two nodes each the other's parent, fed the root's events by exchanges: each pushes
    them to the other as its child, so neither parent falls silent. The cycle itself says
    the tree is broken above us (seeded world, fixed writers: two nodes cut off for
    seconds, p99 0.66-1.46 s), unless that parent is the root itself (a node that became
    the root keeps its old parent's graft for FORMER_PARENT_GRACE_MS)."""
    tree = TopicTree(settle_ms=0)
    at = NOW
    for _ in range(ROOT_MIN_STREAK):  # a steady root: only its copies count as news
        tree.saw(S, at)
        at += ROOT_GAP_MS // 2
    tree.first_copy_from("p", [S], at)
    assert not tree.broken(at)
    tree.child_joined("p")  # p named us its parent
    tree.first_copy_from("p", [S], at + 1)  # the root's copies still come by it
    assert tree.broken(at + 1)
    tree.first_copy_from("q", [S], at + 2)  # so the next first root copy moves us
    assert tree.is_parent("q") and not tree.broken(at + 2)
    root_itself = TopicTree(settle_ms=0)
    root_itself.saw(S, NOW)
    root_itself.news_from("s", NOW)  # (as the engine: news by s, then whose first copy)
    root_itself.first_copy_from("s", [S], NOW, authored=True)  # s is the root
    root_itself.child_joined("s")  # its graft from before it became the root
    assert root_itself.is_parent("s") and not root_itself.broken(NOW)


def test_a_child_becomes_our_parent_only_once_our_parent_fell_silent():
    """A child that fetched a root event whose copy from our parent was lost must not
    become our parent (each the other's, cut off from the root); a root that moved below
    us must, once our parent has been silent about it."""
    tree = placed()
    tree.child_joined("a")
    tree.first_copy_from("a", [S], NOW + 10)
    assert tree.is_parent("p")
    late = NOW + PARENT_SILENT_MS + 1
    tree.first_copy_from("a", [S], late)
    assert tree.is_parent("a")
    assert tree.declarations(["p", "a", "b"], late) == [("p", False), ("a", True)]


def test_a_node_whose_root_changes_to_a_source_heard_already_takes_its_first_link():
    """The root is the least active key: a node that wrote once, before it was anyone's
    root, brings no first copy of a root event afterwards. Its first copy's link, noted
    when it came, is the parent at once (before, 18 of 20 nodes of a lossless world
    took none: no declarations, every link eager, 3.2 duplicates per node and event)."""
    tree = TopicTree(settle_ms=0)
    tree.saw(b"z" * 32, NOW)
    tree.first_copies("b", [b"z" * 32])  # z's event first by b: z is the root, no parent yet
    tree.first_copies("a", [S])  # S's event first by a, before S was the root
    tree.saw(S, NOW + 1)  # S (a lesser key) is active now: the root
    assert tree.root(NOW + 1) == S and not tree.is_parent("a")
    assert tree.declarations(["a", "b"], NOW + 2) == [("a", True), ("b", False)]
    assert tree.is_parent("a")


def test_a_first_link_through_a_child_is_not_taken():
    tree = TopicTree(settle_ms=0)
    tree.child_joined("a")
    tree.first_copies("a", [S])
    tree.saw(S, NOW)
    assert tree.declarations(["a", "b"], NOW) == [] and not tree.is_parent("a")


def test_a_graft_for_repair_adopts_the_announcer_as_parent():
    tree = placed()
    tree.adopt_parent("b", NOW + 5)
    assert tree.is_parent("b") and not tree.broken(NOW + 5)
    assert tree.declarations(["p", "a", "b"], NOW + 5) == [("p", False)]  # b: the graft


def test_once_broken_a_root_copy_by_any_link_makes_a_parent_and_the_old_one_keeps_ours_a_while():
    """After a partition heals, a peer across it still pushing on a link lazy here brings
    the root back; the parent we leave gets our pushes for FORMER_PARENT_GRACE_MS, so it
    can take us as its parent rather than be cut off."""
    tree = placed()
    tree.child_left("p")
    tree.child_left("b")
    assert tree.is_lazy("b")
    late = NOW + PARENT_SILENT_MS + 1  # the parent fell silent: broken
    assert tree.broken(late)
    tree.news_from("b", late)  # (as the engine: news by b, then whose first copy)
    tree.first_copy_from("b", [S], late)
    assert tree.is_parent("b") and not tree.broken(late)
    assert tree.eager_of(["p", "a", "b"]) == ["p", "a", "b"]  # p for a while, a undeclared
    assert tree.declarations(["p", "a", "b"], late) == [("p", False), ("b", True)]
    tree.declarations(["p", "a", "b"], late + FORMER_PARENT_GRACE_MS)
    assert tree.is_lazy("p")


def test_an_overdue_id_is_asked_of_the_parent_first_while_the_tree_is_whole():
    """If the parent lacks it too (lost above it), it passes it down once it has it,
    instead of every node below the loss fetching it."""
    tree = placed()
    tree.announced("a", ids("x"), NOW, never_held)
    at = NOW + GRAFT_TIMEOUT_MS
    assert tree.due(at, never_held) == {"p": ids("x")}
    assert tree.due(at + GRAFT_TIMEOUT_MS, never_held) == {"a": ids("x")}


def test_news_over_a_lazy_link_changes_nothing_once_we_have_a_parent():
    tree = placed()
    tree.child_left("a")
    tree.first_copy_from("a", [S], NOW + 1)  # a push our prune crossed
    assert tree.is_lazy("a") and tree.is_parent("p")
    orphan = TopicTree(settle_ms=0)
    orphan.saw(S, NOW)
    orphan.child_left("a")
    orphan.first_copy_from("a", [S], NOW)  # no parent: the root's copy by any link
    assert orphan.is_parent("a")


def test_a_declared_parent_is_not_left_for_a_faster_copy_by_an_undeclared_link():
    """Before we told our parent, a root copy first by another eager link moves us (the
    tree forming: the fastest path). Once told, it does not: a peer that has not said
    yet may have named us its parent already (its graft on the way), and the two were
    each other's parent, cut off from the root (seeded world, latency 20-120 ms: three
    nodes fetched every event a graft timeout late for seconds)."""
    tree = TopicTree(settle_ms=0)
    tree.saw(S, NOW)
    tree.first_copy_from("p", [S], NOW)
    tree.news_from("a", NOW + 1)  # (as the engine: news by a, then whose first copy)
    tree.first_copy_from("a", [S], NOW + 1)  # nothing told yet: the faster link wins
    assert tree.is_parent("a")
    assert tree.declarations(["p", "a", "b"], NOW + 1) == [("p", False), ("a", True),
                                                            ("b", False)]
    tree.first_copy_from("b", [S], NOW + 2)  # b has not said yet: eager, not a child
    assert tree.is_parent("a") and tree.eager_of(["b"]) == ["b"]


def test_when_the_root_moves_the_parent_turns_to_the_link_its_copies_came_by():
    """Even a child's link, or a lazy one: the old tree's parents point at the old root,
    and the new root's events may still reach us through it, so our parent would never
    fall silent; the node that became the root would be nobody's parent (seeded world:
    its p99 1.1 s for two seconds)."""
    tree = placed()  # root S by p; a and b not our children
    tree.child_joined("a")  # a named us its parent
    tree.child_left("b")
    r = b"r" * 32  # a lesser key: the root once active
    tree.first_copies("a", [r])  # r's event came first by a
    tree.saw(r, NOW + 1)
    assert tree.root(NOW + 1) == r and tree.is_parent("p")
    assert tree.declarations(["p", "a", "b"], NOW + 2) == [("p", False), ("a", True)]
    assert tree.is_parent("a") and not tree.is_child("a") and not tree.broken(NOW + 2)
    tree.first_copies("b", [r])  # later copies by another link move nothing more
    assert tree.declarations(["p", "a", "b"], NOW + 3) == [] and tree.is_parent("a")


def test_the_sources_kept_are_those_that_may_be_the_root():
    """A join storm of more members than MAX_SOURCES: the least key heard first (least
    recent) is still the root once the table is cut, and so is a steady writer."""
    tree = TopicTree(settle_ms=0)
    count = MAX_SOURCES + SOURCES_SLACK + 1
    for i in range(count):  # the least key first: the least recently active
        tree.saw(i.to_bytes(32, "big"), NOW + i)
    assert len(tree._seen) == MAX_SOURCES
    assert tree.root(NOW + count) == bytes(32)
    steady = b"\xff" * 32  # the greatest key, but it writes steadily
    for k in range(ROOT_MIN_STREAK):
        tree.saw(steady, NOW + count + k)
    for i in range(count, 2 * count):  # a second storm: the steady writer is not forgotten
        tree.saw(i.to_bytes(32, "big"), NOW + 2 * count)
    assert tree.root(NOW + 2 * count) == steady
    assert len(tree._seen) <= MAX_SOURCES + SOURCES_SLACK


def test_nothing_is_declared_until_the_root_settles():
    """Every node is a source of its own join: in a join storm each is the root of its own
    view at first. Declared at once, every link was pruned before the joins had spread."""
    tree = TopicTree(me=T)
    tree.saw(T, NOW)  # our own join: we are the root
    assert tree.declarations(["p", "a"], NOW) == []
    tree.saw(S, NOW + 100)  # a lesser key's join, by p: the root changes
    tree.first_copy_from("p", [S], NOW + 100)
    assert tree.is_parent("p") and not tree.settled(NOW + 100 + ROOT_SETTLE_MS - 1)
    assert tree.declarations(["p", "a"], NOW + 100 + ROOT_SETTLE_MS - 1) == []
    assert tree.eager_of(["p", "a"]) == ["p", "a"]
    assert tree.declarations(["p", "a"], NOW + 100 + ROOT_SETTLE_MS) == [("p", True),
                                                                         ("a", False)]


def test_peers_that_declined_us_before_we_placed_ourselves_may_still_be_our_parent():
    """A Prune says "I am not your child", nothing about being our parent. A node whose
    root settled after its neighbours' had been told Prune by all of them, and took
    none as its parent: it never declared, so they all kept pushing to it, and it
    took every event from each (no-loss world, seed 3, announcements flushed every
    200 ms: 1.17 duplicates per node and event, 7 of 20 nodes without a parent)."""
    tree = TopicTree(settle_ms=0)
    tree.saw(S, NOW)
    for peer in ("p", "a"):
        tree.child_left(peer)  # both declared first: we are not their parent
    tree.first_copies("p", [S])
    tree.first_copy_from("p", [S], NOW)
    assert tree.is_parent("p")
    assert tree.declarations(["p", "a"], NOW) == [("p", True), ("a", False)]
    # Placed by the first link too (`_place`), when the first copy's hint came alone.
    late = TopicTree(settle_ms=0)
    late.saw(S, NOW)
    late.child_left("p")
    late.first_copies("p", [S])
    assert late.declarations(["p"], NOW) == [("p", True)] and late.is_parent("p")


def test_a_peer_still_pushing_over_a_lazy_link_is_told_again():
    """Our Prune was lost: after as many useless pushes, and once PRUNE_RETELL_MS passed
    since we told it (pushes sent before it arrived are expected), it is sent another.
    Duplicates over an eager link change nothing (the links follow the parents)."""
    tree = placed()
    tree.child_left("a")
    assert not tree.duplicate_from("p", NOW)
    for _ in range(PRUNE_AFTER_DUPLICATES + 5):
        assert not tree.duplicate_from("a", NOW + 10)  # pushes our prune crossed
    later = NOW + PRUNE_RETELL_MS
    assert tree.duplicate_from("a", later)  # the peer keeps pushing: told again
    assert tree.declarations(["p", "a", "b"], later) == [("a", False)]
    for _ in range(PRUNE_AFTER_DUPLICATES + 5):
        assert not tree.duplicate_from("a", later + 10)  # once per PRUNE_RETELL_MS


def test_ids_an_exchange_brought_are_remembered_as_races():
    tree = TopicTree(settle_ms=0)
    tree.synced(ids("x", "y"))
    assert tree.synced_lately(ids("x")) and not tree.synced_lately(ids("x", "z"))


def test_announcements_wait_for_the_flush_unless_a_batch_is_full():
    tree = TopicTree(settle_ms=0)
    assert tree.announce(["a", "b"], ids("x", "y")) == []
    assert tree.flush(NOW) == [("a", ids("x", "y")), ("b", ids("x", "y"))]
    assert tree.flush(NOW) == []
    many = [i.to_bytes(32, "big") for i in range(MAX_IHAVE_IDS + 3)]
    full = tree.announce(["a"], many)
    assert full == [("a", many[:MAX_IHAVE_IDS]), ("a", many[MAX_IHAVE_IDS:])]
    assert tree.flush(NOW) == []
    # The next flush waits IHAVE_FLUSH_MS: the ticks between gather more ids per IHave.
    tree.announce(["a"], ids("z"))
    assert tree.flush(NOW + IHAVE_FLUSH_MS - 1) == []
    assert tree.flush(NOW + IHAVE_FLUSH_MS) == [("a", ids("z"))]


def test_an_id_the_peer_announced_is_not_announced_back_to_it():
    tree = TopicTree(settle_ms=0)
    tree.announce(["a", "b"], ids("x", "y"))
    tree.announced("a", ids("x"), 0, held=lambda _: True)
    assert tree.flush(NOW) == [("a", ids("y")), ("b", ids("x", "y"))]


def test_an_announced_id_not_received_is_grafted_from_each_announcer_in_turn():
    tree = TopicTree(settle_ms=0)
    tree.announced("a", ids("x"), 0, never_held)
    tree.announced("b", ids("x"), 10, never_held)
    assert tree.due(GRAFT_TIMEOUT_MS - 1, never_held) == {}
    assert tree.due(GRAFT_TIMEOUT_MS, never_held) == {"a": ids("x")}
    assert tree.due(GRAFT_TIMEOUT_MS + 1, never_held) == {}  # a's push gets a timeout too
    assert tree.due(2 * GRAFT_TIMEOUT_MS, never_held) == {"b": ids("x")}
    assert tree.due(3 * GRAFT_TIMEOUT_MS, never_held) == {}  # all asked: anti-entropy's now
    assert tree.awaited_count == 0


def test_ids_received_or_held_are_not_grafted():
    tree = TopicTree(settle_ms=0)
    tree.announced("a", ids("x", "y", "z"), 0, held=lambda i: i == ids("z")[0])
    tree.received(ids("x"))
    assert tree.awaited_count == 1
    assert tree.due(GRAFT_TIMEOUT_MS, held=lambda i: i == ids("y")[0]) == {}
    assert tree.awaited_count == 0


def test_a_closed_link_forgets_its_state_and_reopens_eager():
    tree = placed(parent="a")
    tree.child_left("a")
    tree.announce(["a"], ids("x"))
    tree.announced("a", ids("y"), 0, never_held)
    tree.forget_peer("a")
    assert tree.eager_of(["a"]) == ["a"] and not tree.is_parent("a")
    assert tree.flush(NOW) == []
    assert tree.due(GRAFT_TIMEOUT_MS, never_held) == {}


# ------------------------------------------------------------------ wire


@pytest.mark.parametrize("message", [IHave(TOPIC, tuple(ids("x", "y"))), Graft(TOPIC, ()),
                                     Graft(TOPIC, tuple(ids("x"))), Prune(TOPIC, S)])
def test_tree_messages_round_trip(message):
    assert decode(encode(message)) == message


def test_a_malformed_ihave_is_a_message_error():
    bad = encode(IHave(TOPIC, tuple(ids("x")))).replace(ids("x")[0], b"short".ljust(32, b"."))
    assert decode(bad) == IHave(TOPIC, (b"short".ljust(32, b"."),))
    with pytest.raises(MessageError):
        decode(encode(IHave(TOPIC, ()))[:-1] + b"\x91\xc4\x01x")  # a 1-byte id


def test_a_prune_names_a_32_byte_source():
    with pytest.raises(ValueError):
        encode(Prune(TOPIC, b"short"))
    with pytest.raises(MessageError):
        decode(msgpack.packb([WIRE_VERSION, TAG_PRUNE, TOPIC, b"short"], use_bin_type=True))


def test_the_config_rejects_a_zero_timeout_and_a_negative_lazy_fanout():
    with pytest.raises(ValueError):
        DisseminationConfig(graft_timeout_ms=0)
    with pytest.raises(ValueError):
        DisseminationConfig(lazy_fanout=-1)
    with pytest.raises(ValueError, match="announce_every_ms"):
        DisseminationConfig(announce_every_ms=GRAFT_TIMEOUT_MS)


# ------------------------------------------------------------------ seeded worlds

# The fast path with only the want backstop under it: a node relays only events it has
# applied (issue 16), so a child that outran its parent waits for the parent, and with
# no repair at all a node that missed one event would stop relaying its descendants.
PUSH_ONLY = DisseminationConfig(log=False, sync_interval_ms=NEVER_MS, sync_jitter_ms=0,
                                sync_on_connect=False, sync_on_news=False, depletion=False)


def push_only_run(tree: bool, seed: int = 3, n: int = 20,
                  announce_every_ms: int = PUSH_ONLY.announce_every_ms) -> dict[str, float]:
    """Fast path alone, no loss: after a warm-up, what the second half of the writes cost."""
    config = replace(PUSH_ONLY, tree=tree, announce_every_ms=announce_every_ms)
    cluster = Cluster(seed, n, neighbours=6, config=config, depletion=False)
    cluster.write(rounds=20, writers=2, round_ms=200)
    cluster.run_until(cluster.fault_phase_end() + 2_000)
    before, events_before = dict(cluster.totals()), len(cluster.created)
    cluster.write(rounds=20, writers=2, round_ms=200)
    cluster.run_until(cluster.fault_phase_end() + 2_000)
    totals = cluster.totals()
    per = (len(cluster.created) - events_before) * n
    return {key: (totals.get(key, 0) - before.get(key, 0)) / per
            for key in ("bytes_sent_push", "duplicates", "received_gossip", "grafts_sent")}


def test_the_tree_delivers_everything_by_itself_at_a_fraction_of_the_copies():
    push, tree = push_only_run(tree=False), push_only_run(tree=True)
    everyone = 19 / 20  # all but the author
    # No loss: most copies by the fast path (the rest by a want, when a child outran its
    # parent: measured 0.85 for the tree, 0.945 for push).
    assert tree["received_gossip"] >= 0.8 * everyone
    assert push["received_gossip"] >= 0.9 * everyone
    # (Measured 0.47 against 2.18: 20 writers each writing twice a phase, so each
    # author's own tree below its first hop has few events to form on; 0.24 before
    # nodes relayed only applied events.)
    assert tree["duplicates"] <= 0.5 < 1.5 <= push["duplicates"], (push, tree)
    assert tree["bytes_sent_push"] <= 0.5 * push["bytes_sent_push"], (push, tree)
    assert tree["grafts_sent"] <= 0.05, tree  # the tree holds still once formed


def test_a_node_all_its_neighbours_declined_first_still_finds_its_parent():
    """Regression, seed 3 with announcements every 200 ms: 7 of 20 nodes heard a Prune
    from every neighbour before their root settled, took no parent, never declared,
    and were pushed every event by each neighbour (1.17 duplicates per node and event;
    `test_peers_that_declined_us_before_we_placed_ourselves_may_still_be_our_parent`)."""
    tree = push_only_run(tree=True, seed=3, announce_every_ms=200)
    assert tree["duplicates"] <= 0.05 and tree["grafts_sent"] == 0, tree


TREE_WORLD = Scenario(seed=0, nodes=20, loss=0.1, rounds=10, writers=3, round_ms=200,
                      partition_at_ms=800, heal_at_ms=2_000, tree=True)


@pytest.mark.parametrize("seed", [1])  # more: python -m transport.sim --fast-path tree --sweep N
def test_the_tree_converges_with_loss_and_a_partition(seed):
    """The authorized world (state, acks, order): every checker, as for push."""
    summary = run_scenario(replace(TREE_WORLD, seed=seed))
    assert summary.converged


def test_a_join_storm_spreads_on_the_tree_before_it_forms():
    """60 members join at once. Each is a source, the root of its own view at first: it
    declared at once, every link was pruned before the joins had spread, and they then
    crossed by announcements and timeouts (measured at seed 0: every member held every
    join at 2,517 ms, 14 dummies, the width from there 11.8 over the bound of 10).
    Declarations wait for the root to settle (ROOT_SETTLE_MS): 898 ms, no dummy, 5.5.
    Until a node has declared its place, its exchanges hold back no young event (nothing
    carries them yet: the joins go on a few undeclared links each, as by push): 727 ms
    before, 427 since (at 100 nodes 2.3 s and 4.1 s before, seeds 0 and 2; 0.6 s since)."""
    summary = run_scenario(replace(TREE_WORLD, nodes=60, partition_at_ms=1_000,
                                   heal_at_ms=4_000, writers=5))
    assert summary.converged
    assert summary.joins_held_ms is not None and summary.joins_held_ms < 600
    assert summary.dummies <= 3, summary.dummies
    assert summary.tick_mean_width_after_joins is not None
    assert summary.tick_mean_width_after_joins <= DepletionPolicy().threshold


def test_before_a_node_declares_its_place_its_exchanges_hold_nothing_back():
    """Until a node has told any peer its place in the tree (`TopicTree.formed`), no tree
    carries what it applied, so its exchanges send everything. Holding back what came
    since its last tick, as before, 41,153 events were held back by 200 ms in the
    200-node join storm, and every join was everywhere at 994 ms (seed 1, links that
    keep order); 508 ms since."""
    cluster = Cluster.from_scenario(replace(TREE_WORLD, nodes=40, partition_at_ms=None,
                                            heal_at_ms=None))
    cluster.run_until(400)  # the join storm: no root has settled (ROOT_SETTLE_MS)
    unformed = [n for n in cluster.members if not n.engine._trees[cluster.topic].formed]
    assert len(unformed) == len(cluster.members)
    assert sum(n.engine.stats["sessions"] for n in unformed) > 0  # exchanges ran
    assert sum(n.engine.stats["sync_held_back"] for n in unformed) == 0


def test_before_the_tree_forms_what_an_exchange_brought_goes_no_further_than_push():
    """Regression: while no root had settled, every event an exchange brought went on
    `forward_fanout` undeclared links besides the tree's own, a second flood of the
    join storm that push never sends (push forwards only what came by push). In this
    40-member storm (seed 0, the first 600 ms) the tree pushed 1.29x push's bytes;
    those events now go on the tree's links alone while it forms: 0.90x."""
    def storm_push_bytes(tree: bool) -> int:
        cluster = Cluster.from_scenario(replace(TREE_WORLD, nodes=40, partition_at_ms=None,
                                                heal_at_ms=None, tree=tree))
        cluster.run_until(600)  # the joins' storm: no root has settled yet
        assert tree == (cluster.totals().get("tree_forwarded_sync", 0) > 0)
        return cluster.totals()["bytes_sent_push"]

    assert storm_push_bytes(tree=True) <= 1.05 * storm_push_bytes(tree=False)


def test_a_fleet_half_on_the_tree_and_half_on_push_converges():
    """A fleet upgraded node by node runs both paths at once (the tree became a node's
    default, docs/deploy.md): push nodes ignore announcements and answer grafts, tree
    nodes take push copies; anti-entropy carries the rest. Every checker, loss and a
    partition included."""
    cluster = Cluster.from_scenario(replace(TREE_WORLD, nodes=30, seed=2))
    for node in cluster.members[1::2]:  # every other member back on push
        node.engine.config = replace(node.engine.config, tree=False)
        node.engine._trees.clear()
    end, converged_at = cluster.run_scenario_phases()
    cluster.check(converged_at is not None)  # raises, naming the replay, unless right
    totals = cluster.totals()
    assert totals["grafts_sent"] > 0 and totals["messages_sent_ihave"] > 0  # both paths ran


def test_an_exchange_over_a_link_just_opened_holds_nothing_back():
    """Young events are held back from exchanges because the tree carries them, but
    not over a link opened within FRESH_LINK_MS: the peer may be across a partition
    that this connection heals. (The demo's heal, node 3 dialling node 0: node 0's
    reply held back its side's last second of events, which reached the other side
    1.0 s later, at the next exchange; 0.03 s since. Push: 0.0 s.)"""
    cluster = Cluster.from_scenario(replace(TREE_WORLD, loss=0.0, partition_at_ms=None,
                                            heal_at_ms=None))
    cluster.run_until(3_000)  # formed
    cluster.write(rounds=2, writers=3, round_ms=100)
    cluster.run_until(cluster.now_ms + 300)  # the writes are young everywhere
    now = cluster.now_ms
    node = next(n for n in cluster.members if n.engine._trees[cluster.topic].formed)
    graph = node.replica.graph
    ids = [e.id for _, e in graph.deliveries(0, graph.delivered_count)]
    peer = node.engine._peers[0]
    assert len(node.engine._held_back(graph, ids, now, peer)) < len(ids)  # young held
    node.engine.on_peer_down(peer, now)
    node.engine.on_peer_up(peer, now)  # the link opens again
    assert node.engine._held_back(graph, ids, now, peer) == ids
    assert node.engine._held_back(graph, ids, now + FRESH_LINK_MS - 1, peer) == ids


def test_an_author_sends_its_acks_off_the_tree_too():
    """Acks gate the convergence after a heal (one confirmed order everywhere): their
    authors also push them on ORDER_EVENT_EXTRA_LINKS random links off the tree; the
    writes go on the tree alone (once it formed: after the root settled). Measured:
    5.9 links per ack against 1.9 per write."""
    cluster = Cluster.from_scenario(replace(TREE_WORLD, loss=0.0, partition_at_ms=None,
                                            heal_at_ms=None))
    pushed: dict[tuple[int, bytes], set[int]] = {}  # (author node, event id) -> to whom
    transmit = cluster.network.transmit

    def recording(src: int, dst: int, data: bytes) -> None:
        message = decode(data)
        if isinstance(message, Push):
            for raw in message.events:
                pushed.setdefault((src, event_id_of(raw)), set()).add(dst)
        transmit(src, dst, data)

    cluster.network.transmit = recording  # type: ignore[method-assign]
    cluster.run_until(cluster.fault_phase_end() + 2_000)
    fanout: dict[str, list[int]] = {KIND_ACK: [], "message": []}
    graph = cluster.members[0].replica.graph
    keys = {node.identity.public_key: node.index for node in cluster.nodes}
    for (sender, event_id), to in pushed.items():
        event = graph.get(event_id)
        if (event is not None and keys[event.author] == sender and event.kind in fanout
                and event.timestamp_ms >= ROOT_SETTLE_MS + 1_000):  # its author's pushes
            fanout[event.kind].append(len(to))
    acks, writes = fanout[KIND_ACK], fanout["message"]
    assert acks and writes
    assert sum(acks) / len(acks) >= sum(writes) / len(writes) + ORDER_EVENT_EXTRA_LINKS - 1, \
        (acks, writes)


def test_the_tree_converges_on_the_pure_graph_with_duplication_and_reordering():
    summary = run_scenario(replace(TREE_WORLD, seed=4, authorization=False, duplicate=0.1,
                                   reorder=0.2, groups=3))
    assert summary.converged


def test_fast_path_flag_replays_the_tree_world():
    ns = build_parser().parse_args(TREE_WORLD.argv())
    assert scenario_from_args(ns) == TREE_WORLD
    assert "--fast-path tree" in TREE_WORLD.replay_command()
    push = scenario_from_args(build_parser().parse_args(["--seed", "1", "--fast-path", "none"]))
    assert not push.push and not push.tree


def test_the_comparison_reports_both_paths_and_the_tree_sends_fewer_copies():
    result = compare(replace(TREE_WORLD, seed=3, nodes=15, partition_at_ms=None, heal_at_ms=None,
                             authorization=False))
    push, tree = result["push"], result["tree"]
    assert push["announce_sent_x_event"] == 0 < tree["announce_sent_x_event"]
    assert tree["push_sent_x_event"] < push["push_sent_x_event"]
    assert tree["duplicates_per_node_event"] < push["duplicates_per_node_event"]
    assert tree["convergence_ms"] is not None and push["convergence_ms"] is not None


@pytest.mark.parametrize("sync_interval_ms", [NEVER_MS, 2_000])
def test_on_fifo_links_one_tree_keeps_causal_order_and_sends_one_copy(sync_interval_ms):
    """Links that keep order (as a libp2p stream does; equal latencies here): once formed,
    no event overtakes a parent (none held back), so nothing is wanted or grafted and each
    node receives one copy. With exchanges on, they hold back young events (no race), yet
    a root that moves lets a few of theirs come first.
    The old tree per source held back about a third of the copies in this world."""
    config = replace(PUSH_ONLY, tree=True, sync_interval_ms=sync_interval_ms,
                     sync_jitter_ms=0 if sync_interval_ms == NEVER_MS else 500)
    cluster = Cluster(1, 10, neighbours=4, config=config, depletion=False, latency_ms=(20, 20))
    for _ in range(3):  # the first phases form the tree
        before, events_before = dict(cluster.totals()), len(cluster.created)
        cluster.write(rounds=40, writers=5, round_ms=25)
        cluster.run_until(cluster.fault_phase_end() + 2_000)
    totals = cluster.totals()
    per = (len(cluster.created) - events_before) * 10

    def rate(key: str) -> float:
        return (totals.get(key, 0) - before.get(key, 0)) / per

    measured = {key: rate(key) for key in ("tree_held_back", "wants_sent", "grafts_sent",
                                           "tree_fetches_sent", "received_gossip", "duplicates")}
    if sync_interval_ms == NEVER_MS:
        assert measured["tree_held_back"] == 0 and measured["wants_sent"] == 0, measured
        assert measured["received_gossip"] == 0.9, measured  # every copy by the tree
        assert measured["grafts_sent"] == 0 and measured["tree_fetches_sent"] == 0, measured
        assert measured["duplicates"] <= 0.05, measured
    else:
        # Here the root moves in this phase (a writer with a lesser key turned steady),
        # and while the parents turn towards it, exchanges bring a few events first
        # (measured: 0.82 by the tree, 0.02 fetches, 0.13 duplicates, 0.007 held back).
        assert measured["tree_held_back"] <= 0.02 and measured["wants_sent"] <= 0.01, measured
        assert measured["received_gossip"] >= 0.75, measured
        assert measured["grafts_sent"] <= 0.01 and measured["tree_fetches_sent"] <= 0.05, measured
        assert measured["duplicates"] <= 0.2, measured


def fixed_writers_world(tmp_path, seed: int, fifo_links: bool = True) -> tuple[list[int], int]:
    """A 10-node tree world whose writers are fixed, as an application's are (the
    cluster bench's 5 publishers): the five greatest keys for 2 s, then three of them
    and the two least keys for 2 s more (the root moves); 200 events/s in all, links
    of 20-120 ms that keep order, as a stream does (with `fifo_links=False` each
    message draws its own latency and overtakes others on its link). Returns the
    writes' delivery latencies (created -> delivered at each other node, ms), and how
    many of those deliveries an exchange made once the tree had formed (after 1 s)."""
    cluster = Cluster(seed, 10, neighbours=4, latency_ms=(20, 120), log_dir=tmp_path,
                      config=DisseminationConfig(tree=True), authorization=True,
                      fifo_links=fifo_links)
    by_key = sorted(cluster.nodes, key=lambda node: node.identity.public_key)
    for step in range(160):
        now = cluster.now_ms + 25
        cluster.run_until(now)
        writers = by_key[5:] if step < 80 else by_key[5:8] + by_key[:2]
        for node in writers:
            event, _ = node.replica.publish(b"reading", now, cluster.rng)
            cluster._apply(node, node.engine.on_publish(cluster.topic, event, now))
    cluster.run_until(cluster.now_ms + 3_000)
    cluster.close_logs()
    created, delivered = read_writes(tmp_path)
    writes = [(at - created[event][1], channel) for node, event, at, channel in delivered
              if event in created and created[event][0] != node]
    assert len(writes) == len(created) * 9  # every write everywhere
    by_exchange = sum(1 for node, event, at, channel in delivered
                      if channel != "gossip" and at >= 1_000)
    return sorted(latency for latency, _ in writes), by_exchange


@pytest.mark.parametrize("seed", [1, 2, 3, 8, 20])
def test_fixed_writers_and_a_moving_root_keep_the_tree_s_latency_tail_short(tmp_path, seed):
    """Three faults of the tree under fixed writers, each a tail of about a second (the
    cluster bench's tree p99 was over 1 s in some runs):
    * a node left its declared parent for a faster copy by a peer whose graft to it was
      on the way: each the other's parent, cut off from the root (seed 1);
    * a push that released events a child had pushed (buffered here, waiting for their
      past) did not pass them on to the pusher, our parent: they went up the tree by
      exchanges (`released_by`; seed 1);
    * when the root moved, parents stayed pointed at the old root until silent, which
      they never were: the new root was nobody's parent (seeds 2 and 3).
    Measured (p99 ms / deliveries by exchange after 1 s): seed 1 1,181 / many before,
    445 / 166 with the first fix, 360 / 4 with the second, 367 / 14 with all three;
    seed 2 990 / 238 before the third, 378 / 33 with it; seed 3 1,046 / 492, then
    493 / 21. Push in the same worlds: 223, 267, 210. Seed 8: a node the root of its
    own view for a moment pruned its parent, and its graft waited for the next root
    to settle: 952 / 205, then 491 / 15 once a new root keeps its old parent's link
    through FORMER_PARENT_GRACE_MS. Seed 20: two nodes each the other's parent, fed by
    exchanges, 656 / 89, then 414 / 2 once such a cycle counts as broken. (All of
    these on links that reordered; on links that keep order, as the daemons' streams
    do, seeds 1, 2, 3, 8: 402 / 0, 374 / 0, 415 / 20, 412 / 8: docs/anti-entropy.md,
    "FIFO links".)"""
    latencies, by_exchange = fixed_writers_world(tmp_path, seed=seed)
    p99 = latencies[len(latencies) * 99 // 100]
    late = sum(1 for latency in latencies if latency > GRAFT_TIMEOUT_MS + 300)
    assert p99 <= 600 and late / len(latencies) <= 0.005, (p99, late, len(latencies))
    assert by_exchange <= 50, by_exchange
