"""Every patch megnode applies to py-libp2p, in one place, applied by `apply()` only.

py-libp2p 0.8.1 has bugs and fixed sizes we cannot configure; we patch the
library process-wide (one node per process). Nothing here runs on import:
`P2PHost` calls `apply()` when it starts a host, so importing the transport
(tests, the simulator, the CLI) leaves the library as shipped. `apply()` is
idempotent and logs a warning, leaving the library alone, where its shape
changed. The patches:

A. Write path (`install_write_path`): two fixes without which bursts and
stalls break connections, found with the cluster benchmark
(tests/bench/test_cluster_bench.py, issue #6) and reproduced with two hosts,
one of them SIGSTOPped:

1. A cancelled write corrupts the connection. Every write goes yamux frame ->
   `SecureSession.write` -> Noise message(s) -> `trio.SocketStream.send_all`,
   and no layer protects a write from cancellation. A writer cancelled
   half-way — our `fail_after` on a stream write or open, the bounded
   `close_quietly` around a reset, a library timeout — leaves part of a Noise
   message (or the first of the two Noise messages a 64 KiB yamux frame
   needs) in the kernel, and the rest never follows. The peer's reader is
   then misaligned for good: it waits for bytes that never come (nothing
   reaches it any more, every exchange with it times out: "a node stopped
   for more than ~10 s never recovers"), or later bytes complete the message
   and decryption fails ("Failed authentication of message"), the connection
   drops and every message stream on it ends mid-frame ("truncated_frame").

   Fix: `SecureSession.write` runs shielded from its caller's cancellation,
   so a message reaches the kernel whole; a caller cancelled meanwhile sees
   it at its next checkpoint. The shielded write is bounded: if the kernel
   does not take the message within `stall_timeout_s` the peer is not
   reading at all (stopped, hung, gone), a partial message may be on the
   wire, and the connection can never carry another correct byte: it is
   aborted (socket closed), so both sides see it go down and can redial.

2. Yamux's reader writes. The one task reading a connection answers pings
   and acknowledges (or refuses) new streams inline, through the same write
   lock as the data. When both directions are saturated — several nodes
   publishing thousands of events at once — each side's data writer waits
   for the other side's kernel buffer, which only its reader can drain, and
   each reader waits for the write lock to send a pong or an ACK: both
   readers stop and the connection deadlocks (and, before fix 1, timeouts
   then cut writes in half).

   Fix: a frame the reader task writes is queued instead (at most
   `MAX_QUEUED_CONTROL_FRAMES`, 12 bytes each; past that the reader writes
   inline again, which paces a peer that floods us with pings or stream
   opens) and written by a helper task in the muxer's nursery. Order is
   kept: every other write on the connection first flushes the queue under
   the write lock, so e.g. the ACK of a new inbound stream still precedes
   anything the local side writes on that stream.

B. Gossipsub queues (`enlarge_gossip_queues`): the library's per-peer
outbound RPC queue (32) drops bursts and cannot be sized through its API;
see that function.

C. Gossipsub writes one RPC at a time per stream (`serialize_gossip_writes`):
the per-peer sending task is not the only writer of a peer's pubsub stream —
gossipsub writes pending and recent messages to a peer that just grafted
directly (`Pubsub.write_msg` from its own task). A large RPC (a ~94 KB batch
of events) goes out as several yamux frames with checkpoints between them,
so a second RPC written meanwhile lands inside the first: the receiver fails
to parse it ("Error parsing message with type 'pubsub.pb.RPC'"), which ends
its host's stream handler. Seen when a node subscribed to a topic just
before a large publish (tests/node/test_batch_gossip.py). Fix: `write_msg`
holds a lock per stream.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import libp2p.pubsub.pubsub as _pubsub_module
import libp2p.pubsub.rpc_queue as _rpc_queue_module
import trio
from libp2p.io.exceptions import ConnectionClosedError
from libp2p.security.secure_session import SecureSession
from libp2p.stream_muxer.yamux.yamux import Yamux

logger = logging.getLogger(__name__)

# A live peer takes one message (at most 64 KiB) within this, however busy it
# is: past it the peer is not reading at all. Equal to the message-stream
# write timeout, so a stalled peer is caught by whichever fires first.
WRITE_STALL_TIMEOUT_S = 10.0
ABORT_TIMEOUT_S = 1.0  # closing a socket is local; bound it anyway
MAX_QUEUED_CONTROL_FRAMES = 1_024

# Read at every write; `apply` sets it from the host's limits (one value per process).
stall_timeout_s = WRITE_STALL_TIMEOUT_S
# Connections aborted because a write stalled, in this process (all hosts).
stalled_aborts = 0

_MARKER = "megnode_write_path"
_READER = "_megnode_reader_task"
_QUEUE = "_megnode_control_frames"
_FLUSHING = "_megnode_control_flushing"

_Write = Callable[[Any, bytes], Awaitable[None]]


class WriteStalled(ConnectionClosedError):
    """The peer did not take one message within the bound; the connection was aborted."""


async def abort_session(session: Any) -> None:
    """Close the socket under a secure session, now: no further frame can be trusted."""
    with trio.CancelScope(shield=True), trio.move_on_after(ABORT_TIMEOUT_S):
        try:
            await session.close()
        except Exception:
            logger.debug("aborting a connection failed", exc_info=True)


# -- 1. whole-or-abort secure writes --------------------------------------------


def _whole_or_abort(original: _Write) -> _Write:
    async def write(self: Any, data: bytes) -> None:
        global stalled_aborts
        timeout_s = stall_timeout_s
        with trio.CancelScope(shield=True):
            with trio.move_on_after(timeout_s) as stall:
                await original(self, data)
            if stall.cancelled_caught:
                logger.warning("connection to %s stalled for %s s in a write; aborting it",
                               getattr(self, "remote_peer", "?"), timeout_s)
                stalled_aborts += 1
                await abort_session(self)
                raise WriteStalled(f"peer took no data for {timeout_s} s; connection aborted")

    setattr(write, _MARKER, True)
    return write


# -- 2. the yamux reader never waits on the write lock ----------------------------


async def _flush_locked(muxer: Any) -> None:
    """Write the queued control frames; the caller holds the muxer's write lock."""
    queued: list[bytes] | None = getattr(muxer, _QUEUE, None)
    if queued:
        data = b"".join(queued)
        queued.clear()
        await muxer.secured_conn.write(data)


