"""A topic's consistent total order: the quorum linearizer, fed by a replica.

`node.core.order.Linearizer` orders abstract nodes. `TopicOrder` is the
glue between it and one topic's replica: which events it sees, as which
nodes, under which indexer set, what survives a restart, and when a node
should acknowledge. Sans-IO like the rest of the core: time comes in as
`now_ms`, nothing here draws randomness or does I/O of its own (the
confirmed prefix is written through the graph's write-set).

Theory of operation
-------------------
*What is ordered.* The replica applies events in causal order (the graph's
delivery order) and the state tracker judges each one; `catch_up` then
feeds the newly applied events, one `Linearizer.extend` per batch (a graph
cascade: the event received and the buffered descendants it released, so
the two siblings of a fork that arrive together are decided together):

    event e, judged by the auth rules          node given to the linearizer
    ----------------------------------------   ---------------------------------
    rejected (unauthorized; only a vertex in     none: e is a *proxy* for its
    a store from before the replica's gate,     parents; children that name e
    docs/state.md "Rejected events")            depend on e's parents instead
    author RELAYED in the state before e        OrderNode, kept aside (relayed)
    anything else                               OrderNode(e.id, e.author, n, deps)

`deps` are the parents with proxies replaced. `n` is the author's ordinal:
1 + the highest ordinal of the author's nodes in e's past (0 if none). For a
well-behaved writer, whose every event has its previous one in its past
(`node.replica.order_duties.own_tip` sees to that for local events), n == e.seq. For a writer that
breaks its chain n still numbers a chain, so two events with one ordinal are
a fork, which the linearizer's equivocation rule handles; nothing authorized
is ever left out, and the linearizer never meets a node it must refuse.
Everything above is a function of e's past, so every replica builds the same
nodes.

*Indexers.* The first set is the topic's creator (the first indexer, see
`node.state.roles`). The linearizer asks `role_change` about newly confirmed
nodes; the answer is the indexer set in the state after the newest confirmed
node - the anchor that ends the batch, whose past holds everything
confirmed - when it differs from the current set. So a role change takes
effect when the event that made it is confirmed, at the same point of the
confirmed order on every replica. A state with no indexer at all keeps the
previous set (the order would otherwise stall for ever).

*Relayed writers* and *acknowledgements*: what the order asks of a local
author (`parents_to_keep`, `ack_due`) is `node.replica.order_duties`,
mixed into `TopicOrder`.

*Persistence* (`TABLE_ORDER`, through `Graph.table`, so it commits with the
events it describes)::

    c|position (8)  -> event id     the confirmed prefix, append-only
    n               -> u64          its length
    b|start (8)     -> end (8)      a batch replay must feed as it was fed
    p|id            -> ids          a rejected event's ordered deps (its proxy)
    x|id            -> reason       a confirmed event excluded by a ban (order_bans)
    w|id, l|lane|seq, k             where each ordered node sits
                                    (`node.replica.order_records`)

The linearizer lives in memory. On restart `TopicOrder` replays the
delivery order and checks that the rebuilt confirmed prefix equals the
persisted one (`OrderIntegrityError` otherwise: the promise that confirmed
positions never change would be broken). How the delivery order is cut into
`extend` calls does not change the confirmed sequence - the linearizer's
guarantee: any causal feeding of the same nodes confirms the same - except
around a fork: the linearizer judges votes and anchors by the voting
nodes' pasts, so one sibling or both give the same answers, except where a
forked leader has two candidates that both reach a quorum (possible only
when equivocators make up a whole quorum overlap, see
`node.core.order.consensus`, "Forks"): there, which siblings a replica held
when it decided matters. So a batch that reveals a fork is recorded (its
delivery range), replay feeds it as one batch and everything between such
batches in chunks of REPLAY_BATCH: the decisions made live, at the cost of
one record per fork instead of one per batch.

*Bans that hold* (`node.replica.order_bans`). The views are the
linearizer's order with every event that fails the auth rules against the
order's own state at its position left out: a ban, kick or role loss takes
effect at its position in the order, identically on every replica. The
linearizer still orders the excluded events (nothing else moves); the
persisted confirmed prefix (`c|position`), its length and every position a
reader sees count only the events that stay. Excluded confirmed events are
recorded (`x|id`, for `is_excluded`); replay rebuilds the same exclusions
from the same confirmed sequence, and the persisted-prefix check covers them.

*Views* (causal, confirmed, tentative; `Rewind`, `OrderStatus`) are
described in `node.replica.order_views`.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from node.core.event import ID_BYTES as _ID_BYTES
from node.core.event import Event
from node.core.graph import Graph
from node.core.order import Linearizer, OrderNode, OrderUpdate
from node.core.order.linearizer import common_prefix
from node.replica.order_bans import OrderBans
from node.replica.order_duties import OrderDuties
from node.replica.order_records import OrderRecords
from node.replica.order_views import OrderStatus
from node.state.roles import Role
from node.state.roles import indexers as indexers_in
from node.state.roles import role_of as role_in
from node.state.tracker import StateTracker
from node.core.store import TABLE_ORDER, DamagedTopicError

KIND_ACK = "ack"

DEFAULT_ACK_INTERVAL_MS = 250  # at most one ack per interval per topic
REPLAY_PAGE = 1_024  # events read per page while replaying the delivery order
REPLAY_BATCH = 256  # events per `extend` between recorded batches (keeps the tail short)
ROLE_CACHE_SIZE = 4_096  # (state group, author) -> role
PROXY_CACHE_SIZE = 1_024  # rejected events' deps kept in memory (all are in the table)
UNCONFIRMED_CACHE_SIZE = 8_192  # fed, unconfirmed events kept for the ban check (else read back)

_CONFIRMED = b"c"
_COUNT = b"n"
_BATCH = b"b"
_PROXY = b"p"
_EXCLUDED = b"x"

_NO_GROUP = -1


def _u64(value: int) -> bytes:
    return value.to_bytes(8, "big")


class OrderIntegrityError(RuntimeError):
    """The rebuilt confirmed prefix differs from the persisted one (a bug or a damaged store)."""


@dataclass(frozen=True, slots=True)
class OrderConfig:
    """Ordering switches of a replica. `enabled=False`: no total order (causal only)."""

    enabled: bool = True
    ack_interval_ms: int = DEFAULT_ACK_INTERVAL_MS


class TopicOrder(OrderDuties):
    """The total order of one topic's authorized events (see the module docstring).

    Feeding, replay and persistence live here; what the order asks of a local
    author (`parents_to_keep`, `ack_due`) is `OrderDuties` (node.replica.order_duties).
    """

    def __init__(self, graph: Graph, tracker: StateTracker, config: OrderConfig = OrderConfig(),
                 replay_to: int | None = None, where_cache: int | None = None) -> None:
        root = graph.get(graph.topic_id)
        if root is None:
            raise ValueError("a topic order needs the topic's create event")
        self.config = config
        self.stats: Counter[str] = Counter()
        self._graph = graph
        self._tracker = tracker
        self._table = graph.table(TABLE_ORDER)
        self._lin = Linearizer(frozenset({root.author}), role_change=self._role_change,
                               directory=OrderRecords(self._table), cache_size=where_cache)
        self._fed = 0  # delivery positions consumed
        # Rejected event -> its ordered deps: recorded in the table (`p|id`), the
        # newest PROXY_CACHE_SIZE kept in memory; `_rejected` says whether any
        # was fed at all (until then no parent needs looking up).
        self._proxy: dict[bytes, tuple[bytes, ...]] = {}
        self._rejected = False
        self._aside: dict[bytes, OrderNode] = {}  # relayed, not referenced yet
        self._acks: set[bytes] = set()  # unconfirmed acks
        self._latest: dict[bytes, tuple[int, bytes]] = {}  # writer -> (ordinal, id), ordered nodes
        self._roles: OrderedDict[tuple[int, bytes], Role] = OrderedDict()
        self._role_cache_size = ROLE_CACHE_SIZE  # a node's cache budget may shrink it
        self._indexers_group = _NO_GROUP
        self._last_ack_ms: int | None = None
        self._vote_memo: tuple[Sequence[bytes], tuple[int, bytes] | None, bool] | None = None
        # The confirmed prefix lives in the table (`c|position`); this is its length.
        self._confirmed_count = 0
        self._persisted = int.from_bytes(self._table.get(_COUNT) or bytes(8), "big")
        self._tentative: Sequence[bytes] = ()  # the tentative view (bans applied)
        self._lin_tail: Sequence[bytes] = ()  # the linearizer's tail (order_duties)
        # Events this node soft-failed (node.state.soft_fail), set by the replica: the
        # ack duty ignores them, since local events never build on them.
        self.soft_failed: Callable[[bytes], bool] = lambda event_id: False
        self._forks_recorded: dict[bytes, int] = {}  # forks known at the last recorded batch
        self._bans = OrderBans(graph)
        # Fed, unconfirmed events (the newest UNCONFIRMED_CACHE_SIZE; others read back).
        self._unconfirmed: OrderedDict[bytes, Event] = OrderedDict()
        self._replay(graph.delivered_count if replay_to is None else replay_to)

    # ------------------------------------------------------------------ reading

    def resize_caches(self, where: int, roles: int) -> None:
        """Resize the order's position and role caches (node.replica.cache_budget)."""
        self._lin.resize_cache(where)
        self._role_cache_size = roles
        while len(self._roles) > roles:
            self._roles.popitem(last=False)

    @property
    def confirmed(self) -> tuple[bytes, ...]:
        """The whole confirmed prefix (O(n) reads: pages use `confirmed_slice`)."""
        return tuple(event_id for _, event_id in self.confirmed_slice(0, self._confirmed_count))

    @property
    def tentative(self) -> tuple[bytes, ...]:
        return self._tentative

    @property
    def confirmed_length(self) -> int:
        return self._confirmed_count

    @property
    def tentative_length(self) -> int:
        return len(self._tentative)

    @property
    def indexers(self) -> frozenset[bytes]:
        return self._lin.indexers

    @property
    def linearizer(self) -> Linearizer:
        return self._lin

    def is_confirmed(self, event_id: bytes) -> bool:
        """True if the event holds a position of the confirmed view (never an excluded one)."""
        return self._lin.is_confirmed(event_id) and not self.is_excluded(event_id)

    def excluded_tail(self) -> frozenset[bytes]:
        """Unconfirmed events the tentative view leaves out (a ban placed before them)."""
        return frozenset(self._lin_tail).difference(self._tentative)

    def is_excluded(self, event_id: bytes) -> bool:
        """True if the event was confirmed by the linearizer but a ban left it out of the view."""
        return self._table.get(_EXCLUDED + event_id) is not None

    def pending_relayed(self) -> list[bytes]:
        """Relayed events nobody has referenced yet, sorted."""
        return sorted(self._aside)

    def confirmed_slice(self, since: int, limit: int) -> list[tuple[int, bytes]]:
        start = max(since, 0)
        return [(position, self._confirmed_at(position))
                for position in range(start, min(start + max(limit, 0), self._confirmed_count))]

    def _confirmed_at(self, position: int) -> bytes:
        event_id = self._table.get(_CONFIRMED + _u64(position))
        if event_id is None:
            raise DamagedTopicError(f"confirmed position {position} missing",
                                    self._graph.topic_id)
        return event_id

    def full_slice(self, since: int, limit: int) -> list[tuple[int, bytes]]:
        """Positions and ids of the tentative view (confirmed + tentative) from `since`."""
        start = max(since, 0)
        end = start + max(limit, 0)
        confirmed = self._confirmed_count
        out = self.confirmed_slice(start, min(end, confirmed) - start)
        if end > confirmed:
            first = max(start, confirmed)
            out += enumerate(self._tentative[first - confirmed:end - confirmed], first)
        return out

    def status(self) -> OrderStatus:
        return OrderStatus(self._confirmed_count, len(self._tentative),
                           tuple(sorted(k.hex() for k in self._lin.indexers)), len(self._aside))

    # ------------------------------------------------------------------ feeding

    def catch_up(self, applied: Sequence[Event] = ()) -> OrderUpdate | None:
        """Feed every event the graph applied since the last call, as one batch.

        `applied` (the events the graph just applied, in order) saves reading
        them back when they are exactly the unfed tail of the delivery order.
        """
        end = self._graph.delivered_count
        if self._fed >= end:
            return None
        if applied and self._fed + len(applied) == end:
            events: Sequence[Event] = applied
        else:
            events = self._read(self._fed, end)
        update = self._feed(events)
        if self._lin.forks != self._forks_recorded:  # this batch revealed a fork
            self._table.put(_BATCH + _u64(self._fed), _u64(end))
            self._forks_recorded = self._lin.forks
        self._fed = end
        return update

    def _read(self, start: int, end: int) -> list[Event]:
        events: list[Event] = []
        while start < end:
            page = self._graph.deliveries(start, min(REPLAY_PAGE, end - start))
            events += [event for _, event in page]
            start = page[-1][0] + 1
        return events

    def _replay(self, end: int) -> None:
        """Rebuild the linearizer from the delivery order (recorded batches kept whole)."""
        cut = len(_BATCH)
        for key, value in self._table.scan(_BATCH):
            start, stop = int.from_bytes(key[cut:], "big"), int.from_bytes(value, "big")
            if stop > end:
                break
            self._replay_chunks(start)
            self._feed(self._read(self._fed, stop), persist=False)
            self._fed = stop
        self._replay_chunks(end)
        self._forks_recorded = self._lin.forks
        if self._persisted > self._confirmed_count:
            raise OrderIntegrityError(
                f"{self._persisted} events were confirmed before the restart, "
                f"{self._confirmed_count} after")

    def _replay_chunks(self, end: int) -> None:
        while self._fed < end:
            stop = min(end, self._fed + REPLAY_BATCH)
            self._feed(self._read(self._fed, stop), persist=False)
            self._fed = stop

    def _append_confirmed(self, appended: tuple[bytes, ...], replaying: bool) -> None:
        """Persist newly confirmed ids; on replay, check those persisted before instead."""
        position = self._confirmed_count
        for event_id in appended:
            if position < self._persisted:
                stored = self._table.get(_CONFIRMED + _u64(position))
                if stored is None:  # lost from the store, not a different order
                    raise DamagedTopicError(f"confirmed position {position} missing",
                                            self._graph.topic_id)
                if stored != event_id:
                    raise OrderIntegrityError(f"confirmed position {position} holds "
                                              f"{(stored or b'').hex()[:16]}, the replay gives "
                                              f"{event_id.hex()[:16]}")
            else:
                self._table.put(_CONFIRMED + _u64(position), event_id)
                if replaying:
                    self.stats["persisted_on_replay"] += 1
            position += 1
        self._confirmed_count = position
        if position > self._persisted:
            self._persisted = position
            self._table.put(_COUNT, _u64(position))

    def _feed(self, events: Sequence[Event], persist: bool = True) -> OrderUpdate | None:
        nodes: list[OrderNode] = []
        relayed: set[bytes] = set()
        batch: dict[bytes, OrderNode] = {}
        memo: dict[tuple[bytes, bytes], int] = {}
        for event in events:
            record = self._tracker.event_state(event.id)
            if record is None:  # applied while state was not tracked: judge it now
                self._tracker.apply([event])
                record = self._tracker.event_state(event.id)
                assert record is not None
            deps = self._deps(event.parents)
            if record.reason is not None:
                self._record_proxy(event.id, deps)
                self.stats["rejected_skipped"] += 1
                continue
            ordinal = 1 + max((self._seen(d, event.author, batch, memo) for d in deps), default=-1)
            if ordinal != event.seq:
                self.stats["renumbered"] += 1
            node = OrderNode(event.id, event.author, ordinal, deps)
            batch[event.id] = node
            nodes.append(node)
            if self._role(event.author, record.before) is Role.RELAYED:
                relayed.add(event.id)
                self._aside[event.id] = node
            elif ordinal >= self._latest.get(event.author, (-1, b""))[0]:
                self._latest[event.author] = (ordinal, event.id)
            if event.kind == KIND_ACK:
                self._acks.add(event.id)
            self._unconfirmed[event.id] = event
        if not nodes:
            return None
        while len(self._unconfirmed) > UNCONFIRMED_CACHE_SIZE:
            self._unconfirmed.popitem(last=False)
        update = self._lin.extend(nodes, relayed)
        if self._aside:
            for node_id in [i for i in self._aside if i in self._lin]:
                del self._aside[node_id]
        if self._acks:
            self._acks.difference_update(update.confirmed_appended)  # only unconfirmed ones matter
        return self._filtered(update, replaying=not persist)

    def _filtered(self, update: OrderUpdate, replaying: bool) -> OrderUpdate:
        """The linearizer's update with banned authors' events left out (`order_bans`).

        Positions are those of the views: `rewind_to` is recomputed as the
        prefix the old and new filtered views share.
        """
        self._lin_tail = update.tentative
        base = self._confirmed_count
        appended: list[bytes] = []
        bans_before = self._bans.tail
        reasons, tentative = self._bans.advance(update.confirmed_appended, update.tentative,
                                                self._unconfirmed_event,
                                                previous=update.previous, shared=update.shared)
        for event_id, reason in zip(update.confirmed_appended, reasons):
            self._unconfirmed.pop(event_id, None)
            if reason is None:
                appended.append(event_id)
                continue
            self.stats["excluded"] += 1
            self.stats[f"excluded.{reason}"] += 1
            if self._table.get(_EXCLUDED + event_id) is None:
                self._table.put(_EXCLUDED + event_id, str(reason).encode())
        confirmed = tuple(appended)
        if confirmed:
            self._append_confirmed(confirmed, replaying)
        excluded = len(update.tentative) - len(tentative)
        if excluded:
            self.stats["excluded_tentative"] += excluded
        old = self._tentative
        if (old is bans_before and tentative is update.tentative
                and len(confirmed) == len(update.confirmed_appended)
                and self._bans.shared_with_last >= 0):
            # Nothing left out, before or now: the view is the bans' sequence, whose
            # shared prefix they found (a comparison costs the tail, on every event).
            shared = self._bans.shared_with_last
        else:
            shared = common_prefix(old, confirmed + tentative)  # slice comparisons, in C
        self._tentative = tentative
        return OrderUpdate(confirmed, tentative, base + shared)

    def _unconfirmed_event(self, event_id: bytes) -> Event:
        event = self._unconfirmed.get(event_id)
        return event if event is not None else self._event(event_id)

    def _event(self, event_id: bytes) -> Event:
        event = self._graph.get(event_id)
        if event is None:
            raise OrderIntegrityError(f"ordered event {event_id.hex()[:16]} is not in the graph")
        return event

    def _deps(self, parents: tuple[bytes, ...]) -> tuple[bytes, ...]:
        """Parents with every rejected event replaced by its own (ordered) deps."""
        if not self._rejected:
            return parents
        replaced = [self._proxy_of(p) for p in parents]
        if all(r is None for r in replaced):
            return parents
        deps: set[bytes] = set()
        for parent, proxy in zip(parents, replaced):
            deps.update((parent,) if proxy is None else proxy)
        return tuple(sorted(deps))

    def _record_proxy(self, event_id: bytes, deps: tuple[bytes, ...]) -> None:
        self._rejected = True
        self._table.put(_PROXY + event_id, b"".join(deps))
        self._proxy[event_id] = deps
        if len(self._proxy) > PROXY_CACHE_SIZE:
            del self._proxy[next(iter(self._proxy))]

    def _proxy_of(self, event_id: bytes) -> tuple[bytes, ...] | None:
        """The ordered deps a rejected event stands for; None for any other event."""
        deps = self._proxy.get(event_id)
        if deps is not None:
            return deps
        value = self._table.get(_PROXY + event_id)
        if value is None:
            return None
        return tuple(value[i:i + _ID_BYTES] for i in range(0, len(value), _ID_BYTES))

    def _seen(self, start: bytes, writer: bytes, batch: dict[bytes, OrderNode],
              memo: dict[tuple[bytes, bytes], int]) -> int:
        """Highest ordinal of `writer` among `start` and its ancestors (-1: none).

        The linearizer answers for nodes in the order; nodes of this batch and
        relayed nodes kept aside are walked (iteratively, memoised) down to it.
        """
        lin = self._lin
        aside = self._aside

        def ordered(node_id: bytes) -> bool:
            # A node of this batch or kept aside is not in the order yet: asked of
            # the linearizer, each such id cost a store lookup that finds nothing
            # (a 50k catch-up, one writer's chain: 4% of the node's CPU).
            return node_id not in batch and node_id not in aside and node_id in lin

        if ordered(start):
            return lin.latest_seen(start, writer)
        stack = [start]
        while stack:
            current = stack[-1]
            if (current, writer) in memo:
                stack.pop()
                continue
            node = batch.get(current) or self._aside[current]
            if node.writer == writer:  # its ordinal tops the writer's nodes in its past
                memo[(current, writer)] = node.seq
                stack.pop()
                continue
            todo = [d for d in node.deps if (d, writer) not in memo and not ordered(d)]
            if todo:
                stack += todo
                continue
            memo[(current, writer)] = max(
                (memo[(d, writer)] if (d, writer) in memo else lin.latest_seen(d, writer)
                 for d in node.deps),
                default=-1)
            stack.pop()
        return memo[(start, writer)]

    def _role(self, author: bytes, group: int) -> Role:
        key = (group, author)
        role = self._roles.get(key)
        if role is None:
            role = role_in(author, self._tracker.state(group), self._graph)
            self._roles[key] = role
            if len(self._roles) > self._role_cache_size:
                self._roles.popitem(last=False)
        return role

    def _role_change(self, node: OrderNode) -> frozenset[bytes] | None:
        """The linearizer's hook: the indexers after the newest confirmed node, if changed."""
        if node.id != self._lin.last_confirmed:
            return None  # not the anchor: the anchor's state covers this node
        record = self._tracker.event_state(node.id)
        if record is None or record.after == self._indexers_group:
            return None
        self._indexers_group = record.after
        found = indexers_in(self._tracker.state(record.after), self._graph)
        if not found or found == self._lin.indexers:
            return None
        self.stats["indexer_changes"] += 1
        return found
