"""The connection manager: how many connections a node keeps, and which. Sans-IO.

Peer exchange and the peer book could connect a node to every peer of a big
fleet, and anyone may dial a node: its connections need bounds, and a choice
of which to keep. The rules (the runtime, node.fleet, carries them out):

* A connection that comes up is refused (closed at once) when the node
  already holds `max_connections` (node-wide) or `max_per_ip` from the same
  IP address (issue 16: a flood of connections costs the flooder, not the
  node). Loopback is exempt from the per-IP bound (a local cluster, tests);
  the node-wide bound holds for it too.
  A connection refused at the node-wide limit first answers one peer-exchange
  request (`lingers`), so a joiner a full bootstrap refuses learns the fleet.
* Above the high water mark the manager trims down to a point between the
  marks (`Limits.trim_to`, TRIM_POINT), closing first peers that share no topic with us, then the most recently
  connected; a peer connected less than GRACE_MS ago is spared (it has not
  had time to tell us its topics), and so is one we share topics with while
  others can go.
* Below the low water mark the node dials more (from the peer book) and
  redials lost peers; peer exchange dials only while under the trim point
  (`wants_more`).

py-libp2p 0.8.1 ships a resource manager (`libp2p.rcmgr`) with connection
limits, but it counts connections per process, knows nothing of topics and
its per-IP limits cannot exempt a local cluster; deciding here keeps the
simulator and the node on one rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

LOW_WATER = 16  # below this many connections, dial more from the peer book
HIGH_WATER = 48  # above this many, trim down to LOW_WATER
MAX_CONNECTIONS = 128  # node-wide: a connection past this is closed at once
MAX_CONNECTIONS_PER_IP = 8  # from one IP address (loopback exempt)
GRACE_MS = 30_000  # a new connection is not trimmed for this long
# Above the high water mark, trim to this point between the marks (0: the low mark, 1: the
# high one), and peer exchange dials only below it: room for inbound connections before the
# next trim. Trimming to the low mark made a saw-tooth (fill to high, trim to low, fill).
TRIM_POINT = 0.5
# A connection refused at the node-wide limit stays open this long to answer one
# peer-exchange request before it is closed (see `lingers`); the asker asks 0.5 s after up.
REFUSED_LINGER_MS = 5_000  # (2 s was too short for a loaded 2-core machine)
MAX_LINGERING = 16  # at most this many refused connections linger at once


class Refusal(str, Enum):
    """Why a connection was closed as soon as it came up (the string is what logs show)."""

    NODE_LIMIT = "node_connection_limit"
    IP_LIMIT = "ip_connection_limit"


@dataclass(frozen=True, slots=True)
class Limits:
    low_water: int = LOW_WATER
    high_water: int = HIGH_WATER
    max_connections: int = MAX_CONNECTIONS
    max_per_ip: int = MAX_CONNECTIONS_PER_IP

    @property
    def trim_to(self) -> int:
        """Where a trim stops, and below which peer exchange dials (TRIM_POINT)."""
        return self.low_water + int((self.high_water - self.low_water) * TRIM_POINT)

    def __post_init__(self) -> None:
        if not 0 <= self.low_water <= self.high_water <= self.max_connections:
            raise ValueError("connection limits must satisfy 0 <= low <= high <= max")
        if self.max_per_ip < 1:
            raise ValueError("max_per_ip must be at least 1")


@dataclass(frozen=True, slots=True)
class Connection:
    """One connected peer as the manager sees it."""

    peer: str
    ip: str | None  # None: unknown (never counted against an IP bound)
    since_ms: int
    shares_topics: bool = False


def is_loopback(ip: str) -> bool:
    return ip.startswith("127.") or ip == "::1"


def admit(new: Connection, others: list[Connection], limits: Limits) -> Refusal | None:
    """None to keep the connection `new` just made; else why it is closed. `others`:
    the other connections held now."""
    if len(others) >= limits.max_connections:
        return Refusal.NODE_LIMIT
    if new.ip is not None and not is_loopback(new.ip):
        same = sum(1 for c in others if c.ip == new.ip)
        if same >= limits.max_per_ip:
            return Refusal.IP_LIMIT
    return None


def lingers(refusal: Refusal, lingering: int) -> bool:
    """Whether a refused connection first answers the peer's peer-exchange request
    (for at most REFUSED_LINGER_MS), as gossipsub's PRUNE carries peer exchange.

    A node at its node-wide limit is typically a bootstrap the whole fleet knows of;
    a joiner it refuses knows nobody else, and would be lost with it. Only that
    refusal lingers: one past the per-IP limit (a flood from one address) is closed at
    once, and at most MAX_LINGERING linger at a time (`lingering`: how many do now).
    """
    return refusal is Refusal.NODE_LIMIT and lingering < MAX_LINGERING


def to_trim(connections: list[Connection], now_ms: int, limits: Limits) -> list[str]:
    """The peers to disconnect now: none at or under the high water mark; else down to
    `limits.trim_to` (between the marks), the least wanted first, never one inside its
    grace period."""
    if len(connections) <= limits.high_water:
        return []
    excess = len(connections) - limits.trim_to
    # Sharing no topic goes first; then the most recent (older links have proven useful).
    # The order is over every connection, those in their grace period included, and only
    # then are those skipped: a connection goes now only if it would go were they all
    # past their grace. Choosing among the old ones alone would close an old topic peer
    # while a flood of newer strangers waits out its grace (issue 16: the honest peer of
    # the adversary bench's 200-connection flood was trimmed, then refused at the limit).
    order = sorted(connections, key=lambda c: (c.shares_topics, -c.since_ms, c.peer))
    return [c.peer for c in order[:excess] if now_ms - c.since_ms >= GRACE_MS]


def wants_more(count: int, limits: Limits) -> bool:
    """Whether discovery (peer exchange) may add a connection: below the trim point, so
    the room up to the high water mark is left for peers that dial us."""
    return count < limits.trim_to


def needs_more(count: int, limits: Limits) -> bool:
    """Whether the node should dial more peers from its book."""
    return count < limits.low_water
