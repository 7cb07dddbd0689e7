"""Peer exchange: peers tell each other where the other peers of their shared topics are. Sans-IO.

Each node knows only the peers it dialled or that dialled it; a fleet that
bootstrapped from one node falls apart when that node dies. So every node
now and then asks a connected peer (a small request/answer on its own
protocol, node.fleet): the request names the topics the asker serves that
the answerer may read; the answer lists peers the answerer knows (connected,
or in its peer book with a recent connection) that serve one of those
topics, with their addresses and the shared topics they serve.

What is revealed, and to whom (docs/access.md, "Peer exchange"):

* a request names an invite topic only to a peer that may read it
  (`Replica.may_read`: it is a member); open topic ids go to any peer, as the
  anti-entropy offers already do;
* an answer names a topic only if the asker named it and, for an invite
  topic, may read it here too; it lists only peers that told us they serve
  that topic (peers reveal their own topics to us only under the same rule),
  with the addresses they were connected from or announced.

Everything from the wire is untrusted and bounded: at most MAX_PX_TOPICS
topics per request, MAX_PX_PEERS peers per answer, the peer book's address
bounds per peer, MAX_PX_BYTES per message; entries that do not parse are
dropped and counted. The dials an answer may cause are bounded elsewhere
(node.mdns.DiscoveryBudget, shared with mDNS: dials per minute in total).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgpack

from node.core.peer_book import (FAILURES_BEFORE_STALE, MAX_BOOK_ADDRESSES, MAX_PEER_ID_CHARS,
                                 PeerBook, valid_address)

PROTOCOL_PX = "/megnode/px/1"  # the libp2p protocol: one request, one answer
PX_VERSION = 1
MAX_PX_TOPICS = 64  # topics named in one request (the first ones)
MAX_PX_PEERS = 32  # peers listed in one answer
MAX_PX_BYTES = 64 * 1024  # a request or an answer larger than this is refused unread
TOPIC_ID_BYTES = 32
# A peer not connected now is listed only if it was connected this recently.
PX_RECENT_MS = 10 * 60 * 1_000


@dataclass(frozen=True, slots=True)
class PxPeer:
    """One peer an answer lists: its id, addresses and the (hex) topics it serves."""

    peer_id: str
    addresses: tuple[str, ...]
    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PxAnswer:
    peers: tuple[PxPeer, ...]
    dropped: int = 0  # entries that did not parse, or past the bounds


def encode_request(topics: Iterable[bytes]) -> bytes:
    return msgpack.packb([PX_VERSION, list(topics)[:MAX_PX_TOPICS]])


def decode_request(data: bytes) -> tuple[bytes, ...] | None:
    """The topic ids a request names, or None if it is not a request."""
    if len(data) > MAX_PX_BYTES:
        return None
    try:
        version, topics = msgpack.unpackb(data)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    if version != PX_VERSION or not isinstance(topics, list):
        return None
    return tuple(t for t in topics[:MAX_PX_TOPICS]
                 if isinstance(t, bytes) and len(t) == TOPIC_ID_BYTES)


def encode_answer(peers: Iterable[PxPeer]) -> bytes:
    return msgpack.packb([PX_VERSION, [[p.peer_id, list(p.addresses), list(p.topics)]
                                       for p in list(peers)[:MAX_PX_PEERS]]])


def decode_answer(data: bytes, asked: Iterable[str]) -> PxAnswer | None:
    """The peers an answer lists, keeping only topics we `asked` about (hex ids) and
    valid addresses; None if it is not an answer at all."""
    if len(data) > MAX_PX_BYTES:
        return None
    try:
        version, entries = msgpack.unpackb(data)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    if version != PX_VERSION or not isinstance(entries, list):
        return None
    wanted = set(asked)
    peers: list[PxPeer] = []
    dropped = max(0, len(entries) - MAX_PX_PEERS)
    for entry in entries[:MAX_PX_PEERS]:
        try:
            peer_id, addresses, topics = entry
        except (ValueError, TypeError):
            dropped += 1
            continue
        if not isinstance(peer_id, str) or not 0 < len(peer_id) <= MAX_PEER_ID_CHARS \
                or not isinstance(addresses, list) or not isinstance(topics, list):
            dropped += 1
            continue
        good = tuple(a for a in addresses[:MAX_BOOK_ADDRESSES] if valid_address(a, peer_id))
        shared = tuple(t for t in topics[:MAX_PX_TOPICS] if isinstance(t, str) and t in wanted)
        if not good or not shared:
            dropped += 1
            continue
        peers.append(PxPeer(peer_id, good, shared))
    return PxAnswer(tuple(peers), dropped)


def select(book: PeerBook, asker: str, topics: Iterable[str], connected: Iterable[str],
           now_ms: int, may_list: Callable[[str], bool] = lambda peer: True) -> list[PxPeer]:
    """The peers to list for `asker`, who named (and may read) `topics` (hex ids).

    Peers connected now first, then those connected within PX_RECENT_MS; never
    the asker, never a peer `may_list` refuses (e.g. a banned one); at most
    MAX_PX_PEERS.
    """
    wanted = set(topics)
    if not wanted:
        return []
    live = set(connected)
    candidates = []
    for entry in book.entries():
        if entry.peer_id == asker or not entry.addresses or not may_list(entry.peer_id):
            continue
        shared = tuple(t for t in entry.topics if t in wanted)
        if not shared:
            continue
        is_live = entry.peer_id in live
        if not is_live and (now_ms - entry.last_success_ms > PX_RECENT_MS
                            or entry.failures >= FAILURES_BEFORE_STALE):
            continue
        candidates.append((is_live, entry.last_success_ms, entry.peer_id,
                           PxPeer(entry.peer_id, entry.addresses, shared)))
    candidates.sort(reverse=True)
    return [peer for *_, peer in candidates[:MAX_PX_PEERS]]
