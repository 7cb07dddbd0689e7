"""Misbehaviour accounting: which faults are a peer's, how much each weighs, when to drop it.

A peer's score is the weighted sum of its faults (`Fault`, `FAULT_WEIGHTS`),
decaying with a half-life of `SCORE_HALF_LIFE_MS`; at `DisseminationConfig.
misbehaviour_threshold` (default `transport.defaults.MISBEHAVIOUR_THRESHOLD`,
in units of one hard fault) the engine asks its driver to disconnect the peer
(`Disconnect`), and the peer policy (`node.core.peer_policy`) bans it for a
growing time. Kept apart from the engine so what is blamed, and how much,
reads as one table.

What counts, and why each weight is what it is:

* **Hard faults (weight 1).** A correct peer validates every event before it
  relays it, so some Reference Monitor verdicts (`MISBEHAVIOUR_REASONS`) and
  undecodable frames can only come from a faulty or malicious sender.
* **Impossible offers (weight 1).** An offer naming heads its own filter
  does not hold (`transport.anti_entropy`): a correct offerer's filter holds
  every head above its floor, so only a forger sends one (the cheap
  amplification attack: 512 made-up heads and an empty filter).
* **Authorization rejections by the author itself (`UNAUTHORIZED_WEIGHT`).**
  Counted only when the peer that handed the event over is its author (the
  key that signed it) and only for `AUTH_BLAMED_REASONS`: verdicts computed
  from the event and its own past, which every replica computes alike, so an
  honest author — who checks its event against the same past when it
  publishes — never makes one. A relay is never blamed for someone else's
  event: it may hold a state that differs from ours for a while (a ban or a
  join it has not received yet, or events soft-failed by current state
  rather than by their past), and forwarding what it took in honestly must
  not cost it its links. Verdicts that depend on the receiver's state
  (`state_unresolvable`, anything soft-failed on current state) are not in
  the list. The weight is a quarter of a hard fault: even if a reason in the
  list turned out to depend on state in some edge we did not foresee (a
  concurrent ban and write, decided on a state an honest author had not
  seen), it takes 80 such events — more than an honest author writes in the
  few round trips such a race lasts — and the score decays meanwhile. A
  non-member flooding its own signed events reaches the threshold after 80.
* **Stray traffic**: messages for a topic we do not replicate
  (`UNKNOWN_TOPIC_WEIGHT`), and a private topic's messages from a peer that
  may not read it (`NOT_MEMBER_WEIGHT`). Honest peers send both: the engine
  pushes and offers to peers without knowing which topics they hold, a new
  member sends before its join reaches us, a kicked one before its kick
  reaches it. So each peer has a free allowance (`STRAY_ALLOWANCE_PER_S`,
  burst `STRAY_ALLOWANCE_BURST`: a `transport.peer_budget.RateBucket`) and
  only messages beyond it count, a tenth of a hard fault each. A peer
  flooding at 1,000 messages/s is dropped after ~0.7 s (500 free, then 200).

* **Invalid gossip relayed** (`INVALID_RELAYED_WEIGHT`): a GossipSub message
  whose events the topic validator refuses by the auth rules (or refused
  before), handed over by a peer that is not their author. A correct relay
  validates before it forwards, but it passes on what it cannot judge yet
  (a parent it lacks), so like stray traffic it is free within the stray
  allowance and a tenth of a hard fault beyond it. Hard verdicts (decoding,
  signature) in gossip weigh a hard fault on the forwarder: every relay
  checks those whatever it holds (`transport.intake.Intake.check_gossip`).

* **Over its intake budget** (`OVER_BUDGET_WEIGHT`): each frame dropped
  because the peer used up a whole burst of its events or bytes per second
  (`transport.intake_budget`), a tenth of a hard fault: honest traffic
  never reaches the burst, a flood past it is dropped after 200 frames.

`Scores` keeps the per-peer scores, bounded by MAX_BLAMED_PEERS (the least
suspect go first); a score is reset when it reaches the threshold, so a peer
that comes back after its ban and misbehaves again is dropped again.
"""

from __future__ import annotations

