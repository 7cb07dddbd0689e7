"""Topic-state operations of a member: which events they take, and why one is refused.

Pure functions over a `StateView`: the replica asks "which events make bob a
writer?", checks each against the auth rules before signing it, and signs
what passes. Nothing here signs, stores or reads a clock.

Role mapping (what `set_role` writes; `node.state.roles` reads it back):

    role      power levels `users[key]`            member event of the key
    -------   ----------------------------------   --------------------------------
    INDEXER   `indexer_level`                      joined, no "relayed" flag
    WRITER    the writing level: the level to send  joined, no "relayed" flag
              a `message` (events["message"], else
              `events_default`)
    RELAYED   the writing level                     joined with "relayed": true
    NONE      entry removed (users_default), or     unchanged: a reader stays joined
              one below the writing level when
              users_default would reach it

A member event with membership "join" can only be sent by the member itself
(Matrix rule 4.3.2), so the "relayed" flag is *self-declared*: a small device
joins with `relayed=True`, or calls `set_role(own key, RELAYED)`. An admin
cannot mark someone else relayed (`RoleError`); it can only grant the level.

`add_writer(key)` = an invite (unless the key is joined or invited already) +
the writing level (unless the key has it already). The invitee then joins
from its own replica.

New topics (`initial_power_levels`): the creator at 100 (an indexer), joined
members at 0 read only, `events_default` = `WRITER_LEVEL` so writing is a
grant, and moderation (invite, kick, ban, state) at `MODERATOR_LEVEL`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from node.core.event import KIND_DUMMY, KIND_MESSAGE, Event
from node.state.power_levels import CREATOR_LEVEL, DEFAULT_INDEXER_LEVEL
from node.state.roles import RELAYED_FLAG, Role
from node.state.types import (
    POWER_LEVELS_KEY,
    TYPE_MEMBER,
    TYPE_POWER_LEVELS,
    AuthReason,
    Membership,
    content_of,
    user_id,
)
from node.state.view import StateView

WRITER_LEVEL = 10
MODERATOR_LEVEL = 50


class NotAuthorizedError(Exception):
    """The local identity may not do this in the current state; `reason` is the rule's."""

    def __init__(self, reason: AuthReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class RoleError(ValueError):
    """A role change that no event of the local identity can make."""


@dataclass(frozen=True)
class EventSpec:
    """An event to author: kind, state key and content (msgpack-able)."""

    kind: str
    state_key: str | None
    content: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


def initial_power_levels(creator: bytes, members_write: bool = False) -> dict[str, Any]:
    """Power levels content of a new topic (see the module docstring).

    `members_write`: every member starts at the writing level (open topics).
    """
    return {
        "users": {user_id(creator): CREATOR_LEVEL},
        "users_default": WRITER_LEVEL if members_write else 0,
        "events_default": WRITER_LEVEL,
        "state_default": MODERATOR_LEVEL,
        "ban": MODERATOR_LEVEL,
        "kick": MODERATOR_LEVEL,
        "redact": MODERATOR_LEVEL,
        "invite": MODERATOR_LEVEL,
        "indexer_level": DEFAULT_INDEXER_LEVEL,
    }


def membership_spec(target: bytes, membership: Membership, **extra: Any) -> EventSpec:
    return EventSpec(TYPE_MEMBER, user_id(target), {"membership": membership, **extra})


def writing_level(view: StateView) -> int:
    return view.power_levels().send_level(KIND_MESSAGE, is_state=False)


def power_levels_content(view: StateView) -> dict[str, Any]:
    """A fresh copy of the current power levels content to edit (Matrix's defaults if none)."""
    content = view.content(POWER_LEVELS_KEY)
    if content is None:
        creator = view.creator()
        return {"users": {creator: CREATOR_LEVEL}} if creator is not None else {}
    copy = dict(content)
    users = copy.get("users")
    copy["users"] = dict(users) if isinstance(users, dict) else {}
    return copy


def level_spec(view: StateView, target: bytes, level: int | None) -> EventSpec | None:
    """A power levels event giving `target` `level` (None: the default); None if no change."""
    content = power_levels_content(view)
    users: dict[str, int] = content["users"]
    user = user_id(target)
    if users.get(user) == level:
        return None
    if level is None:
        if user not in users:
            return None
        del users[user]
    else:
        users[user] = level
    return EventSpec(TYPE_POWER_LEVELS, "", content)


def writer_specs(view: StateView, target: bytes) -> list[EventSpec]:
    """Events that make `target` a writer: an invite if needed, then the writing level."""
    specs: list[EventSpec] = []
    if view.membership(user_id(target)) not in (Membership.JOIN, Membership.INVITE):
        specs.append(membership_spec(target, Membership.INVITE))
    power = view.power_levels()
    if power.user_level(user_id(target)) < writing_level(view):
        spec = level_spec(view, target, writing_level(view))
        if spec is not None:
            specs.append(spec)
    return specs


def role_specs(view: StateView, own: bytes, target: bytes, role: Role) -> list[EventSpec]:
    """Events that give `target` `role` (see the mapping above), in order."""
    user = user_id(target)
    member = view.member_content(user) or {}
    relayed_now = member.get(RELAYED_FLAG) is True
    power = view.power_levels()
    specs: list[EventSpec] = []
    if role is Role.INDEXER:
        level: int | None = max(power.indexer_level, power.user_level(user))
    elif role in (Role.WRITER, Role.RELAYED):
        level = writing_level(view)
    else:  # Role.NONE: back to the default if that is below writing, else one below writing
        level = None if power.users_default < writing_level(view) else writing_level(view) - 1
    want_relayed = role is Role.RELAYED
    if want_relayed != relayed_now and target != own:
        raise RoleError(
            f"only {user[:12]}… can {'declare' if want_relayed else 'drop'} the relayed flag: "
            "it lives in the member's own join event; that member calls set_role on its replica")
    spec = level_spec(view, target, level)
    if spec is not None:
        specs.append(spec)
    if want_relayed != relayed_now:
        if view.membership(user) != Membership.JOIN:
            raise RoleError("join the topic before changing the relayed flag")
        content = {k: v for k, v in member.items() if k != RELAYED_FLAG}
        if want_relayed:
            content[RELAYED_FLAG] = True
        specs.append(EventSpec(TYPE_MEMBER, user, content))
    return specs


def explain(event: Event, reason: AuthReason, view: StateView) -> str:
    """A sentence for a refused local event, naming the missing power where there is one."""
    who = user_id(event.author)
    what = _describe(event)
    if reason == AuthReason.SENDER_NOT_JOINED:
        return (f"{what}: {who[:12]}… is not a joined member (join after an invite, or when "
                f"the join rule is public)")
    if reason == AuthReason.INSUFFICIENT_POWER:
        needed, name = _needed_power(event, view)
        have = view.power_levels().user_level(who)
        if event.kind == TYPE_POWER_LEVELS and have >= needed:
            return (f"{what}: a sender may only change levels below its own and set levels "
                    f"up to it (a peer at or above {have} cannot be demoted by "
                    f"{who[:12]}…)")
        if (event.kind == TYPE_MEMBER and have >= needed and event.state_key
                and content_of(event).get("membership") in (Membership.BAN, Membership.LEAVE)):
            target_level = view.power_levels().user_level(event.state_key)
            return (f"{what}: the target's power level {target_level} is not below "
                    f"{who[:12]}…'s {have} (only members below the sender can be banned "
                    "or kicked)")
        return f"{what}: needs power level {needed} ({name}); {who[:12]}… has {have}"
    if reason == AuthReason.NOT_INVITED:
        return f"{what}: the join rule is {view.join_rule()!r} and there is no invite"
    if reason == AuthReason.BANNED:
        return f"{what}: {who[:12]}… is banned"
    if reason == AuthReason.TARGET_JOINED_OR_BANNED:
        return f"{what}: the target is already joined or banned"
    return f"{what}: refused by the auth rules ({reason})"


def _describe(event: Event) -> str:
    if event.kind == TYPE_MEMBER:
        membership = content_of(event).get("membership")
        target = (event.state_key or "")[:12]
        if event.state_key == user_id(event.author):
            return f"{membership} (own membership)"
        return f"{membership} of {target}…"
    if event.is_state:
        return f"setting state {event.kind!r}/{event.state_key!r}"
    return f"sending {event.kind!r}"


def _needed_power(event: Event, view: StateView) -> tuple[int, str]:
    power = view.power_levels()
    if event.kind == TYPE_MEMBER:
        membership = content_of(event).get("membership")
        if membership == Membership.INVITE:
            return power.invite, "invite level"
        if membership == Membership.BAN:
            return power.ban, "ban level"
        if membership == Membership.LEAVE:
            return power.kick, "kick level"
    if event.kind in power.events:
        return power.events[event.kind], f"events[{event.kind!r}]"
    if event.kind == KIND_DUMMY and not event.is_state:
        return 0, "none"
    if event.is_state:
        return power.state_default, "state_default"
    return power.events_default, "events_default"
