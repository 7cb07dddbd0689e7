"""The authorization rules, one allowed and one refused case per rule.

Every test starts from the base chain (alice 100 and creator; bob, charlie,
zara joined at 0; join rules public), adds the state it needs on top of START,
and asks whether one more event would be accepted there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from node.core.event import KIND_CREATE, KIND_DUMMY, pack_payload
from node.core.identity import sign_event
from node.state import (
    EventFields, auth_types_for_event, check_auth, indexers, select_auth_refs,
)
from node.state.types import CREATE_KEY, JOIN_RULES_KEY, POWER_LEVELS_KEY, AuthReason, member_key
from tests.state.builder import (
    CAST, Graph, Node, build, create, join_rules, member, message, on_top, power, topic, uid,
)

HEAD = ["START"]


def verdict(graph: Graph, node: Node, parents: Sequence[str] = HEAD) -> str | None:
    return graph.check(graph.make(node, parents), parents)


def state_event(name: str, sender: str, kind: str, key: str, **content: Any) -> Node:
    return Node(name, sender, kind, key, content)


# --- rule 1: the create event ----------------------------------------------------


def test_base_chain_is_accepted_including_the_creators_first_join(base: Graph) -> None:
    assert base.rejected == {}


def test_create_with_parents_is_refused(base: Graph) -> None:
    assert verdict(base, create("C2", "alice")) == AuthReason.CREATE_HAS_PARENTS


def test_create_needs_empty_state_key() -> None:
    graph = build([Node("C", "alice", KIND_CREATE, "x", {})], [["C"]])
    assert graph.rejected == {"C": AuthReason.BAD_CREATE}


# --- rule 2: the event's own auth refs ------------------------------------------------


def _signed(graph: Graph, auth: list[bytes], kind: str = "message",
            state_key: str | None = None, sender: str = "bob") -> Any:
    return sign_event(CAST[sender], topic=graph.topic_id, seq=99, parents=[graph.id("START")],
                      timestamp_ms=999, kind=kind, payload=pack_payload({}),
                      state_key=state_key, auth=auth)


def test_auth_refs_as_selected_pass(base: Graph) -> None:
    assert verdict(base, message("M", "bob")) is None


@pytest.mark.parametrize(
    "refs, reason",
    [
        (lambda g: [g.id("CREATE"), b"\x01" * 32], AuthReason.AUTH_REF_MISSING),
        (lambda g: [g.id("CREATE"), g.id("START")], AuthReason.AUTH_REF_NOT_STATE),
        (lambda g: [g.id("CREATE"), g.id("IJR")], AuthReason.UNEXPECTED_AUTH_REF),
        (lambda g: [g.id("IPOWER"), g.id("IMB")], AuthReason.NO_CREATE_REF),
    ],
)
def test_bad_auth_refs_are_refused(base: Graph, refs: Any, reason: str) -> None:
    assert base.check(_signed(base, refs(base)), HEAD) == reason


def test_two_refs_for_one_state_key_are_refused(base: Graph) -> None:
    on_top(base, power("PA", "alice", {"alice": 100, "bob": 50}))
    event = _signed(base, [base.id("CREATE"), base.id("IPOWER"), base.id("PA")])
    assert base.check(event, HEAD) == AuthReason.DUPLICATE_AUTH_TYPE


def test_auth_refs_from_another_topic_are_refused(base: Graph) -> None:
    other = build([create("CREATE", "bob"), member("J", "bob", "bob", "join")], [["CREATE", "J"]])
    base.source.update(other.source)
    event = _signed(base, [base.id("CREATE"), other.id("J")])
    assert base.check(event, HEAD) == AuthReason.AUTH_REF_OTHER_TOPIC


def test_auth_state_must_hold_this_topics_create(base: Graph) -> None:
    event = base.make(message("M", "bob"), HEAD)
    assert check_auth(event, {}, base.source) == AuthReason.NO_CREATE
    other = build([create("CREATE", "bob")], [["CREATE"]])
    base.source.update(other.source)
    assert check_auth(event, other.state_after["CREATE"], base.source) == AuthReason.WRONG_TOPIC


def test_auth_selection_names_create_power_sender_target_and_join_rules(base: Graph) -> None:
    join = base.make(member("ME", "evelyn", "evelyn", "join"), HEAD)
    assert auth_types_for_event(join) == {
        CREATE_KEY, POWER_LEVELS_KEY, member_key(CAST["evelyn"].public_key), JOIN_RULES_KEY,
    }
    kick = base.make(member("K", "alice", "bob", "leave"), HEAD)
    assert JOIN_RULES_KEY not in auth_types_for_event(kick)
    assert member_key(CAST["bob"].public_key) in auth_types_for_event(kick)
    fields = EventFields("message", CAST["bob"].public_key)
    assert select_auth_refs(fields, base.state_after["START"]) == sorted(
        [base.id("CREATE"), base.id("IPOWER"), base.id("IMB")]
    )


# --- rule 4: membership -------------------------------------------------------------------


def test_public_join_allowed(base: Graph) -> None:
    assert verdict(base, member("ME", "evelyn", "evelyn", "join")) is None


def test_only_the_creator_joins_straight_after_create(base: Graph) -> None:
    # Right after CREATE there are no join rules (= invite): bob is not invited.
    assert verdict(base, member("MB", "bob", "bob", "join"), ["CREATE"]) == AuthReason.NOT_INVITED


def test_join_for_somebody_else_refused(base: Graph) -> None:
    assert verdict(base, member("ME", "alice", "evelyn", "join")) == AuthReason.JOIN_FOR_OTHER


def test_banned_user_cannot_join(base: Graph) -> None:
    head = on_top(base, member("BAN", "alice", "evelyn", "ban"))
    assert verdict(base, member("ME", "evelyn", "evelyn", "join"), head) == AuthReason.BANNED


@pytest.mark.parametrize("rule", ["invite", "knock", "restricted", "knock_restricted"])
def test_invite_only_rules_admit_the_invited_only(base: Graph, rule: str) -> None:
    head = on_top(base, join_rules("JR", "alice", rule))
    assert verdict(base, member("ME", "evelyn", "evelyn", "join"), head) == AuthReason.NOT_INVITED
    head = on_top(
        base, join_rules("JR2", "alice", rule), member("INV", "alice", "evelyn", "invite")
    )
    assert verdict(base, member("ME", "evelyn", "evelyn", "join"), head) is None


def test_private_join_rule_refuses_joins(base: Graph) -> None:
    head = on_top(base, join_rules("JR", "alice", "private"))
    assert verdict(base, member("ME", "evelyn", "evelyn", "join"), head) == AuthReason.JOIN_RULE_FORBIDS


def test_invite_rules(base: Graph) -> None:
    assert verdict(base, member("I", "bob", "evelyn", "invite")) is None  # invite level 0
    assert verdict(base, member("I", "evelyn", "evelyn", "invite")) == AuthReason.SENDER_NOT_JOINED
    assert verdict(base, member("I", "alice", "bob", "invite")) == AuthReason.TARGET_JOINED_OR_BANNED
    head = on_top(base, power("PA", "alice", {"alice": 100}, invite=50))
    assert verdict(base, member("I", "bob", "evelyn", "invite"), head) == AuthReason.INSUFFICIENT_POWER


def test_leaving_yourself(base: Graph) -> None:
    assert verdict(base, member("L", "bob", "bob", "leave")) is None
    assert verdict(base, member("L", "evelyn", "evelyn", "leave")) == AuthReason.NOT_A_MEMBER


def test_kicks(base: Graph) -> None:
    assert verdict(base, member("K", "alice", "bob", "leave")) is None
    assert verdict(base, member("K", "bob", "charlie", "leave")) == AuthReason.INSUFFICIENT_POWER
    assert verdict(base, member("K", "evelyn", "bob", "leave")) == AuthReason.SENDER_NOT_JOINED
    head = on_top(base, power("PA", "alice", {"alice": 100, "bob": 50}))
    # bob reaches the kick level but not above alice's level
    assert verdict(base, member("K", "bob", "alice", "leave"), head) == AuthReason.INSUFFICIENT_POWER
    assert verdict(base, member("K", "bob", "charlie", "leave"), head) is None


def test_unban_needs_the_ban_level(base: Graph) -> None:
    head = on_top(
        base,
        power("PA", "alice", {"alice": 100, "bob": 60}, ban=75),
        member("BAN", "alice", "evelyn", "ban"),
    )
    assert verdict(base, member("U", "bob", "evelyn", "leave"), head) == AuthReason.INSUFFICIENT_POWER
    assert verdict(base, member("U", "alice", "evelyn", "leave"), head) is None


def test_bans(base: Graph) -> None:
    assert verdict(base, member("B", "alice", "bob", "ban")) is None
    assert verdict(base, member("B", "bob", "charlie", "ban")) == AuthReason.INSUFFICIENT_POWER
    assert verdict(base, member("B", "evelyn", "bob", "ban")) == AuthReason.SENDER_NOT_JOINED
    head = on_top(base, power("PA", "alice", {"alice": 100, "bob": 50}))
    assert verdict(base, member("B", "bob", "alice", "ban"), head) == AuthReason.INSUFFICIENT_POWER


def test_knocks(base: Graph) -> None:
    assert verdict(base, member("KN", "evelyn", "evelyn", "knock")) == AuthReason.JOIN_RULE_FORBIDS
    head = on_top(base, join_rules("JR", "alice", "knock"))
    assert verdict(base, member("KN", "evelyn", "evelyn", "knock"), head) is None
    assert verdict(base, member("KN", "alice", "evelyn", "knock"), head) == AuthReason.KNOCK_FOR_OTHER
    assert verdict(base, member("KN", "bob", "bob", "knock"), head) == AuthReason.ALREADY_MEMBER


@pytest.mark.parametrize(
    "node, reason",
    [
        (state_event("M", "alice", "m.room.member", "not-a-user", membership="join"),
         AuthReason.BAD_STATE_KEY),
        (state_event("M", "alice", "m.room.member", uid("alice")), AuthReason.NO_MEMBERSHIP),
        (state_event("M", "alice", "m.room.member", uid("alice"), membership="dance"),
         AuthReason.UNKNOWN_MEMBERSHIP),
        (member("M", "alice", "evelyn", "invite", third_party_invite={"signed": {}}),
         AuthReason.THIRD_PARTY_INVITE_UNSUPPORTED),
    ],
)
def test_malformed_member_events_refused(base: Graph, node: Node, reason: str) -> None:
    assert verdict(base, node) == reason


# --- rules 5-8: everything else -----------------------------------------------------------


def test_sender_must_be_joined(base: Graph) -> None:
    assert verdict(base, message("M", "zara")) is None
    assert verdict(base, message("M", "evelyn")) == AuthReason.SENDER_NOT_JOINED
    head = on_top(base, member("L", "zara", "zara", "leave"))
    assert verdict(base, message("M", "zara"), head) == AuthReason.SENDER_NOT_JOINED


def test_third_party_invite_events_refused(base: Graph) -> None:
    node = state_event("T", "alice", "m.room.third_party_invite", "token")
    assert verdict(base, node) == AuthReason.THIRD_PARTY_INVITE_UNSUPPORTED


def test_state_needs_state_default(base: Graph) -> None:
    assert verdict(base, topic("T", "alice")) is None
    assert verdict(base, topic("T", "bob")) == AuthReason.INSUFFICIENT_POWER  # state_default 50


def test_messages_need_their_level_and_dummies_need_none(base: Graph) -> None:
    head = on_top(base, power("PA", "alice", {"alice": 100}, events={"message": 20}))
    assert verdict(base, message("M", "bob"), head) == AuthReason.INSUFFICIENT_POWER
    assert verdict(base, message("M", "alice"), head) is None
    assert verdict(base, Node("D", "bob", KIND_DUMMY), head) is None
    assert verdict(base, Node("D", "evelyn", KIND_DUMMY), head) == AuthReason.SENDER_NOT_JOINED


def test_at_state_keys_belong_to_their_user(base: Graph) -> None:
    head = on_top(base, power("PA", "alice", {"alice": 100}, state_default=0))
    mine = state_event("S", "bob", "app.profile", "@" + uid("bob"), nick="b")
    theirs = state_event("S", "bob", "app.profile", "@" + uid("alice"), nick="a")
    assert verdict(base, mine, head) is None
    assert verdict(base, theirs, head) == AuthReason.STATE_KEY_OWNED_BY_OTHER


# --- rule 9: power levels -----------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        {"users_default": "5"},
        {"ban": True},
        {"indexer_level": 1.5},
        {"events": {"m.room.name": "50"}},
        {"events": ["m.room.name"]},
        {"users": {"@alice:example.org": 100}},
        {"users": {uid("alice"): "100"}},
    ],
)
def test_malformed_power_levels_refused(base: Graph, content: dict[str, Any]) -> None:
    node = Node("P", "alice", "m.room.power_levels", "", {"users": {uid("alice"): 100}, **content})
    assert verdict(base, node) == AuthReason.BAD_POWER_LEVELS


def test_first_power_levels_are_free(base: Graph) -> None:
    head = ["IMA"]  # alice joined, no power levels yet
    node = power("P", "alice", {"alice": 100, "bob": 100}, ban=0, indexer_level=1)
    assert verdict(base, node, head) is None


BOB_AT_50 = {"alice": 100, "bob": 50, "charlie": 50}


@pytest.mark.parametrize(
    "before, after, reason",
    [
        # thresholds: old and new values must both be within the sender's level
        ({}, {"kick": 40}, None),
        ({}, {"ban": 60}, AuthReason.INSUFFICIENT_POWER),
        ({"ban": 75}, {"ban": 40}, AuthReason.INSUFFICIENT_POWER),
        ({"indexer_level": 100}, {"indexer_level": 50}, AuthReason.INSUFFICIENT_POWER),
        # An absent value is its default, not "nothing to compare" (Matrix's
        # reading): indexer_level absent = 100, so adding 50 or 0 mints indexers.
        ({}, {"indexer_level": 50}, AuthReason.INSUFFICIENT_POWER),
        ({}, {"indexer_level": 0}, AuthReason.INSUFFICIENT_POWER),
        ({}, {"indexer_level": 100}, AuthReason.INSUFFICIENT_POWER),  # as Matrix: 100 > 50
        ({"indexer_level": 50}, {}, AuthReason.INSUFFICIENT_POWER),  # removing = back to 100 > 50
        ({"events_default": 60}, {}, AuthReason.INSUFFICIENT_POWER),  # removing = back to 0
        ({"users_default": 60}, {}, AuthReason.INSUFFICIENT_POWER),
        ({}, {"ban": 50}, None),
        # per-type levels
        ({}, {"events": {"m.room.name": 40}}, None),
        ({}, {"events": {"m.room.name": 60}}, AuthReason.INSUFFICIENT_POWER),
        ({"events": {"m.room.name": 80}}, {"events": {"m.room.name": 40}}, AuthReason.INSUFFICIENT_POWER),
        # An absent entry is events_default / state_default: writers minted
        # through events["message"] under an events_default bob does not reach.
        ({"events_default": 60}, {"events_default": 60, "events": {"message": 0}},
         AuthReason.INSUFFICIENT_POWER),
        ({"events_default": 60, "events": {"message": 0}}, {"events_default": 60},
         AuthReason.INSUFFICIENT_POWER),
        ({"state_default": 50, "events": {"m.room.power_levels": 50}},
         {"state_default": 50, "events": {"m.room.power_levels": 50, "m.room.name": 50}},
         None),
    ],
)
def test_power_level_thresholds(
    base: Graph, before: dict[str, Any], after: dict[str, Any], reason: str | None
) -> None:
    head = on_top(base, power("PA", "alice", BOB_AT_50, **before))
    assert verdict(base, power("PB", "bob", BOB_AT_50, **after), head) == reason


@pytest.mark.parametrize(
    "users, reason",
    [
        ({"alice": 100, "bob": 50, "charlie": 50, "zara": 50}, None),    # up to own level
        ({"alice": 100, "bob": 50, "charlie": 50, "zara": 60}, AuthReason.INSUFFICIENT_POWER),
        ({"alice": 100, "bob": 50, "charlie": 0}, AuthReason.INSUFFICIENT_POWER),  # demoting a peer
        ({"alice": 100, "bob": 10, "charlie": 50}, None),                # demoting oneself
        ({"bob": 50, "charlie": 50}, AuthReason.INSUFFICIENT_POWER),              # removing alice
    ],
)
def test_power_level_user_changes(base: Graph, users: dict[str, int], reason: str | None) -> None:
    head = on_top(base, power("PA", "alice", BOB_AT_50))
    assert verdict(base, power("PB", "bob", users), head) == reason


@pytest.mark.parametrize(
    "users, reason",
    [
        # zara has no entry: she is at users_default 60, above bob
        ({"alice": 100, "bob": 50, "charlie": 10, "zara": 0}, AuthReason.INSUFFICIENT_POWER),
        ({"alice": 100, "bob": 50}, AuthReason.INSUFFICIENT_POWER),  # charlie 10 -> 60, above bob
        ({"alice": 100, "charlie": 10}, AuthReason.INSUFFICIENT_POWER),  # bob 50 -> 60: self-promotion
        ({"alice": 100, "bob": 50, "charlie": 40}, None),
    ],
)
def test_absent_user_entries_are_read_as_users_default(
    base: Graph, users: dict[str, int], reason: str | None
) -> None:
    head = on_top(base, power("PA", "alice", {"alice": 100, "bob": 50, "charlie": 10},
                              users_default=60, events={"m.room.power_levels": 50}))
    assert verdict(base, power("PB", "bob", users, users_default=60,
                               events={"m.room.power_levels": 50}), head) == reason


def test_a_moderator_cannot_mint_indexers_through_a_replica(base: Graph) -> None:
    """The audit's case end to end: bob (50) adds indexer_level 50 where it was absent."""
    head = on_top(base, power("PA", "alice", BOB_AT_50))
    assert CAST["bob"].public_key not in indexers(base.state_after[head[0]], base.source)
    node = power("PB", "bob", BOB_AT_50, indexer_level=50)
    base.add(node, head)
    assert base.rejected == {"PB": AuthReason.INSUFFICIENT_POWER}
    assert indexers(base.state_after["PB"], base.source) == {CAST["alice"].public_key}


