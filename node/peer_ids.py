"""Node ids and libp2p peer ids, converted both ways; and the runtime's wall clock.

The core names peers by their node id (hex of the ed25519 key, the id the
logs use); libp2p by peer id. An ed25519 peer id embeds the key, so the two
convert both ways without a table that could go stale. `now_ms` is the one
clock the runtime reads: the core never does, it is handed `now`.
"""

from __future__ import annotations

import time

from transport.libp2p_identity import peer_id_of_public_key, public_key_of_peer_id


def now_ms() -> int:
    """Wall-clock milliseconds (the logs' clock; what the core is given as `now`)."""
    return time.time_ns() // 1_000_000


def node_id_of(peer_id: str) -> str | None:
    """The node id behind a libp2p peer id; None if it is not an ed25519 identity."""
    try:
        key = public_key_of_peer_id(peer_id)
    except Exception:  # any malformed peer id is "not one of ours", whatever py-libp2p raises
        return None
    return None if key is None else key.hex()


def peer_id_of(node_id: str) -> str:
    """The libp2p peer id of a node id."""
    return peer_id_of_public_key(bytes.fromhex(node_id))
