"""Varint-length-prefixed frames: encoding and a sans-IO, bounded decoder.

Every megnode stream carries frames `uvarint(len) || payload` (unsigned LEB128,
the multiformats/protobuf varint that libp2p uses everywhere). The decoder is
fed whatever bytes a read returned and hands back every complete frame, so one
read of 64 KiB can yield hundreds of small gossip frames without a read per
length byte (py-libp2p's own `read_varint_prefixed_bytes*` reads the prefix one
byte per stream read, which costs a yamux round per byte).

Bad input is the peer's fault and is reported as a `FrameError` subclass, never
as a crash: a length above the decoder's bound raises `FrameTooLarge` as soon
as the prefix is complete (before any of the body is buffered, so a peer cannot
make us allocate the length it claims), and a prefix that is longer than
`MAX_VARINT_BYTES`, or not minimally encoded, raises `MalformedFrame`.
Minimal encoding is required so that one payload has exactly one framing.
"""

from __future__ import annotations

MAX_VARINT_BYTES = 10  # a uint64 needs at most ten 7-bit groups
_CONTINUE = 0x80
_LOW_BITS = 0x7F


class FrameError(Exception):
    """The peer sent bytes that are not a valid frame sequence."""


class FrameTooLarge(FrameError):
    """A frame announced a length above the decoder's bound."""


class MalformedFrame(FrameError):
    """The length prefix is not a valid, minimal uvarint."""


def encode_uvarint(value: int) -> bytes:
    if value < 0:
        raise ValueError("uvarint must be non-negative")
    out = bytearray()
    while value >= _CONTINUE:
        out.append((value & _LOW_BITS) | _CONTINUE)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_frame(payload: bytes) -> bytes:
    return encode_uvarint(len(payload)) + payload


def _decode_prefix(buffer: bytearray, start: int) -> tuple[int, int] | None:
    """(length, prefix size) of the varint at `start`, or None if incomplete."""
    value = 0
    for index in range(MAX_VARINT_BYTES):
        position = start + index
        if position >= len(buffer):
            return None
        byte = buffer[position]
        value |= (byte & _LOW_BITS) << (7 * index)
        if not byte & _CONTINUE:
            if byte == 0 and index > 0:
                raise MalformedFrame("length prefix is not minimally encoded")
            return value, index + 1
    raise MalformedFrame(f"length prefix longer than {MAX_VARINT_BYTES} bytes")


class FrameDecoder:
    """Turns a byte stream into frames of at most `max_frame_bytes` each.

    The buffer never holds more than one incomplete frame plus one read, so its
    size is bounded by `max_frame_bytes + MAX_VARINT_BYTES + len(last chunk)`.
    After a `FrameError` the decoder is poisoned: the stream must be dropped,
    since there is no way to find the next frame boundary.
    """

    def __init__(self, max_frame_bytes: int) -> None:
        if max_frame_bytes <= 0:
            raise ValueError("max_frame_bytes must be positive")
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._failed: FrameError | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes received that are not yet part of a returned frame."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; return the frames they complete, in order."""
        if self._failed is not None:
            raise self._failed
        self._buffer += data
        frames: list[bytes] = []
        offset = 0
        try:
            while True:
                prefix = _decode_prefix(self._buffer, offset)
                if prefix is None:
                    break
                length, prefix_size = prefix
                if length > self.max_frame_bytes:
                    raise FrameTooLarge(
                        f"frame of {length} bytes exceeds the limit of {self.max_frame_bytes}"
                    )
                end = offset + prefix_size + length
                if end > len(self._buffer):
                    break
                frames.append(bytes(self._buffer[offset + prefix_size:end]))
                offset = end
        except FrameError as error:
            self._failed = error
            self._buffer.clear()
            raise
        # Compact once per feed, not once per frame: deleting a prefix of a
        # bytearray is O(remaining), and a 64 KiB read may hold hundreds of frames.
        del self._buffer[:offset]
        return frames
