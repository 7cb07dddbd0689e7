"""Joining a topic one does not hold yet: the member's template and the joiner's signature.

An invitee of a private topic holds nothing of it (members send a topic's
events only to members, `node.replica.read_access`), so it cannot author its
own join the usual way (`Replica.join` needs the topic's state). The join
handshake (`transport.join_handshake`) splits the work in two:

* a member computes the `JoinTerms` for the invitee's key: the parents (its
  forward extremities, up to d_max), the auth refs and the sequence number,
  after checking the draft join against the auth rules in its current state
  (`Replica.join_terms`: `NotAuthorizedError` if the key may not join now);
* the invitee signs its `m.room.member` join from them (`sign_join`, a pure
  function of its identity, the terms and its clock) and hands the event to
  the member, which receives it like any other event.

The content is the one `Replica.join` writes, so both ways give the same
state. Nothing here stores anything.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from node.core.event import Event, pack_payload
from node.core.identity import Identity, sign_event
from node.core.parents import select_parents
from node.replica.types import NotReadyError, ReplicaConfig, TopicParams
from node.state import actions
from node.state.types import TYPE_MEMBER, Membership, content_of, user_id

if TYPE_CHECKING:
    from node.core.graph import Graph


@dataclass(frozen=True, slots=True)
class JoinTerms:
    """What a joiner needs from a member to sign its join: seq, parents, auth refs."""

    seq: int
    parents: tuple[bytes, ...]
    auth: tuple[bytes, ...]


def join_payload(key: bytes) -> bytes:
    """The content of `key`'s join, exactly as `Replica.join` writes it."""
    return pack_payload(dict(actions.membership_spec(key, Membership.JOIN).content))


def sign_join(identity: Identity, topic: bytes, terms: JoinTerms, now_ms: int) -> Event:
    """`identity`'s signed join of `topic` on the member's `terms` (pure)."""
    key = identity.public_key
    return sign_event(identity, topic=topic, seq=terms.seq, parents=terms.parents,
                      timestamp_ms=now_ms, kind=TYPE_MEMBER, state_key=user_id(key),
                      payload=join_payload(key), auth=terms.auth)


def is_join_of(event: Event, topic: bytes, key: bytes) -> bool:
    """True if `event` is `key`'s own join of `topic` (what a join handshake may submit)."""
    return (event.topic == topic and event.author == key and event.kind == TYPE_MEMBER
            and event.state_key == user_id(key) and event.payload == join_payload(key))


def is_invite_of(event: Event, topic: bytes, key: bytes) -> bool:
    """True if `event` invites `key` to `topic` (another key's `m.room.member` invite)."""
    return (event.topic == topic and event.author != key and event.kind == TYPE_MEMBER
            and event.state_key == user_id(key)
            and content_of(event).get("membership") == Membership.INVITE.value)


def invite_cited_by(join: Event, graph: Graph) -> Event | None:
    """The invite of the joiner that `join` names among its auth refs, if held in `graph`:
    what let it join (None for a join under a public rule, or a member's re-join)."""
    for auth_id in join.auth:
        event = graph.get(auth_id)
        if event is not None and is_invite_of(event, join.topic, join.author):
            return event
    return None


class Joining:
    """The member's half of a join from outside; a mixin of `Replica`."""

    if TYPE_CHECKING:
        topic_id: bytes
        config: ReplicaConfig
        graph: Graph

        @property
        def params(self) -> TopicParams: ...
        @property
        def ready(self) -> bool: ...
        @property
        def authorizing(self) -> bool: ...
        def _draft(self, kind: str, state_key: str | None, payload: bytes,
                   parents: tuple[bytes, ...] | list[bytes], seq: int, now_ms: int) -> Event: ...
        def _checked(self, draft: Event) -> Event: ...

    def join_terms(self, key: bytes, now_ms: int, rng: random.Random) -> JoinTerms:
        """The terms on which `key` may join now, checked against the current state.

        NotReadyError without the create event; NotAuthorizedError (with the
        rule's reason) if the auth rules refuse `key`'s join on these parents:
        not invited, banned, join rule. Nothing is added or signed here.
        """
        if not self.ready:
            raise NotReadyError("the topic's create event has not arrived yet")
        extremities = self.graph.extremities()
        d_max = self.params.d_max
        depth = (lambda i: self.graph.depth(i) or 0)
        parents = tuple(sorted(extremities if len(extremities) <= d_max else select_parents(
            extremities, d_max, self.config.parent_policy, rng, depth)))
        latest = self.graph.author_latest_seq(key)
        seq = (latest if latest is not None else -1) + 1
        auth: tuple[bytes, ...] = (self.topic_id,)
        if self.authorizing:
            draft = replace(self._draft(TYPE_MEMBER, user_id(key), join_payload(key), parents,
                                        seq, now_ms), author=key)
            auth = self._checked(draft).auth
        return JoinTerms(seq, parents, tuple(auth))
