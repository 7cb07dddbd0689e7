"""One simulated node: its key, replica, engine and policy, and what a crash keeps.

A crash loses the replica's memory, the engine and the peer policy (bans
included); the `store` survives, and a restart reopens the replica from it.
`seed_bytes` derives each node's key from the world's seed, so node i of
seed s is the same identity in every run.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from node.core.identity import Identity
from node.core.peer_policy import PeerPolicy
from node.replica.replica import Replica
from storage.memory import MemoryStore
from transport.dissemination import Disseminator


@dataclass
class SimNode:
    """A node of the world; `alive` is False between its crash and its restart."""

    index: int
    node_id: str
    identity: Identity
    replica: Replica
    engine: Disseminator
    writer: Any = None  # node.logschema.JsonLinesLogWriter when logging
    store: MemoryStore | None = None  # what survives a crash
    policy: PeerPolicy | None = None
    alive: bool = True
    seen_confirmed: tuple[bytes, ...] = ()  # the confirmed order last observed here
    member: bool = True  # False: a node that knows the topic id but was never invited
    next_join_ms: int = 0  # an invitee or outsider asks to join again from then on


def seed_bytes(seed: int, index: int) -> bytes:
    return hashlib.blake2b(f"megnode-sim/{seed}/{index}".encode(), digest_size=32).digest()
