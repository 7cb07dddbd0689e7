"""The fleet world (issue 12): an overlay formed by the runtime's own decisions, under churn.

The other worlds give every node a fixed ring with chords. Here no node is
given a link: node 0 is every other node's bootstrap, and each node forms
and keeps its links by the same sans-IO decisions `megnode run` uses
(node.fleet carries them out with trio and libp2p; this module carries them
out on the simulated network):

* the peer book (node.core.peer_book): every connection and every peer
  exchange answer is recorded; a (re)started node dials the START_DIALS most
  useful entries as well as its bootstrap address; the book survives a
  restart (it is in the node's store);
* peer exchange (node.core.peer_exchange): a node asks a peer
  PX_FIRST_DELAY_MS after it comes up, and one random connected peer every
  PX_INTERVAL_MIN_MS to PX_INTERVAL_MAX_MS (doubling while answers bring
  nothing new); the request and the answer go through the real encoders and
  `select`; news resets a running redial (`PeerPolicy.reset`) and is dialled
  while the connection manager `wants_more`;
* the connection manager (node.core.connection_manager): `admit` as each
  connection comes up (one refused at the node-wide limit first answers the
  refused side's peer-exchange request: `lingers`), and every KEEP_INTERVAL_MS `to_trim` above the high
  water mark and, below the low one, dials from the book (an entry at most
  once per FILL_REDIAL_MS);
* the peer policy's redial backoff (node.core.peer_policy): a connection that
  dies is redialled unless this side closed it (trimmed or refused), as in
  node.peer_executor; the bootstrap address is dialled until it answers with
  BOOTSTRAP_BACKOFF, as node.dialer does.

A node's address is `/ip4/10.x.y.1/tcp/<port>/p2p/<node id>`; a dial reaches a
node only if it is alive and one of the dialled addresses is its current one,
so a node restarted on a new port (NEW_ADDRESS_SHARE of the restarts: same key,
its old links gone) is reachable only by those that learnt its new address (it
dials them, or peer exchange tells them). Dials and peer-exchange round trips
are instantaneous and lossless (the libp2p round trips they stand for are not
what is under test); engine traffic goes over the network with its faults.
Not modelled: the discovery dial budget shared with mDNS (node.mdns, 60 dials
a minute: answers here list at most MAX_PX_PEERS peers), per-IP limits (every
node has its own address) and the peer book's one-second flush.

Nodes start (dial their bootstrap) at random times within JOIN_SPREAD_MS;
`churn` of the nodes (node 0 aside) restart per virtual minute, down for
RESTART_MIN_MS..RESTART_MAX_MS; node 0 dies for good at
`kill_bootstrap_at_ms`. Every SAMPLE_MS after SETTLE_MS the overlay is sampled.
The checks (`fleet_problems`, then transport.sim.checks over the live
nodes): every live node got a connection (joined the overlay; a joiner that a
full node 0 refuses waits for a slot, and `max_join_wait_ms` is reported); the
live nodes that joined form one component at every sample; no node
ever holds more than `max_connections`; connections older than GRACE_MS +
KEEP_INTERVAL_MS (the ones a trim round could have closed) never exceed the
high water mark - the bounded transient above it is the young connections a
trim must spare; and every live member converges on the events (an event
only node 0 held when it died is not required).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from node.core.connection_manager import (GRACE_MS, Connection, Limits, Refusal, admit,
                                          lingers, needs_more, to_trim, wants_more)
from node.core.peer_book import FAILURES_BEFORE_STALE, PeerBook
from node.core.peer_exchange import (decode_answer, decode_request, encode_answer,
                                     encode_request, select)
from node.core.peer_policy import BOOTSTRAP_BACKOFF, Dial
from transport.sim import checks
from transport.sim.network import Due
from transport.sim.scenario import Scenario
from transport.sim.summary import Summary, summarise
from transport.sim.world import Cluster, run_scenario

# The runtime's timers (node.fleet), in virtual ms.
START_DIALS = 16  # node.fleet.START_DIALS
PX_FIRST_DELAY_MS = 500  # node.fleet.PX_FIRST_DELAY_S
PX_INTERVAL_MIN_MS = 2_000  # node.fleet.PX_INTERVAL_MIN_S
PX_INTERVAL_MAX_MS = 60_000  # node.fleet.PX_INTERVAL_MAX_S
KEEP_INTERVAL_MS = 5_000  # node.fleet.KEEP_INTERVAL_S
FILL_REDIAL_MS = 60_000  # node.fleet.FILL_REDIAL_S
# The world's own schedule.
JOIN_SPREAD_MS = 10_000  # nodes start (dial their bootstrap) at random times within this
RESTART_MIN_MS = 1_000  # a churned node is down at least this long ...
RESTART_MAX_MS = 5_000  # ... and at most this long
NEW_ADDRESS_SHARE = 0.5  # restarts that come back on a new port
SETTLE_MS = JOIN_SPREAD_MS + GRACE_MS + KEEP_INTERVAL_MS  # the overlay is checked from then on
SAMPLE_MS = 1_000  # how often the overlay is sampled
CHURN_WINDOW_MS = 60_000  # `churn` is a fraction of the nodes per this much virtual time
BASE_PORT = 4001
REFUSED_ASK_MS = 1_000  # a node asks a refusal at most this often (the dial budget: 60/min)
OBSERVE_EVERY_MS = 1_000  # the order watch looks at a node at most this often
AGED_MS = GRACE_MS + KEEP_INTERVAL_MS  # a connection this old has faced a trim round


def address(index: int, port: int, node_id: str) -> str:
    return f"/ip4/10.{(index >> 8) & 255}.{index & 255}.1/tcp/{port}/p2p/{node_id}"


@dataclass
class FleetState:
    """One node's fleet state: the book survives a restart, the rest is its memory."""

    book: PeerBook = field(default_factory=PeerBook)
    port: int = BASE_PORT
    start_ms: int = 0
    started: bool = False
    since: dict[int, int] = field(default_factory=dict)  # peer index -> connection up at
    dropped: set[int] = field(default_factory=set)  # closed by this side: not redialled
    filled: dict[str, int] = field(default_factory=dict)  # peer id -> last fill dial
    px_soon: dict[int, int] = field(default_factory=dict)  # peer index -> first ask due
    refused_by: list[int] = field(default_factory=list)  # lingering refusals to ask
    next_refused_ask_ms: int = 0
    px_interval_ms: int = PX_INTERVAL_MIN_MS
    next_px_ms: int = 0
    next_keep_ms: int = 0
    bootstrap_due_ms: int | None = None  # None: answered (or node 0 itself)
    bootstrap_delay_ms: int = BOOTSTRAP_BACKOFF.first_ms