async def _flush_task(muxer: Any) -> None:
    try:
        while getattr(muxer, _QUEUE, None):
            async with muxer._write_lock:
                await _flush_locked(muxer)
    except Exception as error:  # the connection died; its reader tears it down
        logger.debug("writing queued yamux control frames failed: %r", error)
    finally:
        setattr(muxer, _FLUSHING, False)


def _queue_control(muxer: Any, data: bytes) -> bool:
    """Queue a frame the reader task wants written; False if it must write inline."""
    nursery = getattr(muxer, "_nursery", None)
    queued: list[bytes] = muxer.__dict__.setdefault(_QUEUE, [])
    if nursery is None or len(queued) >= MAX_QUEUED_CONTROL_FRAMES:
        return False
    queued.append(data)
    if not getattr(muxer, _FLUSHING, False):
        try:
            nursery.start_soon(_flush_task, muxer)
        except RuntimeError:  # the muxer's nursery is closing: so is the connection
            queued.clear()
            return True
        setattr(muxer, _FLUSHING, True)
    return True


def _queued_write_frame(_original: _Write) -> _Write:
    async def _write_frame(self: Any, data: bytes) -> None:
        if trio.lowlevel.current_task() is getattr(self, _READER, None) and _queue_control(self, data):
            return
        async with self._write_lock:
            await _flush_locked(self)  # frames the reader queued go first, in order
            await self.secured_conn.write(data)
        await trio.lowlevel.checkpoint()

    setattr(_write_frame, _MARKER, True)
    return _write_frame


