"""The local control socket: how the `megnode` CLI talks to a running daemon.

A Unix socket in the data dir (`control.sock`, mode 0600: only the node's
user may drive it). Each request is one JSON object on one line; each reply
is one JSON line `{"ok": true, ...}` or `{"ok": false, "error": "..."}`. A
`subscribe` request keeps the connection open and streams one line per
delivered event until the client hangs up (or `count` events were sent).
Every request line is bounded in size and depth and every kind of work has a
budget of its own, so no input crashes the daemon and nothing locks `status`
out (ControlServer; docs/control.md has the bounds and the status fields).

A refusal names its kind in `code` (node.errors: "topic_not_found",
"not_allowed", "banned", "payload_too_large", "encoding", "timeout",
"topic_left", "error"), which the CLI maps to its exit status.

Requests:
    {"op": "status"}
    {"op": "topic_create", "name": "kitchen", "d_max": 10, "access": "open" | "invite"}
    {"op": "topic_join", "topic": "<64 hex>", "wait": false, "timeout": 10.0}
        (wait: answer once this node is a joined member, or refuse with the reason)
    {"op": "topic_leave", "topic": "<64 hex>"}
    {"op": "topic_list"}                       the topics replicated here, one entry each
    {"op": "topic_members", "topic": ...}      members, their membership and role
    {"op": "topic_info", "topic": ...}         status + access, member counts, peers in it
    {"op": "publish", "topic": "<64 hex>", "payload": "text"} | "payload_b64": "..."
    {"op": "publish_batch", "topic": "<64 hex>", "payloads": ["text", ...]}
        | "payloads_b64": ["...", ...]   (all stored or none: one group commit)
    {"op": "subscribe", "topic": "<64 hex>", "since": 0 | "<event id hex>", "count": null,
     "order": "causal"|"confirmed"|"tentative", "kinds": ["message", "state", "ack"],
     "payload": "text" | "base64"}
        (tentative: a line {"rewind": n} means drop the entries from position
        n on; the event lines after it replay from n; `count` counts events;
        kinds: default every event; since an event id: resume just after it;
        a subscription that ends on the node's side (topic left, banned) ends
        with one {"ok": false, "code": ..., "error": ...} line)
    {"op": "connect", "address": "/ip4/.../p2p/..."}
    {"op": "peers"}   (connected and known peers: node.fleet.peers_report)
    {"op": "state", "topic": ...}
    {"op": "set_state", "topic": ..., "type": "app.config", "state_key": "", "content": {...}}
    {"op": "invite" | "add_writer" | "ban", "topic": ..., "member": "<node id hex>"}
    {"op": "set_role", "topic": ..., "member": ..., "role": "indexer"|"writer"|"relayed"|"none"}
    {"op": "backup", "path": "/absolute/empty/dir"}   (a hot copy of the store: node.backup)
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from itertools import accumulate, count as counter
from pathlib import Path
from typing import Any

import msgpack
import trio

from node.core.event import Event
from node.errors import BadPayload
from node.core.store import DamagedTopicError, StoreError
from node.replica.order_views import Rewind
from node.runtime import JOIN_HANDSHAKE_TIMEOUT_S, Node, NodeError, parse_topic_id
from node.topic_handle import check_kinds
from node.topic_views import TOPIC_VIEWS

logger = logging.getLogger("megnode.control")

MAX_REQUEST_BYTES = 1 << 20  # one request line; a longer one is refused and the connection closed
# Nesting of arrays and objects in one request. json.loads recurses once per level
# and a few thousand levels raise RecursionError; no request needs more than a few
# (set_state's content is the deepest), so deeper lines are refused before parsing.
MAX_REQUEST_DEPTH = 32
MAX_PUBLISH_BATCH = 10_000  # events in one publish_batch request
MAX_JOIN_WAIT_S = 3_600.0  # topic_join's `timeout`: the longest a join request may wait
# Slots. Each kind of work has a budget of its own, so no kind can lock out
# another: `status` above all must answer while subscribers and slow requests
# hold theirs (issue 16). Connections past MAX_CONTROL_CONNECTIONS push out the
# one idle (or queued) longest; the busy budgets add up to less than it, so a
# new connection is always let in.
MAX_CONTROL_CONNECTIONS = 128  # open connections, idle ones included
MAX_CONTROL_REQUESTS = 48  # requests in progress other than status and subscribe; more queue
MAX_STATUS_REQUESTS = 8  # status answers in progress (each is quick); more queue
MAX_SUBSCRIBERS = 32  # streaming subscriptions; one more is refused at once
FIRST_REQUEST_TIMEOUT_S = 5.0  # a client that connects and sends no request this long is dropped
CLIENT_IDLE_TIMEOUT_S = 30.0  # a client that sends nothing more for this long is dropped
# A client whose socket takes nothing for this long is dropped: above all a
# subscriber that does not read, whose send buffer stays full.
SEND_TIMEOUT_S = 10.0
MAX_LOGGED_CHARS = 200
RECEIVE_CHUNK = 65_536  # of a refused request's reason, in the daemon's log
SOCKET_MODE = 0o600
# What decoding a damaged stored record raises (requests themselves are JSON,
# so only records read back from the store are msgpack or UTF-8 bytes).
STORED_RECORD_ERRORS = (msgpack.UnpackException, msgpack.ExtraData, UnicodeDecodeError)
MSGPACK_FAILURE_PREFIX = "Unpack failed"  # msgpack's plain ValueError for a cut-short record


def is_damaged_record(exc: BaseException) -> bool:
    """Whether `exc` is what decoding a damaged stored record raises."""
    return isinstance(exc, STORED_RECORD_ERRORS) or (
        isinstance(exc, ValueError) and str(exc).startswith(MSGPACK_FAILURE_PREFIX))


def damaged_store_message(node: Node, exc: BaseException) -> str:
    """One line for a request that met a stored record that does not decode."""
    return (f"the store at {node.store.path} is damaged: a stored record does not decode "
            f"({type(exc).__name__}); restore the store from a backup (docs/store.md)")


class _StreamDone(Exception):
    """A streaming reply (subscribe) is complete: the connection ends."""


class BadRequest(ValueError):
    """A request line that is not a request (too long, too deep, not JSON, not an object)."""


class _RequestTooLong(BadRequest):
    """A line longer than MAX_REQUEST_BYTES: the stream cannot be resynchronised."""


class _SlowReader(Exception):
    """The client took nothing for SEND_TIMEOUT_S (a subscriber that does not read)."""


@dataclass(frozen=True)
class ControlLimits:
    """The control socket's bounds (the module constants; tests shrink the timeouts)."""

    max_connections: int = MAX_CONTROL_CONNECTIONS
    max_requests: int = MAX_CONTROL_REQUESTS
    max_status: int = MAX_STATUS_REQUESTS
    max_subscribers: int = MAX_SUBSCRIBERS
    first_request_timeout_s: float = FIRST_REQUEST_TIMEOUT_S
    idle_timeout_s: float = CLIENT_IDLE_TIMEOUT_S
    send_timeout_s: float = SEND_TIMEOUT_S


