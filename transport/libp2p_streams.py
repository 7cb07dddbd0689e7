"""What our libp2p stream protocols share: limits, framing on a stream, failure vocabulary.

megnode's own protocols run on py-libp2p streams in two shapes,
request/response (`transport.libp2p_requests`: the relay protocol) and
long-lived one-way message streams (`transport.libp2p_messages`: the whole
dissemination protocol, push and anti-entropy alike). Anti-entropy is a
request/response exchange at the protocol level (Offer, Reply, Events, Want,
matched by exchange id, each exchange bounded by a session timeout), but its
frames ride the peer's one batched stream: a write per frame on a fresh
stream costs ~50x the CPU of frames batched on one (research measurement
6a), and a catch-up moves many frames. Both carry `transport.framing` varint frames, and both treat the
peer's bytes the same way: an oversized or malformed frame, trailing bytes
after a request, or a stalled request is the peer's misbehaviour. The stream is
reset, the peer is reported through a `Misbehaviour` callback (the node scores
it down and decides when to disconnect), and nothing raises out of the handler
task: py-libp2p runs stream handlers inside the connection's task, so an
exception escaping one tears down the whole swarm (see `guarded`).

Reports come in two kinds (`Misbehaviour.is_protocol_fault`). Protocol
faults — an oversized, malformed or trailing frame, a request never sent —
are bytes (or silence) the peer's code chose, over an authenticated channel:
evidence against the peer. A breakage — a stream that ends in the middle of
a frame — is what a connection dying under a burst, a stall or a restart
looks like, whoever is at fault: it is reported so it can be counted, never
as proof of malice.

Every size, timeout and concurrency bound is a named constant here and can be
overridden per host through `StreamLimits`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio
from libp2p.abc import INetStream
from libp2p.exceptions import BaseLibp2pError
from libp2p.peer.id import ID

from transport.framing import FrameDecoder, FrameError, FrameTooLarge

logger = logging.getLogger(__name__)

# Sizes. A request is a heads offer or an id list; a response may carry a
# batch of events (64 KiB each at most), hence the asymmetry.
MAX_REQUEST_BYTES = 1 * 1024 * 1024
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
MAX_MESSAGE_BYTES = 1 * 1024 * 1024  # one one-way frame (a batch of events)
READ_CHUNK_BYTES = 64 * 1024  # = yamux's max data frame; one read per frame
WRITE_BATCH_BYTES = 256 * 1024  # stop coalescing queued messages past this

# Timeouts (seconds).
REQUEST_TIMEOUT_S = 10.0  # default for the whole exchange, requester side
INBOUND_REQUEST_READ_TIMEOUT_S = 5.0  # a peer must send its request this fast
HANDLER_TIMEOUT_S = 10.0  # our own handler; past this the requester gave up anyway
RESPONSE_WRITE_TIMEOUT_S = 10.0
OPEN_STREAM_TIMEOUT_S = 10.0
MESSAGE_WRITE_TIMEOUT_S = 10.0  # a peer that stops reading blocks yamux; give up
STREAM_CLOSE_TIMEOUT_S = 1.0  # close/reset during cleanup must never hang

# Concurrency.
MAX_INBOUND_REQUESTS = 64  # in flight, all peers together
MAX_INBOUND_REQUESTS_PER_PEER = 8  # so one peer cannot take every slot
MAX_INBOUND_MESSAGE_STREAMS_PER_PEER = 8  # a peer needs one per protocol
OUTBOUND_QUEUE_MESSAGES = 1024  # per (peer, protocol); `send` waits when full

# Peer ids we parse (base58, pure Python: ~0.1 ms each) are cached.
PEER_ID_CACHE_SIZE = 1024

# Misbehaviour reasons (stable strings: they end up in logs and metrics).
OVERSIZED_FRAME = "oversized_frame"
MALFORMED_FRAME = "malformed_frame"
TRAILING_BYTES = "trailing_bytes"
REQUEST_READ_TIMEOUT = "request_read_timeout"
TRUNCATED_FRAME = "truncated_frame"
# Reasons that say the connection broke, not that the peer broke the protocol.
BREAKAGE_REASONS = frozenset({TRUNCATED_FRAME})

# Consecutive timed-out outbound stream opens/writes to one peer (no success
# in between) after which its connection is considered stale and aborted.
# Two, not one: one timeout may be a peer busy for a moment; two in a row,
# each bounded by OPEN_STREAM_TIMEOUT_S or MESSAGE_WRITE_TIMEOUT_S, mean
# nothing has got through for twice that long.
STALE_STREAM_FAILURES = 2

RequestHandler = Callable[[str, bytes], Awaitable[bytes]]
MessageHandler = Callable[[str, bytes], Awaitable[None]]

# Failures of a stream or of the connection under it, as py-libp2p raises them.
STREAM_ERRORS = (BaseLibp2pError, OSError, trio.BrokenResourceError, trio.ClosedResourceError)


@functools.lru_cache(maxsize=PEER_ID_CACHE_SIZE)
def parse_peer_id(peer_id: str) -> ID:
    """The libp2p ID of a base58 peer id; `ValueError` if malformed."""
    return ID.from_base58(peer_id)


@dataclass(frozen=True)
class Misbehaviour:
    """A peer sent something no correct megnode peer sends."""

    peer_id: str
    protocol_id: str
    reason: str
    detail: str = ""

    @property
    def is_protocol_fault(self) -> bool:
        """True if the peer broke the protocol; False for a connection that broke."""
        return self.reason not in BREAKAGE_REASONS


MisbehaviourCallback = Callable[[Misbehaviour], None]


@dataclass(frozen=True)
class StreamLimits:
    max_request_bytes: int = MAX_REQUEST_BYTES
    max_response_bytes: int = MAX_RESPONSE_BYTES
    max_message_bytes: int = MAX_MESSAGE_BYTES
    inbound_request_read_timeout_s: float = INBOUND_REQUEST_READ_TIMEOUT_S
    handler_timeout_s: float = HANDLER_TIMEOUT_S
    open_stream_timeout_s: float = OPEN_STREAM_TIMEOUT_S
    message_write_timeout_s: float = MESSAGE_WRITE_TIMEOUT_S
    # A secure-channel write that stalls this long aborts its connection
    # (transport.libp2p_patches: one value per process, set by the host that starts).
    write_stall_timeout_s: float = MESSAGE_WRITE_TIMEOUT_S
    max_inbound_requests: int = MAX_INBOUND_REQUESTS
    max_inbound_requests_per_peer: int = MAX_INBOUND_REQUESTS_PER_PEER
    max_inbound_message_streams_per_peer: int = MAX_INBOUND_MESSAGE_STREAMS_PER_PEER
    outbound_queue_messages: int = OUTBOUND_QUEUE_MESSAGES


def report_misbehaviour(
    callback: MisbehaviourCallback, peer_id: str, protocol_id: str, reason: str, detail: str
) -> None:
    logger.info("peer %s misbehaved on %s: %s (%s)", peer_id, protocol_id, reason, detail)
    callback(Misbehaviour(peer_id, protocol_id, reason, detail))


class PeerClosedStream(Exception):
    """EOF or reset before a complete frame arrived."""


class TrailingBytes(FrameError):
    """Bytes after the one frame a request stream may carry."""


async def read_single_frame(stream: INetStream, max_bytes: int) -> bytes:
    """Read exactly one frame; anything after it in the same read is a violation."""
    decoder = FrameDecoder(max_bytes)
    while True:
        try:
            chunk = await stream.read(READ_CHUNK_BYTES)
        except STREAM_ERRORS as error:
            raise PeerClosedStream(str(error) or type(error).__name__) from error
        if not chunk:
            raise PeerClosedStream("end of stream")
        frames = decoder.feed(chunk)
        if frames:
            if len(frames) > 1 or decoder.buffered_bytes:
                raise TrailingBytes("bytes after the single expected frame")
            return frames[0]


def frame_error_reason(error: FrameError) -> str:
    if isinstance(error, FrameTooLarge):
        return OVERSIZED_FRAME
    if isinstance(error, TrailingBytes):
        return TRAILING_BYTES
    return MALFORMED_FRAME


async def close_quietly(stream: INetStream, *, reset: bool) -> None:
    """Close or reset, shielded and bounded: cleanup runs during cancellation too."""
    with trio.CancelScope(shield=True), trio.move_on_after(STREAM_CLOSE_TIMEOUT_S):
        try:
            if reset:
                await stream.reset()
            else:
                await stream.close()
        except STREAM_ERRORS:
            pass


async def guarded(serve: Awaitable[None], stream: INetStream) -> None:
    """Run an inbound stream handler so that nothing escapes it.

    py-libp2p runs stream handlers inside the connection's task: an exception
    escaping one tears down the whole swarm, i.e. the host.
    """
    try:
        await serve
    except Exception:
        logger.exception("inbound stream handler failed; stream reset")
        await close_quietly(stream, reset=True)


def peer_of(stream: INetStream) -> str:
    return stream.muxed_conn.peer_id.to_base58()
