"""Rule 4 of the Matrix (room version 11) auth rules: membership changes.

`m.room.member` events move a user (the *target*, named by the state key)
between leave, invite, join, knock and ban. Who may make which move:

    join    only yourself; never when banned; join rule public, or you were
            invited (rules invite/knock/restricted), or you are the creator
            joining right after the create event
    invite  a joined sender with >= invite level; not a joined or banned target
    leave   yourself if invited/joined/knocking; else a kick: a joined sender
            with >= kick level and above the target (unbanning also needs
            >= ban level)
    ban     a joined sender with >= ban level and above the target
    knock   only yourself, only under a knock rule, not if invited/joined/banned

Left out, and refused instead (megnode has no servers and no other rooms):
third-party invites (`content.third_party_invite`), and joins authorised via
another room (restricted rooms admit only invited users here).
"""

from __future__ import annotations

from node.core.event import Event
from node.state.types import (
    BAN,
    INVITE,
    JOIN,
    KNOCK,
    LEAVE,
    RULE_INVITE,
    RULE_KNOCK,
    RULE_KNOCK_RESTRICTED,
    RULE_PUBLIC,
    RULE_RESTRICTED,
    content_of,
    is_user_id,
    user_id,
)
from node.state.view import StateView


def check_member(event: Event, view: StateView) -> str | None:
    """None if the membership change in `event` is allowed by the state in `view`."""
    target = event.state_key
    if not is_user_id(target):
        return "bad_state_key"
    assert target is not None  # is_user_id said so; narrows the type
    content = content_of(event)
    membership = content.get("membership")
    if not isinstance(membership, str):
        return "no_membership"
    if "third_party_invite" in content:
        return "third_party_invite_unsupported"
    if membership == JOIN:
        return _join(event, target, view)
    if membership == INVITE:
        return _invite(event, target, view)
    if membership == LEAVE:
        return _leave(event, target, view)
    if membership == BAN:
        return _ban(event, target, view)
    if membership == KNOCK:
        return _knock(event, target, view)
    return "unknown_membership"


def _join(event: Event, target: str, view: StateView) -> str | None:
    sender = user_id(event.author)
    create = view.create()
    # 4.3.1: the creator's own join straight after the create event.
    if create is not None and event.parents == (create.id,) and target == sender == view.creator():
        return None
    if sender != target:
        return "join_for_other"
    current = view.membership(target)
    if current == BAN:
        return "banned"
    rule = view.join_rule()
    if rule in (RULE_INVITE, RULE_KNOCK, RULE_RESTRICTED, RULE_KNOCK_RESTRICTED):
        return None if current in (INVITE, JOIN) else "not_invited"
    if rule == RULE_PUBLIC:
        return None
    return "join_rule_forbids"


def _invite(event: Event, target: str, view: StateView) -> str | None:
    sender = user_id(event.author)
    if view.membership(sender) != JOIN:
        return "sender_not_joined"
    if view.membership(target) in (JOIN, BAN):
        return "target_joined_or_banned"
    power = view.power_levels()
    return None if power.user_level(sender) >= power.invite else "insufficient_power"


def _leave(event: Event, target: str, view: StateView) -> str | None:
    sender = user_id(event.author)
    if sender == target:
        return None if view.membership(target) in (INVITE, JOIN, KNOCK) else "not_a_member"
    if view.membership(sender) != JOIN:
        return "sender_not_joined"
    power = view.power_levels()
    sender_level = power.user_level(sender)
    if view.membership(target) == BAN and sender_level < power.ban:
        return "insufficient_power"
    if sender_level >= power.kick and power.user_level(target) < sender_level:
        return None
    return "insufficient_power"


def _ban(event: Event, target: str, view: StateView) -> str | None:
    sender = user_id(event.author)
    if view.membership(sender) != JOIN:
        return "sender_not_joined"
    power = view.power_levels()
    sender_level = power.user_level(sender)
    if sender_level >= power.ban and power.user_level(target) < sender_level:
        return None
    return "insufficient_power"


def _knock(event: Event, target: str, view: StateView) -> str | None:
    if view.join_rule() not in (RULE_KNOCK, RULE_KNOCK_RESTRICTED):
        return "join_rule_forbids"
    if user_id(event.author) != target:
        return "knock_for_other"
    return None if view.membership(target) not in (BAN, INVITE, JOIN) else "already_member"
