"""A read-only view of a state map: the questions the auth rules and roles ask.

A state map only holds event ids; answering "is bob joined?" or "what is the
invite level?" means fetching the event and decoding its content. `StateView`
does that in one place, with Matrix's defaults for everything absent:

- no member event             -> membership "leave" (Matrix: not in the room)
- no join rules event         -> join rule "invite" (as Synapse does)
- no power levels event       -> `PowerLevels.without_event(creator)`
- an id the source lacks      -> treated as an absent entry
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from node.core.event import Event
from node.state.power_levels import PowerLevels
from node.state.types import (
    CREATE_KEY,
    HISTORY_JOINED,
    HISTORY_KEY,
    HISTORY_SHARED,
    JOIN_RULES_KEY,
    POWER_LEVELS_KEY,
    RULE_INVITE,
    TYPE_MEMBER,
    EventSource,
    Membership,
    StateKey,
    StateMap,
    content_of,
    is_user_id,
    user_id,
)


@dataclass(frozen=True)
class StateView:
    state: StateMap
    source: EventSource

    def event(self, key: StateKey) -> Event | None:
        event_id = self.state.get(key)
        return None if event_id is None else self.source.get(event_id)

    def content(self, key: StateKey) -> Mapping[str, Any] | None:
        event = self.event(key)
        return None if event is None else content_of(event)

    def create(self) -> Event | None:
        return self.event(CREATE_KEY)

    def creator(self) -> str | None:
        """User id of the create event's author (Matrix v11: the create's sender)."""
        create = self.create()
        return None if create is None else user_id(create.author)

    def power_levels(self) -> PowerLevels:
        content = self.content(POWER_LEVELS_KEY)
        if content is None:
            return PowerLevels.without_event(self.creator())
        return PowerLevels.from_content(content)

    def joined_keys(self) -> frozenset[bytes]:
        """The author keys whose membership is `join` in this state."""
        joined = []
        for (kind, state_key), event_id in self.state.items():
            if kind != TYPE_MEMBER or not is_user_id(state_key):
                continue
            event = self.source.get(event_id)
            if event is not None and content_of(event).get("membership") == Membership.JOIN:
                joined.append(bytes.fromhex(state_key))
        return frozenset(joined)

    def member_content(self, user: str) -> Mapping[str, Any] | None:
        """Content of `user`'s member event, None if there is none."""
        return self.content((TYPE_MEMBER, user))

    def membership(self, user: str) -> str:
        content = self.member_content(user)
        value = None if content is None else content.get("membership")
        return value if isinstance(value, str) else Membership.LEAVE

    def history(self) -> str:
        """The history setting (`HISTORY_SHARED` unless a history event says `joined`)."""
        content = self.content(HISTORY_KEY)
        value = None if content is None else content.get("history_visibility")
        return HISTORY_JOINED if value == HISTORY_JOINED else HISTORY_SHARED

    def join_rule(self) -> str:
        content = self.content(JOIN_RULES_KEY)
        value = None if content is None else content.get("join_rule")
        return value if isinstance(value, str) else RULE_INVITE