def _recording_reader(original: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
    async def handle_incoming(self: Any) -> None:
        setattr(self, _READER, trio.lowlevel.current_task())
        await original(self)

    setattr(handle_incoming, _MARKER, True)
    return handle_incoming


def apply(write_stall_timeout_s: float = WRITE_STALL_TIMEOUT_S) -> bool:
    """Apply every patch in this process (idempotent); True if all are in place.

    `write_stall_timeout_s` bounds a stalled secure-channel write. The patch
    sits on py-libp2p's classes, so it is one value per process: the host that
    started last sets it (in-process test nodes share one setting).
    """
    global stall_timeout_s
    stall_timeout_s = write_stall_timeout_s
    write_path = install_write_path()
    queues = enlarge_gossip_queues()
    gossip_writes = serialize_gossip_writes()
    return write_path and queues and gossip_writes


def install_write_path() -> bool:
    """Apply both write-path fixes (A) in this process (idempotent); True if in place."""
    secure_write = getattr(SecureSession, "write", None)
    write_frame = getattr(Yamux, "_write_frame", None)
    handle_incoming = getattr(Yamux, "handle_incoming", None)
    if secure_write is None or write_frame is None or handle_incoming is None:
        logger.warning("py-libp2p changed: its write path is not patched")
        return False
    if not getattr(secure_write, _MARKER, False):
        SecureSession.write = _whole_or_abort(secure_write)  # type: ignore[method-assign]
    if not getattr(write_frame, _MARKER, False):
        Yamux._write_frame = _queued_write_frame(write_frame)  # type: ignore[method-assign]
    if not getattr(handle_incoming, _MARKER, False):
        Yamux.handle_incoming = _recording_reader(handle_incoming)  # type: ignore[method-assign]
    return True


# --------------------------------------------------------------------------- B. gossipsub queues

# Per-peer outbound RPC queue. The library's 32 drops bursts; 4096 RPCs of at
# most libp2p_gossip.MAX_GOSSIP_MESSAGE_BYTES bound the memory a stuck peer can pin.
OUTBOUND_RPC_QUEUE_SIZE = 4096
# The library's per-subscription channel (32) only needs to absorb a burst
# between two runs of our drainer; enlarged anyway, it costs nothing.
SUBSCRIPTION_CHANNEL_SIZE = 1024


def enlarge_gossip_queues(size: int = OUTBOUND_RPC_QUEUE_SIZE) -> bool:
    """Make every Pubsub created afterwards in this process use `size`-RPC queues (B).

    Workaround: `Pubsub._handle_new_peer` builds each peer's queue with a bare
    `RpcQueue()`, whose `max_size` default was bound to `OutBoundQueueSize`
    (32) when the class was defined, so setting that module constant changes
    nothing. We rebind the name `RpcQueue` in `libp2p.pubsub.pubsub` to a
    subclass with a larger default. Process-wide by nature (one node per
    process); idempotent; the subscription channel size is a module constant
    read at subscribe time, set here too.
    """
    current = getattr(_pubsub_module, "RpcQueue", None)
    if current is None or not hasattr(_pubsub_module, "SUBSCRIPTION_CHANNEL_SIZE"):
        logger.warning("py-libp2p changed: cannot enlarge gossipsub queues")
        return False
    _pubsub_module.SUBSCRIPTION_CHANNEL_SIZE = SUBSCRIPTION_CHANNEL_SIZE
    if getattr(current, "megnode_queue_size", None) == size:
        return True
    base = _rpc_queue_module.RpcQueue

    class EnlargedRpcQueue(base):  # type: ignore[misc, valid-type]
        megnode_queue_size = size

        def __init__(
            self,
            max_size: int = size,
            max_message_size: int = _rpc_queue_module.DefaultMaxMessageSize,
        ) -> None:
            super().__init__(max_size, max_message_size)

    _pubsub_module.RpcQueue = EnlargedRpcQueue
    return True


# --------------------------------------------------------------------------- C. one RPC at a time

# One lock per pubsub stream, dropped with the stream.
_stream_locks: weakref.WeakKeyDictionary[Any, trio.Lock] = weakref.WeakKeyDictionary()


def _serialized_write_msg(original: Callable[..., Awaitable[bool]]) -> Callable[..., Awaitable[bool]]:
    async def write_msg(self: Any, stream: Any, rpc_msg: Any) -> bool:
        lock = _stream_locks.get(stream)
        if lock is None:
            lock = _stream_locks[stream] = trio.Lock()
        async with lock:
            return await original(self, stream, rpc_msg)

    setattr(write_msg, _MARKER, True)
    return write_msg


def serialize_gossip_writes() -> bool:
    """Make `Pubsub.write_msg` write one RPC at a time per stream (C); True if in place."""
    pubsub = getattr(_pubsub_module, "Pubsub", None)
    write_msg = getattr(pubsub, "write_msg", None)
    if write_msg is None:
        logger.warning("py-libp2p changed: gossipsub writes are not serialized")
        return False
    if not getattr(write_msg, _MARKER, False):
        pubsub.write_msg = _serialized_write_msg(write_msg)  # type: ignore[union-attr]
    return True
