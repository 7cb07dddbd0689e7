"""The order's node directory in the store: where each ordered event sits.

Why (issue 17, flat memory): the causal index (`node.core.order.clock`) must
answer "where is node x" for any node ever ordered - a new event may name an
old confirmed one as a parent, and every replica must compute the same clock
for it - but keeping that for every node in memory grows with the topic.
`OrderRecords` keeps it in `TABLE_ORDER`, beside the confirmed prefix,
written through the graph's write-set (so it commits with the events it
describes) and read back when the index's bounded cache misses::

    w|id            -> lane * LANE_STRIDE + seq (8)   position of a node
    l|lane (4)|seq (8) -> id                          the node at a position
    k               -> u64                            nodes recorded

The index adds nodes in the same order on every replay of the same delivery
order (its lanes are a function of that order), so the first `k` nodes a
restart replays are already recorded: they are skipped, not written again.
A store written before these records existed has `k` = 0: its first replay
records every node once.
"""

from __future__ import annotations

from node.core.order.clock import LANE_STRIDE
from node.core.store import DamagedTopicError
from node.core.topic_table import TopicTable

_WHERE = b"w"
_AT = b"l"
_RECORDED = b"k"


class OrderRecords:
    """A `NodeDirectory` (node.core.order.clock) over one topic's order table."""

    def __init__(self, table: TopicTable) -> None:
        self._table = table
        self._recorded = int.from_bytes(table.get(_RECORDED) or bytes(8), "big")

    def locate(self, node_id: bytes) -> int | None:
        value = self._table.get(_WHERE + node_id)
        return None if value is None else int.from_bytes(value, "big")

    def node_at(self, lane: int, seq: int) -> bytes:
        node_id = self._table.get(_AT + lane.to_bytes(4, "big") + seq.to_bytes(8, "big"))
        if node_id is None:
            raise DamagedTopicError(f"order record at lane {lane} seq {seq} missing",
                                    self._table.topic_id)
        return node_id

    def record(self, ordinal: int, node_id: bytes, lane: int, seq: int) -> None:
        if ordinal < self._recorded:
            return  # a replay: recorded by an earlier run, identically
        table = self._table
        table.put(_WHERE + node_id, (lane * LANE_STRIDE + seq).to_bytes(8, "big"))
        table.put(_AT + lane.to_bytes(4, "big") + seq.to_bytes(8, "big"), node_id)
        self._recorded = ordinal + 1
        table.put(_RECORDED, self._recorded.to_bytes(8, "big"))
