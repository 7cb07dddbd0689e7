"""Carrying out the dissemination engine's effects on the real network and log.

The engine (transport.dissemination) and the committer return effects; this
module is where they meet trio and libp2p:

- `Send` goes to the peer's own bounded outbound queue without waiting (a
  stalled peer never holds up the core or the other peers; when its queue is
  full the frame is dropped and anti-entropy repairs the gap);
- `Log` goes to the JSON-lines dissemination log (node.logschema) and, when
  metrics are on, to the exporter's latency histogram;
- `Announce` (events authored here, for GossipSub) is gossiped in chunks,
  one gossip message per chunk, not per event;
- `Disconnect` (a peer broke the protocol) goes to the peer policy, whose
  executor decides whether to ban and drop it (node.peer_executor).

After every call the subscribers of every topic are woken: the step may have
delivered, confirmed or rewound something they wait for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgpack
import trio

from node.logschema import JsonLinesLogWriter
from node.peer_ids import peer_id_of
from node.topic_handle import Topic
from transport.effects import Announce, Disconnect, Log, Send
from transport.libp2p_gossip import gossip_chunks
from transport.libp2p_host import P2PHost
from transport.messages import MAX_FRAME_BYTES, Push, encode  # the push path's frame

logger = logging.getLogger("megnode")

PROTOCOL_DISSEMINATION = "/megnode/dissemination/1.0.0"
GOSSIP_TOPIC_PREFIX = "megnode/topic/"

LogObserver = Callable[[dict[str, Any]], None]


def gossip_topic(topic_id: bytes) -> str:
    """The GossipSub topic name that carries a topic's events."""
    return GOSSIP_TOPIC_PREFIX + topic_id.hex()


def gossip_message_topic(data: bytes) -> bytes | None:
    """The topic a dissemination message is about, read from its head alone; None if the
    head is not one (the engine's full decode judges the rest).

    Every message starts `[version, tag, topic, ...]` (transport.messages), so the
    runtime can drop gossip about topics it takes none for (private ones) without
    decoding the events behind the head.
    """
    unpacker = msgpack.Unpacker(max_buffer_size=max(len(data), 1), max_bin_len=MAX_FRAME_BYTES)
    unpacker.feed(data)
    try:
        if unpacker.read_array_header() < 3:
            return None
        unpacker.skip()  # version
        unpacker.skip()  # type tag
        topic = unpacker.unpack()
    except (ValueError, msgpack.UnpackException, msgpack.OutOfData):
        return None
    return topic if isinstance(topic, bytes) else None


class EffectRunner:
    """Carries out engine effects for one node; `run` never awaits (it may start tasks)."""

    def __init__(self, host: P2PHost, nursery: trio.Nursery, topics: Mapping[bytes, Topic],
                 stats: dict[str, int], log_writer: JsonLinesLogWriter | None,
                 on_misbehaving: Callable[[str, str], None]) -> None:
        self._host = host
        self._nursery = nursery
        self._topics = topics  # the node's live table of joined topics
        self._stats = stats  # the node's own counters (status, metrics)
        self._log_writer = log_writer
        self._on_misbehaving = on_misbehaving
        self.log_observer: LogObserver | None = None  # the metrics exporter, when on

    def run(self, effects: Sequence[object]) -> None:
        """Carry out the core's effects, then wake subscribers of topics that moved."""
        announced: dict[bytes, list[bytes]] = {}
        logged = False
        for effect in effects:
            if isinstance(effect, Announce):
                announced.setdefault(effect.topic, []).extend(effect.raws)
            elif isinstance(effect, Send):
                self._send_now(effect.peer, effect.data)
            elif isinstance(effect, Log):
                self._write_log(effect.record)
                logged = True
                if self.log_observer is not None:
                    self.log_observer(effect.record)
            elif isinstance(effect, Disconnect):
                self._on_misbehaving(effect.peer, effect.reason)
        if logged:
            self._flush_log()
        if announced and self._host.gossip_enabled:
            for topic_id, raws in announced.items():
                self._nursery.start_soon(self._gossip_publish, topic_id, raws)
        for topic in self._topics.values():
            topic.wake_subscribers()

    def _send_now(self, peer: str, data: bytes) -> None:
        """Queue a frame on the peer's own stream; a full queue drops it (anti-entropy repairs).

        Never waits: one stalled peer must not hold up frames to the others.
        """
        try:
            if not self._host.send_nowait(peer_id_of(peer), PROTOCOL_DISSEMINATION, data):
                self._stats["outbox_dropped"] += 1
        except Exception as exc:  # the peer went away or its stream failed
            self._stats["send_failed"] += 1
            logger.debug("send to %s failed: %s", peer, exc)

    def _write_log(self, record: dict[str, Any]) -> None:
        if self._log_writer is None:
            return
        try:
            self._log_writer.write(record, flush=False)  # one flush per step: `_flush_log`
        except (OSError, ValueError) as exc:
            self._stats["log_failed"] += 1
            logger.debug("log record dropped: %s", exc)

    def _flush_log(self) -> None:
        if self._log_writer is None:
            return
        try:
            self._log_writer.flush()
        except OSError as exc:
            self._stats["log_failed"] += 1
            logger.debug("log records dropped: %s", exc)

    async def _gossip_publish(self, topic_id: bytes, raws: Sequence[bytes]) -> None:
        """Gossip a batch of new events: one Push per chunk that fits a gossip message."""
        name = gossip_topic(topic_id)
        for chunk in gossip_chunks(list(raws)):
            try:
                await self._host.publish(name, encode(Push(topic_id, tuple(chunk))))
            except Exception as exc:  # gossip is best effort: anti-entropy repairs
                logger.debug("gossip publish failed: %s", exc)