from collections import Counter
from enum import StrEnum
from typing import Final

from node.core.outcomes import RejectReason
from node.state.types import AuthReason

MAX_BLAMED_PEERS: Final = 4_096  # peers whose fault scores are remembered (the least suspect go first)
# A score halves every 10 minutes: a peer's rare, honest-looking faults (stray
# traffic over its allowance, a race) fade instead of adding up over days,
# while a flood reaches the threshold within seconds.
SCORE_HALF_LIFE_MS: Final = 10 * 60 * 1_000


class Fault(StrEnum):
    """What a peer did wrong (the string is what stats and logs show)."""

    HARD = "hard"  # an undecodable frame, an event failing a hard Reference Monitor check
    IMPOSSIBLE_OFFER = "impossible_offer"  # heads its own filter does not hold
    UNAUTHORIZED = "unauthorized"  # its own event, refused by the auth rules on its own past
    UNKNOWN_TOPIC = "unknown_topic"  # beyond the stray allowance
    NOT_MEMBER = "not_member"  # a private topic's message from a non-reader, beyond the allowance
    OVER_BUDGET = "over_budget"  # a frame beyond its intake budget (transport.intake_budget)
    INVALID_RELAYED = "invalid_relayed"  # gossip it forwarded, refused here, not its own; beyond the allowance


# In units of one hard fault; `misbehaviour_threshold` is in the same unit.
HARD_FAULT_WEIGHT: Final = 1.0
IMPOSSIBLE_OFFER_WEIGHT: Final = 1.0
UNAUTHORIZED_WEIGHT: Final = 0.25
UNKNOWN_TOPIC_WEIGHT: Final = 0.1
NOT_MEMBER_WEIGHT: Final = 0.1
INVALID_RELAYED_WEIGHT: Final = 0.1
OVER_BUDGET_WEIGHT: Final = 0.1
FAULT_WEIGHTS: Final = {
    Fault.HARD: HARD_FAULT_WEIGHT,
    Fault.IMPOSSIBLE_OFFER: IMPOSSIBLE_OFFER_WEIGHT,
    Fault.UNAUTHORIZED: UNAUTHORIZED_WEIGHT,
    Fault.UNKNOWN_TOPIC: UNKNOWN_TOPIC_WEIGHT,
    Fault.NOT_MEMBER: NOT_MEMBER_WEIGHT,
    Fault.INVALID_RELAYED: INVALID_RELAYED_WEIGHT,
    Fault.OVER_BUDGET: OVER_BUDGET_WEIGHT,
}
# Stray messages (unknown topic, non-member) a peer may send free: a token
# bucket of this rate and burst. An honest peer's stray traffic is its pushes
# and offers of topics we lack (about one offer per topic per sync interval,
# its publishes' pushes in group-committed batches) and a membership race of
# a few round trips: far under 50 a second sustained, 500 at once.
STRAY_ALLOWANCE_PER_S: Final = 50
STRAY_ALLOWANCE_BURST: Final = 500


# The core's rejection reasons (`node.core.outcomes.RejectReason`) a correct peer never
# causes: every decoder verdict, a bad signature or id, an event of another topic.
# Not blamed: a future timestamp (our clock may be behind), a full buffer, an antichain
# or rejected-parent verdict on an event the sender may only have buffered.
MISBEHAVIOUR_REASONS: Final = frozenset({
    RejectReason.NOT_BYTES,
    RejectReason.TOO_LARGE,
    RejectReason.NOT_MSGPACK,
    RejectReason.BAD_SHAPE,
    RejectReason.BAD_FIELD,
    RejectReason.UNKNOWN_VERSION,
    RejectReason.NOT_CANONICAL,
    RejectReason.TOO_MANY_PARENTS,
    RejectReason.DUPLICATE_PARENTS,
    RejectReason.NO_PARENTS,
    RejectReason.TOO_MANY_AUTH_REFS,
    RejectReason.DUPLICATE_AUTH_REFS,
    RejectReason.STATE_KEY_TOO_LONG,
    RejectReason.BAD_SIGNATURE,
    RejectReason.ID_MISMATCH,
    RejectReason.WRONG_TOPIC,
})

