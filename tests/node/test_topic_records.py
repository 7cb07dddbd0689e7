"""The node's topic records survive restarts as written: a pending join stays pending.

A join by id records "replicate this topic and become a member"; until the
topic's state lets the node in (here: never, no peer has the topic), that
wish must survive any number of restarts. Reopening a stored topic used to
rewrite its record as a plain "replicate", so the second restart forgot it.
"""

from __future__ import annotations

from node.runtime import Node
from node.topic_records import stored_topics

TOPIC = bytes(range(32))  # a topic no peer has: the join stays pending


async def test_a_pending_join_survives_restarts(tmp_path):
    async with Node.open(tmp_path / "n") as node:
        await node.join(TOPIC)
        assert node.topics[TOPIC].wants_membership
    for _ in range(2):
        async with Node.open(tmp_path / "n") as node:
            assert node.topics[TOPIC].wants_membership
            assert stored_topics(node.store) == [(TOPIC, True)]


async def test_a_created_topic_is_recorded_without_a_pending_join(tmp_path):
    async with Node.open(tmp_path / "n") as node:
        topic = await node.create_topic("kitchen")
    async with Node.open(tmp_path / "n") as node:
        assert stored_topics(node.store) == [(topic.topic_id, False)]
        assert not node.topics[topic.topic_id].wants_membership