# The request's skeleton for the depth check: strings (which may hold brackets)
# out, then every byte but a bracket out; one step per bracket, C speed.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_DEPTH_STEP = [0] * 256
_DEPTH_STEP[ord("[")] = _DEPTH_STEP[ord("{")] = 1
_DEPTH_STEP[ord("]")] = _DEPTH_STEP[ord("}")] = -1


def nesting_depth(line: bytes) -> int:
    """How deep arrays and objects nest in a JSON line (an upper bound if it is not JSON)."""
    skeleton = _NOT_BRACKET.sub(b"", _JSON_STRING.sub(b"", line))
    return max(accumulate(map(_DEPTH_STEP.__getitem__, skeleton)), default=0)


def parse_request(line: bytes) -> dict[str, Any]:
    """One request line as a JSON object; BadRequest says why it is not one.

    Bounded work whatever the line holds: its length is bounded by the reader,
    its depth is checked before json.loads can recurse.
    """
    depth = nesting_depth(line)
    if depth > MAX_REQUEST_DEPTH:
        raise BadRequest(f"nested {depth} levels deep, at most {MAX_REQUEST_DEPTH} allowed")
    try:
        request = json.loads(line)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise BadRequest(f"not JSON: {exc}") from None
    if not isinstance(request, dict):
        raise BadRequest("a request is a JSON object")
    return request