# Auth-rule verdicts decided by the event and its own causal past alone (the
# state at its parents and its auth refs), the same on every replica: an
# honest author never signs an event that fails one (module docstring).
# Listed one by one, not "every AuthReason but ...", so that a verdict that
# depends on the receiver's current state (`state_unresolvable` here; a
# soft-fail on current state) is never blamed by default.
AUTH_BLAMED_REASONS: Final = frozenset({
    AuthReason.NO_CREATE,
    AuthReason.WRONG_TOPIC,
    AuthReason.BAD_CONTENT,
    AuthReason.BAD_CREATE,
    AuthReason.CREATE_HAS_PARENTS,
    AuthReason.SENDER_NOT_JOINED,
    AuthReason.INSUFFICIENT_POWER,
    AuthReason.STATE_KEY_OWNED_BY_OTHER,
    AuthReason.THIRD_PARTY_INVITE_UNSUPPORTED,
    AuthReason.BAD_STATE_KEY,
    AuthReason.NO_MEMBERSHIP,
    AuthReason.UNKNOWN_MEMBERSHIP,
    AuthReason.JOIN_FOR_OTHER,
    AuthReason.BANNED,
    AuthReason.NOT_INVITED,
    AuthReason.JOIN_RULE_FORBIDS,
    AuthReason.TARGET_JOINED_OR_BANNED,
    AuthReason.NOT_A_MEMBER,
    AuthReason.KNOCK_FOR_OTHER,
    AuthReason.ALREADY_MEMBER,
    AuthReason.BAD_POWER_LEVELS,
    AuthReason.AUTH_REF_MISSING,
    AuthReason.AUTH_REF_NOT_STATE,
    AuthReason.AUTH_REF_OTHER_TOPIC,
    AuthReason.DUPLICATE_AUTH_TYPE,
    AuthReason.UNEXPECTED_AUTH_REF,
    AuthReason.NO_CREATE_REF,
    AuthReason.AUTH_REFS_NOT_SELECTED,
})


def count_fault(counts: Counter[str], peer: str, threshold: float,
                weight: float = HARD_FAULT_WEIGHT) -> bool:
    """Add `weight` to `peer`'s score; True when it reached `threshold` (drop it).

    The score starts again once it is reached, so a peer that comes back
    (its ban expired) and misbehaves again is dropped again. Only peers with
    faults are counted, and at most MAX_BLAMED_PEERS of them: past that the
    least suspect is forgotten, so a flood of fresh identities cannot grow
    the table.
    """
    counts[peer] += weight
    # A hair under: weights like 0.1 do not add up to exact multiples in floating point.
    if counts[peer] >= threshold - 1e-9:
        del counts[peer]
        return True
    if len(counts) > MAX_BLAMED_PEERS:
        del counts[min(counts, key=counts.__getitem__)]
    return False


class Scores(Counter[str]):
    """Per-peer misbehaviour scores that decay (`SCORE_HALF_LIFE_MS`) between faults.

    A Counter, so `scores[peer]` reads a score (0 for an unblamed peer);
    `add` decays the peer's score to `now_ms`, then counts the fault.
    """

    def __init__(self) -> None:
        super().__init__()
        self._stamps: dict[str, int] = {}  # peer -> when its score was last decayed

    def add(self, peer: str, weight: float, threshold: float, now_ms: int) -> bool:
        """`count_fault` on the decayed score; True: disconnect `peer`."""
        last = self._stamps.get(peer)
        if last is not None and peer in self and now_ms > last:
            self[peer] *= 0.5 ** ((now_ms - last) / SCORE_HALF_LIFE_MS)
        dropped = count_fault(self, peer, threshold, weight)
        if peer in self:
            self._stamps[peer] = max(now_ms, last or now_ms)
        else:
            self._stamps.pop(peer, None)
        if len(self._stamps) > len(self):  # peers forgotten by the bound
            for gone in [p for p in self._stamps if p not in self]:
                del self._stamps[gone]
        return dropped