# --- control events must carry a map -------------------------------------------------


GARBAGE_PAYLOADS = [b"", b"\xc1", pack_payload([1, 2, 3]), pack_payload("x"), pack_payload(None)]


@pytest.mark.parametrize("payload", GARBAGE_PAYLOADS)
@pytest.mark.parametrize(
    "kind, state_key",
    [
        ("m.room.power_levels", ""),
        ("m.room.join_rules", ""),
        ("m.room.member", uid("alice")),
        ("m.room.power_levels", None),  # not even a state event: still refused
    ],
)
def test_control_events_without_map_content_are_refused(
    base: Graph, kind: str, state_key: str | None, payload: bytes
) -> None:
    # alice (100, the creator) could make any of these: only the content is wrong.
    # Read as {}, a power levels event would reset every level to its default.
    fields = EventFields(kind, CAST["alice"].public_key, state_key)
    event = sign_event(CAST["alice"], topic=base.topic_id, seq=99, parents=[base.id("START")],
                       timestamp_ms=999, kind=kind, payload=payload, state_key=state_key,
                       auth=select_auth_refs(fields, base.state_after["START"]))
    assert base.check(event, HEAD) == AuthReason.BAD_CONTENT


@pytest.mark.parametrize("payload", GARBAGE_PAYLOADS)
def test_create_without_map_content_is_refused(payload: bytes) -> None:
    event = sign_event(CAST["alice"], topic=b"", seq=0, parents=[], timestamp_ms=1,
                       kind=KIND_CREATE, payload=payload, state_key="", auth=[])
    assert check_auth(event, {}, {}) == AuthReason.BAD_CONTENT


def test_other_kinds_may_carry_any_payload(base: Graph) -> None:
    head = on_top(base, power("PA", "alice", {"alice": 100}, state_default=0))
    for kind, key in (("message", None), ("app.blob", "k")):
        fields = EventFields(kind, CAST["bob"].public_key, key)
        event = sign_event(CAST["bob"], topic=base.topic_id, seq=99, parents=[base.id(head[0])],
                           timestamp_ms=999, kind=kind, payload=b"\x00\x01raw", state_key=key,
                           auth=select_auth_refs(fields, base.state_after[head[0]]))
        assert base.check(event, head) is None, kind
