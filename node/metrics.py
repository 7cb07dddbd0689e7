"""Prometheus metrics of a running node, served on 127.0.0.1:<metrics_port>.

Enabled by `metrics_port` > 0 in the node's config. The node already counts
what matters (each replica's `counters`, the disseminator's `stats`, the
graph's width and buffer); this module reads those at scrape time instead of
keeping a second set of counters on the hot path. Only the dissemination
latency is new state: a histogram fed from the `delivered` log records the
core emits (`on_log`).

Exported (all names start with `megnode_`; `topic` is the 64-hex topic id of an
open topic, or a local alias `private-<n>` for any other: see below):

    name                                       type       labels          source
    events_accepted_total                      counter    topic, origin   replica counters
    events_rejected_total                      counter    topic, reason   replica counters rejected.*
    events_delivered_total                     counter    topic           graph.delivered_count (stored)
    topic_buffered_events                      gauge      topic           graph.buffered_count
    topic_extremities                          gauge      topic           graph.width
    topics                                     gauge      -               joined topics
    peers                                      gauge      -               peers with an open connection
    bytes_sent_total, bytes_received_total     counter    -               disseminator stats
    bytes_sent_by_message_total                counter    message         disseminator stats bytes_sent_*
    messages_sent_total                        counter    -               disseminator stats
    duplicates_received_total                  counter    -               disseminator stats
    peer_misbehaviour_total                    counter    -               disseminator stats
    anti_entropy_sessions_total                counter    -               disseminator stats
    anti_entropy_offers_sent_total             counter    -               disseminator stats
    wants_sent_total                           counter    -               disseminator stats
    outbox_dropped_total, send_failed_total,
    transport_faults_total, log_failed_total   counter    -               Node.stats
    dissemination_latency_seconds              histogram  channel         delivered log records

`origin` is "local" (authored here: `created`) or "remote" (received, passed
the reference monitor and the auth rules: applied + buffered - created -
unauthorized; an event is counted when it arrives, buffered or not).
Latency is the delivery time here minus the event's own timestamp, for the
first delivery of events authored elsewhere; `channel` is how the delivering
frame came (`gossip`: the fast path, `sync`: anti-entropy). The event
timestamp is the author's clock, so across machines the figure includes
clock skew; a negative difference is counted as 0. Bytes are dissemination
frames (push and anti-entropy); gossipsub's own traffic is not in them.

Invite topics are not named by their id. A topic id is how a peer asks for a
topic, and scrapes leave the machine (a Prometheus server, dashboards,
alerts), so a topic whose join rule is not public - or whose join rule this
node cannot know yet (no create event) - is labelled `private-<n>`: n counts
from 1 in the order the exporter first sees such topics (sorted by id at
each scrape), fixed for the life of the process; after a restart the same
set of topics gets the same aliases. The node stores no local name for a
topic to use instead (the create event's name is the creator's, and it
travels with the topic). Open topics (public join rule, or a topic that
keeps no state) keep their hex id. docs/access.md lists what else is not
protected on the node's own machine (its logs name every topic id).

Why a trio task and not prometheus_client's `start_http_server` thread: a
scrape reads the core's state (Counters, the graph's caches, LMDB through the
graph), which the trio thread mutates without locks by design. Answering on
the trio thread makes each scrape a consistent snapshot taken between two core
calls, needs no lock, and the task belongs to the node's nursery, so it stops
(and frees the port) when the node closes. The responder speaks just enough
HTTP/1.0 for a Prometheus scraper: GET or HEAD, bounded request size and time,
a bounded number of connections, one response, then close.

Slow sockets (issue 16: 8 of them made every scrape fail). A client that
connects and sends nothing, or half a request, holds a slot until
`REQUEST_HEAD_TIMEOUT_S`; one that sends a request and does not read the
answer, until `RESPONSE_TIMEOUT_S`. When all `MAX_CONNECTIONS` slots are
taken, a new connection evicts the one that has waited longest for its
request head (it has cost us nothing but a slot and gets no answer): an
honest scraper sends its request at once, so it is served while any number
of slow sockets stay open. Only when every slot is sending a response is a
new connection answered 503.

Each node has its own `CollectorRegistry` (never the process-global one), so
several nodes in one process (tests) do not clash.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import trio
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from node.logschema import CHANNELS, DELIVERED
from node.state.types import RULE_PUBLIC
from node.state.view import StateView

if TYPE_CHECKING:
    from node.replica.replica import Replica

LOOPBACK = "127.0.0.1"  # NodeConfig has no metrics_host: the exporter never leaves the machine
METRICS_PATHS = ("/metrics", "/")
MAX_REQUEST_BYTES = 8 * 1024  # request line + headers; a scraper sends a few hundred
REQUEST_HEAD_TIMEOUT_S = 2.0  # a client must send its whole request head within this
RESPONSE_TIMEOUT_S = 5.0  # and take the whole answer within this (a slow reader)
MAX_CONNECTIONS = 8  # served at once; a new one evicts the oldest still sending its head
RECEIVE_CHUNK = 4_096
# Seconds: from a few ms (push on a LAN) to minutes (anti-entropy after an outage).
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                     60.0, 300.0, math.inf)
MS_PER_S = 1_000

# (metric name, disseminator stats key, help). Counters of the whole node.
DISSEMINATION_COUNTERS = (
    ("megnode_bytes_sent", "bytes_sent", "Bytes of dissemination frames sent (push, anti-entropy)"),
    ("megnode_bytes_received", "bytes_received", "Bytes of dissemination frames received"),
    ("megnode_messages_sent", "messages_sent", "Dissemination frames sent"),
    ("megnode_duplicates_received", "duplicates", "Events received again after they were known"),
    ("megnode_peer_misbehaviour", "misbehaviour", "Invalid messages blamed on peers"),
    ("megnode_anti_entropy_sessions", "sessions", "Anti-entropy exchanges opened"),
    ("megnode_anti_entropy_offers_sent", "offers_sent", "Anti-entropy offers sent (round trips)"),
    ("megnode_wants_sent", "wants_sent", "Missing parents asked for"),
)
# (metric name, Node.stats key, help).
NODE_COUNTERS = (
    ("megnode_outbox_dropped", "outbox_dropped", "Frames dropped because a peer's queue was full"),
    ("megnode_send_failed", "send_failed", "Frames whose peer stream failed"),
    ("megnode_transport_faults", "transport_faults", "Frames the transport refused (bad framing)"),
    ("megnode_log_failed", "log_failed", "Dissemination log records that could not be written"),
)
BYTES_BY_MESSAGE_PREFIX = "bytes_sent_"
REJECTED_PREFIX = "rejected."
PRIVATE_ALIAS_PREFIX = "private-"


# --------------------------------------------------------------------------- what is observed


# The exporter reads a node through these narrow views, not `node.runtime.Node`:
# the runtime owns the exporter, so importing the runtime here would be a cycle,
# and the views say exactly what a scrape may touch.
class PeerView(Protocol):
    def peers(self) -> Collection[Any]: ...


class DisseminatorView(Protocol):
    @property
    def stats(self) -> Mapping[str, int]: ...

    def replica(self, topic: bytes) -> Replica: ...


class TopicView(Protocol):
    @property
    def replica(self) -> Replica: ...


class ObservedNode(Protocol):
    """What the metrics read of a running node (`node.runtime.Node` is one)."""

    @property
    def node_id(self) -> str: ...

    @property
    def host(self) -> PeerView: ...

    @property
    def disseminator(self) -> DisseminatorView: ...

    @property
    def stats(self) -> Mapping[str, int]: ...

    @property
    def topics(self) -> Mapping[bytes, TopicView]: ...


# --------------------------------------------------------------------------- collection


def is_open(replica: Replica) -> bool:
    """True if anyone may read the topic: it keeps no state, or its join rule is public.

    A replica without the create event does not know its join rule yet: not open.
    """
    if not replica.ready:
        return False
    if not replica.authorizing:
        return True
    tracker = replica.tracker
    return StateView(tracker.state(tracker.current_group()), replica.graph).join_rule() \
        == RULE_PUBLIC


class TopicLabels:
    """The `topic` label of each topic: the hex id if open, else a process-stable alias."""

    def __init__(self) -> None:
        self._aliases: dict[bytes, str] = {}  # kept after a leave: a re-join gets the same

    def label(self, topic_id: bytes, replica: Replica) -> str:
        if is_open(replica):
            return topic_id.hex()
        alias = self._aliases.get(topic_id)
        if alias is None:
            alias = f"{PRIVATE_ALIAS_PREFIX}{len(self._aliases) + 1}"
            self._aliases[topic_id] = alias
        return alias


class NodeCollector:
    """A prometheus_client collector reading one node's own counters at scrape time."""

    def __init__(self, node: ObservedNode) -> None:
        self._node = node
        self._labels = TopicLabels()

    def collect(self) -> Iterator[Metric]:
        node = self._node
        yield from _topic_metrics(node, self._labels)
        peers = GaugeMetricFamily("megnode_peers", "Peers with an open connection")
        peers.add_metric([], len(node.host.peers()))
        yield peers
        stats = node.disseminator.stats
        for name, key, help_text in DISSEMINATION_COUNTERS:
            yield CounterMetricFamily(name, help_text, value=stats.get(key, 0))
        by_message = CounterMetricFamily("megnode_bytes_sent_by_message",
                                         "Bytes of dissemination frames sent, by message type",
                                         labels=["message"])
        for key, value in sorted(stats.items()):
            if key.startswith(BYTES_BY_MESSAGE_PREFIX):
                by_message.add_metric([key[len(BYTES_BY_MESSAGE_PREFIX):]], value)
        yield by_message
        for name, key, help_text in NODE_COUNTERS:
            yield CounterMetricFamily(name, help_text, value=node.stats.get(key, 0))


