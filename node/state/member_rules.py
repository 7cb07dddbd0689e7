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
    RULE_INVITE,
    RULE_KNOCK,
    RULE_KNOCK_RESTRICTED,
    RULE_PUBLIC,
    RULE_RESTRICTED,
    AuthReason,
    Membership,
    content_of,
    is_user_id,
    user_id,
)
from node.state.view import StateView


def check_member(event: Event, view: StateView) -> AuthReason | None:
    """None if the membership change in `event` is allowed by the state in `view`."""
    target = event.state_key
    if not is_user_id(target):
        return AuthReason.BAD_STATE_KEY
    assert target is not None  # is_user_id said so; narrows the type
    content = content_of(event)
    membership = content.get("membership")
    if not isinstance(membership, str):
        return AuthReason.NO_MEMBERSHIP
    if "third_party_invite" in content:
        return AuthReason.THIRD_PARTY_INVITE_UNSUPPORTED
    if membership == Membership.JOIN:
        return _join(event, target, view)
    if membership == Membership.INVITE:
        return _invite(event, target, view)
    if membership == Membership.LEAVE:
        return _leave(event, target, view)
    if membership == Membership.BAN:
        return _ban(event, target, view)
    if membership == Membership.KNOCK:
        return _knock(event, target, view)
    return AuthReason.UNKNOWN_MEMBERSHIP


def _join(event: Event, target: str, view: StateView) -> AuthReason | None:
    sender = user_id(event.author)
    create = view.create()
    # 4.3.1: the creator's own join straight after the create event.
    if create is not None and event.parents == (create.id,) and target == sender == view.creator():
        return None
    if sender != target:
        return AuthReason.JOIN_FOR_OTHER
    current = view.membership(target)
    if current == Membership.BAN:
        return AuthReason.BANNED
    rule = view.join_rule()
    if rule in (RULE_INVITE, RULE_KNOCK, RULE_RESTRICTED, RULE_KNOCK_RESTRICTED):
        return None if current in (Membership.INVITE, Membership.JOIN) else AuthReason.NOT_INVITED
    if rule == RULE_PUBLIC:
        return None
    return AuthReason.JOIN_RULE_FORBIDS


def _invite(event: Event, target: str, view: StateView) -> AuthReason | None:
    sender = user_id(event.author)
    if view.membership(sender) != Membership.JOIN:
        return AuthReason.SENDER_NOT_JOINED
    if view.membership(target) in (Membership.JOIN, Membership.BAN):
        return AuthReason.TARGET_JOINED_OR_BANNED
    power = view.power_levels()
    return None if power.user_level(sender) >= power.invite else AuthReason.INSUFFICIENT_POWER


def _leave(event: Event, target: str, view: StateView) -> AuthReason | None:
    sender = user_id(event.author)
    if sender == target:
        if view.membership(target) in (Membership.INVITE, Membership.JOIN, Membership.KNOCK):
            return None
        return AuthReason.NOT_A_MEMBER
    if view.membership(sender) != Membership.JOIN:
        return AuthReason.SENDER_NOT_JOINED
    power = view.power_levels()
    sender_level = power.user_level(sender)
    if view.membership(target) == Membership.BAN and sender_level < power.ban:
        return AuthReason.INSUFFICIENT_POWER
    if sender_level >= power.kick and power.user_level(target) < sender_level:
        return None
    return AuthReason.INSUFFICIENT_POWER


def _ban(event: Event, target: str, view: StateView) -> AuthReason | None:
    sender = user_id(event.author)
    if view.membership(sender) != Membership.JOIN:
        return AuthReason.SENDER_NOT_JOINED
    power = view.power_levels()
    sender_level = power.user_level(sender)
    if sender_level >= power.ban and power.user_level(target) < sender_level:
        return None
    return AuthReason.INSUFFICIENT_POWER


def _knock(event: Event, target: str, view: StateView) -> AuthReason | None:
    if view.join_rule() not in (RULE_KNOCK, RULE_KNOCK_RESTRICTED):
        return AuthReason.JOIN_RULE_FORBIDS
    if user_id(event.author) != target:
        return AuthReason.KNOCK_FOR_OTHER
    if view.membership(target) not in (Membership.BAN, Membership.INVITE, Membership.JOIN):
        return None
    return AuthReason.ALREADY_MEMBER