class _Reader:
    """Line reader over a trio stream with a bound on the line length."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = bytearray()

    async def line(self) -> bytes | None:
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_REQUEST_BYTES:
                raise _RequestTooLong(f"request longer than {MAX_REQUEST_BYTES} bytes")
            chunk = await self._stream.receive_some(RECEIVE_CHUNK)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, rest = bytes(self._buffer).partition(b"\n")
        if len(line) > MAX_REQUEST_BYTES:  # it arrived whole in the last chunk
            raise _RequestTooLong(f"request longer than {MAX_REQUEST_BYTES} bytes")
        self._buffer = bytearray(rest)
        return line


def event_json(position: int, event: Event, base64_payload: bool = False) -> dict[str, Any]:
    """An event as the CLI prints it (payload as text when it is UTF-8, else base64).

    `cursor` is where a subscription resumes just after this event (`since`).
    """
    out: dict[str, Any] = {
        "position": position,
        "cursor": position + 1,
        "id": event.id.hex(),
        "author": event.author.hex(),
        "seq": event.seq,
        "kind": event.kind,
        "timestamp_ms": event.timestamp_ms,
        "parents": [p.hex() for p in event.parents],
    }
    if event.state_key is not None:
        out["state_key"] = event.state_key
    if base64_payload:
        out["payload_b64"] = base64.b64encode(event.payload).decode("ascii")
        return out
    try:
        out["payload"] = event.payload.decode("utf-8")
    except UnicodeDecodeError:
        out["payload_b64"] = base64.b64encode(event.payload).decode("ascii")
    return out


MEMBER_OPS = ("invite", "add_writer", "set_role", "ban")


def _since_of(value: Any) -> int | bytes:
    """subscribe's `since`: a position (a printed `cursor`) or the id of the last event seen."""
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, str):
        try:
            event_id = bytes.fromhex(value)
        except ValueError:
            event_id = b""
        if len(event_id) == 32:
            return event_id
    raise NodeError(f"since must be a position (a printed cursor) or an event id (64 hex), "
                    f"not {value!r}")


def _member_key(value: Any) -> bytes:
    """A member's key from its hex node id (as `megnode status` prints it)."""
    try:
        key = bytes.fromhex(str(value))
    except ValueError:
        key = b""
    if len(key) != 32:
        raise NodeError(f"not a member key (the 64-hex node id from `megnode status`): {value!r}")
    return key


