"""The handle on one joined topic: publishing, state actions, subscriptions, status.

`Topic` is what an application holds (`node.create_topic`, `node.join`). It
reads its replica directly (the core runs on the trio thread, so a read never
interleaves with a write) and authors through its node (`TopicAuthor`: the
committer, the only writer). Subscribers wait on `TopicChanges`, which the
runtime wakes after every step that may have moved the topic. Kept apart from
the `Node` so the application-facing API of a topic reads at once, and so the
node's wiring does not have to be read to understand a subscription.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from node.core.event import KIND_DUMMY, MAX_PAYLOAD_BYTES, Event
from node.errors import Banned, JoinTimeout, NodeError, PayloadTooLarge, TopicLeft
from node.replica.delivery_count import COUNT_READ_BACK_PAGE, DeliveryCount
from node.replica.order_views import ORDER_CAUSAL, ORDER_CONFIRMED, ORDERS, Rewind
from node.replica.ordering import KIND_ACK
from node.replica.replica import Received, Replica
from node.state.roles import Role

SUBSCRIBE_BATCH = 256  # deliveries read from the store per wake-up
# Delivered events read back per slice by `Node.count_deliveries` (6-14 us each: the
# history of a topic stored without a kept count; a kept one is read at no cost,
# `Replica.handed_count`), at most ~15 ms of the event loop; then the count pauses
# COUNT_PAUSE_S, not just a checkpoint: a frame passes three tasks between the
# socket and the committer, one scheduling round each, so with bare checkpoints a
# catch-up page waited out the whole count (the bench's status polls: 45 ms, at
# slices of 2,048).
COUNT_SLICE_EVENTS = 1_024
COUNT_PAUSE_S = 0.001
MAX_REJECT_REASONS_SHOWN = 32  # rejection reasons listed by status, the most frequent first
JOIN_RETRY_MS = 1_000  # membership pursuit: at most one join attempt per topic this often
# `publish` right after `join` waits (at most this long) for what it needs instead of
# failing on a race: the topic's create event, and this node's own join, which the
# membership pursuit writes on a later tick. Past it the precise refusal is raised.
PUBLISH_WAIT_S = 10.0
JOIN_WAIT_S = 10.0  # `Topic.joined()` / `Node.join(wait=True)`: default bound
# What `subscribe(kinds=...)` tells apart: an application's events ("message": any
# kind that is not state and not the protocol's own), state events (members, roles,
# set_state; the create event too), and the protocol's empty events (indexers'
# acks, depletion dummies), grouped as "ack".
KIND_MESSAGE_CLASS = "message"
KIND_STATE_CLASS = "state"
KIND_ACK_CLASS = "ack"
EVENT_CLASSES = (KIND_MESSAGE_CLASS, KIND_STATE_CLASS, KIND_ACK_CLASS)

# A state-changing replica action: (replica, now_ms, rng) -> what it made.
StateAction = Callable[[Replica, int, random.Random], Sequence[tuple[Event, Received]]]


class TopicAuthor(Protocol):
    """What a topic handle asks of its node: authoring, through the committer."""

    async def publish_many(self, topic: Topic, payloads: Sequence[bytes],
                           kind: str) -> list[bytes]: ...

    async def state_action(self, topic: Topic, action: StateAction) -> list[bytes]: ...


def event_class(event: Event) -> str:
    """Which of EVENT_CLASSES an event belongs to (what `subscribe(kinds=...)` filters)."""
    if event.state_key is not None:
        return KIND_STATE_CLASS
    if event.kind in (KIND_ACK, KIND_DUMMY):
        return KIND_ACK_CLASS
    return KIND_MESSAGE_CLASS


def check_kinds(kinds: Sequence[str] | None) -> frozenset[str] | None:
    """`kinds` as a set (None: every class); NodeError naming a class that is not one."""
    if kinds is None:
        return None
    unknown = sorted(set(kinds) - set(EVENT_CLASSES))
    if unknown or isinstance(kinds, str):
        raise NodeError(f"kinds must be among {', '.join(EVENT_CLASSES)}, not "
                        f"{', '.join(unknown) if unknown else repr(kinds)}")
    return frozenset(kinds)


@dataclass(frozen=True, slots=True)
class Delivered:
    """One event handed to a subscriber: its position in the topic's delivery order."""

    position: int
    event: Event


