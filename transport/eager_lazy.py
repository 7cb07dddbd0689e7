"""The eager/lazy tree of one topic (Plumtree): who gets a new event in full, who only its id.

Theory of operation
-------------------
Random push (`transport.dissemination`, `push`) sends every event to about
`forward_fanout` peers per node, so each node receives it several times: on
the wire that is several times the event's bytes. Plumtree (Leitão, Pereira,
Rodrigues, "Epidemic Broadcast Trees", SRDS 2007) receives it about once:

* every link of a topic is **eager** or **lazy** for each source (the
  author of the events: one tree per source, as Plumtree's per-sender trees
  and Thicket; a tree shared by many writers is the best one for none, and
  its prunes for one writer cut the others' paths, so that every event then
  needed a graft). New links start eager. An event new here is pushed in full
  on the links eager for its author and announced by id only on the others
  (`IHave`, batched per peer and flushed once per tick or as soon as a batch
  holds `MAX_IHAVE_IDS` ids);
* a push that brings nothing new over an eager link means the source's tree
  has a cycle there: the receiver makes that link lazy for the source and
  tells the sender (`Prune(topic, source)`), which does the same. It prunes
  at the first duplicate while it keeps more than `KEEP_EAGER` eager links
  for the source (so the tree forms within a few events, where every link
  starts eager), else after `PRUNE_AFTER_DUPLICATES` in a row (a loss on one
  path makes another first now and then). The eager links left form a
  spanning tree per source, shaped by the first copies received (the fastest
  paths). A new source starts on the tree of the source last active here
  (any source's tree spans the overlay), so a topic with many writers does
  not flood every link for each new one;
* an announced id not received within `GRAFT_TIMEOUT_MS` means the tree is
  broken above us (a lost push, a closed link): the receiver asks one
  announcer for it (`Graft`), which also makes that link eager on both
  sides, so the tree repairs itself where it broke. If that announcer does
  not deliver in another timeout, the next one is asked.

Anti-entropy stays the guarantee underneath (`transport.anti_entropy`): an id
nobody announces, or all announcers fail to deliver, still arrives by
reconciliation. So every table here is bounded and may forget.

Announcements are sent only where they may be news: never to a holder (the
sender, the author), and an id a lazy peer announced to us since the last
flush is struck from what we announce to it (it holds it).

`TopicTree` is pure state (no clock, no randomness, no IO): the engine hands
it the time, the peers and each event's author, and sends what it returns.
It keeps the trees of the `MAX_SOURCES` most recently active authors.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from transport.effects import PeerId

# An announced id not received within this is fetched from its announcer (a graft).
# Far above one tick (the announcer's batching: 50 ms in the node, 100 ms in the
# simulator) plus a one-way latency, so a push on its way is not fetched twice:
# on a loaded machine a hop of the tree took hundreds of ms, and at 250 ms the
# cluster bench grafted (then pruned) 0.2 links per event. GossipSub waits 3 s
# for an IWANT's answer; anti-entropy (2 s) repairs what grafts do not.
GRAFT_TIMEOUT_MS: Final = 1_000
# Pushes in a row over one of a source's last KEEP_EAGER eager links that brought
# nothing new before it is pruned: with loss, another path is first now and then,
# and pruning the last links at the first duplicate made the tree churn.
PRUNE_AFTER_DUPLICATES: Final = 3
# Eager links a node keeps before it waits for PRUNE_AFTER_DUPLICATES: above this
# many, the first duplicate prunes (the tree forms within a few events, where
# every link starts eager); the last ones go only after duplicates in a row.
KEEP_EAGER: Final = 2
MAX_IHAVE_IDS: Final = 256  # ids in one IHave; a fuller batch is flushed before the tick
MAX_MISSING_IDS: Final = 16_384  # announced ids awaited per topic (the oldest are forgotten)
MAX_ANNOUNCERS: Final = 4  # announcers remembered per awaited id (each asked in turn)
MAX_HEARD_IDS: Final = 4_096  # ids a peer announced to us since our last flush to it
# Sources (event authors) whose trees a topic keeps; the least recently active is
# forgotten (its links start eager again, and prune back within a few events).
MAX_SOURCES: Final = 256


@dataclass
class _Awaited:
    """An id announced to us that we do not hold: when to fetch it, and from whom."""

    due_ms: int
    announcers: list[PeerId]


@dataclass
class _Links:
    """One source's tree at this node: the links that are lazy for its events."""

    lazy: set[PeerId] = field(default_factory=set)
    useless: dict[PeerId, int] = field(default_factory=dict)  # duplicate pushes in a row


