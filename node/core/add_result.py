"""What one `Graph.add` did: `AddResult`, built for every event handed to the graph.

Apart from `node.core.outcomes` (the statuses and reasons it carries)
because it holds events, and the event decoder below it imports those
outcomes: here the dependency runs one way. Built with `fast_init`, since
the replica reads one per received or published event (`node.core.fastinit`).
"""

from __future__ import annotations

from dataclasses import dataclass

from node.core.event import Event
from node.core.fastinit import fast_init
from node.core.outcomes import AddStatus, RejectReason, Rejection


@fast_init
@dataclass(frozen=True, slots=True)
class AddResult:
    """What one `add` did.

    `status` is about the event passed in. `applied` lists every event that
    became part of the graph (the event itself and any buffered descendants
    it released), in application order; `rejected` the ones that failed
    application checks. `missing` are parents the caller should fetch;
    `dropped` buffered events evicted by the caps; `equivocations` applied
    events whose (author, seq) was already taken by another event.
    """

    status: AddStatus
    event_id: bytes
    applied: tuple[Event, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    missing: tuple[bytes, ...] = ()
    dropped: tuple[bytes, ...] = ()
    equivocations: tuple[Event, ...] = ()

    @property
    def reason(self) -> RejectReason | None:
        for rejection in self.rejected:
            if rejection.event_id == self.event_id:
                return rejection.reason
        return None