class _Client:
    """One connection's send side: every reply line under the send timeout."""

    def __init__(self, stream: trio.abc.Stream, send_timeout_s: float) -> None:
        self.stream = stream
        self._send_timeout_s = send_timeout_s

    async def send(self, obj: dict[str, Any]) -> None:
        with trio.move_on_after(self._send_timeout_s) as slow:
            await self.stream.send_all(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
        if slow.cancelled_caught:
            raise _SlowReader(f"took nothing for {self._send_timeout_s:g} s")


async def _stream_events(client: _Client, topic: Any, since: int | bytes, count: int | None,
                         order: str, kinds: list[str] | None = None,
                         base64_payload: bool = False) -> None:
    """A subscription's lines until `count` events were sent (or forever)."""
    sent = 0
    async for delivered in topic.subscribe(since=since, order=order, kinds=kinds):
        if isinstance(delivered, Rewind):  # tentative view: truncate, then replay
            await client.send({"rewind": delivered.to_length})
            continue
        await client.send(event_json(delivered.position, delivered.event, base64_payload))
        sent += 1
        if count is not None and sent >= count:
            return


async def _stream_until_hangup(client: _Client, stream_events: Callable[[], Awaitable[None]]
                               ) -> None:
    """Run a subscription while watching the client: its hang-up ends the subscription.

    Without the watch a subscriber that went away would hold its slot until the
    next event failed to send, which on a quiet topic is never.
    """
    failure: Exception | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_until_hangup, client.stream, nursery.cancel_scope)
        try:
            await stream_events()
        except Exception as exc:  # re-raised bare below: callers catch NodeError etc.
            failure = exc
        nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure


async def _until_hangup(stream: trio.abc.ReceiveStream, scope: trio.CancelScope) -> None:
    """Read (and drop) what a subscriber sends until it hangs up, then cancel `scope`."""
    try:
        while await stream.receive_some(RECEIVE_CHUNK):
            pass
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    scope.cancel()


def _payload_of(request: dict[str, Any]) -> bytes:
    if "payload_b64" in request:
        return _from_base64(request["payload_b64"])
    return _text_payload(request.get("payload", ""))


def _from_base64(value: Any) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (ValueError, TypeError):
        raise BadPayload("payload_b64 is not valid base64") from None


def _text_payload(value: Any) -> bytes:
    """A text payload as UTF-8; a JSON string may hold lone surrogates, which are not text."""
    if not isinstance(value, str):
        raise NodeError("payload must be a string")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadPayload("payload is not valid Unicode text (a lone surrogate); send bytes "
                         "as payload_b64") from None


def _batch_payloads(request: dict[str, Any]) -> list[bytes]:
    """publish_batch's payloads: `payloads` (text) or `payloads_b64`, at most MAX_PUBLISH_BATCH."""
    field = "payloads_b64" if "payloads_b64" in request else "payloads"
    payloads = request.get(field)
    if not isinstance(payloads, list) or not all(isinstance(p, str) for p in payloads):
        raise NodeError(f"{field} must be a list of strings")
    if len(payloads) > MAX_PUBLISH_BATCH:
        raise NodeError(f"at most {MAX_PUBLISH_BATCH} payloads per batch")
    decode = _from_base64 if field == "payloads_b64" else _text_payload
    return [decode(p) for p in payloads]


def error_reply(exc: NodeError) -> dict[str, Any]:
    """A refusal's reply line: its message and the kind of failure (node.errors codes)."""
    return {"ok": False, "error": str(exc), "code": exc.code}


