"""The eager/lazy tree of one topic (Plumtree): who gets a new event in full, who only its id.

Theory of operation
-------------------
Random push (`transport.dissemination`, `push`) sends every event to about
`forward_fanout` peers per node, so each node receives it several times: on
the wire that is several times the event's bytes. Plumtree (Leitão, Pereira,
Rodrigues, "Epidemic Broadcast Trees", SRDS 2007) receives it about once:

* every link of a topic is **eager** or **lazy**; new links start eager. An
  event new here is pushed in full on the eager links and announced by id
  only on the lazy ones (`IHave`, batched per peer and flushed once per tick
  or as soon as a batch holds `MAX_IHAVE_IDS` ids);
* a push that brings nothing new over an eager link means the tree has a
  cycle there: after `PRUNE_AFTER_DUPLICATES` such pushes in a row the
  receiver makes that link lazy and tells the sender (`Prune`), which makes
  it lazy on its side too. The eager links left form
  a spanning tree, shaped by the first copies received (the fastest paths);
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
it the time and the peers, and sends what it returns.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from transport.effects import PeerId

# An announced id not received within this is fetched from its announcer (a graft).
# Above one tick (the announcer's batching: 50 ms in the node, 100 ms in the
# simulator) plus a one-way latency, so a push on its way is not fetched twice.
GRAFT_TIMEOUT_MS: Final = 250
# Pushes in a row over one eager link that brought nothing new before it is pruned.
# One (Plumtree's rule) suits one source; with several concurrent sources a link
# first for one source is second for another, and pruning on every duplicate cut
# nodes off the tree (every event then needed a graft). A link first for some
# source now and then is kept; the simulator's figures are in docs/anti-entropy.md.
PRUNE_AFTER_DUPLICATES: Final = 3
# Eager links a node keeps before it waits for PRUNE_AFTER_DUPLICATES: above this
# many, the first duplicate prunes (the tree forms within a few events, where
# every link starts eager); the last ones go only after duplicates in a row.
KEEP_EAGER: Final = 2
MAX_IHAVE_IDS: Final = 256  # ids in one IHave; a fuller batch is flushed before the tick
MAX_MISSING_IDS: Final = 16_384  # announced ids awaited per topic (the oldest are forgotten)
MAX_ANNOUNCERS: Final = 4  # announcers remembered per awaited id (each asked in turn)
MAX_HEARD_IDS: Final = 4_096  # ids a peer announced to us since our last flush to it


@dataclass
class _Awaited:
    """An id announced to us that we do not hold: when to fetch it, and from whom."""

    due_ms: int
    announcers: list[PeerId]


@dataclass
class TopicTree:
    """One topic's lazy links, pending announcements and awaited ids (module docstring)."""

    graft_timeout_ms: int = GRAFT_TIMEOUT_MS
    prune_after: int = PRUNE_AFTER_DUPLICATES
    lazy: set[PeerId] = field(default_factory=set)
    _useless: dict[PeerId, int] = field(default_factory=dict)  # duplicate pushes in a row
    _pending: dict[PeerId, list[bytes]] = field(default_factory=dict)
    _heard: dict[PeerId, set[bytes]] = field(default_factory=dict)
    _awaited: OrderedDict[bytes, _Awaited] = field(default_factory=OrderedDict)

    # ------------------------------------------------------------- links

    def eager_of(self, peers: Iterable[PeerId]) -> list[PeerId]:
        return [p for p in peers if p not in self.lazy]

    def lazy_of(self, peers: Iterable[PeerId]) -> list[PeerId]:
        return [p for p in peers if p in self.lazy]

    def duplicate_from(self, peer: PeerId, eager: int = 0) -> bool:
        """A push from `peer` brought nothing new; True if a `Prune` is to be sent now.

        Also for a link already lazy here: the peer still pushing means it missed
        our prune (lost on the way), so it is told again.
        """
        count = self._useless.get(peer, 0) + 1
        if count < self.prune_after and eager <= KEEP_EAGER:
            self._useless[peer] = count
            return False
        self._useless.pop(peer, None)
        self.prune(peer)
        return True

    def fresh_from(self, peer: PeerId) -> bool:
        """`peer` brought news first: its link stays (or becomes) eager; True if it was lazy."""
        self._useless.pop(peer, None)
        return self.graft(peer)

    def prune(self, peer: PeerId) -> bool:
        """Make the link to `peer` lazy; True if it was eager."""
        if peer in self.lazy:
            return False
        self.lazy.add(peer)
        return True

    def graft(self, peer: PeerId) -> bool:
        """Make the link to `peer` eager; True if it was lazy."""
        if peer not in self.lazy:
            return False
        self.lazy.discard(peer)
        return True

    def forget_peer(self, peer: PeerId) -> None:
        """The link closed: a new one to the same peer starts eager."""
        self.lazy.discard(peer)
        self._useless.pop(peer, None)
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
            asks.setdefault(peer, []).append(event_id)
        return asks

    @property
    def awaited_count(self) -> int:
        return len(self._awaited)