@dataclass
class Overlay:
    """What the samples saw, and what the fleet decisions did."""

    samples: int = 0
    split_samples: list[str] = field(default_factory=list)  # "at ms: component sizes"
    over_max: list[str] = field(default_factory=list)
    over_high: list[str] = field(default_factory=list)  # aged connections above high water
    degree_sum: int = 0
    degree_count: int = 0
    max_degree: int = 0
    max_aged: int = 0
    min_degree: int | None = None
    joined_ms: dict[int, int] = field(default_factory=dict)  # node -> its first connection
    max_join_wait_ms: int = 0  # longest wait from a node's start to its first connection
    never_joined: list[int] = field(default_factory=list)  # live nodes, at the check
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("refused", "trimmed", "restarts", "moved", "px_asked", "px_heard", "px_dialled",
         "fill_dials", "dials_failed", "px_refused"), 0))


class LiveView:
    """The world as the checkers should see it: only the live members, and no event that
    only a dead node ever held (it died before passing it on)."""

    def __init__(self, cluster: FleetCluster) -> None:
        self._cluster = cluster
        self.members = [n for n in cluster.members if n.alive]
        self.correct_members = [n for n in cluster.correct_members if n.alive]
        live = set().union(*(self.event_ids(i) for i in range(len(self.members))))
        dead: set[bytes] = set()
        for node in cluster.members:
            if not node.alive:
                dead |= cluster.event_ids(node.index)
        self.created = [e for e in cluster.created if e in live or e not in dead]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cluster, name)

    def event_ids(self, index: int) -> set[bytes]:
        return checks.held_ids(self.members[index])


