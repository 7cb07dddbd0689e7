"""Which state changes can take a right away: the guard of the bans-that-hold checks.

Why. Bans hold by two checks that judge authorized events again against a
*later* state than their own past: the order's state at their position
(`node.replica.order_bans`) and this node's current state (soft fail,
`node.state.soft_fail`). Both cost a check per event (and soft fail a state
resolution per batch), yet in a topic where nobody was ever banned, kicked,
left or demoted they can only say "stands". This module names the changes
after which they can say anything else, so both checks skip their work until
one happened.

The rule. A state change is *restrictive* unless it is one of:

    m.room.create                                    (the root)
    m.room.member with membership join or invite     (adds a right)
    m.room.power_levels that no user level goes down in and no send level
      goes up in, against the power levels it replaces (`at_least_as_permissive`)
    the first m.room.power_levels, while the creator is the only member, if
      the creator's level still reaches every send level (`_first_levels_keep`:
      Matrix's no-power-levels default lets a joined member send at level 0,
      but only the creator can be joined yet)
    the first m.room.join_rules, if public or invite  (Synapse's default is invite)
    any other state type                             (no auth rule of a non-state
                                                      event or of standing reads it)

Why that suffices. A non-state event that passed the auth rules against its
own past S reads three things of a later state O: the create event, the
sender's membership (join in S) and the power levels (its level and the
send level of its kind in S). If every change placed between S and O, and
every change O holds, is non-restrictive, the sender is still joined in O
(only join or invite replaced the join, and an invite of a joined user
fails its own check) and its level minus the send level only grew (each
power-levels change was at least as permissive as the one it replaced, and
that relation is transitive). So the event passes against O. State events
are judged in full regardless: their rules read content (a concurrent
re-invite of a member who joined fails against O), and the callers treat
such a failure as restrictive too.

Pure: reads the state through an `EventSource`, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from node.core.event import Event
from node.state.power_levels import PowerLevels
from node.state.types import (
    JOIN_RULES_KEY,
    POWER_LEVELS_KEY,
    RULE_INVITE,
    RULE_PUBLIC,
    TYPE_JOIN_RULES,
    TYPE_MEMBER,
    TYPE_POWER_LEVELS,
    EventSource,
    Membership,
    StateKey,
    content_of,
)
from node.state.view import StateView

_GRANTING_MEMBERSHIPS = frozenset({Membership.JOIN, Membership.INVITE})
_FIRST_RULES = frozenset({RULE_PUBLIC, RULE_INVITE})  # no stricter than the default (invite)


def at_least_as_permissive(new: PowerLevels, old: PowerLevels) -> bool:
    """True if no user's level is lower and no send level higher in `new` than in `old`."""
    if new.users_default < old.users_default:
        return False
    if any(new.user_level(user) < old.user_level(user) for user in {*old.users, *new.users}):
        return False
    if new.events_default > old.events_default or new.state_default > old.state_default:
        return False
    return not any(new.send_level(kind, is_state) > old.send_level(kind, is_state)
                   for kind in {*old.events, *new.events} for is_state in (False, True))


def _first_levels_keep(new: PowerLevels, view: StateView,
                       before: Mapping[StateKey, bytes]) -> bool:
    """True if the first power levels take nothing from anyone: only the creator is a
    member, and its level reaches every send level."""
    creator = view.creator()
    if creator is None:
        return False
    if any(key[0] == TYPE_MEMBER and key[1] != creator for key in before):
        return False
    level = new.user_level(creator)
    return (level >= new.events_default and level >= new.state_default
            and all(level >= value for value in new.events.values()))


def restricts(event: Event, before: Mapping[StateKey, bytes], source: EventSource) -> bool:
    """True if the state change `event` (authorized against `before`) may take a right away.

    `before` is the state it replaces a key of (module docstring).
    """
    kind = event.kind
    if event.state_key is None:
        return False
    if kind == TYPE_MEMBER:
        content = content_of(event)
        membership = content.get("membership") if isinstance(content, Mapping) else None
        return membership not in _GRANTING_MEMBERSHIPS
    if kind == TYPE_POWER_LEVELS:
        content = content_of(event)
        if not isinstance(content, Mapping):
            return True
        new = PowerLevels.from_content(content)
        view = StateView(before, source)
        if POWER_LEVELS_KEY not in before:
            return not _first_levels_keep(new, view, before)
        return not at_least_as_permissive(new, view.power_levels())
    if kind == TYPE_JOIN_RULES:
        if JOIN_RULES_KEY in before:
            return True  # any change of an existing rule: rare, judged in full
        content = content_of(event)
        rule = content.get("join_rule") if isinstance(content, Mapping) else None
        return rule not in _FIRST_RULES
    return False
