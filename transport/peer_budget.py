"""Per-peer budgets of the anti-entropy responder: answer bytes and offers per second.

Why: anti-entropy answers are the engine's one amplifier. A 100-byte offer
naming old heads (or an empty filter) makes the responder send up to a 4 MiB
reply; a Want of 1024 ids of large events does the same. Unbounded, ~5 MB of
offers drew 153 MB of answers (issue 16). So, per peer:

* **Answer bytes** (`AnswerBudget`). What the engine sends in answer (Reply
  to an Offer, Events to a Reply or a Want) to a peer that is not trusted is
  bounded by `AMPLIFICATION_FACTOR` times the bytes received from it, plus a
  free part: `ANSWER_ALLOWANCE_BYTES` at first (refilled at
  `ANSWER_REFILL_BYTES_PER_S`, 0 by default, up to the same cap). An answer that does not fit
  is cut to what does (`more` tells the peer to ask again); one that cannot
  carry anything is not sent (`answers_throttled`). So over any stretch of
  time t, bytes out ≤ factor × bytes in + allowance + refill × t: a
  sustained flood gets at most `factor` (2) bytes per byte it sends.
* **Trust** lifts the byte bound. A peer is trusted once it handed over an
  event that was applied, authorized and new here (useful traffic:
  `Intake._ingest`), or while it is a joined member of the topic in our
  state (`Replica.readers` / `membership_of`). Why these: both cost the peer
  something the topic's own rules judge (an authorized event is signed by a
  writer the topic admitted; a join was admitted by the topic's join rule),
  so a stranger cannot buy trust with bytes alone; and they cover the peers
  that need big answers: a member that was offline catches up at full speed
  (50,000 events in ~49 round trips, docs/anti-entropy.md), a writer is
  trusted after its first event. Who is left is a reader that is neither
  (a pure MEG without topic state, or an open topic it never joined): it
  gets the allowance from each peer it syncs with (16 MiB: a 50,000-event
  history from one peer), and more once it writes.
* **Offers per second** (`RateBucket`, `OFFERS_PER_S` and `OFFER_BURST` per
  peer and topic, trusted or not). An honest peer offers each topic once a
  sync interval (2 s) plus one continuation per round trip of a catch-up;
  the burst covers ~100 continuations (100,000 events) at once. An offer
  over the budget is dropped unanswered (`offers_throttled`); the offerer's
  exchange times out and it offers again later.

Sans-IO: every call names its `now_ms`; tables are bounded (`MAX_BUDGETED_PEERS`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

AMPLIFICATION_FACTOR: Final = 2  # answer bytes per byte received, for a peer not trusted
# Free answer bytes at first: a history of 16 MiB (50,000 events of ~330 bytes)
# reaches a laggard that is neither trusted nor a member, from one peer.
ANSWER_ALLOWANCE_BYTES: Final = 16 * 1024 * 1024
# The free part refills this fast, up to the allowance. Off: any refill by time
# is amplification without input (a peer sending 1 KB/s of offers would get
# this rate back), which the factor is there to forbid. A node that serves
# large open topics to readers that never write may turn it on.
ANSWER_REFILL_BYTES_PER_S: Final = 0
OFFERS_PER_S: Final = 10  # offers answered per peer and topic, sustained
OFFER_BURST: Final = 100  # ... and at once (a catch-up's continuations)
MAX_BUDGETED_PEERS: Final = 4_096  # peers (or peer, topic pairs) with a budget; the stalest go
MAX_TRUSTED_PEERS: Final = 4_096  # peers remembered as trusted; the stalest go


class RateBucket:
    """Token buckets of `per_s` refill and `burst` size, one per key, LRU-bounded."""

    def __init__(self, per_s: float, burst: float, max_keys: int = MAX_BUDGETED_PEERS) -> None:
        self._per_s = per_s
        self._burst = burst
        self._max_keys = max_keys
        self._buckets: OrderedDict[object, tuple[float, int]] = OrderedDict()
        self._low_water = float(burst)  # the fewest tokens any key had left after a take

    def low_water_fraction(self) -> float:
        """The least headroom any key had left, as a fraction of the burst (measurement)."""
        return self._low_water / self._burst if self._burst else 0.0

    def take(self, key: object, now_ms: int, amount: float = 1) -> bool:
        """Take `amount` tokens if there are that many; False (nothing taken) if not."""
        tokens, since = self._buckets.pop(key, (self._burst, now_ms))
        tokens = min(self._burst, tokens + max(0, now_ms - since) * self._per_s / 1_000)
        taken = tokens >= amount
        left = tokens - amount if taken else tokens
        if left < self._low_water:
            self._low_water = left
        self._buckets[key] = (left, max(now_ms, since))
        while len(self._buckets) > self._max_keys:
            self._buckets.popitem(last=False)
        return taken


class AnswerBudget:
    """Bytes the engine may still answer each untrusted peer (module docstring)."""

    def __init__(self, factor: float = AMPLIFICATION_FACTOR,
                 allowance: int = ANSWER_ALLOWANCE_BYTES,
                 refill_per_s: int = ANSWER_REFILL_BYTES_PER_S) -> None:
        self.factor = factor
        self.allowance = allowance
        self.refill_per_s = refill_per_s
        # peer -> [earned (factor × bytes in, not yet spent), free part, as of ms]
        self._peers: OrderedDict[str, list[float]] = OrderedDict()
        self._trusted: OrderedDict[str, None] = OrderedDict()

    def is_trusted(self, peer: str) -> bool:
        return peer in self._trusted

    def trust(self, peer: str) -> None:
        self._trusted[peer] = None
        self._trusted.move_to_end(peer)
        while len(self._trusted) > MAX_TRUSTED_PEERS:
            self._trusted.popitem(last=False)

    def received(self, peer: str, nbytes: int, now_ms: int) -> None:
        """`nbytes` came from `peer`: it earns `factor` times as many answer bytes."""
        self._state(peer, now_ms)[0] += self.factor * nbytes

    def room(self, peer: str, now_ms: int) -> int:
        """Answer bytes `peer` may be sent now."""
        earned, free, _ = self._state(peer, now_ms)
        return int(earned + free)

    def spend(self, peer: str, nbytes: int, now_ms: int) -> None:
        """`nbytes` were answered: from what the peer earned first, then from the free part."""
        state = self._state(peer, now_ms)
        from_earned = min(state[0], nbytes)
        state[0] -= from_earned
        state[1] = max(0.0, state[1] - (nbytes - from_earned))

    def _state(self, peer: str, now_ms: int) -> list[float]:
        state = self._peers.pop(peer, None)
        if state is None:
            state = [0.0, float(self.allowance), float(now_ms)]
        elif now_ms > state[2]:
            state[1] = min(float(self.allowance),
                           state[1] + (now_ms - state[2]) * self.refill_per_s / 1_000)
            state[2] = float(now_ms)
        self._peers[peer] = state
        while len(self._peers) > MAX_BUDGETED_PEERS:
            self._peers.popitem(last=False)
        return state