async def _handle(node: Node, request: dict[str, Any], client: _Client) -> None:
    op = request.get("op")
    if op == "status" or op in TOPIC_VIEWS:
        await node.count_deliveries()  # in slices: a long history must not stall the node
    if op == "status":
        await client.send({"ok": True, "status": node.status()})
    elif op == "topic_create":
        name = request.get("name", "")
        if not isinstance(name, str):
            raise NodeError("name must be a string")
        d_max = request.get("d_max")
        if d_max is not None and type(d_max) is not int:
            raise NodeError("d_max must be an integer")
        access = request.get("access", "open")
        history = request.get("history", "shared")
        try:
            topic = await node.create_topic(name, d_max=d_max, access=str(access),
                                            history=str(history))
        except ValueError as exc:
            raise NodeError(str(exc)) from None
        await client.send({"ok": True, "topic": topic.id_hex})
    elif op == "topic_join":
        wait, timeout = request.get("wait", False), request.get("timeout", JOIN_HANDSHAKE_TIMEOUT_S)
        if type(wait) is not bool:
            raise NodeError("wait must be true or false")
        if type(timeout) not in (int, float) or not 0 < timeout <= MAX_JOIN_WAIT_S:
            raise NodeError(f"timeout must be a number of seconds in (0, {MAX_JOIN_WAIT_S:g}]")
        topic = await node.join(parse_topic_id(str(request.get("topic", ""))), wait=wait,
                                timeout_s=float(timeout))
        await client.send({"ok": True, "topic": topic.id_hex, "ready": topic.ready,
                           "membership": topic.membership()})
    elif op == "topic_leave":
        await node.leave(parse_topic_id(str(request.get("topic", ""))))
        await client.send({"ok": True})
    elif op == "publish":
        topic = node.topic(parse_topic_id(str(request.get("topic", ""))))
        event_id = await topic.publish(_payload_of(request))
        await client.send({"ok": True, "id": event_id.hex()})
    elif op == "publish_batch":
        topic = node.topic(parse_topic_id(str(request.get("topic", ""))))
        ids = await topic.publish_many(_batch_payloads(request))
        await client.send({"ok": True, "ids": [i.hex() for i in ids]})
    elif op == "subscribe":
        topic = node.topic(parse_topic_id(str(request.get("topic", ""))))
        since, count = _since_of(request.get("since", 0)), request.get("count")
        order = request.get("order", "causal")
        if count is not None and (type(count) is not int or count < 1):
            raise NodeError("count must be a positive integer")
        kinds = request.get("kinds")
        if kinds is not None and (not isinstance(kinds, list)
                                  or not all(isinstance(k, str) for k in kinds)):
            raise NodeError("kinds must be a list of strings")
        check_kinds(kinds)
        if request.get("payload", "text") not in ("text", "base64"):
            raise NodeError('payload must be "text" or "base64"')
        if isinstance(since, bytes):  # resolved before the first line: an unknown id is refused
            since = await topic.position_after(since, str(order))
        await client.send({"ok": True})
        try:
            await _stream_until_hangup(
                client, partial(_stream_events, client, topic, since, count, str(order), kinds,
                                request.get("payload") == "base64"))
        except NodeError as exc:  # the topic was left, this node banned: the stream's last line
            await client.send(error_reply(exc))
        raise _StreamDone
    elif op == "state":
        topic = node.topic(parse_topic_id(str(request.get("topic", ""))))
        if not topic.ready or not topic.replica.authorizing:
            raise NodeError("this topic has no state yet (not synced, or a pure MEG topic)")
        await client.send({"ok": True, "state": topic.state()})
    elif op == "set_state":
        topic = node.topic(parse_topic_id(str(request.get("topic", ""))))
        kind, key, content = request.get("type"), request.get("state_key", ""), request.get("content")
        if not isinstance(kind, str) or not isinstance(key, str) or not isinstance(content, dict):
            raise NodeError("set_state needs a type, a state_key and a JSON object content")
        event_id = await topic.set_state(kind, key, content)
        await client.send({"ok": True, "id": event_id.hex()})
    elif op in MEMBER_OPS:
        topic = node.topic(parse_topic_id(str(request.get("topic", ""))))
        key = _member_key(request.get("member"))
        if op == "invite":
            event_id = await topic.invite(key)
        elif op == "add_writer":
            event_id = await topic.add_writer(key)
        elif op == "set_role":
            event_id = await topic.set_role(key, str(request.get("role", "")))
        else:
            event_id = await topic.ban(key, request.get("reason"))
        # None: the member had that role already; nothing was written.
        await client.send({"ok": True, "id": None if event_id is None else event_id.hex(),
                             "changed": event_id is not None})
    elif op == "backup":
        path = request.get("path")
        if not isinstance(path, str) or not os.path.isabs(path):
            raise NodeError("backup needs an absolute path")
        await client.send({"ok": True} | await node.backup(path))
    elif op == "connect":
        peer = await node.connect(str(request.get("address", "")))
        await client.send({"ok": True, "peer": peer})
    elif op in TOPIC_VIEWS:
        await client.send({"ok": True} | TOPIC_VIEWS[op](node, request))
    elif op == "peers":
        await client.send({"ok": True, "peers": node.peers_report()})
    else:
        raise NodeError(f"unknown op {op!r}")