class FleetCluster(Cluster):
    """A world whose overlay the nodes form themselves (see the module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        s = self.scenario
        self.limits = Limits(low_water=s.low_water, high_water=s.high_water)
        self.fleet = [FleetState() for _ in self.nodes]
        for i, st in enumerate(self.fleet):
            st.start_ms = 0 if i == 0 else self.rng.randrange(JOIN_SPREAD_MS)
            st.bootstrap_due_ms = None if i == 0 else st.start_ms
        self.overlay = Overlay()
        self._hex_topic = self.topic.hex()
        self._next_sample_ms = SETTLE_MS
        self._next_observe: dict[int, int] = {}

    def _overlay(self, total: int, neighbours: int) -> list[tuple[int, int]]:
        return []  # no given links: every node dials node 0 and finds the rest

    @classmethod
    def from_scenario(cls, scenario: Scenario, log_dir: str | Path | None = None) -> FleetCluster:
        s = scenario
        if s.invite or s.outsiders or s.adversary or s.banned_writer or s.crashes \
                or s.partition_at_ms is not None:
            raise ValueError("the fleet world has its own faults (churn, node 0 killed); "
                             "it does not combine with invite, adversary, crashes or partitions")
        if not 0 <= s.churn <= 1:
            raise ValueError("churn must be a fraction of the nodes, in [0, 1]")
        cluster = cls(s.seed, s.nodes, loss=s.loss, duplicate=s.duplicate,
                      latency_ms=s.latency_ms, reorder=s.reorder, neighbours=s.neighbours,
                      config=s.dissemination_config(log=False), d_max=s.d_max,
                      depletion=s.depletion, log_dir=log_dir, scenario=s,
                      authorization=s.authorization, indexers=s.indexers,
                      fifo_links=s.fifo_links)
        interval = max(1, s.fleet_ms // (s.rounds + 1))  # writes spread over the fleet phase
        cluster.write(s.rounds, s.writers, interval, start_ms=interval)
        cluster.schedule_churn()
        if 0 <= s.kill_bootstrap_at_ms < s.fleet_ms:
            cluster.network.schedule(s.kill_bootstrap_at_ms, Due.CRASH, 0, 0, None)
        return cluster

    def schedule_churn(self) -> None:
        """`churn` of the nodes (node 0 aside) restart in each CHURN_WINDOW_MS of the
        fleet phase, after JOIN_SPREAD_MS; a node is not crashed again while down."""
        s = self.scenario
        n = len(self.members)
        per_window = round(s.churn * n)
        busy_until = [0] * n
        start = JOIN_SPREAD_MS
        while start < s.fleet_ms and per_window:
            end = min(start + CHURN_WINDOW_MS, s.fleet_ms - RESTART_MAX_MS)
            if end <= start:
                break
            for index in sorted(self.rng.sample(range(1, n), min(per_window, n - 1))):
                at = self.rng.randrange(start, end)
                down = self.rng.randrange(RESTART_MIN_MS, RESTART_MAX_MS + 1)
                if at < busy_until[index]:
                    continue
                busy_until[index] = at + down
                self.crash(index, at, down)
            start += CHURN_WINDOW_MS

    # ------------------------------------------------------------- running

    def run_until(self, end_ms: int) -> None:
        while self._next_sample_ms <= end_ms:
            super().run_until(self._next_sample_ms)
            self.sample()
            self._next_sample_ms += SAMPLE_MS
        super().run_until(end_ms)

    def fault_phase_end(self) -> int:
        return max([super().fault_phase_end(), self.scenario.fleet_ms]
                   + self.network.last(Due.RESTART))

    def run(self) -> Summary:
        started = time.perf_counter()
        end = self.fault_phase_end()
        self.run_until(end)
        self.heal(clean=not self.scenario.lossy_liveness)
        converged_at = self.run_to_convergence(self.scenario.liveness_bound_ms)
        self.close_logs()
        self.check(converged_at is not None)
        view: Any = LiveView(self)  # a World to the summary: the live members
        summary = summarise(view, end, converged_at, time.perf_counter() - started)
        return replace(summary, notes=(self.overlay_note(),))

    def converged(self) -> bool:
        return checks.converged(LiveView(self))  # type: ignore[arg-type]

    def check(self, converged: bool = True) -> None:
        self.overlay.never_joined = [n.index for n in self.members
                                     if n.alive and n.index not in self.overlay.joined_ms]
        problems = fleet_problems(self.overlay)
        if problems:
            raise AssertionError(f"simulation failed (seed {self.seed}): " + "; ".join(problems)
                                 + f"\nreplay: {self.replay_hint()}")
        checks.check(LiveView(self), converged)  # type: ignore[arg-type]

    def overlay_note(self) -> str:
        o, c = self.overlay, self.overlay.counts
        mean = o.degree_sum / max(1, o.degree_count)
        return (f"overlay: {o.samples} samples connected, longest join "
                f"{o.max_join_wait_ms / 1000:.1f} s, degree min {o.min_degree} "
                f"mean {mean:.1f} max {o.max_degree} (aged max {o.max_aged}), "
                f"{c['restarts']} restarts ({c['moved']} moved), {c['refused']} refused, "
                f"{c['trimmed']} trimmed, px {c['px_asked']} asks {c['px_dialled']} dials")

    # ------------------------------------------------------------- the samples

    def sample(self) -> None:
        """One look at the overlay: components among the live started nodes, degrees."""
        now = self.now_ms
        live = [n.index for n in self.members if n.alive and self.fleet[n.index].started
                and n.index in self.overlay.joined_ms]
        if not live:
            return
        o = self.overlay
        o.samples += 1
        alive = set(live)
        seen: set[int] = set()
        sizes = []
        for root in live:
            if root in seen:
                continue
            stack, size = [root], 0
            seen.add(root)
            while stack:
                size += 1
                for other in self._adjacent[stack.pop()]:
                    if other in alive and other not in seen:
                        seen.add(other)
                        stack.append(other)
            sizes.append(size)
        if len(sizes) > 1:
            o.split_samples.append(f"{now} ms: components {sorted(sizes, reverse=True)[:8]}")
        for i in live:
            degree = len(self._adjacent[i])
            aged = sum(1 for k, up in self.fleet[i].since.items() if now - up >= AGED_MS)
            o.degree_sum += degree
            o.degree_count += 1
            o.max_degree = max(o.max_degree, degree)
            o.min_degree = degree if o.min_degree is None else min(o.min_degree, degree)
            o.max_aged = max(o.max_aged, aged)
            if degree > self.limits.max_connections:
                o.over_max.append(f"node {i}: {degree} connections at {now} ms")
            if aged > self.limits.high_water:
                o.over_high.append(f"node {i}: {aged} aged connections at {now} ms")

    def _observe(self, node: Any) -> None:
        """The order watch, at most once per OBSERVE_EVERY_MS per node: a fleet world runs
        for virtual minutes, and a look per tick was most of its cost. A confirmed prefix
        that changed is still caught (it is compared with the last look), a brief
        disagreement between two looks could be missed; the final check compares every
        live node's order."""
        if self.now_ms >= self._next_observe.get(node.index, 0):
            self._next_observe[node.index] = self.now_ms + OBSERVE_EVERY_MS
            super()._observe(node)

    # ------------------------------------------------------------- a node's fleet work

    def _tick(self, index: int) -> None:
        super()._tick(index)
        if index < len(self.nodes) and self.nodes[index].alive:
            self._fleet_tick(index)

    def _fleet_tick(self, i: int) -> None:
        st, now = self.fleet[i], self.now_ms
        if not st.started:
            if now >= st.start_ms:
                self._start(i)
            return
        if st.bootstrap_due_ms is not None and now >= st.bootstrap_due_ms:
            self._dial_bootstrap(i)
        # A refusal's answer, at a tick (asked at once, its dials could be refused and
        # asked in turn, recursively), while this node still needs peers, and at most one
        # per REFUSED_ASK_MS: the runtime's discovery budget, not modelled, bounds the
        # dials such answers cause (a fleet whose nodes are all full would otherwise
        # refuse and answer in a storm).
        refused_by, st.refused_by = st.refused_by, []
        live = [k for k in refused_by if self.nodes[k].alive]
        if live and now >= st.next_refused_ask_ms \
                and needs_more(len(self._adjacent[i]), self.limits):
            st.next_refused_ask_ms = now + REFUSED_ASK_MS
            self.overlay.counts["px_refused"] += 1
            self._ask(i, live[-1])
        for peer, due in sorted(st.px_soon.items()):
            if due <= now:
                del st.px_soon[peer]
                if peer in self._adjacent[i]:
                    self._ask(i, peer)
        if now >= st.next_px_ms:
            peers = sorted(self._adjacent[i])
            if peers:
                news = self._ask(i, self.rng.choice(peers))
                st.px_interval_ms = PX_INTERVAL_MIN_MS if news else min(
                    st.px_interval_ms * 2, PX_INTERVAL_MAX_MS)
            st.next_px_ms = now + int(st.px_interval_ms * (0.5 + self.rng.random()))
        if now >= st.next_keep_ms:
            st.next_keep_ms = now + KEEP_INTERVAL_MS
            self._keep(i)

    def _start(self, i: int) -> None:
        """The node starts: its bootstrap address and the most useful peers of its book."""
        st, now = self.fleet[i], self.now_ms
        st.started = True
        st.next_px_ms = now + int(PX_INTERVAL_MIN_MS * (0.5 + self.rng.random()))
        st.next_keep_ms = now + self.rng.randrange(1, KEEP_INTERVAL_MS + 1)
        if st.bootstrap_due_ms is not None:
            self._dial_bootstrap(i)
        connected = [self.nodes[k].node_id for k in self._adjacent[i]]
        for entry in st.book.most_useful(now, START_DIALS, exclude=connected):
            self._dial(i, entry.peer_id, entry.addresses)

    def _dial_bootstrap(self, i: int) -> None:
        st, boot = self.fleet[i], self.nodes[0]
        if self._dial(i, boot.node_id, (address(0, BASE_PORT, boot.node_id),)):
            st.bootstrap_due_ms = None
            return
        st.bootstrap_due_ms = self.now_ms + st.bootstrap_delay_ms
        st.bootstrap_delay_ms = BOOTSTRAP_BACKOFF.next(st.bootstrap_delay_ms)

    def _address_of(self, k: int) -> str:
        return address(k, self.fleet[k].port, self.nodes[k].node_id)

    def _reachable(self, peer_id: str, addresses: Iterable[str]) -> int | None:
        """The index of the node a dial of `addresses` reaches, if it is there now."""
        k = self._index.get(peer_id)
        if k is None or k >= len(self.nodes):
            return None
        node = self.nodes[k]
        if not node.alive or not self.fleet[k].started or self._address_of(k) not in addresses:
            return None
        return k

    def _dial(self, i: int, peer_id: str, addresses: Iterable[str]) -> bool:
        """Dial `peer_id` at `addresses`; True if it answered (the connection may still be
        refused by a limit). A dial that reaches nobody counts against the book entry."""
        k = self._reachable(peer_id, addresses)
        if k is None or k == i:
            self.fleet[i].book.failed(peer_id, self.now_ms)
            self.overlay.counts["dials_failed"] += 1
            return False
        if k not in self._adjacent[i]:
            self._connect(i, k)
        return True

    def _connect(self, a: int, b: int) -> None:
        """A connection a -> b comes up: each side's connection manager admits it or closes
        it at once; a side that did not close it sees it go down (and redials)."""
        now = self.now_ms
        refused: dict[int, Refusal] = {}
        for me, other in ((a, b), (b, a)):
            others = [Connection(self.nodes[k].node_id, None, 0) for k in self._adjacent[me]]
            refusal = admit(Connection(self.nodes[other].node_id, None, now), others,
                            self.limits)
            if refusal is not None:
                refused[me] = refusal
        if refused:
            self.overlay.counts["refused"] += len(refused)
            for me, other in ((a, b), (b, a)):
                if me in refused:
                    continue
                node, peer = self.nodes[me], self.nodes[other]
                assert node.policy is not None
                self.fleet[me].book.connected(peer.node_id, [self._address_of(other)], now)
                self._apply_policy(node, node.policy.peer_up(peer.node_id, now))
                if lingers(refused[other], 0):  # it answers our ask before the close
                    self.fleet[me].refused_by.append(other)
                self._apply_policy(node, node.policy.peer_down(peer.node_id, now))
            return
        self._link(a, b)
        if (min(a, b), max(a, b)) not in self.links:
            return
        for me, other in ((a, b), (b, a)):
            st = self.fleet[me]
            if me not in self.overlay.joined_ms:  # it is part of the overlay from now on
                self.overlay.joined_ms[me] = now
                self.overlay.max_join_wait_ms = max(self.overlay.max_join_wait_ms,
                                                    now - st.start_ms)
            st.since[other] = now
            st.dropped.discard(other)
            st.book.connected(self.nodes[other].node_id, [self._address_of(other)], now)
            st.px_soon[other] = now + PX_FIRST_DELAY_MS

    def _cut(self, a: int, b: int) -> None:
        """The connection closes; a live side redials unless it closed it itself."""
        if not self._unlink(a, b):
            return
        for me, other in ((a, b), (b, a)):
            node, peer = self.nodes[me], self.nodes[other]
            st = self.fleet[me]
            st.since.pop(other, None)
            st.px_soon.pop(other, None)
            dropped = other in st.dropped
            st.dropped.discard(other)
            if node.policy is None or not node.alive:
                continue
            self._apply(node, node.engine.on_peer_down(peer.node_id, self.now_ms))
            if not dropped:
                self._apply_policy(node, node.policy.peer_down(peer.node_id, self.now_ms))

    def _apply_policy(self, node: Any, effects: list[Any]) -> None:
        super()._apply_policy(node, effects)
        for effect in effects:
            if isinstance(effect, Dial):  # a reset redial (peer exchange named the peer)
                self._redial_dial(node.index, effect.peer)

    def _redial(self, index: int, peer: int) -> None:
        node = self.nodes[index]
        if not node.alive or node.policy is None or not self.fleet[index].started:
            return
        target = self.nodes[peer]
        wanted = needs_more(len(self._adjacent[index]), self.limits)  # as node.peer_executor
        for _ in node.policy.redial_due(target.node_id, self.now_ms,
                                        connected=peer in self._adjacent[index], wanted=wanted):
            self._redial_dial(index, target.node_id)

    def _redial_dial(self, i: int, peer_id: str) -> None:
        node, st = self.nodes[i], self.fleet[i]
        assert node.policy is not None
        entry = st.book.get(peer_id)
        addresses = entry.addresses if entry is not None else ()
        if self._reachable(peer_id, addresses) is not None:
            node.policy.dial_succeeded(peer_id)
        if not self._dial(i, peer_id, addresses):
            self._apply_policy(node, node.policy.dial_failed(peer_id, self.now_ms))

    def _ask(self, i: int, j: int) -> bool:
        """Node i asks node j for peers of their topic (node.fleet.PeerExchange.ask and
        _answer, through the real encoders); True if the answer told i of a new peer."""
        now = self.now_ms
        node, peer, st = self.nodes[i], self.nodes[j], self.fleet[i]
        assert node.policy is not None and peer.policy is not None
        answerer = peer.policy
        st.book.connected(peer.node_id, [self._address_of(j)], now)
        self.overlay.counts["px_asked"] += 1
        named = decode_request(encode_request([self.topic])) or ()
        shared = [t.hex() for t in named if t == self.topic]
        book = self.fleet[j].book
        book.served(node.node_id, shared, now)
        listed = select(book, node.node_id, shared,
                        [self.nodes[k].node_id for k in self._adjacent[j]], now,
                        may_list=lambda p: not answerer.is_banned(p, now))
        answer = decode_answer(encode_answer(listed), [self._hex_topic])
        news = False
        for entry in answer.peers if answer is not None else ():
            if entry.peer_id in (node.node_id, peer.node_id) \
                    or node.policy.is_banned(entry.peer_id, now):
                continue
            self.overlay.counts["px_heard"] += 1
            known = st.book.get(entry.peer_id)
            st.book.heard(entry.peer_id, entry.addresses, now, entry.topics)
            k = self._index.get(entry.peer_id)
            if k is None or k in self._adjacent[i]:
                continue
            news = news or known is None
            self._apply_policy(node, node.policy.reset(entry.peer_id, now))
            heard = st.book.get(entry.peer_id)
            if heard is not None and k not in self._adjacent[i] \
                    and wants_more(len(self._adjacent[i]), self.limits):
                self.overlay.counts["px_dialled"] += 1
                self._dial(i, entry.peer_id, heard.addresses)
        return news

    def _keep(self, i: int) -> None:
        """The connection manager's round (node.fleet.ConnectionKeeper.keep)."""
        st, now = self.fleet[i], self.now_ms
        connections = []
        for k in sorted(self._adjacent[i]):
            entry = st.book.get(self.nodes[k].node_id)
            connections.append(Connection(self.nodes[k].node_id, None, st.since.get(k, now),
                                          entry is not None and self._hex_topic in entry.topics))
        for peer_id in to_trim(connections, now, self.limits):
            k = self._index[peer_id]
            self.overlay.counts["trimmed"] += 1
            st.dropped.add(k)
            self._cut(i, k)
        count = len(connections)
        st.filled = {p: t for p, t in st.filled.items() if now - t < FILL_REDIAL_MS}
        if needs_more(count, self.limits):
            recent = set(st.filled) | {self.nodes[k].node_id for k in self._adjacent[i]}
            for entry in st.book.most_useful(now, self.limits.low_water - count,
                                             exclude=recent):
                if entry.last_success_ms and entry.failures < FAILURES_BEFORE_STALE:
                    st.filled[entry.peer_id] = now
                    self.overlay.counts["fill_dials"] += 1
                    self._dial(i, entry.peer_id, entry.addresses)

    # ------------------------------------------------------------- crashes and restarts

    def _restart(self, index: int) -> None:
        """Back from its store (the peer book too), perhaps on a new port; dials at once."""
        old = self.fleet[index]
        moved = self.rng.random() < NEW_ADDRESS_SHARE
        self.overlay.counts["restarts"] += 1
        self.overlay.counts["moved"] += moved
        self.fleet[index] = FleetState(book=old.book, port=old.port + moved,
                                       start_ms=self.now_ms, started=False,
                                       bootstrap_due_ms=self.now_ms)
        super()._restart(index)  # no given links to dial: the fleet state does
        self._start(index)


def run_world(scenario: Scenario, log_dir: str | Path | None = None) -> Summary:
    """Run `scenario`: the fleet world if it says `fleet`, else the fixed-overlay one."""
    if scenario.fleet:
        return FleetCluster.from_scenario(scenario, log_dir).run()
    return run_scenario(scenario, log_dir)


def fleet_problems(overlay: Overlay) -> list[str]:
    """The overlay's checks: one component at every sample, connections within bounds."""
    problems = []
    if overlay.split_samples:
        problems.append(f"the overlay was split at {len(overlay.split_samples)} of "
                        f"{overlay.samples} samples, first {overlay.split_samples[:3]}")
    if overlay.never_joined:
        problems.append(f"live nodes that never got a connection: {overlay.never_joined[:8]}")
    if overlay.over_max:
        problems.append(f"connections above the node-wide limit: {overlay.over_max[:3]}")
    if overlay.over_high:
        problems.append(f"aged connections above the high water mark: {overlay.over_high[:3]}")
    return problems
