"""Power levels: who may do what, read from `m.room.power_levels` content.

Matrix semantics, defaults as in the Matrix spec (client-server API,
`m.room.power_levels`), plus one megnode field:

    users            {user id: level}     users_default   0
    events           {type: level}        events_default  0
    state_default    50 (0 when the topic has no power levels event at all)
    ban 50 · kick 50 · redact 50 · invite 0
    indexer_level    100   megnode: members at or above it are indexers
                           (see `roles`)

With no power levels event, the create event's author has level
`CREATOR_LEVEL` and everybody else `users_default` (0) - Matrix's creator rule,
which is also what makes the creator the topic's first indexer.

Content read from state has passed the auth rules, which require integers; a
value that is still not an integer (a bool, a string) is read as absent rather
than trusted, so a malformed event can never raise here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

CREATOR_LEVEL = 100

DEFAULT_USERS_DEFAULT = 0
DEFAULT_EVENTS_DEFAULT = 0
DEFAULT_STATE_DEFAULT = 50
STATE_DEFAULT_WITHOUT_POWER_LEVELS = 0
DEFAULT_BAN = 50
DEFAULT_KICK = 50
DEFAULT_REDACT = 50
DEFAULT_INVITE = 0
DEFAULT_INDEXER_LEVEL = 100

# The integer thresholds whose changes rule 9 of the auth rules polices. Ours
# adds `indexer_level`: lowering it would mint indexers, so it is guarded like
# `ban` or `kick`.
SCALAR_FIELDS: tuple[str, ...] = (
    "users_default", "events_default", "state_default", "ban", "redact", "kick", "invite",
    "indexer_level",
)
# Maps of type -> level whose entries rule 9 polices one by one.
LEVEL_MAP_FIELDS: tuple[str, ...] = ("events", "notifications")

_EMPTY: Mapping[str, int] = MappingProxyType({})


def is_level(value: object) -> bool:
    """A power level is a plain integer (bool is not one, though Python says so)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _level(content: Mapping[str, Any], name: str, default: int) -> int:
    value = content.get(name)
    return value if is_level(value) else default


def _level_map(content: Mapping[str, Any], name: str) -> Mapping[str, int]:
    value = content.get(name)
    if not isinstance(value, dict):
        return _EMPTY
    return MappingProxyType({k: v for k, v in value.items() if isinstance(k, str) and is_level(v)})


@dataclass(frozen=True)
class PowerLevels:
    """The effective power levels of a topic at some state."""

    users: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    users_default: int = DEFAULT_USERS_DEFAULT
    events: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    events_default: int = DEFAULT_EVENTS_DEFAULT
    state_default: int = DEFAULT_STATE_DEFAULT
    ban: int = DEFAULT_BAN
    kick: int = DEFAULT_KICK
    redact: int = DEFAULT_REDACT
    invite: int = DEFAULT_INVITE
    indexer_level: int = DEFAULT_INDEXER_LEVEL

    @classmethod
    def from_content(cls, content: Mapping[str, Any]) -> "PowerLevels":
        """Levels from the content of an `m.room.power_levels` event."""
        return cls(
            users=_level_map(content, "users"),
            users_default=_level(content, "users_default", DEFAULT_USERS_DEFAULT),
            events=_level_map(content, "events"),
            events_default=_level(content, "events_default", DEFAULT_EVENTS_DEFAULT),
            state_default=_level(content, "state_default", DEFAULT_STATE_DEFAULT),
            ban=_level(content, "ban", DEFAULT_BAN),
            kick=_level(content, "kick", DEFAULT_KICK),
            redact=_level(content, "redact", DEFAULT_REDACT),
            invite=_level(content, "invite", DEFAULT_INVITE),
            indexer_level=_level(content, "indexer_level", DEFAULT_INDEXER_LEVEL),
        )

    @classmethod
    def without_event(cls, creator: str | None) -> "PowerLevels":
        """Levels of a topic that has no power levels event yet (Matrix's creator rule)."""
        users = {creator: CREATOR_LEVEL} if creator is not None else {}
        return cls(users=MappingProxyType(users), state_default=STATE_DEFAULT_WITHOUT_POWER_LEVELS)

    def user_level(self, user: str) -> int:
        return self.users.get(user, self.users_default)

    def send_level(self, kind: str, is_state: bool) -> int:
        """The level needed to send an event of this type (per-type override first)."""
        if kind in self.events:
            return self.events[kind]
        return self.state_default if is_state else self.events_default
