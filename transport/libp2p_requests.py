"""Request/response over py-libp2p: one stream per request, one frame each way.

The anti-entropy and backfill exchanges are requests. The requester opens a
stream, writes one frame and reads one frame; the responder reads one frame,
calls the handler, writes one frame and closes. The request size, response
size, the time for each step, and the number of requests served at once (in
total and per peer) are bounded (`transport.libp2p_streams.StreamLimits`).
A peer that breaks the framing, on either side, is reported as misbehaviour.

Why not `libp2p.request_response.RequestResponse` (py-libp2p 0.8.1)? It has
the right shape (one stream per request, varint frames, 10 s / 1 MiB / 10 MiB /
128 concurrent by default) but (1) it turns every peer error into a log line,
so an oversized or garbage frame cannot be reported as misbehaviour, which the
node needs to score peers down; (2) its concurrency limit is per protocol, not
per peer, so one peer can take every slot; (3) it reads the length prefix one
byte per stream read. This module is about as long, uses only the host's
`new_stream`/`set_stream_handler`, and shares the frame decoder with the
one-way streams. Round-trip times are the same (measured side by side in
`tests/bench/test_libp2p_bench.py`).
"""

from __future__ import annotations

import logging

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol

from transport.framing import FrameError, encode_frame
from transport.libp2p_streams import (
    REQUEST_READ_TIMEOUT,
    REQUEST_TIMEOUT_S,
    RESPONSE_WRITE_TIMEOUT_S,
    STREAM_ERRORS,
    MisbehaviourCallback,
    PeerClosedStream,
    RequestHandler,
    StreamLimits,
    close_quietly,
    frame_error_reason,
    guarded,
    parse_peer_id,
    peer_of,
    read_single_frame,
    report_misbehaviour,
)

logger = logging.getLogger(__name__)


class RequestError(Exception):
    """A request got no valid response; the message says why."""


class RequestTimeout(RequestError):
    pass


class InvalidResponse(RequestError):
    """The responder broke the framing (it is also reported as misbehaviour)."""


class RequestProtocols:
    """Request handlers and outbound requests on one libp2p host."""

    def __init__(self, host: IHost, limits: StreamLimits, on_misbehaviour: MisbehaviourCallback) -> None:
        self._host = host
        self.limits = limits
        self._on_misbehaviour = on_misbehaviour
        self._in_flight = 0
        self._in_flight_by_peer: dict[str, int] = {}
        self.refused = 0  # inbound requests reset for lack of a slot

    def set_handler(self, protocol_id: str, handler: RequestHandler) -> None:
        async def on_stream(stream: INetStream) -> None:
            await guarded(self._serve(stream, protocol_id, handler), stream)

        self._host.set_stream_handler(TProtocol(protocol_id), on_stream)

    async def _serve(self, stream: INetStream, protocol_id: str, handler: RequestHandler) -> None:
        peer_id = peer_of(stream)
        by_peer = self._in_flight_by_peer.get(peer_id, 0)
        if (
            self._in_flight >= self.limits.max_inbound_requests
            or by_peer >= self.limits.max_inbound_requests_per_peer
        ):
            # Overload, not misbehaviour: an honest peer may retry later.
            self.refused += 1
            await close_quietly(stream, reset=True)
            return
        self._in_flight += 1
        self._in_flight_by_peer[peer_id] = by_peer + 1
        try:
            await self._answer(stream, peer_id, protocol_id, handler)
        finally:
            self._in_flight -= 1
            remaining = self._in_flight_by_peer[peer_id] - 1
            if remaining:
                self._in_flight_by_peer[peer_id] = remaining
            else:
                del self._in_flight_by_peer[peer_id]

    async def _answer(
        self, stream: INetStream, peer_id: str, protocol_id: str, handler: RequestHandler
    ) -> None:
        limits = self.limits
        try:
            with trio.fail_after(limits.inbound_request_read_timeout_s):
                request = await read_single_frame(stream, limits.max_request_bytes)
        except FrameError as error:
            report_misbehaviour(self._on_misbehaviour, peer_id, protocol_id,
                                frame_error_reason(error), str(error))
            await close_quietly(stream, reset=True)
            return
        except trio.TooSlowError:
            report_misbehaviour(self._on_misbehaviour, peer_id, protocol_id,
                                REQUEST_READ_TIMEOUT, "no complete request")
            await close_quietly(stream, reset=True)
            return
        except PeerClosedStream:
            # The requester gave up (its timeout, its shutdown): not an offence.
            await close_quietly(stream, reset=True)
            return
        try:
            with trio.fail_after(limits.handler_timeout_s):
                response = await handler(peer_id, request)
        except trio.TooSlowError:
            logger.warning("request handler for %s timed out (peer %s)", protocol_id, peer_id)
            await close_quietly(stream, reset=True)
            return
        except Exception:
            # Our handler's bug must not take the host down; the requester sees a reset.
            logger.exception("request handler for %s failed (peer %s)", protocol_id, peer_id)
            await close_quietly(stream, reset=True)
            return
        if len(response) > limits.max_response_bytes:
            logger.error(
                "handler for %s returned %d bytes, above max_response_bytes=%d; not sent",
                protocol_id, len(response), limits.max_response_bytes,
            )
            await close_quietly(stream, reset=True)
            return
        try:
            with trio.fail_after(RESPONSE_WRITE_TIMEOUT_S):
                await stream.write(encode_frame(response))
        except (trio.TooSlowError, *STREAM_ERRORS):
            await close_quietly(stream, reset=True)
            return
        await close_quietly(stream, reset=False)

    async def request(
        self, peer_id: str, protocol_id: str, data: bytes, timeout_s: float = REQUEST_TIMEOUT_S
    ) -> bytes:
        """Send one request and return the response; raises `RequestError`."""
        if len(data) > self.limits.max_request_bytes:
            raise ValueError(
                f"request of {len(data)} bytes exceeds max_request_bytes={self.limits.max_request_bytes}"
            )
        peer = parse_peer_id(peer_id)
        stream: INetStream | None = None
        try:
            with trio.fail_after(timeout_s):
                stream = await self._host.new_stream(peer, [TProtocol(protocol_id)])
                await stream.write(encode_frame(data))
                response = await read_single_frame(stream, self.limits.max_response_bytes)
        except trio.TooSlowError:
            if stream is not None:
                await close_quietly(stream, reset=True)
            raise RequestTimeout(f"no response from {peer_id} on {protocol_id} in {timeout_s} s") from None
        except FrameError as error:
            assert stream is not None
            report_misbehaviour(self._on_misbehaviour, peer_id, protocol_id,
                                frame_error_reason(error), str(error))
            await close_quietly(stream, reset=True)
            raise InvalidResponse(f"invalid response from {peer_id}: {error}") from None
        except (PeerClosedStream, *STREAM_ERRORS) as error:
            if stream is not None:
                await close_quietly(stream, reset=True)
            raise RequestError(
                f"request to {peer_id} on {protocol_id} failed: {error or type(error).__name__}"
            ) from None
        await close_quietly(stream, reset=False)
        return response
