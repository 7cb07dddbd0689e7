"""Topic-state operations of a replica: join, invite, ban, make a writer, give a role,
set application state - each authored as the local identity.

`Replica` (node.replica.replica) mixes this in. Which events an operation
takes, and why one is refused, is pure logic in `node.state.actions`; this
module turns that into signed events through the replica's authoring
(node.replica.authoring). An operation of several events is checked whole
before the first is signed, so a refusal (`NotAuthorizedError`, naming the
missing power; `RoleError`) never leaves half an operation behind.

Like `publish`, the events are durable once committed: in a running node by
the committer (node.committer), standalone by `Replica.commit()`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from node.core.event import Event, pack_payload
from node.core.graph import Graph
from node.core.identity import Identity
from node.replica.types import Received
from node.state import actions
from node.state.actions import EventSpec
from node.state.roles import Role
from node.state.types import Membership, StateKey
from node.state.view import StateView


class StateOperations:
    """The topic-state half of `Replica` (see the module docstring)."""

    if TYPE_CHECKING:
        # What the operations use of the Replica they are part of (node.replica.replica,
        # node.replica.authoring).
        identity: Identity
        graph: Graph

        def publish(self, payload: bytes, now_ms: int, rng: random.Random, kind: str = ...,
                    state_key: str | None = None) -> tuple[Event, Received]: ...
        def _draft(self, kind: str, state_key: str | None, payload: bytes,
                   parents: tuple[bytes, ...] | list[bytes], seq: int, now_ms: int) -> Event: ...
        def _checked(self, draft: Event) -> Event: ...
        def _current_state(self) -> Mapping[StateKey, bytes]: ...

    def set_state(self, kind: str, state_key: str, content: Mapping[str, Any], now_ms: int,
                  rng: random.Random) -> tuple[Event, Received]:
        """Set application (or Matrix) state: `kind`/`state_key` -> `content`."""
        return self._publish_spec(EventSpec(kind, state_key, dict(content)), now_ms, rng)

    def invite(self, user_key: bytes, now_ms: int, rng: random.Random) -> tuple[Event, Received]:
        """Invite `user_key` (it then joins from its own replica)."""
        spec = actions.membership_spec(user_key, Membership.INVITE)
        return self._publish_spec(spec, now_ms, rng)

    def ban(self, user_key: bytes, now_ms: int, rng: random.Random,
            reason: str | None = None) -> tuple[Event, Received]:
        """Ban `user_key` (`reason`, if given, goes into the member event)."""
        extra = {} if reason is None else {"reason": reason}
        spec = actions.membership_spec(user_key, Membership.BAN, **extra)
        return self._publish_spec(spec, now_ms, rng)

    def join(self, now_ms: int, rng: random.Random,
             relayed: bool = False) -> tuple[Event, Received]:
        """Join as the local identity (after an invite, or under a public join rule).

        `relayed=True` declares this device a relayed writer (see node.state.roles).
        """
        extra = {"relayed": True} if relayed else {}
        spec = actions.membership_spec(self.identity.public_key, Membership.JOIN, **extra)
        return self._publish_spec(spec, now_ms, rng)

    def add_writer(self, user_key: bytes, now_ms: int,
                   rng: random.Random) -> tuple[tuple[Event, Received], ...]:
        """Invite `user_key` (unless joined or invited) and give it the writing level.

        Returns every event made, in order (none if it is a writer already).
        """
        specs = actions.writer_specs(self._view(), user_key)
        return self._publish_specs(specs, now_ms, rng)

    def set_role(self, user_key: bytes, role: Role, now_ms: int,
                 rng: random.Random) -> tuple[tuple[Event, Received], ...]:
        """Give `user_key` a writer role (mapping in node.state.actions); events made, in order.

        RoleError if the role cannot be given by this identity at all (the
        relayed flag of another member); NotAuthorizedError if it lacks power.
        """
        specs = actions.role_specs(self._view(), self.identity.public_key, user_key, role)
        return self._publish_specs(specs, now_ms, rng)

    def _view(self) -> StateView:
        return StateView(self._current_state(), self.graph)

    def _publish_spec(self, spec: EventSpec, now_ms: int,
                      rng: random.Random) -> tuple[Event, Received]:
        payload = pack_payload(dict(spec.content))
        return self.publish(payload, now_ms, rng, kind=spec.kind, state_key=spec.state_key)

    def _publish_specs(self, specs: list[EventSpec], now_ms: int,
                       rng: random.Random) -> tuple[tuple[Event, Received], ...]:
        # Check them all against the current state before signing the first,
        # so a refusal never leaves half an operation behind. (The events of
        # one operation touch different keys, so each one's verdict does not
        # depend on the others.)
        parents = tuple(self.graph.extremities())
        for spec in specs:
            payload = pack_payload(dict(spec.content))
            self._checked(self._draft(spec.kind, spec.state_key, payload, parents, 0, now_ms))
        return tuple(self._publish_spec(spec, now_ms, rng) for spec in specs)
