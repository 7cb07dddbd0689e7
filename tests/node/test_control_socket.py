"""The control socket's slots and timeouts, and what `status` reports (issue 16).

A real `Node` serves `control.sock` in-process (`serve_control`), with the
timeouts shrunk where a test waits for one; clients are plain trio Unix
sockets. Every wait is bounded: `status` must answer within STATUS_BOUND_S
while the subscriber budget is full and idle clients hold every other
connection. The slow-subscriber test drives the server over a lockstep
in-memory stream (nothing buffered: a client that does not read blocks the
send at once), so its timing does not depend on socket buffer sizes.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import trio
import trio.testing

from node.control import ControlLimits, ControlServer, serve_control
from node.core.peer_policy import BAN_DURATION_MS
from node.peer_ids import now_ms
from node.runtime import MAX_BANS_SHOWN, Node
from node.topic_handle import Topic
from tests.helpers import authorized_topic, child, identity

STATUS_BOUND_S = 1.0  # issue 16: status answers within a second under attack
BOUND_S = 10.0  # any other wait in these tests


async def request(stream: trio.abc.Stream, obj: dict[str, Any]) -> dict[str, Any]:
    """Send one request line and read one reply line."""
    await stream.send_all(json.dumps(obj).encode() + b"\n")
    return await reply(stream)


async def reply(stream: trio.abc.ReceiveStream) -> dict[str, Any]:
    buffer = b""
    while b"\n" not in buffer:
        chunk = await stream.receive_some(65_536)
        assert chunk, "the server closed the connection without answering"
        buffer += chunk
    return json.loads(buffer.partition(b"\n")[0])


async def wait_until(condition, bound_s: float = BOUND_S) -> None:
    """Poll `condition` (a cheap check of server state) until true, at most `bound_s`."""
    with trio.fail_after(bound_s):
        while not condition():
            await trio.sleep(0.01)


async def test_status_answers_with_subscribers_full_and_idle_clients_everywhere(tmp_path):
    limits = ControlLimits(max_connections=24, max_subscribers=4, first_request_timeout_s=600.0,
                           idle_timeout_s=600.0)
    async with Node.open(tmp_path / "n") as node:
        socket = tmp_path / "n" / "control.sock"
        async with trio.open_nursery() as nursery:
            server: ControlServer = await nursery.start(serve_control, node, socket, limits)
            topic = (await request(await trio.open_unix_socket(socket),
                                   {"op": "topic_create", "name": "t"}))["topic"]
            subscribers = []
            for _ in range(limits.max_subscribers):
                stream = await trio.open_unix_socket(socket)
                assert (await request(stream, {"op": "subscribe", "topic": topic}))["ok"]
                subscribers.append(stream)
            extra = await trio.open_unix_socket(socket)
            refused = await request(extra, {"op": "subscribe", "topic": topic})
            assert not refused["ok"] and "too many subscribers" in refused["error"]
            # Idle clients: more than every connection left, and they never time out here.
            idle = [await trio.open_unix_socket(socket) for _ in range(2 * limits.max_connections)]
            await wait_until(lambda: server.stats["pushed_out"] >= limits.max_connections)
            assert server.subscribers == limits.max_subscribers  # busy ones are never pushed out
            start = trio.current_time()
            with trio.fail_after(STATUS_BOUND_S):
                status = await request(await trio.open_unix_socket(socket), {"op": "status"})
            assert status["ok"] and trio.current_time() - start < STATUS_BOUND_S
            assert server.connections <= limits.max_connections + 1
            for stream in subscribers + idle + [extra]:
                await stream.aclose()
            nursery.cancel_scope.cancel()


async def test_a_client_that_sends_nothing_is_dropped_after_the_first_request_timeout(
        tmp_path, caplog):
    limits = ControlLimits(first_request_timeout_s=0.2)
    caplog.set_level(logging.INFO, logger="megnode.control")
    async with Node.open(tmp_path / "n") as node:
        socket = tmp_path / "n" / "control.sock"
        async with trio.open_nursery() as nursery:
            server: ControlServer = await nursery.start(serve_control, node, socket, limits)
            silent = await trio.open_unix_socket(socket)
            with trio.fail_after(BOUND_S):
                assert await silent.receive_some(100) == b""  # the server hung up
            await wait_until(lambda: server.connections == 0)
            assert server.stats["idle_dropped"] == 1
            assert "idle for 0.2 s" in caplog.text
            nursery.cancel_scope.cancel()


async def test_a_subscriber_that_does_not_read_is_dropped_and_its_slot_freed(tmp_path, caplog):
    limits = ControlLimits(max_subscribers=1, send_timeout_s=0.2)
    async with Node.open(tmp_path / "n") as node:
        topic = await node.create_topic("t")
        await topic.publish(b"one")
        server = ControlServer(node, limits)
        async with trio.open_nursery() as nursery:
            client, server_side = trio.testing.lockstep_stream_pair()
            server.admit(nursery, server_side)
            # The reply {"ok": true} is read; the events after it are not.
            assert (await request(client, {"op": "subscribe", "topic": topic.id_hex}))["ok"]
            await wait_until(lambda: server.stats["slow_dropped"] == 1)
            await wait_until(lambda: server.subscribers == 0 and server.connections == 0)
            assert "does not read" in caplog.text
            nursery.cancel_scope.cancel()


async def test_a_subscriber_that_hangs_up_frees_its_slot_on_a_quiet_topic(tmp_path):
    async with Node.open(tmp_path / "n") as node:
        socket = tmp_path / "n" / "control.sock"
        async with trio.open_nursery() as nursery:
            server: ControlServer = await nursery.start(serve_control, node, socket)
            topic = await node.create_topic("quiet")
            stream = await trio.open_unix_socket(socket)
            assert (await request(stream, {"op": "subscribe", "topic": topic.id_hex,
                                           "since": 10**6}))["ok"]
            assert server.subscribers == 1
            await stream.aclose()
            await wait_until(lambda: server.subscribers == 0 and server.connections == 0)
            nursery.cancel_scope.cancel()


def test_delivered_counts_what_subscribers_get_not_rejected_events():
    replica = authorized_topic()
    outsider = identity("mallory")
    heads = sorted(replica.graph.extremities())
    before = replica.graph.delivered_count
    for seq in range(1, 6):  # a non-member's events: refused, never in the graph
        event = child(outsider, replica.topic_id, heads, seq=seq, payload=b"spam")
        replica.receive(event.raw, 10**12)
        heads = [event.id]
    assert replica.graph.delivered_count == before
    topic = Topic(identity("alice").public_key.hex(), replica, author=None)  # type: ignore[arg-type]
    status = topic.status()
    assert status["delivered"] == len(replica.deliveries(0, 1_000))
    assert status["delivered"] == replica.graph.delivered_count
    assert sum(status["rejected"].values()) == 5


async def test_status_lists_banned_peers_with_their_remaining_time(tmp_path):
    async with Node.open(tmp_path / "n") as node:
        now = now_ms()
        for n in range(MAX_BANS_SHOWN + 3):
            node.peer_policy.record_ban(f"peer{n:03d}", now + BAN_DURATION_MS + n * 1_000, now,
                                        "test")
        node.peer_policy.record_ban("expired", now - 1, now - 10, "test")
        banned = node.status()["banned_peers"]
        assert banned["count"] == MAX_BANS_SHOWN + 3
        assert len(banned["peers"]) == MAX_BANS_SHOWN
        first = banned["peers"][0]
        assert first["peer"] == f"peer{MAX_BANS_SHOWN + 2:03d}"  # the longest remaining first
        remaining = (BAN_DURATION_MS + (MAX_BANS_SHOWN + 2) * 1_000) / 1000
        assert remaining - 5 < first["remaining_s"] <= remaining
        assert "expired" not in json.dumps(banned)


async def test_status_shows_the_intakes_newest_refusals(tmp_path):
    from node.runtime import MAX_REFUSALS_SHOWN
    from transport.intake import Refusal
    async with Node.open(tmp_path / "n") as node:
        kept = node.disseminator.refusals
        for n in range(MAX_REFUSALS_SHOWN + 4):
            reason = "sender_not_joined" if n % 2 else "insufficient_power"
            kept.append(Refusal(b"\x01" * 32, n.to_bytes(32, "big"), reason, f"peer{n}"))
        refusals = node.status()["refusals"]
        assert refusals["kept"] == MAX_REFUSALS_SHOWN + 4
        assert refusals["by_reason"] == {"sender_not_joined": 6, "insufficient_power": 6}
        newest = refusals["newest"]
        assert len(newest) == MAX_REFUSALS_SHOWN
        last = MAX_REFUSALS_SHOWN + 3
        assert newest[0] == {"topic": "01" * 32, "event": last.to_bytes(32, "big").hex(),
                             "reason": "sender_not_joined", "peer": f"peer{last}"}
        json.dumps(refusals)  # what the control socket sends


async def test_a_line_over_the_size_bound_is_answered_and_the_connection_closed(tmp_path, caplog):
    from node.control import MAX_REQUEST_BYTES
    async with Node.open(tmp_path / "n") as node:
        socket = tmp_path / "n" / "control.sock"
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_control, node, socket)
            stream = await trio.open_unix_socket(socket)
            big = b'{"op":"status","pad":"' + b"x" * (MAX_REQUEST_BYTES + 10) + b'"}\n'
            async with trio.open_nursery() as sender:
                sender.start_soon(_send_ignoring_hangup, stream, big)
                with trio.fail_after(BOUND_S):
                    answer = await reply(stream)
            assert not answer["ok"] and "longer than" in answer["error"]
            assert "refused a request" in caplog.text
            with trio.fail_after(STATUS_BOUND_S):
                assert (await request(await trio.open_unix_socket(socket), {"op": "status"}))["ok"]
            nursery.cancel_scope.cancel()


async def _send_ignoring_hangup(stream: trio.abc.SendStream, data: bytes) -> None:
    try:
        await stream.send_all(data)
    except trio.BrokenResourceError:
        pass  # the server answered and hung up before reading it all: that is the point



async def test_status_counts_the_one_writers_steps(tmp_path):
    """`commit.*` in `stats`: each publish is applied in a step and committed in one
    transaction (node.committer), so a user can see how the node batches its writes."""
    async with Node.open(tmp_path / "n") as node:
        topic = await node.create_topic("kitchen")
        before = node.status()["stats"]
        for n in range(3):
            await topic.publish(b"reading %d" % n)
        stats = node.status()["stats"]
        assert stats["commit.publishes"] - before.get("commit.publishes", 0) == 3
        assert stats["commit.commits"] - before.get("commit.commits", 0) >= 1
        assert stats["commit.batches"] >= stats["commit.commits"]
        json.dumps(stats)
