"""Topic state and member operations through the real control socket of a running node.

One `Node` (LMDB in a tmp dir, libp2p on 127.0.0.1) serves `control.sock`; the
test speaks the socket's JSON protocol from a worker thread, as the CLI does.
"""

import json
from pathlib import Path

import pytest
import trio

from node.control import serve_control
from node.control_client import ControlError, control_call
from node.core.identity import Identity
from node.runtime import Node, NodeError

BOUND_S = 30.0


async def call(socket: Path, **request):
    return await trio.to_thread.run_sync(control_call, socket, request)


async def test_member_operations_and_state_through_the_control_socket(tmp_path):
    async with Node.open(tmp_path / "n") as node:
        socket = tmp_path / "n" / "control.sock"
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_control, node, socket)
            topic = (await call(socket, op="topic_create", name="ops", access="invite"))["topic"]
            member = Identity.generate().public_key.hex()

            invited = await call(socket, op="invite", topic=topic, member=member)
            assert invited["changed"] and len(bytes.fromhex(invited["id"])) == 32
            first = await call(socket, op="add_writer", topic=topic, member=member)
            assert first["changed"]
            # Asking again is not an error: nothing to write, and the reply says so.
            again = await call(socket, op="add_writer", topic=topic, member=member)
            assert again == {"ok": True, "id": None, "changed": False}
            promoted = await call(socket, op="set_role", topic=topic, member=member,
                                  role="indexer")
            assert promoted["changed"]
            with pytest.raises(ControlError, match="role must be one of"):
                await call(socket, op="set_role", topic=topic, member=member, role="king")
            await call(socket, op="set_state", topic=topic, type="app.config", state_key="",
                       content={"unit": "C"})
            # An indexer has the creator's level: Matrix lets no one ban an equal.
            with pytest.raises(ControlError, match="not below"):
                await call(socket, op="ban", topic=topic, member=member)
            writer = Identity.generate().public_key.hex()
            await call(socket, op="add_writer", topic=topic, member=writer)
            banned = await call(socket, op="ban", topic=topic, member=writer)
            assert banned["changed"]

            state = (await call(socket, op="state", topic=topic))["state"]
            text = json.dumps(state)
            assert "app.config" in text and '"C"' in text
            assert member in text and writer in text and '"ban"' in text
            nursery.cancel_scope.cancel()


async def test_leaving_a_topic_ends_its_subscribers(tmp_path):
    async with Node.open(tmp_path / "n") as node:
        topic = await node.create_topic("short-lived")
        await topic.publish(b"one")
        seen: list[bytes] = []

        async def subscriber() -> None:
            with pytest.raises(NodeError, match="left"):
                async for delivered in topic.subscribe(since=0):
                    seen.append(delivered.event.payload)

        with trio.fail_after(BOUND_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(subscriber)
                await topic.wait_delivered(topic.replica.graph.delivered_count, BOUND_S)
                await trio.testing.wait_all_tasks_blocked()
                await node.leave(topic.topic_id)
        assert b"one" in seen
