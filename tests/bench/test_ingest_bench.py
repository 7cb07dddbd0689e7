"""Ingest rate of a real node receiving a burst of small frames (issue #2 / #6).

One real `Node` (LMDB with fsync, libp2p on loopback, dissemination log on)
joins an open topic; raw `P2PHost` senders push it BURST_EVENTS events, one
event per `Push` frame, as fast as their queues take them. The figure is
events/s from the first frame sent to the last event delivered at the node
(`wait_delivered`): with one commit per frame it is capped by the fsync
rate; with the group-commit window (`node/committer.py`) it is not.

Same-run baselines, so the ratio survives a loaded machine:

* `store_commit_per_event`: raw `LmdbStore.apply_writes` of one 300-byte put
  per transaction (one fsync each) — what a commit per frame costs at best;
* `store_batched`: the same puts, STORE_BATCH per transaction.

Also a publish burst: CONCURRENT_PUBLISHERS tasks publishing one event each,
repeatedly, through `Topic.publish` (each returns once durable), and one
publisher alone (`publish_sequential`: the latency a lone caller pays).

Writes bench-results/ingest.json. Not part of `make test`.
"""

from __future__ import annotations

import os
import random
import time
from contextlib import AsyncExitStack
from pathlib import Path

import trio

from node.core.identity import Identity
from node.data_dir import open_data_dir
from node.replica.replica import Replica, ReplicaConfig
from node.runtime import PROTOCOL_DISSEMINATION, Node
from node.state.types import RULE_PUBLIC
from storage.lmdb_store import LmdbStore
from storage.memory import MemoryStore
from node.core.store import TABLE_EVENTS
from transport.libp2p_gossip import GossipConfig
from transport.libp2p_host import P2PHost
from transport.messages import Push, encode

BURST_EVENTS = 2_000
SENDERS = (1, 4)  # raw hosts pushing to the node at once
PAYLOAD_BYTES = 200
STORE_PUTS = 300
STORE_BATCH = 1_000
PUBLISH_EVENTS = 400
CONCURRENT_PUBLISHERS = 16
RUN_TIMEOUT_S = 240.0
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
HELD_EVENTS = 16  # the topic's creation and first events, stored before the node starts


