"""Making local events: what a replica signs as its own identity (or prepares for a
relayed device to sign), checked against the auth rules before anything is signed.

`Replica` (node.replica.replica) mixes this in; it holds the graph, the state
tracker and the order these methods read. Kept apart from receiving because
authoring has concerns of its own: choosing parents (the policy up to d_max,
keeping the author's chain and pending relayed events), numbering the
author's events, choosing auth refs and refusing before signing
(`NotAuthorizedError`), and the two kinds a replica emits on its own:
dummies (`maybe_deplete`, when the graph is too wide) and acknowledgements
(`maybe_ack`, when the total order needs a vote).

Every event made here is added to the graph at once but is durable only when
committed: in a running node by the committer (node.committer), the node's
only writer, at the end of the step that made it; standalone, by
`Replica.commit()`. Nobody is told of it before then.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING

from node.core.outcomes import AddStatus
from node.core.event import EVENT_VERSION, KIND_CREATE, KIND_DUMMY, KIND_MESSAGE, Event
from node.core.graph import Graph
from node.core.identity import Identity, sign_event
from node.core.parents import select_parents, select_share
from node.replica.order_duties import own_tip
from node.replica.ordering import KIND_ACK, TopicOrder
from node.replica.types import NotReadyError, PublishError, Received, ReplicaConfig, TopicParams
from node.state import actions
from node.state.actions import NotAuthorizedError, RoleError
from node.state.auth_rules import EventFields, select_auth_refs
from node.state.roles import Role
from node.state.soft_fail import SoftFails
from node.state.tracker import StateResolutionError, StateTracker
from node.state.types import TYPE_MEMBER, AuthReason
from node.state.view import StateView
# Soft-failed events walked below the heads when every head is soft-failed.
MAX_SOFT_FAILED_WALK = 65_536

if TYPE_CHECKING:
    from node.core.add_result import AddResult


class Authoring:
    """The authoring half of `Replica` (see the module docstring)."""

    if TYPE_CHECKING:
        # What authoring reads of the Replica it is part of (node.replica.replica).
        topic_id: bytes
        identity: Identity
        config: ReplicaConfig
        graph: Graph
        counters: Counter[str]
        _last_dummy_ms: int | None

        @property
        def params(self) -> TopicParams: ...
        @property
        def ready(self) -> bool: ...
        @property
        def authorizing(self) -> bool: ...
        @property
        def tracker(self) -> StateTracker: ...
        @property
        def ordering(self) -> TopicOrder | None: ...
        @property
        def soft_fails(self) -> SoftFails: ...
        def role_of(self, key: bytes) -> Role: ...
        def _outcome(self, result: AddResult) -> Received: ...

    def publish(
        self,
        payload: bytes,
        now_ms: int,
        rng: random.Random,
        kind: str = KIND_MESSAGE,
        state_key: str | None = None,
        *,
        share: int | None = None,
    ) -> tuple[Event, Received]:
        """Author, sign and add an event on top of the current extremities.

        Returns the event and the graph outcome (which lists it under
        `applied`). Durable once committed (module docstring). On an authorized topic the
        event is checked against the state before it first, and refused with
        NotAuthorizedError (nothing signed) if the auth rules forbid it.
        `share`: for a dummy written with others at once, which run of the
        extremities it merges (`node.core.parents.select_share`).
        """
        if not self.ready:
            raise NotReadyError("the topic's create event has not arrived yet; wait for sync")
        if kind == KIND_CREATE:
            raise PublishError("a topic has exactly one create event")
        parents = self._choose_parents(rng, kind, share)
        latest = self.graph.author_latest_seq(self.identity.public_key)
        seq = (latest if latest is not None else -1) + 1
        auth: tuple[bytes, ...] = (self.topic_id,)
        if self.authorizing:
            draft = self._draft(kind, state_key, payload, parents, seq, now_ms)
            auth = self._checked(draft).auth
        event = sign_event(
            self.identity, topic=self.topic_id, seq=seq, parents=parents, timestamp_ms=now_ms,
            kind=kind, payload=payload, state_key=state_key, auth=auth,
        )
        # fresh: seq is above the author's latest here, so the id cannot be applied yet.
        outcome = self._outcome(self.graph.add(event, fresh=True))
        if outcome.status is not AddStatus.APPLIED:
            raise PublishError(f"local event not applied: {outcome.status} {outcome.reason}")
        if outcome.unauthorized:  # the check above passed: only a bug gets here
            raise PublishError(f"local event rejected: {outcome.unauthorized[0][1]}")
        self.counters["created"] += 1
        return event, outcome

    def _choose_parents(self, rng: random.Random, kind: str = KIND_MESSAGE,
                        share: int | None = None) -> list[bytes]:
        """Parents of a local event: the policy's choice (or a dummy's `share`), keeping
        the author's chain and pending relayed events when the width exceeds d_max."""
        extremities = self._buildable_extremities()
        d_max = self.params.d_max
        if kind == KIND_DUMMY:  # a dummy only merges: it may name more (node.core.parents)
            d_max = self.config.depletion.dummy_parents(d_max)
        parents = self._policy_parents(extremities, d_max, rng, kind, share)
        if self.authorizing and len(extremities) < self.graph.width:
            return self._with_own_chain(parents, d_max)  # some head is soft-failed
        return parents

    def _with_own_chain(self, parents: list[bytes], d_max: int) -> list[bytes]:
        """`parents`, with our latest event among them if no parent has it in its past
        because the only head above it is soft-failed (never a parent here).

        Else our chain would break, and our own join could be missing from the state
        the event is checked in: seed 11 of the 40-node private banned world, where a
        member's join was covered only by the banned member's soft-failed write, and
        its publish was refused as "not a joined member" though its state said joined.
        It takes the place of the last other parent if there are d_max of them, and
        only if the set stays an antichain (if not, a parent has it in its past).
        """
        me = self.identity.public_key
        seq = self.graph.author_latest_seq(me)
        if seq is None:
            return parents
        latest = max(self.graph.events_by(me, seq))
        if latest in parents or not self.graph.has(latest) \
                or self.soft_fails.is_soft_failed(latest):
            return parents
        tip = own_tip(self.graph, me)
        if tip is None or not self.soft_fails.is_soft_failed(tip):
            return parents
        candidate = sorted((parents if len(parents) < d_max else parents[:-1]) + [latest])
        if not self.graph.forms_antichain(candidate):
            return parents
        self.counters["own_chain_kept_below_soft_failed"] += 1
        return candidate

    def _policy_parents(self, extremities: list[bytes], d_max: int, rng: random.Random,
                        kind: str, share: int | None) -> list[bytes]:
        if len(extremities) <= d_max:
            return extremities  # all of them, sorted: what every policy picks, no rng drawn
        policy, depth = self.config.parent_policy, (lambda i: self.graph.depth(i) or 0)

        def pick(pool: list[bytes], count: int) -> list[bytes]:
            if kind == KIND_DUMMY and share is not None:
                return select_share(pool, count, share)
            return select_parents(pool, count, policy, rng, depth)

        order = self.ordering
        if order is None:
            return pick(extremities, d_max)
        me = self.identity.public_key
        keep = [k for k in order.parents_to_keep(me, self.role_of(me) is Role.RELAYED)
                if not self.soft_fails.is_soft_failed(k)][:d_max]
        rest = [e for e in extremities if e not in set(keep)]
        chosen = pick(rest, d_max - len(keep)) if len(keep) < d_max else []
        return sorted(keep + chosen)

    def sign_on(self, parents: tuple[bytes, ...], payload: bytes, now_ms: int,
                kind: str = KIND_MESSAGE) -> Event:
        """Sign an event of the local identity on chosen `parents`, checked against their
        state; nothing is added. For tests and the seeded world's banned writer, which
        keeps writing on parents from before its ban (node.state.soft_fail)."""
        latest = self.graph.author_latest_seq(self.identity.public_key)
        seq = (latest if latest is not None else -1) + 1
        draft = self._checked(self._draft(kind, None, payload, parents, seq, now_ms))
        return sign_event(self.identity, topic=self.topic_id, seq=seq, parents=draft.parents,
                          timestamp_ms=now_ms, kind=kind, payload=payload, state_key=None,
                          auth=draft.auth)

    def _buildable_extremities(self) -> list[bytes]:
        """The forward extremities a local event may build on: soft-failed ones left out.

        A soft-failed head (node.state.soft_fail) stays an extremity of the
        graph (anti-entropy offers it) but is never a parent here. If every
        head is soft-failed, the walk goes down their parents to the first
        events that are not, and the deepest of those is the one parent (one
        parent is always an antichain; several found this way may not be).
        """
        extremities = self.graph.extremities()
        if not self.authorizing:
            return extremities
        soft = self.soft_fails
        kept = [e for e in extremities if not soft.is_soft_failed(e)]
        if kept or not extremities:
            return kept
        below: list[bytes] = []
        stack, seen = list(extremities), set(extremities)
        while stack and len(seen) <= MAX_SOFT_FAILED_WALK:
            for parent in self.graph.parents_of(stack.pop()) or ():
                if parent in seen:
                    continue
                seen.add(parent)
                (stack if soft.is_soft_failed(parent) else below).append(parent)
        if not below:
            raise PublishError("every head of this topic is soft-failed here, and no event "
                               f"below them was found within {MAX_SOFT_FAILED_WALK}")
        return [max(below, key=lambda i: (self.graph.depth(i) or 0, i))]

    def _draft(self, kind: str, state_key: str | None, payload: bytes,
               parents: tuple[bytes, ...] | list[bytes], seq: int, now_ms: int) -> Event:
        """The event as it would be signed, unsigned, auth refs not chosen yet."""
        return Event(
            version=EVENT_VERSION, topic=self.topic_id, author=self.identity.public_key, seq=seq,
            parents=tuple(sorted(parents)), auth=(), timestamp_ms=now_ms, kind=kind,
            state_key=state_key, payload=payload, signature=b"", raw=b"", id=b"", digest=b"",
        )

    def _checked(self, draft: Event) -> Event:
        """`draft` with its auth refs, if the auth rules allow it; else NotAuthorizedError."""
        tracker = self.tracker
        try:
            before = tracker.group_before(draft.parents)
        except StateResolutionError as error:
            # Every replica would reject this event as state_unresolvable.
            raise NotAuthorizedError(AuthReason.STATE_UNRESOLVABLE, (
                f"the states of this topic's heads cannot be resolved ({error}); an event "
                "on these parents would be rejected everywhere")) from None
        state = tracker.state(before)
        fields = (EventFields.of(draft) if draft.kind == TYPE_MEMBER
                  else EventFields(draft.kind, draft.author, draft.state_key))
        draft = replace(draft, auth=tuple(select_auth_refs(fields, state)))
        reason = tracker.check(draft, before)
        if reason is not None:
            raise NotAuthorizedError(reason, actions.explain(draft, reason,
                                                             StateView(state, self.graph)))
        return draft

    def maybe_deplete(self, now_ms: int, rng: random.Random,
                      share: int | None = None) -> tuple[Event, Received] | None:
        """Emit a dummy event if the width is over the depletion threshold (rate-limited).

        On an authorized topic only a joined member may send one; others skip.
        `share`: this dummy's run of the extremities when several are written at
        once (transport.depletion decides; None: the parent policy's pick).
        """
        if not self.ready:
            return None
        if not self.config.depletion.due(self.graph.width, now_ms, self._last_dummy_ms):
            return None
        if self.authorizing:
            buildable = len(self._buildable_extremities())
            if buildable < self.graph.width and not self.config.depletion.over(buildable):
                return None  # the rest are soft-failed heads, which a dummy may not merge
        self._last_dummy_ms = now_ms
        try:
            made = self.publish(b"", now_ms, rng, kind=KIND_DUMMY, share=share)
        except NotAuthorizedError:
            self.counters["dummies_not_authorized"] += 1
            return None
        self.counters["dummies"] += 1
        return made

    def maybe_ack(self, now_ms: int, rng: random.Random) -> tuple[Event, Received] | None:
        """Append an empty acknowledgement (kind "ack") if the order needs one now.

        An indexer acks while some non-ack event is unconfirmed and it has
        something new to vote on (a lone indexer: until its writes are
        confirmed); any writer acks to reference pending relayed events; at
        most once per `ReplicaConfig.ordering.ack_interval_ms`. Durable once
        committed, like `publish`. In a running node the node's tick duties
        call it (node.runtime, `_acknowledge`) inside a committer `Tick` step,
        after the engine's tick; the committer commits the step, then announces
        the ack. The dissemination engine never calls it.
        """
        order = self.ordering if self.ready else None
        if order is None:
            return None
        me = self.identity.public_key
        if not order.ack_due(me, now_ms, lambda: self.role_of(me)):
            return None
        order.note_ack(now_ms)
        try:
            made = self.publish(b"", now_ms, rng, kind=KIND_ACK)
        except NotAuthorizedError:
            self.counters["acks_not_authorized"] += 1
            return None
        self.counters["acks"] += 1
        return made

    def sign_relayed(self, payload: bytes, now_ms: int, rng: random.Random,
                     kind: str = KIND_MESSAGE, state_key: str | None = None) -> Event:
        """Author an event as a relayed writer; the caller hands `event.raw` to a relay.

        Only for an identity whose role is RELAYED (RoleError otherwise). The
        event's parents are the current extremities (the previous own event's
        chain kept), and it is added to the local graph, so its sequence
        number is durable (never reused after a restart: that would be an
        equivocation), the next relayed event chains on it and its auth refs
        come from the local state. It is never a head of the order, here or
        anywhere: every replica keeps it aside until a writer references it.
        """
        me = self.identity.public_key
        if self.role_of(me) is not Role.RELAYED:
            raise RoleError("sign_relayed is for relayed writers; this identity is "
                            f"{self.role_of(me).value}: use publish")
        event, _ = self.publish(payload, now_ms, rng, kind=kind, state_key=state_key)
        self.counters["relayed_signed"] += 1
        return event

    def relayed_template(self, author: bytes, kind: str, state_key: str | None,
                         payload: bytes, now_ms: int,
                         rng: random.Random) -> tuple[int, tuple[bytes, ...], tuple[bytes, ...]]:
        """What a relayed device with key `author` needs to sign its next event here.

        Returns (seq, parents, auth refs). Parents keep the device's chain (the
        extremity above its latest event, as `publish` keeps the local
        author's) and the policy fills up to d_max; auth refs come from the
        state before those parents. The draft (`kind`, `state_key`,
        `payload`) is checked against the auth rules first: NotAuthorizedError
        (nothing to sign) if they refuse it. Nothing is added or signed here:
        the relay (node.relay) serves this to the device over the network.
        """
        if not self.ready:
            raise NotReadyError("the topic's create event has not arrived yet; wait for sync")
        if kind == KIND_CREATE:
            raise PublishError("a topic has exactly one create event")
        extremities = self._buildable_extremities()
        d_max = self.params.d_max
        order = self.ordering
        keep = ([k for k in order.parents_to_keep(author, True)
                 if not self.soft_fails.is_soft_failed(k)][:d_max] if order is not None else [])
        rest = [e for e in extremities if e not in set(keep)]
        depth = (lambda i: self.graph.depth(i) or 0)
        chosen = (select_parents(rest, d_max - len(keep), self.config.parent_policy, rng, depth)
                  if len(keep) < d_max else [])
        parents = tuple(sorted(keep + chosen))
        latest = self.graph.author_latest_seq(author)
        seq = (latest if latest is not None else -1) + 1
        auth: tuple[bytes, ...] = (self.topic_id,)
        if self.authorizing:
            draft = replace(self._draft(kind, state_key, payload, parents, seq, now_ms),
                            author=author)
            auth = self._checked(draft).auth
        return seq, parents, tuple(sorted(auth))
