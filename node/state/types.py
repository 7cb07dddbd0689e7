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
module of `node.state` agrees on, including the two enums compared across
the node: `Membership` and `AuthReason`.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
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
# Who may read the history before their join (Matrix's m.room.history_visibility; issue 15).
TYPE_HISTORY = "m.room.history_visibility"

# Kinds whose content the auth rules read: an event of one of these kinds whose
# payload is not a msgpack map is refused (`bad_content`), never read as `{}`
# (an empty power levels content would reset every level to its default).
MAP_CONTENT_TYPES = frozenset({TYPE_CREATE, TYPE_MEMBER, TYPE_POWER_LEVELS, TYPE_JOIN_RULES})

CREATE_KEY: StateKey = (TYPE_CREATE, "")
POWER_LEVELS_KEY: StateKey = (TYPE_POWER_LEVELS, "")
JOIN_RULES_KEY: StateKey = (TYPE_JOIN_RULES, "")
HISTORY_KEY: StateKey = (TYPE_HISTORY, "")



class Membership(StrEnum):
    """Membership values (content["membership"] of m.room.member).

    A StrEnum: a member equals its string, so it packs, logs and compares
    with the raw value read from an event's content unchanged.
    """

    JOIN = "join"
    LEAVE = "leave"
    BAN = "ban"
    INVITE = "invite"
    KNOCK = "knock"


class AuthReason(StrEnum):
    """Why the auth rules refuse an event: the reason a rejected event is stored and
    logged with (`EventState.reason`, `Received.unauthorized`, the
    `rejected.<reason>` counters) and `NotAuthorizedError.reason`.

    A StrEnum, so stored records, logs and the relay's wire replies keep these
    exact strings. Grouped by the rule that gives them.
    """

    # check_auth: the create event, the sender, the content (node.state.auth_rules)
    NO_CREATE = "no_create"
    WRONG_TOPIC = "wrong_topic"
    BAD_CONTENT = "bad_content"
    BAD_CREATE = "bad_create"
    CREATE_HAS_PARENTS = "create_has_parents"
    SENDER_NOT_JOINED = "sender_not_joined"
    INSUFFICIENT_POWER = "insufficient_power"
    STATE_KEY_OWNED_BY_OTHER = "state_key_owned_by_other"
    THIRD_PARTY_INVITE_UNSUPPORTED = "third_party_invite_unsupported"
    # m.room.member (node.state.member_rules)
    BAD_STATE_KEY = "bad_state_key"
    NO_MEMBERSHIP = "no_membership"
    UNKNOWN_MEMBERSHIP = "unknown_membership"
    JOIN_FOR_OTHER = "join_for_other"
    BANNED = "banned"
    NOT_INVITED = "not_invited"
    JOIN_RULE_FORBIDS = "join_rule_forbids"
    TARGET_JOINED_OR_BANNED = "target_joined_or_banned"
    NOT_A_MEMBER = "not_a_member"
    KNOCK_FOR_OTHER = "knock_for_other"
    ALREADY_MEMBER = "already_member"
    # m.room.power_levels (node.state.power_rules)
    BAD_POWER_LEVELS = "bad_power_levels"
    # check_auth_refs: the event's auth refs themselves (node.state.auth_rules)
    AUTH_REF_MISSING = "auth_ref_missing"
    AUTH_REF_NOT_STATE = "auth_ref_not_state"
    AUTH_REF_OTHER_TOPIC = "auth_ref_other_topic"
    DUPLICATE_AUTH_TYPE = "duplicate_auth_type"
    UNEXPECTED_AUTH_REF = "unexpected_auth_ref"
    NO_CREATE_REF = "no_create_ref"
    # the state tracker (node.state.tracker)
    AUTH_REFS_NOT_SELECTED = "auth_refs_not_selected"  # not exactly select_auth_refs(state before)
    STATE_UNRESOLVABLE = "state_unresolvable"  # its parents' states cannot be resolved
    # soft fail (node.state.soft_fail): valid in its past, but its author is banned,
    # has left or was kicked, or lost the level, in this node's current state
    SOFT_FAILED = "soft_failed"


# Join rules (content["join_rule"] of m.room.join_rules).
HISTORY_SHARED = "shared"  # a member reads the whole topic, from before its join too
HISTORY_JOINED = "joined"  # a member reads payloads only of events it was joined at
HISTORY_SETTINGS = (HISTORY_SHARED, HISTORY_JOINED)

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
    # `issuperset` walks the string in C: the auth rules ask this for every
    # member event they check, and a per-character generator was ~10x slower.
    return isinstance(value, str) and len(value) == USER_ID_CHARS and _HEX_DIGITS.issuperset(value)


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