def store_rates(tmp: Path) -> dict[str, float]:
    rng = random.Random(1)
    with LmdbStore(tmp / "raw") as store:
        start = time.perf_counter()
        for _ in range(STORE_PUTS):
            store.apply_writes({TABLE_EVENTS: {rng.randbytes(64): rng.randbytes(300)}})
        per_event = STORE_PUTS / (time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(3):
            store.apply_writes({TABLE_EVENTS: {rng.randbytes(64): rng.randbytes(300)
                                               for _ in range(STORE_BATCH)}})
        batched = 3 * STORE_BATCH / (time.perf_counter() - start)
    return {"store_commit_per_event_per_s": round(per_event), "store_batched_per_s": round(batched)}


def authored_topic(count: int) -> tuple[Replica, list[bytes]]:
    """An open topic authored off-line; its events' raws in delivery (causal) order."""
    identity = Identity.generate()
    replica = Replica.create_topic(MemoryStore(), identity, 0, name="burst",
                                   config=ReplicaConfig(), authorization=True,
                                   join_rule=RULE_PUBLIC, members_write=True)
    rng = random.Random(7)
    now = int(time.time() * 1000)
    for i in range(count):
        replica.publish(os.urandom(PAYLOAD_BYTES), now, rng)
        if i % 500 == 0:
            replica.commit()
    replica.commit()
    raws = [event.raw for _, event in replica.graph.deliveries(0, limit=count + 16)]
    return replica, raws


async def ignore(peer: str, data: bytes) -> None:
    return None


def hold_first_events(directory: Path, topics: list[tuple[Replica, list[bytes]]]
                      ) -> list[tuple[Replica, list[bytes]]]:
    """Store each topic's first HELD_EVENTS in the node's data dir before it starts, and
    return the rest. A join by handshake needs a member peer, and the raw hosts are none:
    holding the topic's creation, the node joins on its own."""
    identity, store = open_data_dir(directory)
    with store:
        for replica, raws in topics:
            held = Replica(store, replica.topic_id, identity, ReplicaConfig())
            for raw in raws[:HELD_EVENTS]:
                held.receive(raw, int(time.time() * 1000))
            held.commit()
    return [(replica, raws[HELD_EVENTS:]) for replica, raws in topics]


async def burst(tmp: Path, senders: int) -> dict[str, float]:
    topics = [authored_topic(BURST_EVENTS // senders + HELD_EVENTS) for _ in range(senders)]
    topics = hold_first_events(tmp / f"node{senders}", topics)
    total = sum(len(raws) for _, raws in topics)
    async with Node.open(tmp / f"node{senders}", listen=LOOPBACK) as node:
        handles = [await node.join(replica.topic_id) for replica, _ in topics]
        async with AsyncExitStack() as stack:
            hosts = [await stack.enter_async_context(
                P2PHost(os.urandom(32), LOOPBACK, gossip=GossipConfig(enabled=False)))
                for _ in range(senders)]
            for host in hosts:  # the node offers anti-entropy to its peers: take and ignore
                host.set_message_handler(PROTOCOL_DISSEMINATION, ignore)
            peers = [await host.connect(node.addresses[0]) for host in hosts]
            commits_before = node.store.commits
            start = time.perf_counter()

            async def push_all(host: P2PHost, peer: str, replica: Replica,
                               raws: list[bytes]) -> None:
                for raw in raws:
                    await host.send(peer, PROTOCOL_DISSEMINATION,
                                    encode(Push(replica.topic_id, (raw,))))

            async with trio.open_nursery() as nursery:
                for host, peer, (replica, raws) in zip(hosts, peers, topics):
                    nursery.start_soon(push_all, host, peer, replica, raws)
                with trio.fail_after(RUN_TIMEOUT_S):
                    for handle, (_, raws) in zip(handles, topics):
                        await handle.wait_delivered(len(raws), RUN_TIMEOUT_S)
            elapsed = time.perf_counter() - start
            commits = node.store.commits - commits_before
    return {"events": total, "seconds": round(elapsed, 3),
            "events_per_s": round(total / elapsed), "store_commits": commits}


async def publish_burst(tmp: Path, publishers: int = CONCURRENT_PUBLISHERS) -> dict[str, float]:
    async with Node.open(tmp / f"publisher{publishers}", listen=LOOPBACK) as node:
        topic = await node.create_topic("publish-burst")
        latencies: list[float] = []

        async def publisher(count: int) -> None:
            for _ in range(count):
                began = time.perf_counter()
                await topic.publish(os.urandom(PAYLOAD_BYTES))
                latencies.append(time.perf_counter() - began)

        commits_before = node.store.commits
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(publishers):
                nursery.start_soon(publisher, PUBLISH_EVENTS // publishers)
        elapsed = time.perf_counter() - start
        latencies.sort()
        return {"events": PUBLISH_EVENTS, "publishers": publishers,
                "events_per_s": round(PUBLISH_EVENTS / elapsed),
                "store_commits": node.store.commits - commits_before,
                "latency_p50_ms": round(latencies[len(latencies) // 2] * 1000, 2),
                "latency_p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2)}


def test_ingest_burst(tmp_path: Path, record_figures) -> None:
    figures: dict[str, object] = store_rates(tmp_path)
    for senders in SENDERS:
        figures[f"burst_{senders}_senders"] = trio.run(burst, tmp_path, senders)
    figures["publish_burst"] = trio.run(publish_burst, tmp_path)
    figures["publish_sequential"] = trio.run(publish_burst, tmp_path, 1)
    per_event = figures["store_commit_per_event_per_s"]
    for senders in SENDERS:
        run = figures[f"burst_{senders}_senders"]
        run["ratio_to_store_commit_per_event"] = round(run["events_per_s"] / per_event, 2)
    figures["publish_burst"]["ratio_to_store_commit_per_event"] = round(
        figures["publish_burst"]["events_per_s"] / per_event, 2)
    record_figures(os.environ.get("MEGNODE_INGEST_NAME", "ingest"), figures)
    for senders in SENDERS:
        assert figures[f"burst_{senders}_senders"]["events"] >= BURST_EVENTS
