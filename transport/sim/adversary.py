"""The misbehaving peer of a simulated world, and the asks of non-members.

`outsider_frames`: what a node that knows a private topic's id but was never
invited sends besides its engine's own offers and join asks: a want of the
topic's root, and a push of an event it signed itself. Members must drop
them all as if the topic were unknown (transport.dissemination).

The misbehaving peer: garbage frames and forged events.

One more peer with a key of its own and no replica. Each tick it sends each
neighbour ADVERSARY_FRAMES_PER_TICK frames, alternating random bytes and a
Push of a signed event whose signature was then broken. It is here so the
world proves the honest side of the peer policy: every honest node it talks
to bans it (node.core.peer_policy), and no honest node is banned. It listens
to nobody, and dials back whoever restarts (a ban lives in memory only).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

from node.core.identity import Identity, sign_event
from transport.messages import Push, Want, encode

ADVERSARY_FRAMES_PER_TICK = 2  # bad frames the misbehaving peer sends each neighbour per tick
ADVERSARY_NEIGHBOURS = 6
GARBAGE_FRAME_BYTES = 32
FORGED_PAYLOAD = b"forged"
OUTSIDER_PAYLOAD = b"let me in"


def outsider_frames(identity: Identity, topic: bytes, seq: int, now_ms: int) -> list[bytes]:
    """A non-member's extra asks of a private topic (module docstring)."""
    event = sign_event(identity, topic=topic, seq=seq, parents=(topic,), timestamp_ms=now_ms,
                       kind="message", state_key=None, payload=OUTSIDER_PAYLOAD, auth=(topic,))
    return [encode(Want(topic, (topic,))), encode(Push(topic, (event.raw,)))]


class Adversary:
    """The misbehaving peer: a node id and neighbours, no replica, no engine, no policy."""

    policy = None  # it obeys no peer policy
    alive = True  # it never crashes

    def __init__(self, index: int, identity: Identity, neighbours: list[int]) -> None:
        self.index = index
        self.identity = identity
        self.node_id = identity.public_key.hex()
        self.neighbours = neighbours  # the honest nodes it dials (and redials after restarts)
        self._seq = 0

    def frames(self, topic: bytes, peers: Iterable[int], now_ms: int,
               rng: random.Random) -> Iterator[tuple[int, bytes]]:
        """This tick's bad frames, as (peer, frame). Lazy: the caller transmits each
        before the next is drawn, so the seed's random draws keep their order."""
        for peer in peers:
            for _ in range(ADVERSARY_FRAMES_PER_TICK):
                self._seq += 1
                if self._seq % 2:
                    frame = bytes(rng.getrandbits(8) for _ in range(GARBAGE_FRAME_BYTES))
                else:
                    event = sign_event(self.identity, topic=topic, seq=self._seq,
                                       parents=(topic,), timestamp_ms=now_ms, kind="message",
                                       state_key=None, payload=FORGED_PAYLOAD)
                    raw = bytearray(event.raw)
                    raw[-1] ^= 0xFF  # the signature no longer verifies
                    frame = encode(Push(topic, (bytes(raw),)))
                yield peer, frame
