"""The tentative view as a stream: `Topic.subscribe(order="tentative")` on real nodes.

Node A creates an invite-only topic (A is its only indexer), node B joins as
a writer. Then A goes offline, B writes (its events stay tentative: nobody
can confirm them), A comes back with writes of its own made offline and
connects to B. At B, A's events are confirmed as they arrive and go before
B's concurrent ones, so the tentative view B's subscriber holds must rewind.
A second follower reads the same view through the control socket's
`subscribe` op (JSON lines, {"rewind": n} for a truncation). The property:
applying the stream (a `Rewind` truncates, a `Delivered`
appends at exactly the subscriber's length) always leaves the subscriber
with a prefix-consistent copy, and once all is confirmed it equals B's full
order. Real libp2p on 127.0.0.1, real LMDB in tmp dirs; every wait is bounded.
"""

from __future__ import annotations

from pathlib import Path

import json

import trio

from node.control import serve_control
from node.replica.order_views import Rewind
from node.runtime import Delivered, Node, Topic
from node.state.types import Membership

TEST_TIMEOUT_S = 90.0
WAIT_S = 40.0
POLL_S = 0.05
LOOPBACK_LISTEN = ["/ip4/127.0.0.1/tcp/0"]
WRITES = 3  # events each side writes while apart


def apply(view: list[bytes], item: Delivered | Rewind) -> None:
    """What a subscriber does with one item of the tentative stream."""
    if isinstance(item, Rewind):
        assert item.to_length <= len(view), "rewind past the subscriber's length"
        del view[item.to_length:]
    else:
        assert item.position == len(view), "a delivery not at the subscriber's length"
        view.append(item.event.id)


def full_order(topic: Topic) -> list[bytes]:
    order = topic.replica.ordering
    assert order is not None
    return list(order.confirmed + order.tentative)


async def wait_until(condition, what: str) -> None:
    with trio.fail_after(WAIT_S):
        while not condition():
            await trio.sleep(POLL_S)


async def test_tentative_subscription_rewinds_when_confirmed_events_go_first(tmp_path: Path) -> None:
    view: list[bytes] = []
    rewinds: list[int] = []
    lines_view: list[bytes] = []  # the same view through the control socket's JSON lines

    async def follow(topic: Topic) -> None:
        async for item in topic.subscribe(order="tentative"):
            if isinstance(item, Rewind):
                rewinds.append(item.to_length)
            apply(view, item)

    async def follow_lines(socket_path: Path, topic: Topic) -> None:
        stream = await trio.open_unix_socket(str(socket_path))
        request = {"op": "subscribe", "topic": topic.id_hex, "order": "tentative"}
        await stream.send_all(json.dumps(request).encode() + b"\n")
        buffer = b""
        while True:
            chunk = await stream.receive_some()
            assert chunk, "the daemon closed the subscription"
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                reply = json.loads(line)
                if "rewind" in reply:
                    del lines_view[reply["rewind"]:]
                elif "id" in reply:
                    assert reply["position"] == len(lines_view)
                    lines_view.append(bytes.fromhex(reply["id"]))
                else:
                    assert reply == {"ok": True}

    with trio.fail_after(TEST_TIMEOUT_S):
        async with Node.open(tmp_path / "b", listen=LOOPBACK_LISTEN, seed=2) as b:
            async with Node.open(tmp_path / "a", listen=LOOPBACK_LISTEN, seed=1) as a:
                topic_a = await a.create_topic("kitchen", access="invite")
                await topic_a.add_writer(b.identity.public_key)
                await b.connect(a.addresses[0])
                topic_b = await b.join(topic_a.topic_id)
                await topic_b.wait_ready(WAIT_S)
                # Everything so far is confirmed at both: a fresh start for the view.
                await wait_until(lambda: topic_b.membership() == Membership.JOIN
                                 and topic_a.replica.graph.delivered_count
                                 == topic_b.replica.graph.delivered_count
                                 and not topic_b.replica.ordering.tentative, "joined, confirmed")
            # A has gone away.
            async with trio.open_nursery() as nursery:
                socket_path = tmp_path / "b.sock"
                await nursery.start(serve_control, b, socket_path)
                nursery.start_soon(follow, topic_b)
                nursery.start_soon(follow_lines, socket_path, topic_b)
                mine = [await topic_b.publish(b"b%d" % i) for i in range(WRITES)]
                await wait_until(lambda: view == full_order(topic_b), "B's writes streamed")
                assert topic_b.replica.ordering.tentative  # no indexer: they wait
                shared = len(view) - WRITES  # where B's own writes start

                async with Node.open(tmp_path / "a", listen=LOOPBACK_LISTEN, seed=3) as a:
                    topic_a = a.topic(topic_b.topic_id)
                    theirs = [await topic_a.publish(b"a%d" % i) for i in range(WRITES)]
                    await a.connect(b.addresses[0])
                    order_b = topic_b.replica.ordering
                    await wait_until(lambda: set(mine + theirs) <= set(order_b.confirmed)
                                     and view == full_order(topic_b) == lines_view,
                                     "all confirmed at B, both followers up to date")
                    status = topic_b.status()["order"]
                    assert status["indexers"] == [a.identity.public_key.hex()]
                    assert status["confirmed_length"] == len(order_b.confirmed)
                    assert status["tentative_length"] == len(order_b.tentative)
                nursery.cancel_scope.cancel()
            # A's writes were confirmed ahead of B's: the view went back to (at
            # most) where B's writes began and replayed, never further back.
            assert rewinds and min(rewinds) >= shared
            assert view.index(theirs[0]) < view.index(mine[0])
