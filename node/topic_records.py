"""The node's durable list of the topics it replicates (one record each in TABLE_META).

A record says "this node replicates topic X"; its value b"join" adds "and wants
to be a member" (a join by id, pursued until the topic's state lets it in). On
open the node reopens every recorded topic. The records are the node's own
writes, so they too go through the committer (the runtime submits the ops).
"""

from __future__ import annotations

from node.core.store import TABLE_META, Delete, Op, Put, Store

TOPIC_META_PREFIX = b"megnode/topic/"
WANTS_MEMBERSHIP = b"join"


def topic_record(topic_id: bytes, value: bytes = b"") -> list[Op]:
    """The node's record that it replicates `topic_id` (b"join": and wants membership)."""
    return [Put(TABLE_META, TOPIC_META_PREFIX + topic_id, value)]


def forget_topic(topic_id: bytes) -> list[Op]:
    """Remove the record (the topic's events stay in the store for a later re-join)."""
    return [Delete(TABLE_META, TOPIC_META_PREFIX + topic_id)]


def stored_topics(store: Store) -> list[tuple[bytes, bool]]:
    """Every recorded topic id, and whether this node wants membership in it."""
    prefix = TOPIC_META_PREFIX
    return [(key[len(prefix):], value == WANTS_MEMBERSHIP)
            for key, value in store.scan(TABLE_META, prefix)]
