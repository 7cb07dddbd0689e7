"""Misbehaviour accounting: which faults are a peer's, and when to drop it.

A correct peer validates every event before it relays it, so some Reference
Monitor verdicts (`MisbehaviourReason`) can only come from a faulty or
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
from enum import StrEnum
from typing import Final

MAX_BLAMED_PEERS: Final = 4_096  # peers whose fault counts are remembered (the least suspect go first)


class MisbehaviourReason(StrEnum):
    """Reference Monitor rejection reasons a correct peer never causes.

    The values are the core's reason strings (`node.core.monitor`): a
    StrEnum, so a member equals, hashes and logs as its string.
    """

    NOT_BYTES = "not_bytes"
    TOO_LARGE = "too_large"
    NOT_MSGPACK = "not_msgpack"
    BAD_SHAPE = "bad_shape"
    BAD_FIELD = "bad_field"
    UNKNOWN_VERSION = "unknown_version"
    NOT_CANONICAL = "not_canonical"
    TOO_MANY_PARENTS = "too_many_parents"
    DUPLICATE_PARENTS = "duplicate_parents"
    NO_PARENTS = "no_parents"
    TOO_MANY_AUTH_REFS = "too_many_auth_refs"
    DUPLICATE_AUTH_REFS = "duplicate_auth_refs"
    STATE_KEY_TOO_LONG = "state_key_too_long"
    BAD_SIGNATURE = "bad_signature"
    ID_MISMATCH = "id_mismatch"
    WRONG_TOPIC = "wrong_topic"


# For `reason in MISBEHAVIOUR_REASONS` with the core's plain-string reasons.
MISBEHAVIOUR_REASONS: Final = frozenset(MisbehaviourReason)


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
