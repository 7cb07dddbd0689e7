"""The misbehaving peer of a simulated world, and the asks of non-members.

`outsider_frames`: what a node that knows a private topic's id but was never
invited sends besides its engine's own offers and join asks: a want of the
topic's root, and a push of an event it signed itself. Members must drop
them all as if the topic were unknown (transport.dissemination).

The banned writer (`BannedWriter`, issue 16): a member that the creator bans
and that keeps writing signed events on parents from before its ban (its
heads when the ban was made, then its own chain), pushing them straight to
its neighbours. Its events are valid in their own past, so every replica
keeps them; the order must keep them out of every view (node.replica.order_bans),
and a node that has the ban soft-fails them (node.state.soft_fail).

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

from node.core.event import Event
from node.core.identity import Identity, sign_event
from node.replica.replica import Replica
from transport.messages import Push, Want, encode

ADVERSARY_FRAMES_PER_TICK = 2  # bad frames the misbehaving peer sends each neighbour per tick
ADVERSARY_NEIGHBOURS = 6
GARBAGE_FRAME_BYTES = 32
FORGED_PAYLOAD = b"forged"
OUTSIDER_PAYLOAD = b"let me in"
BANNED_WRITES_PER_ROUND = 2  # events the banned writer signs at each of its writes
BANNED_WRITE_INTERVAL_MS = 200  # how often it writes, from its ban on
BANNED_WRITES_AFTER = 6  # it stops once this many were signed after its ban took effect
# ... or, in a private topic, once it signed this many before any member confirmed its ban
# (a bound for a world whose order would not confirm it; the convergence checks fail then).
BANNED_WRITES_UNTOLD = 30
BANNED_PAYLOAD = b"still here"


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


def ban_confirmed(replica: Replica, ban_id: bytes) -> bool:
    """Does `replica`'s order hold the ban at a confirmed position (or excluded it there)?"""
    order = replica.ordering
    return order is not None and (order.is_confirmed(ban_id) or order.is_excluded(ban_id))


class BannedWriter:
    """A member banned at `ban_round` that keeps writing on pre-ban parents, every
    BANNED_WRITE_INTERVAL_MS on its ticks, until BANNED_WRITES_AFTER of its writes
    came after its ban took effect.

    Its writes are split by whether the ban was confirmed when it signed them:
    `concurrent` were signed before (the order may place them on either side
    of the ban, the same way everywhere), `after` once it was (the ban holds a
    confirmed position below anything signed then, so no correct node may show
    them in any view). In an open topic that is what its own replica knew. In a
    private topic it reads no ack after its ban, so the world says whether any
    correct member had the ban confirmed (`write(confirmed_elsewhere=)`). (Seed 5
    of the 40-node private world with loss and a partition: writes signed once
    it held the ban, but before any member had confirmed it, were placed before
    the ban, rightly, and the check, which had counted them as after, failed.)
    """

    def __init__(self, index: int, ban_round: int, private: bool = False) -> None:
        self.index = index
        self.ban_round = ban_round
        # In a private topic the banned member reads nothing once banned, the acks that
        # confirm its ban included: the world judges its writes by a correct member's
        # order, and it is no member that must converge (`Cluster.correct_members`).
        self.private = private
        self.ban_id: bytes | None = None
        self._parents: tuple[bytes, ...] = ()  # its heads when the ban was made
        self._tip: bytes | None = None  # its latest post-ban event
        self.concurrent: list[bytes] = []
        self.after: list[bytes] = []
        self._next_ms = 0

    @property
    def done(self) -> bool:
        return len(self.after) >= BANNED_WRITES_AFTER or (
            self.private and not self.after and len(self.concurrent) >= BANNED_WRITES_UNTOLD)

    def due(self, now_ms: int) -> bool:
        """Time to write again? (From its ban until BANNED_WRITES_AFTER writes after it,
        into the liveness phase if need be: partitioned away, it learns of its ban late.)"""
        return self.ban_id is not None and not self.done and now_ms >= self._next_ms

    def banned(self, ban_id: bytes, heads: list[bytes]) -> None:
        self.ban_id = ban_id
        self._parents = tuple(heads)

    def write(self, replica: Replica, now_ms: int,
              confirmed_elsewhere: bool = False) -> list[Event]:
        """Sign BANNED_WRITES_PER_ROUND events on the pre-ban chain; add them to its replica.

        `confirmed_elsewhere`: a correct member's order has the ban confirmed (or
        excluded) now; what a private topic's banned member cannot see itself."""
        assert self.ban_id is not None
        self._next_ms = now_ms + BANNED_WRITE_INTERVAL_MS
        told = ban_confirmed(replica, self.ban_id) or confirmed_elsewhere
        made: list[Event] = []
        for _ in range(BANNED_WRITES_PER_ROUND):
            parents = (self._tip,) if self._tip is not None else tuple(
                p for p in self._parents if replica.graph.has(p))
            if not parents:
                break  # its heads at the ban were lost in a crash before its store had them
            event = replica.sign_on(parents, BANNED_PAYLOAD, now_ms)
            replica.receive(event.raw, now_ms)  # its engine offers them to whoever syncs
            (self.after if told else self.concurrent).append(event.id)
            self._tip = event.id
            made.append(event)
        # Durable before they are pushed, as a node's publish is: a crash then cannot
        # lose the tip the next write builds on (sweep seed 62: it did, and the write
        # after the restart named a parent its store never had).
        replica.commit()
        return made

    @staticmethod
    def push(topic: bytes, events: list[Event]) -> bytes:
        return encode(Push(topic, tuple(e.raw for e in events)))
