"""The node's topic records survive restarts as written: a pending join stays pending.

A re-join of a topic the node holds records "replicate this topic and become a
member"; until the topic's state lets the node in, that wish must survive any
number of restarts. Reopening a stored topic used to rewrite its record as a
plain "replicate", so the second restart forgot it. (A join by id of a topic
the node does not hold is a handshake that records nothing until it succeeds:
tests/node/test_join_handshake.py.) The record is written here as that re-join
writes it, through the committer.
"""

from __future__ import annotations

from node.committer import Records
from node.runtime import Node
from node.topic_records import WANTS_MEMBERSHIP, stored_topics, topic_record

TOPIC = bytes(range(32))  # a topic no peer has: the join stays pending


async def test_a_pending_join_survives_restarts(tmp_path):
    async with Node.open(tmp_path / "n") as node:
        await node.committer.submit(Records(tuple(topic_record(TOPIC, WANTS_MEMBERSHIP))))
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