def _stop_serving(node: Node, request: dict[str, Any], exc: DamagedTopicError) -> None:
    """The topic a request found damaged is served no more (the others are)."""
    topic_id = exc.topic_id
    if topic_id is None:  # the layer that found it could not name it: the request does
        try:
            topic_id = parse_topic_id(str(request.get("topic", "")))
        except NodeError:
            return
    node.mark_damaged(topic_id, exc.what)


class _State(StrEnum):
    """Where a connection is; IDLE and QUEUED ones hold no budget and may be pushed out."""

    IDLE = "idle"  # waiting for the client's next request line
    QUEUED = "queued"  # a request waits for its budget
    BUSY = "busy"  # a request is being answered (or a subscription streams)


class _Connection:
    """One client's bookkeeping for the server: its state, since when, its cancel scope."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.scope = trio.CancelScope()
        self.state = _State.IDLE
        self.since = trio.current_time()
        self.pushed_out = False

    def enter(self, state: _State) -> None:
        self.state, self.since = state, trio.current_time()


class ControlServer:
    """Serves control connections on any trio stream, within the ControlLimits."""

    def __init__(self, node: Node, limits: ControlLimits = ControlLimits()) -> None:
        self.node = node
        self.limits = limits
        self._budgets = {
            "status": trio.CapacityLimiter(limits.max_status),
            "request": trio.CapacityLimiter(limits.max_requests),
        }
        self._subscribers = trio.CapacityLimiter(limits.max_subscribers)
        self._connections: dict[int, _Connection] = {}
        self._numbers = counter()
        self.stats: dict[str, int] = {"refused": 0, "idle_dropped": 0, "pushed_out": 0,
                                      "slow_dropped": 0, "subscribers_refused": 0}

    @property
    def connections(self) -> int:
        return len(self._connections)

    @property
    def subscribers(self) -> int:
        return self._subscribers.borrowed_tokens

    def admit(self, nursery: trio.Nursery, stream: trio.abc.Stream) -> None:
        """Serve `stream` in `nursery`; at the connection bound, push out the longest idle."""
        if len(self._connections) >= self.limits.max_connections:
            self._push_out_one()
        connection = _Connection(next(self._numbers))
        self._connections[connection.number] = connection
        nursery.start_soon(self._serve, stream, connection)

    def _push_out_one(self) -> None:
        waiting = [c for c in self._connections.values()
                   if c.state is not _State.BUSY and not c.pushed_out]
        if not waiting:
            return  # cannot happen while the budgets add up to less than the bound
        victim = min(waiting, key=lambda c: c.since)
        victim.pushed_out = True
        victim.scope.cancel()
        self.stats["pushed_out"] += 1
        logger.warning("control socket: %d connections, dropped one %s for %.1f s",
                       len(self._connections), victim.state, trio.current_time() - victim.since)

    async def _serve(self, stream: trio.abc.Stream, connection: _Connection) -> None:
        client = _Client(stream, self.limits.send_timeout_s)
        try:
            async with stream:
                with connection.scope:
                    try:
                        await self._converse(client, connection)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass  # the client went away
                    except _SlowReader as exc:
                        self.stats["slow_dropped"] += 1
                        logger.warning("control socket: dropped a client that does not read "
                                       "(%s)", exc)
                    except Exception:  # a bug must cost one connection, never the daemon
                        logger.exception("control socket: a connection failed")
        finally:
            del self._connections[connection.number]

    async def _converse(self, client: _Client, connection: _Connection) -> None:
        reader = _Reader(client.stream)
        timeout_s = self.limits.first_request_timeout_s
        while True:
            connection.enter(_State.IDLE)
            with trio.move_on_after(timeout_s) as idle:
                try:
                    line = await reader.line()
                except _RequestTooLong as exc:
                    await self._refuse(client, str(exc))
                    return  # the rest of the line would be read as requests
            if idle.cancelled_caught:
                self.stats["idle_dropped"] += 1
                logger.info("control socket: dropped a client idle for %g s", timeout_s)
                return
            if line is None:
                return
            timeout_s = self.limits.idle_timeout_s
            try:
                request = parse_request(line)
            except BadRequest as exc:
                await self._refuse(client, str(exc))
                continue
            try:
                await self._answer(client, connection, request)
            except _StreamDone:
                return  # a subscription ends the connection: the client reads to EOF

    async def _refuse(self, client: _Client, reason: str) -> None:
        self.stats["refused"] += 1
        logger.warning("control socket: refused a request: %s", reason[:MAX_LOGGED_CHARS])
        await client.send({"ok": False, "error": f"bad request: {reason}"})

    async def _answer(self, client: _Client, connection: _Connection,
                      request: dict[str, Any]) -> None:
        op = request.get("op")
        if op == "subscribe":
            try:
                self._subscribers.acquire_nowait()
            except trio.WouldBlock:
                self.stats["subscribers_refused"] += 1
                logger.warning("control socket: refused a subscriber: %d streaming already",
                               self.limits.max_subscribers)
                await client.send({"ok": False, "error": f"too many subscribers (at most "
                                   f"{self.limits.max_subscribers}); try again later"})
                return
            try:
                connection.enter(_State.BUSY)
                await self._handle(client, request)
            finally:
                self._subscribers.release()
            return
        connection.enter(_State.QUEUED)
        async with self._budgets["status" if op == "status" else "request"]:
            connection.enter(_State.BUSY)
            await self._handle(client, request)

    async def _handle(self, client: _Client, request: dict[str, Any]) -> None:
        """One request; every failure but the connection's own is one error line."""
        node = self.node
        try:
            await _handle(node, request, client)
        except NodeError as exc:
            await client.send(error_reply(exc))
        except StoreError as exc:  # a damaged or full store: its message says which
            logger.error("control request %r: %s", request.get("op"), exc)
            if isinstance(exc, DamagedTopicError):
                _stop_serving(node, request, exc)
            await client.send({"ok": False, "error": str(exc)})
        except (_StreamDone, _SlowReader, trio.BrokenResourceError, trio.ClosedResourceError):
            raise
        except Exception as exc:  # a bug must cost one request, never the daemon
            logger.exception("control request %r failed", request.get("op"))
            if is_damaged_record(exc):
                await client.send({"ok": False, "error": damaged_store_message(node, exc)})
                return
            await client.send({"ok": False,
                               "error": f"internal error: {type(exc).__name__}: {exc}"})


async def serve_control(node: Node, path: Path, limits: ControlLimits = ControlLimits(), *,
                        task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve the control socket at `path` until cancelled."""
    if path.exists() or path.is_symlink():
        path.unlink()  # a stale socket of a previous run; the store lock proves we own the dir
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        await sock.bind(os.fspath(path))
    except OSError as exc:
        sock.close()
        raise NodeError(f"cannot create the control socket {path}: {exc.strerror or exc} "
                        f"(Unix socket paths are limited to about 100 bytes)") from None
    finally:
        os.umask(old_umask)
    os.chmod(path, SOCKET_MODE)
    sock.listen(limits.max_connections)
    listener = trio.SocketListener(sock)
    server = ControlServer(node, limits)
    task_status.started(server)
    try:
        async with trio.open_nursery() as nursery:
            while True:
                server.admit(nursery, await listener.accept())
    finally:
        with trio.CancelScope(shield=True):
            await listener.aclose()
        try:
            path.unlink()
        except FileNotFoundError:
            pass
