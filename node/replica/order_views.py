"""What a reader of a topic's total order sees: the three views, the status, and the
tentative view's truncation marker.

`TopicOrder` (node.replica.ordering) computes the order; this module names
what the replica and the node hand to readers of it (`Replica.ordered`,
`Replica.order_status`, `Topic.subscribe(order=...)` in the runtime), so a
reader needs none of the linearizer's machinery.

*Views.* "causal" is the delivery order (rejected events left out).
"confirmed" is append-only: a position, once given, never changes. "tentative"
is the full order, `confirmed + tentative`. Each batch the order is fed
returns one `OrderUpdate` (None if it changed nothing): a subscriber of the
tentative view truncates its copy to `rewind_to` entries and replays
`full_slice(rewind_to, ...)`; a subscriber of the confirmed view appends
`confirmed_appended`. Streams of the tentative view carry the truncation as
a `Rewind(to_length)` item before the replayed entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ORDER_CAUSAL = "causal"
ORDER_CONFIRMED = "confirmed"
ORDER_TENTATIVE = "tentative"
ORDERS = (ORDER_CAUSAL, ORDER_CONFIRMED, ORDER_TENTATIVE)


@dataclass(frozen=True, slots=True)
class OrderStatus:
    """What `status` reports about a topic's order; indexers as sorted hex keys."""

    confirmed_length: int
    tentative_length: int
    indexers: tuple[str, ...]
    pending_relayed: int

    def as_dict(self) -> dict[str, Any]:
        return {"confirmed_length": self.confirmed_length,
                "tentative_length": self.tentative_length,
                "indexers": list(self.indexers), "pending_relayed": self.pending_relayed}


@dataclass(frozen=True, slots=True)
class Rewind:
    """A tentative-view subscriber's truncation marker: drop every entry at or after
    position `to_length` (keep the first `to_length`), then the items that follow
    replay the view from there.

    The tentative view (confirmed prefix + tentative tail) may reorder its
    tail as events arrive; this is Autobase's truncate-and-reapply. It never
    reaches into the confirmed prefix as it was when those entries were sent.
    """

    to_length: int
