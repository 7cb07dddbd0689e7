"""Joining a topic by id through the join handshake, with real nodes on 127.0.0.1.

`Node.join` of a topic a node does not hold asks its connected peers to let it
in (`Disseminator.request_join`). An invite topic lets in only the invited:
anyone else gets `JoinRefusedError` within the bound and keeps nothing of the
topic (no record, no replica, no retries). An invitee returns from `join` as a
member and then holds every event of the topic. An open topic lets anyone in,
as before. Invite topics never use GossipSub. Every wait is bounded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from node.config import NodeConfig
from node.core.store import TABLE_EVENTS
from node.runtime import JOIN_HANDSHAKE_TIMEOUT_S, JoinRefusedError, Node, Topic
from node.state.types import Membership
from node.topic_records import stored_topics

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
WAIT_S = 30.0
EVENTS = 20
NO_PEER_TIMEOUT_S = 0.5  # a join with nobody to ask: the bound itself is what is tested


def event_ids(node: Node, topic: Topic) -> set[bytes]:
    """Every event of `topic` in `node`'s store."""
    return {key[32:] for key, _ in node.store.scan(TABLE_EVENTS, topic.topic_id)}


async def wait_holds(topic: Topic, ids: set[bytes]) -> None:
    with trio.fail_after(WAIT_S):
        while not all(topic.replica.graph.has(event_id) for event_id in ids):
            await topic.wait_changed()


async def test_an_uninvited_join_is_refused_within_the_bound_and_keeps_nothing(
        tmp_path: Path) -> None:
    with trio.fail_after(WAIT_S):
        async with Node.open(tmp_path / "a", listen=LOOPBACK, seed=1) as a:
            topic_a = await a.create_topic("private", access="invite")
            await topic_a.publish(b"secret")
            async with Node.open(tmp_path / "b", listen=LOOPBACK, seed=2,
                                 bootstrap=[a.addresses[0]]) as b:
                started = trio.current_time()
                with pytest.raises(JoinRefusedError,
                                   match=rf"topic {topic_a.id_hex} not found or you are not "
                                         r"invited \(asked 1 peer\)"):
                    await b.join(topic_a.topic_id)
                # Refused, not timed out: the member answered at once.
                assert trio.current_time() - started < JOIN_HANDSHAKE_TIMEOUT_S
                assert topic_a.topic_id not in b.topics
                assert stored_topics(b.store) == []
                assert event_ids(b, topic_a) == set()
                assert topic_a.topic_id not in b.disseminator.topics  # no endless retries


async def test_a_join_with_no_peer_gives_up_at_the_bound(tmp_path: Path) -> None:
    async with Node.open(tmp_path / "n", listen=LOOPBACK) as node:
        with trio.fail_after(WAIT_S):
            with pytest.raises(JoinRefusedError, match="no peer connected within"):
                await node.join(bytes(range(32)), timeout_s=NO_PEER_TIMEOUT_S)
        assert node.topics == {} and stored_topics(node.store) == []


async def test_an_invited_join_returns_as_a_member_and_receives_every_event(
        tmp_path: Path) -> None:
    with trio.fail_after(WAIT_S * 2):
        async with Node.open(tmp_path / "a", listen=LOOPBACK, seed=1) as a:
            topic_a = await a.create_topic("private", access="invite")
            await topic_a.publish_many([b"before %d" % i for i in range(EVENTS)])
            async with Node.open(tmp_path / "b", listen=LOOPBACK, seed=2,
                                 bootstrap=[a.addresses[0]]) as b:
                await topic_a.invite(b.identity.public_key)
                topic_b = await b.join(topic_a.topic_id)
                assert topic_b.membership() == Membership.JOIN  # a member on return
                assert stored_topics(b.store) == [(topic_a.topic_id, False)]
                await topic_a.publish_many([b"after %d" % i for i in range(EVENTS)])
                await wait_holds(topic_b, event_ids(a, topic_a))
                # One join, authored by the handshake: the pursuit made no second one.
                joins = [e for _, e in topic_b.replica.deliveries(0, limit=1_000)
                         if e.author == b.identity.public_key]
                assert len(joins) == 1


async def test_an_open_topic_lets_anyone_join(tmp_path: Path) -> None:
    with trio.fail_after(WAIT_S * 2):
        async with Node.open(tmp_path / "a", listen=LOOPBACK, seed=1) as a:
            topic_a = await a.create_topic("public")
            await topic_a.publish_many([b"m %d" % i for i in range(EVENTS)])
            async with Node.open(tmp_path / "b", listen=LOOPBACK, seed=2,
                                 bootstrap=[a.addresses[0]]) as b:
                topic_b = await b.join(topic_a.topic_id)
                assert topic_b.membership() == Membership.JOIN
                await wait_holds(topic_b, event_ids(a, topic_a))
                await topic_b.publish(b"from b")  # an open topic's members write
                # A left topic is held locally: joining again needs no handshake.
                await b.leave(topic_a.topic_id)
                again = await b.join(topic_a.topic_id)
                assert again.ready and again.membership() == Membership.JOIN


async def test_invite_topics_never_use_gossipsub(tmp_path: Path) -> None:
    gossip = NodeConfig(fast_path="gossipsub")
    with trio.fail_after(WAIT_S * 2):
        async with Node.open(tmp_path / "a", listen=LOOPBACK, config=gossip, seed=1) as a:
            private = await a.create_topic("private", access="invite")
            public = await a.create_topic("public")
            assert a.gossip_subscriptions == {public.topic_id}
            async with Node.open(tmp_path / "b", listen=LOOPBACK, config=gossip, seed=2,
                                 bootstrap=[a.addresses[0]]) as b:
                await private.invite(b.identity.public_key)
                await b.join(private.topic_id)
                await b.join(public.topic_id)
                # Decided once each topic's create event is here (the joins waited for it).
                with trio.fail_after(WAIT_S):
                    while b.gossip_subscriptions != {public.topic_id}:
                        await trio.sleep(0.05)
