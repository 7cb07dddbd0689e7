"""What the dissemination engine asks its driver to do: the `Effect` values.

The engine (`transport.dissemination.Disseminator`) is sans-IO: it never
sends, writes or closes anything itself. Every call returns a list of these
frozen values, and the driver (the node's committer and runtime, or the
simulator) carries them out in order, after committing what they cite. They
live apart from the engine so that drivers and tests can name them without
importing the engine's machinery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

PeerId = str  # a peer's id as the transport names it (libp2p: base58; a node's own: key hex)


@dataclass(frozen=True, slots=True)
class Send:
    """Write one encoded frame (`transport.messages`) to `peer`."""

    peer: PeerId
    data: bytes


@dataclass(frozen=True, slots=True)
class Log:
    """One dissemination log record (node.logschema v1 keys; absent fields omitted)."""

    record: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Disconnect:
    """Drop `peer`: it reached the misbehaviour threshold (`transport.misbehaviour`)."""

    peer: PeerId
    reason: str


@dataclass(frozen=True, slots=True)
class Announce:
    """Events authored here, durable, for a fast path outside the engine (GossipSub).

    Emitted for every local event (publishes, acks, joins, state changes,
    dummies, relayed submits) when `DisseminationConfig.announce` is on, so
    an external fast path carries all of them, not only what one API call
    made. Effects of one call keep their order: the runtime may batch the
    announcements of one call into one gossip message.
    """

    topic: bytes
    raws: tuple[bytes, ...]


Effect = Union[Send, Log, Disconnect, Announce]
