"""A pure check of received event bytes: would this replica refuse them? Nothing is inserted.

Why: a relay path that forwards before the engine ingests (GossipSub: the
library forwards a message once its topic validator says yes) needs the
replica's verdict *before* the event goes anywhere, and cheaply, without
writing: the validator runs outside the committer's step (the one writer,
`node.committer`), so it must not add vertices, state groups or pending
writes. This module asks the same questions `Replica.receive` asks, in the
same order, and stops where an answer would need a write:

1. the Reference Monitor (decode, topic, timestamp skew, signature), unless
   the id is already a vertex here (then the bytes are known good) or was
   refused here before (then the old verdict stands);
2. the auth rules against the state at the event's parents — the graph's
   gate (`Replica._gate`), deterministic on every replica — when every
   parent is a vertex with a state record and the state before the event
   is known without a new resolution: a single parent's state, or a merge
   of states resolved before (the groups' memo). Anything else (a parent
   not here, a merge never resolved, a create event, a topic without
   authorization) is `UNDECIDED`: the engine judges it when it applies it.

Soft fail (a banned author's events judged against the current state,
`node.state.soft_fail`) is not asked: it never refuses an event from the
graph, it only keeps it from being forwarded, which the engine does itself.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from enum import StrEnum

from node.core.event import Event, event_id_of
from node.core.monitor import Rejected
from node.replica.replica import Replica


class Verdict(StrEnum):
    KNOWN = "known"  # a vertex here already: the very bytes, checked when they came
    VALID = "valid"  # passes the monitor and the auth rules at its parents
    UNDECIDED = "undecided"  # passes the monitor; authorization needs what is not here yet
    REFUSED = "refused"  # the monitor refused it (`reason` is a RejectReason)
    UNAUTHORIZED = "unauthorized"  # the auth rules at its parents refuse it (an AuthReason)
    REFUSED_BEFORE = "refused_before"  # refused here earlier (for `reason`)


@dataclass(frozen=True, slots=True)
class Precheck:
    verdict: Verdict
    reason: str = ""
    event: Event | None = None  # decoded, when the monitor passed it

    @property
    def refused(self) -> bool:
        return self.verdict in _REFUSING


_REFUSING = frozenset({Verdict.REFUSED, Verdict.UNAUTHORIZED, Verdict.REFUSED_BEFORE})


def precheck(replica: Replica, raw: bytes, now_ms: int,
             batch: Container[bytes] = ()) -> Precheck:
    """What `replica.receive(raw, now_ms)` would say, as far as it can be told without a write.

    `batch`: ids of events earlier in the same message, which the engine will
    apply before this one; a parent among them makes the verdict UNDECIDED
    (its state is not known before it is applied), never a refusal.
    """
    graph = replica.graph
    event_id = event_id_of(raw)
    if graph.has(event_id):
        return Precheck(Verdict.KNOWN)
    if graph.rejected_count:
        before = graph.rejected_reason(event_id)
        if before is not None:
            return Precheck(Verdict.REFUSED_BEFORE, str(before))
    verdict = replica.monitor.check(raw, now_ms, remember=True)  # the ingest skips the signature
    if isinstance(verdict, Rejected):
        return Precheck(Verdict.REFUSED, str(verdict.reason))
    event = verdict
    if event.is_create or event.withheld or not replica.authorizing:
        return Precheck(Verdict.UNDECIDED if event.is_create or event.withheld else Verdict.VALID,
                        event=event)
    tracker = replica.tracker
    groups = tracker.groups
    afters: set[int] = set()
    for parent in event.parents:
        if parent in batch or not graph.has(parent):
            return Precheck(Verdict.UNDECIDED, event=event)
        record = groups.event_state(parent)
        if record is None:  # applied before its state was tracked: catching up would write
            return Precheck(Verdict.UNDECIDED, event=event)
        afters.add(record.after)
    if len(afters) == 1:
        (before_group,) = afters
    else:
        memo = groups.memo(sorted(afters))
        if memo is None:  # a merge never resolved here: resolving would store a group
            return Precheck(Verdict.UNDECIDED, event=event)
        before_group = memo
    reason = tracker.check(event, before_group)
    if reason is not None:
        return Precheck(Verdict.UNAUTHORIZED, str(reason), event=event)
    return Precheck(Verdict.VALID, event=event)
