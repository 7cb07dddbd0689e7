"""Values of the ordering core: the abstract node it orders and the update it reports.

The ordering core never sees an event. It sees an `OrderNode`: an id, the
writer (author key), the writer's sequence number and the ids the node
references. The lead wires real events to it: `OrderNode(event.id,
event.author, event.seq, event.parents)`. Keeping the core this narrow is what
lets the simulations build thousands of DAGs per second without signing
anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


class OrderError(ValueError):
    """A node the linearizer cannot accept: unknown dependency, sequence gap, reused id.

    The graph layer validates events before they get here, so this is a bug in
    the caller, not remote misbehaviour; it is raised, never swallowed.
    `update`, when set, reports what the same call did before the bad node.
    """

    update: "OrderUpdate | None" = None


@dataclass(frozen=True, slots=True)
class OrderNode:
    """One vertex of the DAG as the linearizer sees it.

    `seq` numbers the writer's nodes 0, 1, 2, ...; node `seq` must have the
    writer's node `seq - 1` among its ancestors (each writer is a chain).
    `deps` are the referenced ids: the node's parents.
    """

    id: bytes
    writer: bytes
    seq: int
    deps: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class OrderUpdate:
    """What one call changed in the total order.

    The full order is `confirmed + tentative`. `confirmed_appended` are the ids
    that joined the confirmed prefix (in order); `tentative` is the whole new
    tail after it; `rewind_to` is the length of the prefix that the previous
    full order and the new one share, so a subscriber truncates its view to
    `rewind_to` entries and replays the rest. It never reaches into the
    previously confirmed prefix.

    `previous` (the tentative tail before the call, the very tuple an earlier
    update gave) and `shared` (how much of `confirmed_appended + tentative`
    it shares; -1: not known) let a consumer that kept that tuple skip the
    comparison: each costs the tail's length, on every event of a long
    unconfirmed tail (`node.replica.order_bans`). Not compared.
    """

    confirmed_appended: tuple[bytes, ...]
    tentative: Sequence[bytes]  # a tuple, or the linearizer's immutable view of its list
    rewind_to: int
    previous: Sequence[bytes] | None = field(default=None, compare=False, repr=False)
    shared: int = field(default=-1, compare=False, repr=False)


SortKey = tuple[bytes, int, bytes]


def sort_key(node: OrderNode) -> SortKey:
    """The tie-break between causally independent nodes: (writer key, seq), then id.

    The id only matters for an equivocating writer's two nodes with one seq.
    """
    return (node.writer, node.seq, node.id)
