"""Rule 9 of the Matrix (room version 11) auth rules: changing power levels.

A power levels event may only move levels the sender already dominates:

- a threshold (`ban`, `kick`, ..., and our `indexer_level`) that is added,
  changed or removed must be <= the sender's level both before and after;
- an `events` / `notifications` entry that is changed or removed must have
  been <= the sender's level, and one added or changed must become <= it;
- a `users` entry of somebody else that is changed or removed must have been
  strictly below the sender's level (peers cannot demote peers), and any entry
  added or changed must become <= the sender's level (nobody promotes above
  themselves). The sender's own entry may go down freely.

Values absent on one side are skipped rather than defaulted, as Matrix does:
the comparison is between what the two contents actually say.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from node.core.event import Event
from node.state.power_levels import LEVEL_MAP_FIELDS, SCALAR_FIELDS, is_level
from node.state.types import POWER_LEVELS_KEY, content_of, is_user_id, user_id
from node.state.view import StateView


def check_power_levels(event: Event, view: StateView) -> str | None:
    """None if `event` (an m.room.power_levels event) may replace the current levels."""
    new = content_of(event)
    reason = _validate(new)
    if reason is not None:
        return reason
    previous = view.event(POWER_LEVELS_KEY)
    if previous is None:  # 9.4: the first power levels event sets them freely
        return None
    old = content_of(previous)
    sender = user_id(event.author)
    level = view.power_levels().user_level(sender)
    for name in SCALAR_FIELDS:
        if _exceeds(_as_level(old.get(name)), _as_level(new.get(name)), level):
            return "insufficient_power"
    for name in LEVEL_MAP_FIELDS:
        if _map_exceeds(_levels(old, name), _levels(new, name), level):
            return "insufficient_power"
    return _check_users(_levels(old, "users"), _levels(new, "users"), sender, level)


def _validate(content: Mapping[str, Any]) -> str | None:
    """9.1-9.3: every level is an integer, every user key a user id."""
    for name in SCALAR_FIELDS:
        if name in content and not is_level(content[name]):
            return "bad_power_levels"
    for name in (*LEVEL_MAP_FIELDS, "users"):
        if name not in content:
            continue
        value = content[name]
        if not isinstance(value, dict) or not all(is_level(v) for v in value.values()):
            return "bad_power_levels"
        keys_ok = is_user_id if name == "users" else (lambda k: isinstance(k, str))
        if not all(keys_ok(k) for k in value):
            return "bad_power_levels"
    return None


def _as_level(value: object) -> int | None:
    return value if is_level(value) else None  # type: ignore[return-value]


def _levels(content: Mapping[str, Any], name: str) -> dict[str, int]:
    value = content.get(name)
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and is_level(v)}


def _exceeds(old: int | None, new: int | None, level: int) -> bool:
    if old == new:
        return False
    return (old is not None and old > level) or (new is not None and new > level)


def _map_exceeds(old: dict[str, int], new: dict[str, int], level: int) -> bool:
    return any(_exceeds(old.get(k), new.get(k), level) for k in old.keys() | new.keys())


def _check_users(old: dict[str, int], new: dict[str, int], sender: str, level: int) -> str | None:
    for user in old.keys() | new.keys():
        before, after = old.get(user), new.get(user)
        if before == after:
            continue
        if before is not None and user != sender and before >= level:
            return "insufficient_power"
        if after is not None and after > level:
            return "insufficient_power"
    return None
