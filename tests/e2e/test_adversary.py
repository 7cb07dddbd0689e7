"""A hostile peer against real daemons: garbage, oversized frames, bad signatures, forged parents.

The adversary is a libp2p host in this test process speaking the node's
dissemination protocol; the honest nodes are real `megnode run` processes.
"""

import os

import trio

from deploy.cluster import LocalCluster
from node.core.identity import Identity, sign_event
from node.runtime import PROTOCOL_DISSEMINATION
from transport.libp2p_host import P2PHost
from transport.libp2p_streams import StreamLimits
from transport.messages import Push, encode

BOUND_S = 60.0


async def test_hostile_peer_is_disconnected_and_honest_nodes_converge(tmp_path):
    cluster = LocalCluster(tmp_path, 2)
    await trio.to_thread.run_sync(cluster.__enter__)
    try:
        run = lambda *a: trio.to_thread.run_sync(lambda: cluster.cli(*a))  # noqa: E731
        topic_hex = (await run(0, "topic", "create", "attacked"))["topic"]
        await run(1, "topic", "join", topic_hex)
        await trio.to_thread.run_sync(cluster.wait_joined, topic_hex, BOUND_S)
        topic = bytes.fromhex(topic_hex)
        mallory = Identity.from_seed(os.urandom(32))
        async with P2PHost(os.urandom(32), limits=StreamLimits(max_message_bytes=16 << 20)) as host:
            victim = await host.connect(cluster.nodes[0].address)
            forged = [sign_event(mallory, topic=topic, seq=n, parents=[os.urandom(32)],
                               timestamp_ms=1, kind="message", auth=[topic]).raw
                      for n in range(1, 50)]
            bad_signature = bytearray(forged[0])
            bad_signature[-1] ^= 0xFF
            await host.send(victim, PROTOCOL_DISSEMINATION, encode(Push(topic, tuple(forged))))
            await host.send(victim, PROTOCOL_DISSEMINATION,
                            encode(Push(topic, (bytes(bad_signature),))))
            for n in range(40):
                await host.send(victim, PROTOCOL_DISSEMINATION, b"\x93garbage" + bytes([n]))
            with trio.fail_after(BOUND_S):
                while victim in host.peers():
                    await trio.sleep(0.1)
            # Dialling again after the ban gets the connection dropped at once.
            try:
                await host.connect(cluster.nodes[0].address)
            except Exception:
                pass
            with trio.fail_after(BOUND_S):
                while victim in host.peers():
                    await trio.sleep(0.1)
        # Another identity sending frames over the size limit is dropped too.
        async with P2PHost(os.urandom(32), limits=StreamLimits(max_message_bytes=16 << 20)) as host:
            victim = await host.connect(cluster.nodes[0].address)
            with trio.fail_after(BOUND_S):
                while victim in host.peers():
                    try:
                        await host.send(victim, PROTOCOL_DISSEMINATION, b"\x00" * (8 << 20))
                    except Exception:
                        pass  # the stream was reset: expected
                    await trio.sleep(0.2)
        # The honest nodes still converge on everything they publish.
        for i in (0, 1):
            await run(i, "publish", topic_hex, f"still here {i}")
        status = (await run(0, "status"))
        before = next(t for t in status["topics"] if t["topic"] == topic_hex)
        assert before["buffered"] <= 1_024  # forged parents are held within the per-author cap
        total = 5 + 2  # create, creator join, power levels, join rule, node 1 join + 2 messages
        await trio.to_thread.run_sync(cluster.wait_delivered, topic_hex, total, BOUND_S)
        assert status["stats"].get("misbehaviour", 0) >= 16
        assert before["rejected"].get("bad_signature", 0) >= 1
    finally:
        await trio.to_thread.run_sync(cluster.close)
