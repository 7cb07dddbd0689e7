"""Vocabulary of topic state: state keys, state maps, event sources, user ids.

Topic state follows Matrix's room state model so that the Matrix authorization
rules and state resolution v2 carry over unchanged. A *state map* maps a state
key `(type, state_key)` to the id of the state event that currently holds it.

User ids. Matrix names users `@name:server`; megnode has no servers, a member
is its ed25519 author key. The *user id* of an author is the lowercase hex of
its 32-byte key (64 characters). That string is:

- the `state_key` of the member's `m.room.member` event,
- the key under `users` in `m.room.power_levels` content.

Matrix's rule "a state key starting with `@` belongs to that user" is kept in
the form: a state key `@<user id>` may only be set by that user (see
`auth_rules`).

This module holds no logic beyond decoding helpers: it is what every other
module of `node.state` agrees on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from node.core.event import KEY_BYTES, KIND_CREATE, Event

StateKey = tuple[str, str]
"""(event type, state key), e.g. ("m.room.member", "<hex of a key>")."""

StateMap = Mapping[StateKey, bytes]
"""State key -> id of the event holding it."""


class EventSource(Protocol):
    """Where resolution and auth look events up by id (the graph; a dict in tests).

    `None` means "not known here": such events are treated as absent, never as
    an error, because the graph only hands us events whose auth refs it holds.
    """

    def get(self, event_id: bytes, /) -> Event | None: ...


# Matrix state event types used by the auth rules.
TYPE_CREATE = KIND_CREATE
TYPE_MEMBER = "m.room.member"
TYPE_POWER_LEVELS = "m.room.power_levels"
TYPE_JOIN_RULES = "m.room.join_rules"
TYPE_THIRD_PARTY_INVITE = "m.room.third_party_invite"
TYPE_NAME = "m.room.name"
TYPE_TOPIC = "m.room.topic"

# Kinds whose content the auth rules read: an event of one of these kinds whose
# payload is not a msgpack map is refused (`bad_content`), never read as `{}`
# (an empty power levels content would reset every level to its default).
MAP_CONTENT_TYPES = frozenset({TYPE_CREATE, TYPE_MEMBER, TYPE_POWER_LEVELS, TYPE_JOIN_RULES})

CREATE_KEY: StateKey = (TYPE_CREATE, "")
POWER_LEVELS_KEY: StateKey = (TYPE_POWER_LEVELS, "")
JOIN_RULES_KEY: StateKey = (TYPE_JOIN_RULES, "")

# Membership values (content["membership"] of m.room.member).
JOIN = "join"
LEAVE = "leave"
BAN = "ban"
INVITE = "invite"
KNOCK = "knock"

# Join rules (content["join_rule"] of m.room.join_rules).
RULE_PUBLIC = "public"
RULE_INVITE = "invite"
RULE_KNOCK = "knock"
RULE_RESTRICTED = "restricted"
RULE_KNOCK_RESTRICTED = "knock_restricted"
RULE_PRIVATE = "private"

USER_ID_CHARS = 2 * KEY_BYTES
_HEX_DIGITS = frozenset("0123456789abcdef")


def user_id(author: bytes) -> str:
    """The user id of an author key: its lowercase hex."""
    return author.hex()


def is_user_id(value: object) -> bool:
    """True for a well-formed user id (64 lowercase hex characters)."""
    return (
        isinstance(value, str)
        and len(value) == USER_ID_CHARS
        and all(c in _HEX_DIGITS for c in value)
    )


def member_key(author: bytes) -> StateKey:
    return (TYPE_MEMBER, user_id(author))


def state_key_of(event: Event) -> StateKey | None:
    """The state key an event writes, or None for a non-state event."""
    if event.state_key is None:
        return None
    return (event.kind, event.state_key)


def map_content(event: Event) -> dict[str, Any] | None:
    """The event's payload decoded, if it is a msgpack map; None for anything else."""
    try:
        content = event.content()
    except Exception:  # msgpack raises several types on garbage
        return None
    return content if isinstance(content, dict) else None


def content_of(event: Event) -> Mapping[str, Any]:
    """The event's content as a map; `{}` when the payload is not a msgpack map.

    Auth and resolution must never crash on a malformed payload from the
    network: a missing or garbled field behaves like an absent one. The auth
    rules refuse the kinds in `MAP_CONTENT_TYPES` outright when their payload
    is not a map (`bad_content`), so `{}` is never read from one of those in
    a state map; for other kinds it is what "no content" means.
    """
    content = map_content(event)
    return {} if content is None else content
