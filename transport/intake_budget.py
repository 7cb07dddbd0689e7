"""Per-peer intake budgets: events and bytes a peer may make us take in per second.

Why: everything a peer sends costs us before we can judge it. Bytes cost a
read and a decode; every event that is not a duplicate costs a signature
check (~60 µs) and the auth rules, so one peer at ~16,000 new events a
second keeps a core busy. The answer budget (`transport.peer_budget`)
bounds what we *send*; this bounds what one peer makes us *take in*, so
one flooding peer cannot starve the honest ones or the control socket
(issue 16: a 10-second flood left 37,800 rejected events on two nodes).

Named limits (token buckets, `transport.peer_budget.RateBucket`):

* `PEER_BYTES_PER_S` / `PEER_BYTES_BURST`: bytes of every frame a peer hands
  over itself (pushes, offers, answers, wants; gossip as its forwarder).
  The burst covers a catch-up from that peer: 16 answers of 4 MiB at once.
* `PEER_EVENTS_PER_S` / `PEER_EVENTS_BURST`: events in its Push, Reply and
  Events frames. The burst is a 20,000-event catch-up at once (20 round
  trips of 1,024); the rate is ~12% of a core of signature checks.

* `PEER_BUFFERED_PER_S` / `PEER_BUFFERED_BURST`: events a peer makes us buffer
  (parents unknown here). Past it, the rest of the frame is dropped unread: a
  flood on made-up parents (the adversary bench's buffer flood) otherwise costs
  a signature check per event until the peer is banned. The peer charged is
  the true source: a correct node never pushes on an event it only buffered
  (`transport.intake`, `_ingest` forwards only what it applied), so an honest
  neighbour of the flood's victim never receives the flood from the victim.
  Pushes always count. Anti-entropy answers (Reply, Events: the SYNC channel)
  count only from a peer not trusted (`transport.peer_budget`): a node
  catching up 50,000 events from a trusted peer may legitimately buffer
  thousands of them (a Bloom false positive hides one event, and the answer
  then carries all its descendants before the next round brings it), and what
  such answers can bring is bounded by our own offers and wants and by the
  buffer (`node.core.buffer.MAX_BUFFERED_TOTAL`). Honest pushes buffer only
  what loss or reordering separated from its parents: in the 100-node world
  the busiest peer leaves most of the burst unused
  (tests/transport/test_sim_world.py).

Over budget: the frame is dropped unread (`intake_throttled`), and each
dropped frame counts `Fault.OVER_BUDGET` against the peer (a tenth of a
hard fault): a peer only gets there after using a whole burst, which the
honest traffic of the 100-node world never comes near (measured by
`low_water`, tests/transport/test_intake_budget.py), so sustained abuse is
dropped within a couple of hundred frames past its burst.

Wants in flight (`WANTS_IN_FLIGHT_PER_PEER`): the ids we ask one peer for in
one want round, which stay outstanding until the next retry
(`want_retry_ms`). A buffer flood of events with made-up parents would
otherwise make us send up to `MAX_WANT_IDS` ids to its sender every round
(issue 16: 14,312 wants back); an honest buffer holds a few parents per
peer. The rest wait for the next round.

Sans-IO: every call names `now_ms`; the tables are bounded (`MAX_BUDGETED_PEERS`).
"""

from __future__ import annotations

from typing import Final

from transport.peer_budget import RateBucket

PEER_BYTES_PER_S: Final = 8 * 1024 * 1024
PEER_BYTES_BURST: Final = 64 * 1024 * 1024
PEER_EVENTS_PER_S: Final = 2_000
PEER_EVENTS_BURST: Final = 20_000
# Events a peer makes us buffer (their parents unknown here). Each costs a signature
# check and a buffer slot and can never be judged until its past comes; honest
# traffic buffers only what loss or reordering separated from its parents (answers
# come in delivery order), so this is far below the event budget.
PEER_BUFFERED_PER_S: Final = 200
PEER_BUFFERED_BURST: Final = 2_000
WANTS_IN_FLIGHT_PER_PEER: Final = 256


class IntakeBudget:
    """Bytes and events per peer and second; `low_water` is the least headroom seen."""

    def __init__(self, bytes_per_s: float = PEER_BYTES_PER_S, bytes_burst: float = PEER_BYTES_BURST,
                 events_per_s: float = PEER_EVENTS_PER_S,
                 events_burst: float = PEER_EVENTS_BURST,
                 buffered_per_s: float = PEER_BUFFERED_PER_S,
                 buffered_burst: float = PEER_BUFFERED_BURST) -> None:
        self._bytes = RateBucket(bytes_per_s, bytes_burst)
        self._events = RateBucket(events_per_s, events_burst)
        self._buffered = RateBucket(buffered_per_s, buffered_burst)

    def take_bytes(self, peer: str, nbytes: int, now_ms: int) -> bool:
        """`nbytes` came from `peer`: False if that is over its byte budget (drop the frame)."""
        return self._bytes.take(peer, now_ms, nbytes)

    def take_events(self, peer: str, count: int, now_ms: int) -> bool:
        """`count` events came from `peer`: False if over its event budget (drop the frame)."""
        return not count or self._events.take(peer, now_ms, count)

    def take_buffered(self, peer: str, now_ms: int) -> bool:
        """`peer` made us buffer one more event: False if over that budget (drop the rest
        of its frame unread)."""
        return self._buffered.take(peer, now_ms, 1)

    def buffered_low_water(self) -> float:
        """The least headroom of the buffered-event budget, as a fraction of its burst."""
        return self._buffered.low_water_fraction()

    def low_water(self) -> tuple[float, float]:
        """The least headroom any peer had left, as fractions of the bursts (bytes, events):
        1.0 means nobody used any of it, 0.0 a peer emptied it."""
        return self._bytes.low_water_fraction(), self._events.low_water_fraction()
