"""Small builders shared by the tests: deterministic identities, topics and events."""

from __future__ import annotations

import random
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import msgpack

from node.core.event import (
    EVENT_VERSION,
    KIND_MESSAGE,
    SIGNING_DOMAIN,
    Event,
    decode_event,
    payload_digest,
)
from node.core.identity import Identity, sign_event
from node.replica.replica import Replica, ReplicaConfig
from node.state.roles import Role
from storage.memory import MemoryStore


def identity(name: str) -> Identity:
    """A deterministic identity named for readable tests."""
    return Identity.from_seed(name.encode().ljust(32, b"\0")[:32])


def new_topic(store=None, author: str = "alice", now_ms: int = 1_000, **kwargs) -> Replica:
    return Replica.create_topic(store or MemoryStore(), identity(author), now_ms, **kwargs)


def child(
    author: Identity, topic: bytes, parents: list[bytes], seq: int, ts: int = 2_000,
    payload: bytes = b"", kind: str = KIND_MESSAGE,
) -> Event:
    return sign_event(author, topic=topic, seq=seq, parents=parents, timestamp_ms=ts, kind=kind,
                      payload=payload, auth=(topic,))


def craft_raw(fields: list[Any], signer: Identity | None = None, signature: bytes | None = None) -> bytes:
    """Encode arbitrary (possibly invalid) event fields, signing them like a real author would."""
    if signature is None:
        signed = list(fields)
        if len(signed) > 9 and isinstance(signed[9], bytes):  # what a real author signs
            signed[9] = payload_digest(signed[9])
        body = SIGNING_DOMAIN + msgpack.packb(signed, use_bin_type=True)
        signature = (signer or identity("mallory")).sign(body)
    return msgpack.packb(list(fields) + [signature], use_bin_type=True)


def valid_fields(author: Identity, topic: bytes, parents: list[bytes], seq: int = 1) -> list[Any]:
    return [EVENT_VERSION, topic, author.public_key, seq, sorted(parents), [topic], 2_000,
            KIND_MESSAGE, None, b"hello"]


def random_dag(replica: Replica, writers: list[Identity], count: int, rng: random.Random,
               max_parents: int = 3) -> list[Event]:
    """Events by several writers with random concurrent structure, in a valid causal order."""
    events: list[Event] = []
    heads = [replica.topic_id]
    known = [replica.topic_id]
    seqs = {w.public_key: 0 for w in writers}
    for i in range(count):
        writer = rng.choice(writers)
        # pick an antichain: a few current heads, or an older event to create a fork
        if rng.random() < 0.3 and len(known) > 1:
            parents = [rng.choice(known)]
        else:
            parents = rng.sample(heads, min(len(heads), rng.randint(1, max_parents)))
        seqs[writer.public_key] += 1
        event = sign_event(writer, topic=replica.topic_id, seq=seqs[writer.public_key],
                           parents=parents, timestamp_ms=2_000 + i, kind=KIND_MESSAGE,
                           payload=i.to_bytes(4, "big"), auth=(replica.topic_id,))
        events.append(event)
        known.append(event.id)
        heads = [h for h in heads if h not in parents] + [event.id]
    return events


def decode(raw: bytes) -> Event:
    return decode_event(raw)


def authorized_topic(store=None, author: str = "alice", now_ms: int = 1_000,
                     **kwargs) -> Replica:
    """A topic with topic state and the auth rules on; its creator is joined and an indexer."""
    return Replica.create_topic(store or MemoryStore(), identity(author), now_ms,
                                authorization=True, **kwargs)


def sync(source: Replica, target: Replica, now_ms: int = 10**12) -> int:
    """Send `target` every event of `source` it lacks, parents first; returns how many."""
    missing = source.graph.not_below(target.graph.extremities())
    for event_id in missing:
        event = source.graph.get(event_id)
        assert event is not None
        target.receive(event.raw, now_ms)
    return len(missing)


def joined_writer(creator: Replica, name: str, rng: random.Random, now_ms: int = 10**12,
                  role: Role | None = None) -> Replica:
    """`name`'s replica of `creator`'s topic (memory store), joined as a writer: the
    creator invites it and gives it the writing level (and `role`, if given), it
    syncs and joins; its join is committed and synced back to the creator."""
    who = identity(name)
    creator.add_writer(who.public_key, now_ms, rng)
    if role is not None:
        creator.set_role(who.public_key, role, now_ms, rng)
    creator.commit()
    replica = Replica(MemoryStore(), creator.topic_id, who, ReplicaConfig())
    sync(creator, replica, now_ms)
    replica.join(now_ms, rng)
    replica.commit()
    sync(replica, creator, now_ms)
    creator.commit()
    return replica


@contextmanager
def mounted_tmpfs(mount_point: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (e.g. "3m") at `mount_point`, unmounted afterwards; the test is
    skipped, with the reason, where mounting is not permitted."""
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                             str(mount_point)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


class QuietNode:
    """The least an exporter reads: no topics, no peers, empty stats."""

    node_id = "00" * 32
    stats: dict[str, int] = {}
    topics: dict[bytes, Any] = {}

    class host:  # noqa: N801 - a namespace standing in for the libp2p host
        @staticmethod
        def peers() -> frozenset[str]:
            return frozenset()

    class disseminator:  # noqa: N801
        stats: dict[str, int] = {}