def _topic_metrics(node: ObservedNode, labels: TopicLabels) -> Iterator[Metric]:
    accepted = CounterMetricFamily("megnode_events_accepted", "Events accepted into the graph",
                                   labels=["topic", "origin"])
    rejected = CounterMetricFamily("megnode_events_rejected", "Events rejected, by reason",
                                   labels=["topic", "reason"])
    delivered = CounterMetricFamily("megnode_events_delivered",
                                    "Events delivered to subscribers (stored count)",
                                    labels=["topic"])
    buffered = GaugeMetricFamily("megnode_topic_buffered_events",
                                 "Events waiting for missing parents", labels=["topic"])
    extremities = GaugeMetricFamily("megnode_topic_extremities",
                                    "Forward extremities (the graph's width)", labels=["topic"])
    topics = node.topics
    for topic_id, topic in sorted(topics.items()):
        label = labels.label(topic_id, topic.replica)
        counters = topic.replica.counters
        graph = topic.replica.graph
        local, remote = accepted_counts(counters)
        accepted.add_metric([label, "local"], local)
        accepted.add_metric([label, "remote"], remote)
        for key, value in sorted(counters.items()):
            if key.startswith(REJECTED_PREFIX):
                rejected.add_metric([label, key[len(REJECTED_PREFIX):]], value)
        delivered.add_metric([label], graph.delivered_count)
        buffered.add_metric([label], graph.buffered_count)
        extremities.add_metric([label], graph.width)
    count = GaugeMetricFamily("megnode_topics", "Topics this node replicates")
    count.add_metric([], len(topics))
    yield from (accepted, rejected, delivered, buffered, extremities, count)


