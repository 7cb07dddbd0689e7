"""Writer roles (Autobase) read from topic state.

Roles are not a separate mechanism: they are a reading of Matrix state, so
they change only through state events that passed the auth rules and they
resolve across forks with state resolution like everything else.

    role        who (all need membership "join" in the state)
    ---------   -------------------------------------------------------------
    INDEXER     level >= power levels `indexer_level` (default 100); votes
                on the total order and may author heads.
    WRITER      level >= the level needed to send a `message` (that is
                `events_default`, unless `events` names "message");
                writes but does not vote.
    RELAYED     a writer whose own member event content has
                `"relayed": true`; its events enter the order only when an
                indexer's or writer's event references them, so it never
                authors heads. A relayed device is never an indexer, whatever
                its level: an indexer must author heads to vote.
    NONE        anyone else (not joined, or below the writing level).

The topic's creator is the first indexer: with no power levels event Matrix
gives the create event's author level 100 (= the default `indexer_level`).
This reading also counts the creator as joined while the state holds no
member event for them. In practice that is the state right after the
create event: the creator's own join must come straight after it (rule
4.3.1 in `member_rules`), and later states carry a member event of theirs.
The *auth rules* do not count the creator as joined there: until that join
event the creator may send nothing else (rule 5, `sender_not_joined`). So
the difference is a reading, not a permission: the indexer set of the state
after the create event is {creator}, like the total order's initial indexer
set (`node.replica.ordering`).
A member's level is `users[<hex of their key>]`, else `users_default`.
"""

from __future__ import annotations

import enum

from node.core.event import KIND_MESSAGE
from node.state.types import TYPE_MEMBER, EventSource, Membership, StateMap, is_user_id, user_id
from node.state.power_levels import PowerLevels
from node.state.view import StateView

RELAYED_FLAG = "relayed"


class Role(enum.Enum):
    INDEXER = "indexer"
    WRITER = "writer"
    RELAYED = "relayed"
    NONE = "none"


def role_of(author: bytes, state: StateMap, source: EventSource) -> Role:
    """The role the author key holds in `state`."""
    return _role(user_id(author), StateView(state, source))


def indexers(state: StateMap, source: EventSource) -> frozenset[bytes]:
    """Author keys of every indexer in `state` (the creator's, before anyone joins)."""
    view = StateView(state, source)
    power = view.power_levels()
    creator = view.creator()
    if power.users_default < power.indexer_level:
        # Only a user listed at or above `indexer_level` can be one (everyone else has
        # `users_default`): the total order asks after each confirmation, and reading
        # every member of a thousand-member topic cost it 9 % of the 1000-node world.
        candidates = {user for user, level in power.users.items()
                      if level >= power.indexer_level and (TYPE_MEMBER, user) in state
                      and is_user_id(user)}
    else:
        candidates = {key for (kind, key) in state if kind == TYPE_MEMBER and is_user_id(key)}
    if creator is not None:
        candidates.add(creator)
    return frozenset(bytes.fromhex(u) for u in candidates
                     if _role(u, view, power) is Role.INDEXER)


def _role(user: str, view: StateView, power: PowerLevels | None = None) -> Role:
    content = view.member_content(user)
    if content is None:
        # Only the creator holds a role without a member event: the topic's first indexer.
        joined = user == view.creator()
        relayed = False
    else:
        joined = content.get("membership") == Membership.JOIN
        relayed = content.get(RELAYED_FLAG) is True
    if not joined:
        return Role.NONE
    if power is None:
        power = view.power_levels()
    level = power.user_level(user)
    if level < power.send_level(KIND_MESSAGE, is_state=False):
        return Role.NONE
    if relayed:
        return Role.RELAYED
    return Role.INDEXER if level >= power.indexer_level else Role.WRITER
