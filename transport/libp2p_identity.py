"""Who a libp2p host is: its key pair from the node's seed, and peer id <-> author key.

A node has one ed25519 key: it signs events with it (`node.core.identity`)
and it is the node's libp2p identity, so the peer id a Noise handshake
proves *is* an author key. This module is the bridge between the two
spellings: the libp2p key pair built from the same 32-byte seed as
`Identity.from_seed`, and the conversions between a peer id (base58, as
py-libp2p names peers) and the 32-byte public key the core uses.
"""

from __future__ import annotations

import functools

from libp2p.crypto.ed25519 import Ed25519PublicKey, create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID

from node.core.identity import SEED_BYTES
from transport.libp2p_streams import PEER_ID_CACHE_SIZE, parse_peer_id


def key_pair_from_seed(seed: bytes) -> KeyPair:
    """The libp2p ed25519 key pair of `Identity.from_seed(seed)`."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"seed must be {SEED_BYTES} bytes")
    return create_new_key_pair(seed)


def peer_id_of_key_pair(key_pair: KeyPair) -> str:
    """The peer id (base58) a host with `key_pair` has."""
    return ID.from_pubkey(key_pair.public_key).to_base58()


# Cached both ways: callers convert on every message, and base58 is pure Python.
@functools.lru_cache(maxsize=PEER_ID_CACHE_SIZE)
def peer_id_of_public_key(public_key: bytes) -> str:
    """The peer id (base58) of an ed25519 author key."""
    return ID.from_pubkey(Ed25519PublicKey.from_bytes(public_key)).to_base58()


@functools.lru_cache(maxsize=PEER_ID_CACHE_SIZE)
def public_key_of_peer_id(peer_id: str) -> bytes | None:
    """The ed25519 key embedded in an ed25519 peer id; None for other key types."""
    key = parse_peer_id(peer_id).extract_public_key()
    if not isinstance(key, Ed25519PublicKey):
        return None
    return key.to_bytes()