def accepted_counts(counters: dict[str, int]) -> tuple[int, int]:
    """(local, remote) accepted events from a replica's counters (see the module docstring)."""
    local = counters.get("created", 0)
    arrived = counters.get("applied", 0) + counters.get("buffered", 0)
    return local, max(0, arrived - local - counters.get("unauthorized", 0))


# --------------------------------------------------------------------------- HTTP


class RequestError(Exception):
    """The request cannot be answered with metrics; `status` is the HTTP status to send."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 431: "Request Header Fields Too Large",
            503: "Service Unavailable"}


def request_complete(data: bytes) -> bool:
    """True once `data` holds the request line and all headers (we read no body)."""
    return b"\r\n\r\n" in data or b"\n\n" in data


def parse_request(data: bytes) -> Request:
    """The method and path of an HTTP/1.x request head; RequestError if unusable."""
    line = data.split(b"\n", 1)[0].rstrip(b"\r")
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise RequestError(400, "not an HTTP/1.x request line")
    method = parts[0].decode("ascii", "replace")
    path = parts[1].decode("ascii", "replace").split("?", 1)[0]
    if method not in ("GET", "HEAD"):
        raise RequestError(405, f"method {method} not allowed")
    if path not in METRICS_PATHS:
        raise RequestError(404, f"no such path {path}")
    return Request(method, path)


def response(status: int, body: bytes, content_type: str, include_body: bool = True) -> bytes:
    """A complete HTTP/1.0 response that closes the connection."""
    head = (f"HTTP/1.0 {status} {_REASONS.get(status, 'Error')}\r\n"
            f"Content-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n")
    return head.encode("ascii") + (body if include_body else b"")


def _error_response(error: RequestError) -> bytes:
    return response(error.status, f"{error}\n".encode(), "text/plain; charset=utf-8")


# --------------------------------------------------------------------------- exporter


async def open_metrics_listeners(port: int, host: str = LOOPBACK) -> list[trio.SocketListener]:
    """Bind `host:port` now, so a taken port fails the node's start, not a later scrape.

    Raises OSError. The node binds before it starts anything else, so the
    error reaches the user as one line rather than inside an exception group.
    """
    return await trio.open_tcp_listeners(port, host=host)


async def close_listeners(listeners: list[trio.SocketListener]) -> None:
    """Close listeners that `serve` never took over (a start that failed later)."""
    for listener in listeners:
        await listener.aclose()


class MetricsExporter:
    """One node's registry, its latency histogram and its HTTP endpoint.

        listeners = await open_metrics_listeners(port)        # OSError if taken
        exporter = MetricsExporter(node, listeners)
        nursery.start_soon(exporter.serve)                     # answers until cancelled
        exporter.on_log(record)                                # for each core Log effect
    """

    def __init__(self, node: ObservedNode, listeners: list[trio.SocketListener]) -> None:
        self._node = node
        self._listeners = listeners
        # Open connections in arrival order -> their cancel scope; `_waiting`
        # holds those still sending their request head (evictable).
        self._connections: dict[object, trio.CancelScope] = {}
        self._waiting: set[object] = set()
        self.counts: dict[str, int] = {"evicted": 0, "refused": 0, "timed_out": 0}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NodeCollector(node))
        self.latency = Histogram(
            "megnode_dissemination_latency_seconds",
            "Delivery here minus the event's timestamp, first delivery of remote events",
            labelnames=("channel",), buckets=LATENCY_BUCKETS_S, registry=self.registry)
        for channel in CHANNELS:  # present (at 0) from the first scrape, as Prometheus advises
            self.latency.labels(channel)

    @property
    def port(self) -> int:
        return self._listeners[0].socket.getsockname()[1]

    def on_log(self, record: dict[str, Any]) -> None:
        """Feed one core log record: the first delivery of a remote event is observed."""
        if record.get("type") != DELIVERED or record.get("author") == self._node.node_id:
            return
        try:
            replica = self._node.disseminator.replica(bytes.fromhex(record["topic"]))
            event = replica.graph.get(bytes.fromhex(record["event"]))
        except (KeyError, ValueError):
            return  # the topic was left meanwhile, or a record without an event
        if event is None:
            return
        latency_ms = max(0, record["ts_ms"] - event.timestamp_ms)
        self.latency.labels(record.get("channel", "unknown")).observe(latency_ms / MS_PER_S)

    def render(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)

    async def serve(self) -> None:
        """Answer scrapes until cancelled (the node's nursery owns this task)."""
        await trio.serve_listeners(self._handle, self._listeners)

    @property
    def open_connections(self) -> int:
        """Connections holding a slot now (at most MAX_CONNECTIONS)."""
        return len(self._connections)

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            if len(self._connections) >= MAX_CONNECTIONS and not self._evict_oldest_waiting():
                self.counts["refused"] += 1
                await self._send(stream, _error_response(RequestError(503, "too many scrapes")))
                return
            token = object()
            scope = trio.CancelScope()
            self._connections[token] = scope
            self._waiting.add(token)
            try:
                with scope:
                    await self._answer(stream, token)
            finally:
                self._connections.pop(token, None)
                self._waiting.discard(token)

    def _evict_oldest_waiting(self) -> bool:
        """Free a slot by closing the connection that has waited longest for its head."""
        for token, scope in self._connections.items():  # arrival order
            if token in self._waiting:
                del self._connections[token]
                self._waiting.discard(token)
                scope.cancel()  # its task closes the socket without an answer
                self.counts["evicted"] += 1
                return True
        return False

    async def _answer(self, stream: trio.SocketStream, token: object) -> None:
        data = b""
        with trio.move_on_after(REQUEST_HEAD_TIMEOUT_S) as scope:
            while not request_complete(data):
                if len(data) > MAX_REQUEST_BYTES:
                    self._waiting.discard(token)
                    await self._send(stream, _error_response(
                        RequestError(431, f"request head over {MAX_REQUEST_BYTES} bytes")))
                    return
                try:
                    chunk = await stream.receive_some(RECEIVE_CHUNK)
                except trio.BrokenResourceError:
                    return
                if not chunk:
                    return  # the client went away
                data += chunk
        self._waiting.discard(token)  # from here on it is served, not evicted
        if scope.cancelled_caught:
            self.counts["timed_out"] += 1
            await self._send(stream, _error_response(RequestError(408, "request too slow")))
            return
        try:
            request = parse_request(data)
        except RequestError as error:
            await self._send(stream, _error_response(error))
            return
        await self._send(stream, response(200, self.render(), CONTENT_TYPE_LATEST,
                                          include_body=request.method == "GET"))

    @staticmethod
    async def _send(stream: trio.SocketStream, data: bytes) -> None:
        with trio.move_on_after(RESPONSE_TIMEOUT_S):
            try:
                await stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
