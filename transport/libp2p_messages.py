"""One-way message streams over py-libp2p: the gossip fast path.

One long-lived outbound stream per (peer, protocol) carries many frames.
`send` only enqueues; a writer task takes everything queued and writes it in
one `stream.write`, so batching happens exactly when the link is busy and
costs no latency when it is idle. Measured on py-libp2p (tests/bench): one
write per 300-byte message manages a few thousand messages/s, coalesced
writes ~40x more.

Frames on one stream arrive in order and the receiver's handler is called
for each in that order. Delivery is best effort: frames still queued when a
stream fails are lost (anti-entropy repairs them), `send` then raises
`SendError` and the next `send` opens a fresh stream. A receiver that stops
reading stalls the writer until `StreamLimits.message_write_timeout_s`, then
the stream is reset; a full queue makes `send` wait, which paces the caller to
the link.

Stale connections: a peer that stops reading (stopped process, hung host,
dead network) can leave its connection looking open for ever. Every stream
open or write to a peer that times out counts; `STALE_STREAM_FAILURES` in a
row (no successful write between them) report the peer through `on_stale`,
and the host aborts its connection, so the owner sees the peer go down and
can redial. Refusals (a reset, an unsupported protocol) are fast and say the
peer is alive: they do not count.

A stream that ends in the middle of a frame is reported as `TRUNCATED_FRAME`,
a breakage (the connection under it died: see
`Misbehaviour.is_protocol_fault`), not as proof of malice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.network.stream.exceptions import StreamEOF

from transport.framing import FrameDecoder, FrameError, encode_frame
from transport.libp2p_streams import (
    READ_CHUNK_BYTES,
    STALE_STREAM_FAILURES,
    STREAM_ERRORS,
    TRUNCATED_FRAME,
    WRITE_BATCH_BYTES,
    MessageHandler,
    MisbehaviourCallback,
    StreamLimits,
    close_quietly,
    frame_error_reason,
    guarded,
    parse_peer_id,
    peer_of,
    report_misbehaviour,
)

logger = logging.getLogger(__name__)


class SendError(Exception):
    """The one-way stream to that peer failed or was closed; the message was not queued."""


StaleCallback = Callable[[str, str], None]  # (peer id, why): its connection looks dead


@dataclass
class _Outbound:
    """The queue and writer task of one (peer, protocol) stream."""

    send: trio.MemorySendChannel[bytes]
    cancel_scope: trio.CancelScope
    connection: object | None = None  # the muxed connection its stream runs on, once open


class MessageStreams:
    """Message handlers and outbound message streams on one libp2p host.

    Writer tasks run in `nursery` (the owner's); inbound handlers run in the
    tasks py-libp2p starts per stream and end when the stream does.
    """

    def __init__(
        self,
        host: IHost,
        nursery: trio.Nursery,
        limits: StreamLimits,
        on_misbehaviour: MisbehaviourCallback,
        on_stale: StaleCallback | None = None,
    ) -> None:
        self._host = host
        self._nursery = nursery
        self.limits = limits
        self._on_misbehaviour = on_misbehaviour
        self._on_stale = on_stale
        self._inbound_by_peer: dict[str, int] = {}
        self._outbound: dict[tuple[str, str], _Outbound] = {}
        # Consecutive timed-out opens/writes per peer; a successful write clears it.
        self._failures: dict[str, int] = {}
        self.dropped = 0  # `send_nowait` calls refused by a full queue
        self.timed_out_streams = 0  # outbound streams whose open or a write timed out
        self.closed_with_connection = 0  # outbound streams stopped by `close_on`

    # -- inbound ----------------------------------------------------------------

    def set_handler(self, protocol_id: str, handler: MessageHandler) -> None:
        async def on_stream(stream: INetStream) -> None:
            await guarded(self._receive(stream, protocol_id, handler), stream)

        self._host.set_stream_handler(TProtocol(protocol_id), on_stream)

    async def _receive(self, stream: INetStream, protocol_id: str, handler: MessageHandler) -> None:
        peer_id = peer_of(stream)
        open_streams = self._inbound_by_peer.get(peer_id, 0)
        if open_streams >= self.limits.max_inbound_message_streams_per_peer:
            await close_quietly(stream, reset=True)
            return
        self._inbound_by_peer[peer_id] = open_streams + 1
        try:
            await self._read(stream, peer_id, protocol_id, handler)
        finally:
            remaining = self._inbound_by_peer[peer_id] - 1
            if remaining:
                self._inbound_by_peer[peer_id] = remaining
            else:
                del self._inbound_by_peer[peer_id]

    async def _read(
        self, stream: INetStream, peer_id: str, protocol_id: str, handler: MessageHandler
    ) -> None:
        decoder = FrameDecoder(self.limits.max_message_bytes)
        while True:
            try:
                chunk = await stream.read(READ_CHUNK_BYTES)
            except StreamEOF:
                chunk = b""
            except STREAM_ERRORS:
                # A reset: the sender aborted (its shutdown, a write timeout).
                # Whatever partial frame we hold is its loss, not an offence.
                await close_quietly(stream, reset=True)
                return
            if not chunk:
                # Our sender resets if it stops mid-write, so an end of stream
                # mid-frame means the connection under it died (py-libp2p ends
                # every stream of a dropped connection this way): reported as a
                # breakage, which the node counts but never bans for.
                if decoder.buffered_bytes:
                    report_misbehaviour(self._on_misbehaviour, peer_id, protocol_id, TRUNCATED_FRAME,
                                        f"{decoder.buffered_bytes} bytes of an unfinished frame")
                await close_quietly(stream, reset=False)
                return
            try:
                frames = decoder.feed(chunk)
            except FrameError as error:
                report_misbehaviour(self._on_misbehaviour, peer_id, protocol_id,
                                    frame_error_reason(error), str(error))
                await close_quietly(stream, reset=True)
                return
            for frame in frames:
                try:
                    await handler(peer_id, frame)
                except Exception:
                    # A handler bug loses one message, not the peer's stream.
                    logger.exception("message handler for %s failed (peer %s)", protocol_id, peer_id)

    # -- outbound ---------------------------------------------------------------

    def _queue_for(self, peer_id: str, protocol_id: str, data: bytes) -> tuple[_Outbound, bytes]:
        """The (peer, protocol) queue, opening its stream if needed, and `data` framed."""
        if len(data) > self.limits.max_message_bytes:
            raise ValueError(
                f"message of {len(data)} bytes exceeds max_message_bytes={self.limits.max_message_bytes}"
            )
        key = (peer_id, protocol_id)
        outbound = self._outbound.get(key)
        if outbound is None:
            parse_peer_id(peer_id)  # a malformed id is the caller's error, raised here
            send_channel, receive_channel = trio.open_memory_channel[bytes](
                self.limits.outbound_queue_messages
            )
            outbound = _Outbound(send_channel, trio.CancelScope())
            self._outbound[key] = outbound
            self._nursery.start_soon(self._write, key, outbound, receive_channel)
        return outbound, encode_frame(data)

    async def send(self, peer_id: str, protocol_id: str, data: bytes) -> None:
        """Queue `data` on the (peer, protocol) stream, opening it if needed.

        Returns once queued, waiting while the queue is full: a peer that
        stops reading holds the caller up to `limits.message_write_timeout_s`.
        Raises `SendError` if that stream has failed or been closed.
        """
        outbound, frame = self._queue_for(peer_id, protocol_id, data)
        try:
            # Only a cancellation point while there is room: yielding to the
            # scheduler on every message would wake the writer per message
            # and shrink its batches to a few frames (measured: 8k msg/s at
            # ~7 frames per write). Full queue: wait, which paces the caller.
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                outbound.send.send_nowait(frame)
            except trio.WouldBlock:
                await outbound.send.send(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise SendError(f"stream to {peer_id} on {protocol_id} is closed") from None

    def send_nowait(self, peer_id: str, protocol_id: str, data: bytes) -> bool:
        """Queue `data` unless that peer's queue is full; False (and counted) if it is.

        For a sender shared by all peers: one slow peer must not hold up the
        others, and what it misses is repaired by anti-entropy.
        """
        outbound, frame = self._queue_for(peer_id, protocol_id, data)
        try:
            outbound.send.send_nowait(frame)
        except trio.WouldBlock:
            self.dropped += 1
            return False
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise SendError(f"stream to {peer_id} on {protocol_id} is closed") from None
        return True

    async def _write(
        self, key: tuple[str, str], outbound: _Outbound, queue: trio.MemoryReceiveChannel[bytes]
    ) -> None:
        peer_id, protocol_id = key
        stream: INetStream | None = None
        # Reset (not close) the stream if it failed or we stop mid-write: a
        # graceful close after half a frame would look like a truncating peer.
        failed = False
        writing = False
        try:
            with outbound.cancel_scope, queue:
                with trio.fail_after(self.limits.open_stream_timeout_s):
                    stream = await self._host.new_stream(parse_peer_id(peer_id), [TProtocol(protocol_id)])
                outbound.connection = getattr(stream, "muxed_conn", None)
                while True:
                    try:
                        first = await queue.receive()
                    except trio.EndOfChannel:
                        return
                    batch = [first]
                    size = len(first)
                    while size < WRITE_BATCH_BYTES:
                        try:
                            frame = queue.receive_nowait()
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                        batch.append(frame)
                        size += len(frame)
                    writing = True
                    with trio.fail_after(self.limits.message_write_timeout_s):
                        await stream.write(b"".join(batch))
                    writing = False
                    self._failures.pop(peer_id, None)
        except (trio.TooSlowError, *STREAM_ERRORS) as error:
            failed = True
            logger.info("one-way stream to %s on %s failed: %r", peer_id, protocol_id, error)
            if isinstance(error, trio.TooSlowError):  # staleness is about time, not refusals
                self._stream_timed_out(peer_id, "stream open" if stream is None else "write")
        finally:
            if self._outbound.get(key) is outbound:
                del self._outbound[key]
            # Wakes any sender blocked on a full queue with ClosedResourceError.
            outbound.send.close()
            if stream is not None:
                await close_quietly(stream, reset=failed or writing)

    def _stream_timed_out(self, peer_id: str, step: str) -> None:
        self.timed_out_streams += 1
        failures = self._failures.get(peer_id, 0) + 1
        self._failures[peer_id] = failures
        if failures >= STALE_STREAM_FAILURES and self._on_stale is not None:
            self._failures.pop(peer_id, None)
            try:
                self._on_stale(peer_id, f"{failures} stream opens/writes in a row timed out, "
                                        f"the last one a {step}")
            except Exception:
                logger.exception("stale-peer callback failed for %s", peer_id)

    def close_peer(self, peer_id: str) -> None:
        """Stop the outbound streams to a peer that went away."""
        self._failures.pop(peer_id, None)
        for key, outbound in list(self._outbound.items()):
            if key[0] == peer_id:
                outbound.cancel_scope.cancel()

    def close_on(self, peer_id: str, connection: object) -> int:
        """Stop the outbound streams to `peer_id` that run on `connection`, which closed
        while the peer has another; returns how many.

        They are forgotten at once, not when their writer task ends: the next
        message to the peer opens a stream on a connection that is up, instead
        of being queued on one whose frames go nowhere (a resumed node's first
        offer went out so, and its exchange waited out its timeout).
        """
        closed = 0
        for key, outbound in list(self._outbound.items()):
            if key[0] == peer_id and outbound.connection is connection:
                del self._outbound[key]
                outbound.cancel_scope.cancel()
                outbound.send.close()
                closed += 1
        self.closed_with_connection += closed
        return closed

    def outbound_streams(self) -> frozenset[tuple[str, str]]:
        return frozenset(self._outbound)