class TopicChanges:
    """Wakes subscribers when a topic's delivery count grows; ends them when it is left."""

    def __init__(self) -> None:
        self._event = trio.Event()
        self._closed = False

    def notify(self) -> None:
        self._event.set()
        self._event = trio.Event()

    def close(self) -> None:
        """The topic was left: every waiter (now or later) gets NodeError."""
        self._closed = True
        self.notify()

    async def wait(self) -> None:
        if not self._closed:
            await self._event.wait()
        if self._closed:
            raise TopicLeft("this topic was left")


class Topic:
    """A handle on one joined topic of a running node."""

    def __init__(self, node_id: str, replica: Replica, author: TopicAuthor) -> None:
        self._node_id = node_id
        self._author = author
        self.replica = replica
        self.topic_id = replica.topic_id
        self._changes = TopicChanges()
        self.wants_membership = False  # join as soon as the topic's state allows
        # What subscribers were handed (rejected events left out), counted
        # incrementally up to this delivery position: status's `delivered` and `acks`.
        self._counted_to = 0
        self._delivered = 0
        self._acks = 0
        self.last_join_attempt_ms = -JOIN_RETRY_MS
        self.join_refusal: str | None = None  # why the last membership pursuit could not join

    def membership(self) -> str | None:
        """This node's membership in the topic state ("join", "invite", ...), if any."""
        if not self.replica.ready or not self.replica.authorizing:
            return None
        membership = self.replica.membership_of(bytes.fromhex(self._node_id))
        return None if membership is None else str(membership)

    @property
    def private(self) -> bool:
        """True when only joined members may read the topic (its join rule, in the current
        state, is not public). False until the create event is here, and without state."""
        return self.replica.is_private()

    def state(self) -> dict[str, dict[str, Any]]:
        """The current resolved topic state as {"type|state_key": {sender, content}}."""
        out: dict[str, dict[str, Any]] = {}
        for (kind, key), event in sorted(self.replica.state().items()):
            try:
                content = event.content()
            except Exception:
                content = None
            out[f"{kind}|{key}"] = {"event": event.id.hex(), "sender": event.author.hex(),
                                    "content": content}
        return out

    def _order_status(self) -> dict[str, Any] | None:
        if not self.replica.ready or not self.replica.authorizing:
            return None
        status = self.replica.order_status()
        return None if status is None else status.as_dict()

    async def set_state(self, kind: str, state_key: str, content: dict[str, Any]) -> bytes:
        return (await self._author.state_action(
            self, lambda r, n, g: [r.set_state(kind, state_key, content, n, g)]))[-1]

    async def invite(self, key: bytes) -> bytes:
        return (await self._author.state_action(self, lambda r, n, g: [r.invite(key, n, g)]))[-1]

    async def add_writer(self, key: bytes) -> bytes | None:
        """Make `key` a writer; the id of the last event that did, or None if it already was."""
        made = await self._author.state_action(self, lambda r, n, g: list(r.add_writer(key, n, g)))
        return made[-1] if made else None

    async def set_role(self, key: bytes, role: str) -> bytes | None:
        """Give `key` a role; the id of the last event that did, or None if it had it already."""
        try:
            parsed = Role(role)
        except ValueError:
            raise NodeError(f"role must be one of {', '.join(r.value for r in Role)}") from None
        made = await self._author.state_action(
            self, lambda r, n, g: list(r.set_role(key, parsed, n, g)))
        return made[-1] if made else None

    async def ban(self, key: bytes, reason: str | None = None) -> bytes:
        return (await self._author.state_action(
            self, lambda r, n, g: [r.ban(key, n, g, reason=reason)]))[-1]

    def wake_subscribers(self) -> None:
        """The topic may have moved: its waiting subscribers look again."""
        self._changes.notify()

    def end_subscriptions(self) -> None:
        """The topic was left: its subscribers end (NodeError) instead of waiting for ever."""
        self._changes.close()

    @property
    def id_hex(self) -> str:
        return self.topic_id.hex()

    @property
    def ready(self) -> bool:
        """True once the topic's create event is here (publishing needs it)."""
        return self.replica.ready

    async def publish(self, payload: bytes, kind: str = "message") -> bytes:
        """Author an event; returns its id once it is durable (LMDB commit) and sent on.

        Waits (at most PUBLISH_WAIT_S) for the topic's create event and for this
        node's own join when a join is under way, so `join` then `publish` never
        fails on a race. Raises PayloadTooLarge (over MAX_PAYLOAD_BYTES), NotAMember /
        NotAWriter / Banned (the topic's rules refuse), TopicLeft.
        """
        return (await self.publish_many([payload], kind))[0]

    async def publish_many(self, payloads: Sequence[bytes], kind: str = "message") -> list[bytes]:
        """Author several events in one group commit; their ids once all are durable.
        All or nothing: a refusal stores none of them (errors as for `publish`)."""
        for index, payload in enumerate(payloads):
            if len(payload) > MAX_PAYLOAD_BYTES:
                where = f"payload {index + 1} of {len(payloads)}: " if len(payloads) > 1 else ""
                raise PayloadTooLarge(f"{where}{len(payload)} bytes, over the limit of "
                                      f"{MAX_PAYLOAD_BYTES} bytes per event (MAX_PAYLOAD_BYTES)")
        await self._until_publishable()
        return await self._author.publish_many(self, payloads, kind)

    async def _until_publishable(self) -> None:
        """Wait (bounded) for the create event and a join under way; a refusal is left to
        the authoring step, which names it precisely."""
        if self.ready and not self.wants_membership:
            return
        with trio.move_on_after(PUBLISH_WAIT_S):
            while not self.ready:
                await self._changes.wait()
            if self.wants_membership:
                await self.joined(timeout_s=None)

    async def joined(self, timeout_s: float | None = JOIN_WAIT_S) -> None:
        """Return once this node is a joined member of the topic (its join is in its own
        resolved state). Raises Banned, TopicLeft, or JoinTimeout after `timeout_s`
        (None: no bound) naming what the topic's rules said last."""
        with trio.move_on_after(float("inf") if timeout_s is None else timeout_s):
            while True:
                membership = self.membership()
                if membership == "join":
                    return
                if membership == "ban":
                    raise Banned(f"banned from topic {self.id_hex}")
                await self._changes.wait()
        why = self.join_refusal or ("the topic's state has not arrived yet" if not self.ready
                                    else f"membership is {self.membership() or 'none'}")
        raise JoinTimeout(f"not a joined member of topic {self.id_hex} after {timeout_s:g} s: "
                          f"{why}")

    def _check_not_banned(self) -> None:
        """A banned node's subscription ends (it receives nothing more there)."""
        if self.membership() == "ban":
            raise Banned(f"banned from topic {self.id_hex}")

    async def wait_changed(self) -> None:
        """Wait until the topic may have moved (after a committer step or a peer change);
        NodeError once it was left."""
        await self._changes.wait()

    async def wait_ready(self, timeout_s: float) -> None:
        with trio.fail_after(timeout_s):
            while not self.ready:
                await self._changes.wait()

    async def wait_delivered(self, count: int, timeout_s: float) -> None:
        """Wait until at least `count` events (create event included) are delivered here."""
        with trio.fail_after(timeout_s):
            while self.replica.graph.delivered_count < count:
                await self._changes.wait()

    async def subscribe(self, since: int | bytes = 0, order: str = "causal",
                        kinds: Sequence[str] | None = None
                        ) -> AsyncIterator[Delivered | Rewind]:
        """Events from position `since` on (or after the event whose id `since` is),
        waiting for more; only the EVENT_CLASSES in `kinds` (None: every event).

        Positions are those of the whole order, filtered or not, so a position + 1
        resumes a filtered subscription too. It ends with TopicLeft when the topic is
        left and Banned once this node's own state holds its ban (an open topic's
        members send it; an invite topic's hand a banned node its own ban and nothing after).

        order="causal": every delivered event, never before its parents (default).
        order="confirmed": the quorum-confirmed total order; positions never change.
        order="tentative": the full order (confirmed prefix, then the tentative
        tail), which may reorder: a `Rewind(to_length)` item says to drop every
        entry from position `to_length` on; the `Delivered` items after it replay
        from there. Each `Delivered` position is the subscriber's current length
        (positions from `since` on are watched). Only these yield `Rewind`.
        """
        wanted = check_kinds(kinds)
        if order not in ORDERS:
            raise NodeError('subscribe order must be "causal", "confirmed" or "tentative"')
        if isinstance(since, bytes):
            since = await self.position_after(since, order)
        async for item in self._subscribe(since, order):
            if (wanted is None or isinstance(item, Rewind)
                    or event_class(item.event) in wanted):
                yield item

    async def position_after(self, event_id: bytes, order: str = "causal") -> int:
        """The position just after `event_id` in `order` (a resume point); NodeError if
        it is not there. Scans the order in pages (a resume is rare; ids are not indexed
        by position)."""
        position = 0
        while True:
            if order == ORDER_CAUSAL:
                page = self.replica.deliveries(since=position, limit=SUBSCRIBE_BATCH * 4)
            elif self.replica.ready and self.replica.authorizing:
                page = self.replica.ordered(order, since=position, limit=SUBSCRIBE_BATCH * 4)
            else:
                page = []
            for pos, event in page:
                if event.id == event_id:
                    return pos + 1
            if not page:
                raise NodeError(f"event {event_id.hex()} is not in this topic's {order} order "
                                "here")
            position = page[-1][0] + 1
            await trio.sleep(0)  # a long scan leaves the node's other work its turn

    async def _subscribe(self, since: int, order: str) -> AsyncIterator[Delivered | Rewind]:
        if order != ORDER_CAUSAL:
            view = self._subscribe_confirmed if order == ORDER_CONFIRMED else self._subscribe_tentative
            async for item in view(since):
                yield item
            return
        position = since
        while True:
            batch = self.replica.deliveries(since=position, limit=SUBSCRIBE_BATCH)
            if not batch:
                if position < self.replica.graph.delivered_count:
                    position = self.replica.graph.delivered_count  # only rejected events there
                    continue
                self._check_not_banned()
                await self._changes.wait()
                continue
            for pos, event in batch:
                yield Delivered(pos, event)
                position = pos + 1

    async def _subscribe_confirmed(self, since: int) -> AsyncIterator[Delivered]:
        position = since
        while True:
            batch = (self.replica.ordered("confirmed", since=position, limit=SUBSCRIBE_BATCH)
                     if self.replica.ready and self.replica.authorizing else [])
            if not batch:
                self._check_not_banned()
                await self._changes.wait()
                continue
            for pos, event in batch:
                if not event.withheld:  # a payload this member may not read (history)
                    yield Delivered(pos, event)
                position = pos + 1

    async def _subscribe_tentative(self, since: int) -> AsyncIterator[Delivered | Rewind]:
        position = since  # the subscriber's length
        stable = since  # entries sent below this were confirmed: they never change
        sent: list[bytes] = []  # ids sent at positions stable .. position - 1
        while True:
            order = self.replica.ordering if self.replica.ready and self.replica.authorizing else None
            if order is None:
                self._check_not_banned()
                await self._changes.wait()
                continue
            # The order may have changed while the consumer held an item: compare
            # what was sent with the current view; only unconfirmed entries can differ.
            current = order.full_slice(stable, len(sent))
            keep = next((i for i, (_, now) in enumerate(current) if sent[i] != now), len(current))
            if keep < len(sent):
                del sent[keep:]
                position = stable + keep
                yield Rewind(position)
            settled = min(order.confirmed_length, position) - stable
            if settled > 0:
                del sent[:settled]
                stable += settled
            batch = self.replica.ordered("tentative", since=position, limit=SUBSCRIBE_BATCH)
            if not batch:
                self._check_not_banned()
                await self._changes.wait()
                continue
            for pos, event in batch:
                if not event.withheld:  # a payload this member may not read (history)
                    yield Delivered(pos, event)
                sent.append(event.id)
                position = pos + 1

    def count_delivered(self, limit: int | None = None) -> bool:
        """Bring the count of what subscribers were handed up to date, reading at most
        about `limit` events back from the store (None: no bound); True once it is.

        The replica keeps the count as it applies events (`Replica.handed_count`,
        node.replica.delivery_count): reading it costs nothing. A topic stored by a
        build from before that has none (or one behind, if such a build ran since):
        its events are read back and judged as `Replica.deliveries` judges them,
        once, from where the last call (or the kept count) stopped: about 14 s per
        million events, so a caller on the event loop counts in slices
        (`Node.count_deliveries`, which then hands the count to the replica).
        """
        replica = self.replica
        kept = replica.handed_count
        if kept is not None and (replica.keeps_count or self._counted_to < kept.end):
            # Up to date; or behind (an older build applied events since): on from there.
            self._counted_to, self._delivered, self._acks = kept.end, kept.delivered, kept.acks
        read_back = 0
        while self._counted_to < replica.graph.delivered_count and (
                limit is None or read_back < limit):
            page = COUNT_READ_BACK_PAGE if limit is None \
                else min(COUNT_READ_BACK_PAGE, limit - read_back)
            counted = replica.count_delivered(self._counted_to, replica.graph.delivered_count, page)
            self._delivered += counted.delivered
            self._acks += counted.acks
            read_back += counted.end - counted.start
            self._counted_to = counted.end
        return self._counted_to >= replica.graph.delivered_count

    def counted(self) -> DeliveryCount | None:
        """What the last `count_delivered` read back, if the replica keeps no count that
        is up to date (to hand it over: `Replica.adopt_count`)."""
        if self.replica.keeps_count:
            return None
        return DeliveryCount(0, self._counted_to, self._delivered, self._acks)

    def _count_delivered(self) -> tuple[int, int]:
        """(events delivered to subscribers, empty acknowledgements among them), up to date."""
        self.count_delivered()
        return self._delivered, self._acks

    def status(self) -> dict[str, Any]:
        """This topic's part of `Node.status` (docs/control.md lists the fields)."""
        graph = self.replica.graph
        delivered, acks = self._count_delivered()
        return {
            "topic": self.id_hex,
            "name": self.replica.params.name,
            "ready": self.ready,
            "delivered": delivered,  # handed to subscribers: rejected events are not
            "acks": acks,  # empty acknowledgements among the delivered
            "withheld": self.replica.counters["withheld"],  # received without payload (history)
            # Kept for convergence, never delivered: a banned author's writes that do not
            # see its ban (node.state.soft_fail), since start.
            "soft_failed": self.replica.counters["soft_failed"],
            "extremities": graph.width,
            "buffered": graph.buffered_count,
            "equivocations": graph.equivocation_count,
            "membership": self.membership(),
            "indexers": sorted(k.hex() for k in self.replica.indexers())
            if self.replica.ready and self.replica.authorizing else [],
            "order": self._order_status(),
            "rejected": most_common({k.split(".", 1)[1]: v for k, v in self.replica.counters.items()
                                     if k.startswith("rejected.")}, MAX_REJECT_REASONS_SHOWN),
        }


def most_common(counts: dict[str, int], limit: int) -> dict[str, int]:
    """The `limit` largest counts, largest first (ties by name): a bounded status field."""
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit])


def parse_topic_id(value: bytes | str) -> bytes:
    """A topic id from 32 bytes or 64 hex characters; NodeError naming what is wrong."""
    if isinstance(value, bytes):
        if len(value) != 32:
            raise NodeError("a topic id is 32 bytes")
        return value
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise NodeError(f"not a topic id (64 hex characters): {value!r}")
    return raw
