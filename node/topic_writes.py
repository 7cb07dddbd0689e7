"""What this node authors, each made inside a step of the committer (the only writer).

Publishes and state actions come from applications (through `Topic`); acks
and membership joins are the ticker's duties. Every one is made inside a
committer step, so it is durable in the same commit as the events it cites
and announced only after that commit (node.committer). The replica decides
what may be authored (auth rules, ack pacing); this module turns its refusals
into `NodeError` for users and keeps the all-or-nothing of a batch publish.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence

from node.committer import CommitError, Committer
from node.core.event import Event, EventFormatError
from node.core.outcomes import RejectReason
from node.errors import (Banned, NodeError, NotAMember, NotAWriter, PayloadTooLarge,
                         TopicLeft)
from node.replica.replica import StateDisabledError
from node.state.actions import NotAuthorizedError, RoleError
from node.state.types import Membership
from node.topic_handle import JOIN_RETRY_MS, StateAction, Topic

logger = logging.getLogger("megnode")


def format_refusal(exc: EventFormatError) -> NodeError:
    """A local event the format refuses (too large, a kind too long): the user's mistake."""
    if exc.reason is RejectReason.TOO_LARGE:
        return PayloadTooLarge(f"the event would be too large ({exc.detail})")
    return NodeError(f"not a valid event: {exc}")


class TopicWrites:
    """Authors a node's events through its committer (implements `TopicAuthor`)."""

    def __init__(self, committer: Committer, topics: Mapping[bytes, Topic],
                 rng: random.Random) -> None:
        self._committer = committer
        self._topics = topics  # the node's live table of joined topics
        self._rng = rng

    # ------------------------------------------------------------------ for applications

    async def publish_many(self, topic: Topic, payloads: Sequence[bytes],
                           kind: str) -> list[bytes]:
        """Author the events in the committer's next batch (one group commit with whatever
        else arrived); their ids once that commit returned and they were sent on."""
        if not payloads:
            return []
        self._check_publishable(topic)
        replica = topic.replica

        def make(now: int) -> list[Event]:  # runs inside the batch step
            events: list[Event] = []
            try:
                for payload in payloads:
                    events.append(replica.publish(payload, now, self._rng, kind=kind)[0])
            except Exception as exc:  # whatever refused one event refuses the batch
                if events:
                    replica.graph.discard_pending()  # all or nothing
                if isinstance(exc, NotAuthorizedError):
                    raise self._refusal(topic, exc) from None
                if isinstance(exc, EventFormatError):
                    raise format_refusal(exc) from None
                raise
            return events

        try:
            events = await self._committer.author(topic.topic_id, make)
        except CommitError as exc:
            raise NodeError(f"publish not stored: {exc}") from None
        return [e.id for e in events]

    async def state_action(self, topic: Topic, action: StateAction) -> list[bytes]:
        """Run a state-changing replica action in the committer's next step; the ids of
        its events once that commit returned and they were sent on."""
        self._check_publishable(topic)
        replica = topic.replica

        def make(now: int) -> list[Event]:  # runs inside the committer's step
            try:
                made = action(replica, now, self._rng)
            except (NotAuthorizedError, RoleError, StateDisabledError) as exc:
                raise NodeError(str(exc)) from None
            except EventFormatError as exc:  # e.g. set_state content over the event limit
                raise format_refusal(exc) from None
            return [event for event, _ in made]

        try:
            events = await self._committer.author(topic.topic_id, make)
        except CommitError as exc:
            raise NodeError(f"state change not stored: {exc}") from None
        return [e.id for e in events]

    @staticmethod
    def _refusal(topic: Topic, exc: NotAuthorizedError) -> NotAMember:
        """The auth rules' refusal as the error an application tells apart."""
        membership = topic.membership()
        if membership == Membership.BAN:
            return Banned(f"not allowed to publish: banned from topic {topic.id_hex}")
        if membership != Membership.JOIN:
            return NotAMember(f"not allowed to publish: not a joined member of topic "
                              f"{topic.id_hex} (membership: {membership or 'none'}; join it "
                              f"first: `megnode topic join {topic.id_hex} --wait`)")
        return NotAWriter(f"not allowed to publish: not a writer in topic {topic.id_hex} "
                          f"({exc}; an admin grants it: `megnode topic add-writer`)")

    def _check_publishable(self, topic: Topic) -> None:
        if topic.topic_id not in self._topics:
            raise TopicLeft("this topic was left")
        if not topic.ready:
            raise NodeError("the topic's create event has not arrived yet; wait for sync "
                            "(Topic.wait_ready) before publishing")

    # ------------------------------------------------------------------ the ticker's duties

    def tick_duties(self, now: int) -> list[tuple[bytes, Event]]:
        """The ticker's authoring, run inside the committer's step after the engine's tick."""
        return self.pursue_memberships(now) + self.acknowledge(now)

    def acknowledge(self, now: int) -> list[tuple[bytes, Event]]:
        """Indexers append empty acks so confirmation does not stall when writers go quiet
        (rate-limited inside the replica; see Replica.maybe_ack). Runs inside a committer
        step; returns the acks, which the committer announces once durable.

        Nothing is caught here. A replica that is ready and authorizing (checked
        first: otherwise `maybe_ack` could raise NotReadyError or StateDisabledError)
        answers None itself when it has no order to ack (ordering off), no vote due
        (not an indexer, nothing new) or no power to ack (the auth rules refuse:
        it counts `acks_not_authorized`). Anything it raises past that is a bug:
        it fails the committer's step, which logs it and retries on the next tick.
        """
        made_here: list[tuple[bytes, Event]] = []
        for topic in self._topics.values():
            replica = topic.replica
            if not replica.ready or not replica.authorizing:
                continue
            made = replica.maybe_ack(now, self._rng)
            if made is not None:
                made_here.append((topic.topic_id, made[0]))
        return made_here

    def pursue_memberships(self, now: int) -> list[tuple[bytes, Event]]:
        """Join topics we asked to join, once their state says we may (rate-limited).
        Runs inside a committer step; returns the joins to announce once durable."""
        joins: list[tuple[bytes, Event]] = []
        for topic in self._topics.values():
            if not topic.wants_membership or now - topic.last_join_attempt_ms < JOIN_RETRY_MS:
                continue
            replica = topic.replica
            if not replica.ready or not replica.authorizing:
                continue
            if topic.membership() == Membership.JOIN:
                topic.wants_membership = False
                continue
            topic.last_join_attempt_ms = now
            try:
                event, _ = replica.join(now, self._rng)
            except NotAuthorizedError as exc:
                logger.info("cannot join %s yet: %s", topic.id_hex, exc)
                topic.join_refusal = str(exc)
                continue
            joins.append((topic.topic_id, event))
        return joins