@dataclass
class TopicTree:
    """One topic's trees (one per source), pending announcements and awaited ids."""

    graft_timeout_ms: int = GRAFT_TIMEOUT_MS
    prune_after: int = PRUNE_AFTER_DUPLICATES
    _sources: OrderedDict[bytes, _Links] = field(default_factory=OrderedDict)
    _pending: dict[PeerId, list[bytes]] = field(default_factory=dict)
    _heard: dict[PeerId, set[bytes]] = field(default_factory=dict)
    _awaited: OrderedDict[bytes, _Awaited] = field(default_factory=OrderedDict)
    # Ids fetched by a graft lately (bounded): a copy of one arriving later is a
    # graft that raced the tree (a measured cause of duplicates, `grafted_lately`).
    _grafted: OrderedDict[bytes, None] = field(default_factory=OrderedDict)

    # ------------------------------------------------------------- links

    def _links(self, source: bytes) -> _Links:
        links = self._sources.get(source)
        if links is None:
            # A new source starts on the tree of the source last active here: any
            # source's eager links span the overlay, so its first events reach every
            # node without flooding every link; its own prunes and grafts refine it.
            template = next(reversed(self._sources.values()), None)
            links = self._sources[source] = _Links(
                lazy=set(template.lazy) if template is not None else set())
            while len(self._sources) > MAX_SOURCES:
                self._sources.popitem(last=False)  # forgotten: its links start eager again
        else:
            self._sources.move_to_end(source)
        return links

    def eager_of(self, peers: Iterable[PeerId], source: bytes) -> list[PeerId]:
        lazy = self._links(source).lazy
        return [p for p in peers if p not in lazy]

    def lazy_of(self, peers: Iterable[PeerId], source: bytes) -> list[PeerId]:
        lazy = self._links(source).lazy
        return [p for p in peers if p in lazy]

    def is_lazy(self, peer: PeerId, source: bytes) -> bool:
        return peer in self._links(source).lazy

    def duplicate_from(self, peer: PeerId, source: bytes, eager: int = 0) -> bool:
        """A push of `source`'s events from `peer` brought nothing new; True: send a `Prune`.

        `eager`: the links eager for `source` here. Above KEEP_EAGER the first
        duplicate prunes; else PRUNE_AFTER_DUPLICATES in a row do. Also for a
        link already lazy here: the peer still pushing means it missed our
        prune (lost on the way), so it is told again.
        """
        links = self._links(source)
        count = links.useless.get(peer, 0) + 1
        if count < self.prune_after and eager <= KEEP_EAGER:
            links.useless[peer] = count
            return False
        links.useless.pop(peer, None)
        links.lazy.add(peer)
        return True

    def fresh_from(self, peer: PeerId, source: bytes) -> bool:
        """`peer` brought `source`'s news first: eager for it; True if it was lazy."""
        links = self._links(source)
        links.useless.pop(peer, None)
        return self.graft(peer, source)

    def prune(self, peer: PeerId, source: bytes) -> bool:
        """Make the link to `peer` lazy for `source`; True if it was eager."""
        links = self._links(source)
        if peer in links.lazy:
            return False
        links.lazy.add(peer)
        return True

    def graft(self, peer: PeerId, source: bytes) -> bool:
        """Make the link to `peer` eager for `source`; True if it was lazy."""
        links = self._sources.get(source)
        if links is None or peer not in links.lazy:
            return False
        links.lazy.discard(peer)
        return True

    def forget_peer(self, peer: PeerId) -> None:
        """The link closed: a new one to the same peer starts eager."""
        for links in self._sources.values():
            links.lazy.discard(peer)
            links.useless.pop(peer, None)
        self._pending.pop(peer, None)
        self._heard.pop(peer, None)
        for awaited in self._awaited.values():
            if peer in awaited.announcers:
                awaited.announcers.remove(peer)

    # ------------------------------------------------------------- announcing

    def announce(self, peers: Sequence[PeerId], ids: Sequence[bytes]) -> list[tuple[PeerId, list[bytes]]]:
        """Queue `ids` for each of `peers`; returns the full batches to send now."""
        full: list[tuple[PeerId, list[bytes]]] = []
        for peer in peers:
            batch = self._pending.setdefault(peer, [])
            batch.extend(ids)
            if len(batch) >= MAX_IHAVE_IDS:
                flushed = self._take(peer)
                while flushed:
                    full.append((peer, flushed[:MAX_IHAVE_IDS]))
                    flushed = flushed[MAX_IHAVE_IDS:]
        return full

    def flush(self) -> list[tuple[PeerId, list[bytes]]]:
        """Every pending batch (the tick's flush), in peer order."""
        out = []
        for peer in sorted(self._pending):
            ids = self._take(peer)
            while ids:
                out.append((peer, ids[:MAX_IHAVE_IDS]))
                ids = ids[MAX_IHAVE_IDS:]
        self._heard.clear()
        return out

    def _take(self, peer: PeerId) -> list[bytes]:
        ids = self._pending.pop(peer, [])
        heard = self._heard.pop(peer, None)
        if heard:  # the peer told us it holds these: no news to it
            ids = [i for i in ids if i not in heard]
        return ids

    # ------------------------------------------------------------- awaiting

    def announced(self, peer: PeerId, ids: Sequence[bytes], now_ms: int,
                  held: Callable[[bytes], bool]) -> None:
        """`peer` announced `ids`: await those not `held` here, and never announce them back."""
        heard = self._heard.setdefault(peer, set())
        for event_id in ids:
            if len(heard) < MAX_HEARD_IDS:
                heard.add(event_id)
            if held(event_id):
                continue
            awaited = self._awaited.get(event_id)
            if awaited is None:
                self._awaited[event_id] = _Awaited(now_ms + self.graft_timeout_ms, [peer])
                while len(self._awaited) > MAX_MISSING_IDS:
                    self._awaited.popitem(last=False)
            elif peer not in awaited.announcers and len(awaited.announcers) < MAX_ANNOUNCERS:
                awaited.announcers.append(peer)

    def received(self, ids: Iterable[bytes]) -> None:
        """These ids arrived (by any path): stop awaiting them."""
        if self._awaited:
            for event_id in ids:
                self._awaited.pop(event_id, None)

    def grafted_lately(self, ids: Iterable[bytes]) -> int:
        """How many of `ids` this node fetched by a graft lately (instrumentation)."""
        if not self._grafted:
            return 0
        return sum(1 for event_id in ids if event_id in self._grafted)

    def due(self, now_ms: int, held: Callable[[bytes], bool]) -> dict[PeerId, list[bytes]]:
        """The grafts to send now: per announcer, the awaited ids past their timeout.

        Each overdue id is asked of its next announcer and waits one more
        timeout; an id whose announcers are all spent is given up (anti-entropy
        brings it). Ids that arrived meanwhile are dropped.
        """
        asks: dict[PeerId, list[bytes]] = {}
        for event_id in [i for i, a in self._awaited.items() if a.due_ms <= now_ms]:
            awaited = self._awaited[event_id]
            if held(event_id) or not awaited.announcers:
                del self._awaited[event_id]
                continue
            peer = awaited.announcers.pop(0)
            awaited.due_ms = now_ms + self.graft_timeout_ms
            self._grafted[event_id] = None
            while len(self._grafted) > MAX_MISSING_IDS:
                self._grafted.popitem(last=False)
            asks.setdefault(peer, []).append(event_id)
        return asks

    @property
    def awaited_count(self) -> int:
        return len(self._awaited)
