"""What the core answers about one event: add statuses and rejection reasons.

Why a module of its own: the event decoder, the Reference Monitor and the
graph all give rejection reasons, and the replica, the dissemination engine
and the relay read them and the add statuses. One vocabulary, defined once,
that every one of them imports (a leaf: the decoder at the bottom of the
core uses it too). `Graph.add` answers with `node.core.add_result.AddResult`.

Statuses and reasons are `StrEnum`s: each member *is* its stable string, so
logs, metrics counters, wire messages and stored rejections carry the same
text as before, while code compares against members (`status is
AddStatus.APPLIED`) and a misspelt name fails at import, not silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from node.core.fastinit import fast_init


class AddStatus(StrEnum):
    """What became of one event handed to `Graph.add` (or `Replica.receive`)."""

    APPLIED = "applied"  # a vertex of the graph now
    BUFFERED = "buffered"  # waits for missing parents (the delivery precondition)
    DUPLICATE = "duplicate"  # already applied or buffered here: nothing changed
    REJECTED = "rejected"  # refused; the reason says why


class RejectReason(StrEnum):
    """Why an event was refused. Stable strings: tests, logs and metrics use them."""

    # The decoder (`node.core.event.decode_event`, `check_local_event`).
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
    # The Reference Monitor (`node.core.monitor`).
    BAD_SIGNATURE = "bad_signature"
    ID_MISMATCH = "id_mismatch"
    WRONG_TOPIC = "wrong_topic"  # also the graph's, for an event of another topic
    TIMESTAMP_IN_FUTURE = "timestamp_in_future"
    # The replica's history rule (`node.replica.history_access`): the payload of a
    # withheld form is one this node may read, so it waits for the full event.
    WITHHELD_READABLE = "withheld_readable"
    # The graph, when it applies or buffers the event (`node.core.graph`).
    PARENTS_NOT_ANTICHAIN = "parents_not_antichain"  # `node.core.antichain`
    PARENT_REJECTED = "parent_rejected"  # built on an event rejected there
    BUFFER_FULL = "buffer_full"  # evicted at once by the buffer caps


@fast_init
@dataclass(frozen=True, slots=True)
class Rejection:
    """One event refused at application time, and why."""

    event_id: bytes
    reason: RejectReason | str  # str: the gate's reason (an auth rule, node.state.types)
