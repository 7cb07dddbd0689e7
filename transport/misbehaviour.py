"""Misbehaviour accounting: which faults are a peer's, and when to drop it.

A correct peer validates every event before it relays it, so some Reference
Monitor verdicts (`MISBEHAVIOUR_REASONS`) can only come from a faulty or
malicious sender; the engine counts those (and undecodable frames) against
the peer that handed them over, and at `DisseminationConfig.
misbehaviour_threshold` (default `transport.defaults.MISBEHAVIOUR_THRESHOLD`)
asks its driver to disconnect it. Other verdicts (a future timestamp by our
clock, a full buffer, an antichain verdict on an event it only buffered) are
not the sender's fault and are only logged. Kept apart from the engine so the
list of blameable reasons reads as one table.
"""

from __future__ import annotations

from collections import Counter
from typing import Final

from node.core.outcomes import RejectReason

MAX_BLAMED_PEERS: Final = 4_096  # peers whose fault counts are remembered (the least suspect go first)


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


def count_fault(counts: Counter[str], peer: str, threshold: int) -> bool:
    """Count one hard fault against `peer`; True when it reached `threshold` (drop it).

    The count starts again once it is reached, so a peer that comes back
    (its ban expired) and misbehaves again is dropped again. Only peers with
    faults are counted, and at most MAX_BLAMED_PEERS of them: past that the
    least suspect is forgotten, so a flood of fresh identities cannot grow
    the table.
    """
    counts[peer] += 1
    if counts[peer] >= threshold:
        del counts[peer]
        return True
    if len(counts) > MAX_BLAMED_PEERS:
        del counts[min(counts, key=counts.__getitem__)]
    return False
