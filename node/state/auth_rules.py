"""Authorization rules: may this event enter the topic, given the state before it?

These are the Matrix room version 11 authorization rules (matrix-spec,
`content/rooms/v11.md`), numbered as there, adapted to megnode:

 1. `m.room.create`: no parents, state key "", no auth refs, content a map.
    (Server-domain and room-version checks do not apply: there are no servers.)
 2. The event's own auth refs. The Reference Monitor does not look at them
    beyond their count and form (it holds no state). The state tracker
    (`node.state.tracker`) asks more than Matrix: the refs must be *exactly*
    `select_auth_refs(event, state before)`; when they are not, the event
    is rejected (never a vertex, `node.replica.replica`'s gate), with the reason `check_auth_refs` gives (every
    ref known, a state event of this topic, at most one per state key, only
    keys the selection would pick, the create event among them) or, if the
    refs are well formed but not the selection, `auth_refs_not_selected`.
    `check_auth` itself assumes this was done.
 3. `m.federate`: not applicable (no servers) - skipped.
 4. `m.room.member`: see `member_rules`.
    Before rule 4 (megnode): an event of a kind whose content the rules read
    (`MAP_CONTENT_TYPES`: create, member, power levels, join rules) must
    carry a msgpack map, else `bad_content` - read as `{}`, a garbled power
    levels event would reset every level to its default.
 5. Any other event: the sender must be joined.
 6. `m.room.third_party_invite`: third-party invites are not supported; refused.
 7. The sender's level must reach the type's required level
    (`PowerLevels.send_level`). Our non-state kinds: `message` is an ordinary
    message (needs `events_default` unless `events` names it); `dummy` (the
    extremity-merging event) needs no level: any joined member may send one.
 8. A state key `@<user id>` may only be written by that user (Matrix: keys
    starting with `@`; our user ids are bare hex, so the `@` form marks
    user-owned application state).
 9. `m.room.power_levels`: see `power_rules`.
10. Otherwise, allow.

Also left out: restricted joins via other rooms, aliases, redactions (there are
none), server signatures (every event is signed by its author, checked by the
Reference Monitor).

`check_auth` returns None when the event is allowed, else a short reason:
no_create, wrong_topic, bad_content, bad_create, create_has_parents, sender_not_joined,
insufficient_power, banned, not_invited, join_for_other, join_rule_forbids,
target_joined_or_banned, not_a_member, knock_for_other, already_member,
bad_state_key, no_membership, unknown_membership, bad_power_levels,
state_key_owned_by_other, third_party_invite_unsupported.
`check_auth_refs` reasons: auth_ref_missing, auth_ref_not_state,
auth_ref_other_topic, duplicate_auth_type, unexpected_auth_ref, no_create_ref.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from node.core.event import KIND_DUMMY, MAX_AUTH_REFS, Event
from node.state.member_rules import check_member
from node.state.power_rules import check_power_levels
from node.state.types import (
    CREATE_KEY,
    JOIN_RULES_KEY,
    MAP_CONTENT_TYPES,
    POWER_LEVELS_KEY,
    TYPE_CREATE,
    TYPE_MEMBER,
    TYPE_POWER_LEVELS,
    TYPE_THIRD_PARTY_INVITE,
    AuthReason,
    EventSource,
    Membership,
    StateKey,
    StateMap,
    content_of,
    map_content,
    member_key,
    state_key_of,
    user_id,
)
from node.state.view import StateView

USER_OWNED_PREFIX = "@"


@dataclass(frozen=True)
class EventFields:
    """What auth ref selection needs to know of an event that may not exist yet."""

    kind: str
    author: bytes
    state_key: str | None = None
    content: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, event: Event) -> "EventFields":
        return cls(event.kind, event.author, event.state_key, content_of(event))


def auth_types_for(fields: EventFields) -> set[StateKey]:
    """The state keys whose current events authorise an event (Matrix's selection).

    The create event, the power levels, the sender's membership; for a member
    event also the target's membership, and the join rules when it joins,
    invites or knocks. The create event itself needs nothing.
    """
    if fields.kind == TYPE_CREATE:
        return set()
    keys = {CREATE_KEY, POWER_LEVELS_KEY, member_key(fields.author)}
    if fields.kind == TYPE_MEMBER and fields.state_key is not None:
        keys.add((TYPE_MEMBER, fields.state_key))
        membership = fields.content.get("membership")
        if membership in (Membership.JOIN, Membership.INVITE, Membership.KNOCK):
            keys.add(JOIN_RULES_KEY)
    return keys


def auth_types_for_event(event: Event) -> set[StateKey]:
    return auth_types_for(EventFields.of(event))


def select_auth_refs(fields: EventFields, state: StateMap) -> list[bytes]:
    """Sorted ids of the state events that authorise a new event, taken from `state`."""
    refs = sorted({state[key] for key in auth_types_for(fields) if key in state})
    assert len(refs) <= MAX_AUTH_REFS  # the selection names at most five keys
    return refs


def check_auth_refs(event: Event, source: EventSource) -> AuthReason | None:
    """Rule 2: None if the event's own auth refs are well formed."""
    if event.kind == TYPE_CREATE:  # rule 1 judges create events, parents and refs alike
        return None if not event.auth else AuthReason.UNEXPECTED_AUTH_REF
    allowed = auth_types_for_event(event)
    seen: set[StateKey] = set()
    for ref in event.auth:
        auth_event = source.get(ref)
        if auth_event is None:
            return AuthReason.AUTH_REF_MISSING
        key = state_key_of(auth_event)
        if key is None:
            return AuthReason.AUTH_REF_NOT_STATE
        if auth_event.topic_id() != event.topic_id():
            return AuthReason.AUTH_REF_OTHER_TOPIC
        if key in seen:
            return AuthReason.DUPLICATE_AUTH_TYPE
        if key not in allowed:
            return AuthReason.UNEXPECTED_AUTH_REF
        seen.add(key)
    if CREATE_KEY not in seen:
        return AuthReason.NO_CREATE_REF
    return None


def check_auth(event: Event, auth_state: StateMap, source: EventSource) -> AuthReason | None:
    """None if `event` is allowed against `auth_state`, else the reason it is not.

    `auth_state` is the state the event is judged against (the state before
    it, or the partial state during resolution); only the keys named by
    `auth_types_for_event` are read.
    """
    if event.kind == TYPE_CREATE:
        return _check_create(event)
    view = StateView(auth_state, source)
    create = view.create()
    if create is None:
        return AuthReason.NO_CREATE
    if create.id != event.topic:
        return AuthReason.WRONG_TOPIC
    if event.kind in MAP_CONTENT_TYPES and map_content(event) is None:
        return AuthReason.BAD_CONTENT
    if event.kind == TYPE_MEMBER:
        return check_member(event, view) if event.is_state else AuthReason.BAD_STATE_KEY
    sender = user_id(event.author)
    if view.membership(sender) != Membership.JOIN:
        return AuthReason.SENDER_NOT_JOINED
    if event.kind == TYPE_THIRD_PARTY_INVITE:
        return AuthReason.THIRD_PARTY_INVITE_UNSUPPORTED
    if not (event.kind == KIND_DUMMY and not event.is_state):
        power = view.power_levels()
        if power.send_level(event.kind, event.is_state) > power.user_level(sender):
            return AuthReason.INSUFFICIENT_POWER
    key = event.state_key
    if key is not None and key.startswith(USER_OWNED_PREFIX) and key != USER_OWNED_PREFIX + sender:
        return AuthReason.STATE_KEY_OWNED_BY_OTHER
    if event.kind == TYPE_POWER_LEVELS:
        return check_power_levels(event, view)
    return None


def _check_create(event: Event) -> AuthReason | None:
    if event.parents:
        return AuthReason.CREATE_HAS_PARENTS
    if event.state_key != "" or event.auth or event.topic:
        return AuthReason.BAD_CREATE
    if map_content(event) is None:
        return AuthReason.BAD_CONTENT
    return None
