"""Rule 9 of the Matrix (room version 11) auth rules: changing power levels.

A power levels event may only move levels the sender already dominates:

- a threshold (`ban`, `kick`, ..., and our `indexer_level`) that is added,
  changed or removed must be <= the sender's level both before and after;
- an `events` entry that is added, changed or removed must be <= the
  sender's level both before and after;
- a `users` entry of somebody else that is added, changed or removed must
  have been strictly below the sender's level (peers cannot demote peers),
  and must become <= the sender's level (nobody promotes above themselves).
  The sender's own entry may go down freely.

One deliberate difference from Matrix: a value absent on one side is read as
its *effective* value there - a threshold as its default
(`power_levels.DEFAULT_*`), an `events` entry as `events_default` (for
non-state events) and `state_default` (for state events), a `users` entry as
`users_default` - instead of being skipped. Matrix skips it, which lets a
sender at 50 add `indexer_level: 50` to content that had none (default 100)
and so mint indexers, or add `events: {"message": 0}` under an
`events_default` it does not reach and make everyone a writer. Where Matrix
compares two present values, so do we: this only refuses more, never less.
(`notifications` keeps Matrix's reading; no role depends on it.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from node.core.event import Event
from node.state.power_levels import LEVEL_MAP_FIELDS, SCALAR_FIELDS, PowerLevels, is_level
from node.state.types import POWER_LEVELS_KEY, AuthReason, content_of, is_user_id, user_id
from node.state.view import StateView

_NOTIFICATIONS = "notifications"


def check_power_levels(event: Event, view: StateView) -> AuthReason | None:
    """None if `event` (an m.room.power_levels event) may replace the current levels."""
    new = content_of(event)
    reason = _validate(new)
    if reason is not None:
        return reason
    previous = view.event(POWER_LEVELS_KEY)
    if previous is None:  # 9.4: the first power levels event sets them freely
        return None
    old = content_of(previous)
    before, after = PowerLevels.from_content(old), PowerLevels.from_content(new)
    sender = user_id(event.author)
    level = before.user_level(sender)
    for name in SCALAR_FIELDS:
        if old.get(name) != new.get(name) and _above(level, getattr(before, name),
                                                     getattr(after, name)):
            return AuthReason.INSUFFICIENT_POWER
    old_events, new_events = _levels(old, "events"), _levels(new, "events")
    for kind in old_events.keys() | new_events.keys():
        if old_events.get(kind) != new_events.get(kind) and _above(
            level, *_send_levels(before, kind), *_send_levels(after, kind)
        ):
            return AuthReason.INSUFFICIENT_POWER
    if _map_exceeds(_levels(old, _NOTIFICATIONS), _levels(new, _NOTIFICATIONS), level):
        return AuthReason.INSUFFICIENT_POWER
    return _check_users(_levels(old, "users"), _levels(new, "users"), before, after, sender,
                        level)


def _validate(content: Mapping[str, Any]) -> AuthReason | None:
    """9.1-9.3: every level is an integer, every user key a user id."""
    for name in SCALAR_FIELDS:
        if name in content and not is_level(content[name]):
            return AuthReason.BAD_POWER_LEVELS
    for name in (*LEVEL_MAP_FIELDS, "users"):
        if name not in content:
            continue
        value = content[name]
        if not isinstance(value, dict) or not all(is_level(v) for v in value.values()):
            return AuthReason.BAD_POWER_LEVELS
        keys_ok = is_user_id if name == "users" else (lambda k: isinstance(k, str))
        if not all(keys_ok(k) for k in value):
            return AuthReason.BAD_POWER_LEVELS
    return None


def _above(level: int, *values: int) -> bool:
    return any(value > level for value in values)


def _send_levels(power: PowerLevels, kind: str) -> tuple[int, int]:
    """The levels an `events` entry for `kind` governs: sending it as a non-state / state event."""
    return power.send_level(kind, is_state=False), power.send_level(kind, is_state=True)


def _levels(content: Mapping[str, Any], name: str) -> dict[str, int]:
    value = content.get(name)
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and is_level(v)}


def _map_exceeds(old: dict[str, int], new: dict[str, int], level: int) -> bool:
    """Matrix's reading: entries changed, each present side must be <= level."""
    return any(
        old.get(k) != new.get(k) and _above(level, *(v for v in (old.get(k), new.get(k))
                                                     if v is not None))
        for k in old.keys() | new.keys()
    )


def _check_users(old: dict[str, int], new: dict[str, int], before: PowerLevels,
                 after: PowerLevels, sender: str, level: int) -> AuthReason | None:
    for user in old.keys() | new.keys():
        if old.get(user) == new.get(user):
            continue
        was, becomes = before.user_level(user), after.user_level(user)
        if user != sender and was >= level:
            return AuthReason.INSUFFICIENT_POWER
        if becomes > level:
            return AuthReason.INSUFFICIENT_POWER
    return None
