"""The local control socket: how the `megnode` CLI talks to a running daemon.

A Unix socket in the data dir (`control.sock`, mode 0600: only the node's
user may drive it). Each request is one JSON object on one line; each reply
is one JSON line `{"ok": true, ...}` or `{"ok": false, "error": "..."}`. A
`subscribe` request keeps the connection open and streams one line per
delivered event until the client hangs up (or `count` events were sent).

Requests:
    {"op": "status"}
    {"op": "topic_create", "name": "kitchen", "d_max": 10, "access": "open" | "invite"}
    {"op": "topic_join", "topic": "<64 hex>"}
    {"op": "topic_leave", "topic": "<64 hex>"}
    {"op": "publish", "topic": "<64 hex>", "payload": "text"} | "payload_b64": "..."
    {"op": "publish_batch", "topic": "<64 hex>", "payloads": ["text", ...]}
    {"op": "subscribe", "topic": "<64 hex>", "since": 0, "count": null,
     "order": "causal"|"confirmed"|"tentative"}
        (tentative: a line {"rewind": n} means drop the entries from position
        n on; the event lines after it replay from n; `count` counts events)
    {"op": "connect", "address": "/ip4/.../p2p/..."}
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
from pathlib import Path
from typing import Any

import msgpack
import trio

from node.core.event import Event
from node.core.store import DamagedTopicError, StoreError
from node.replica.order_views import Rewind
from node.runtime import Node, NodeError, parse_topic_id

logger = logging.getLogger("megnode.control")

MAX_REQUEST_BYTES = 1 << 20  # one request line
MAX_CONTROL_CLIENTS = 64
MAX_PUBLISH_BATCH = 10_000  # events in one publish_batch request
CLIENT_IDLE_TIMEOUT_S = 30.0  # a client that sends nothing for this long is dropped
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
    """A streaming reply (subscribe with a count) is complete."""


class _Reader:
    """Line reader over a trio stream with a bound on the line length."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = bytearray()

    async def line(self) -> bytes | None:
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_REQUEST_BYTES:
                raise ValueError(f"request longer than {MAX_REQUEST_BYTES} bytes")
            chunk = await self._stream.receive_some(65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        return line


def event_json(position: int, event: Event) -> dict[str, Any]:
    """An event as the CLI prints it (payload as text when it is UTF-8, else base64)."""
    out: dict[str, Any] = {
        "position": position,
        "id": event.id.hex(),
        "author": event.author.hex(),
        "seq": event.seq,
        "kind": event.kind,
        "timestamp_ms": event.timestamp_ms,
        "parents": [p.hex() for p in event.parents],
    }
    if event.state_key is not None:
        out["state_key"] = event.state_key
    try:
        out["payload"] = event.payload.decode("utf-8")
    except UnicodeDecodeError:
        out["payload_b64"] = base64.b64encode(event.payload).decode("ascii")
    return out


MEMBER_OPS = ("invite", "add_writer", "set_role", "ban")


def _member_key(value: Any) -> bytes:
    """A member's key from its hex node id (as `megnode status` prints it)."""
    try:
        key = bytes.fromhex(str(value))
    except ValueError:
        key = b""
    if len(key) != 32:
        raise NodeError(f"not a member key (the 64-hex node id from `megnode status`): {value!r}")
    return key


async def _send(stream: trio.abc.SendStream, obj: dict[str, Any]) -> None:
    await stream.send_all(json.dumps(obj, separators=(",", ":")).encode() + b"\n")


def _payload_of(request: dict[str, Any]) -> bytes:
    if "payload_b64" in request:
        try:
            return base64.b64decode(request["payload_b64"], validate=True)
        except (ValueError, TypeError):
            raise NodeError("payload_b64 is not valid base64") from None
    payload = request.get("payload", "")
    if not isinstance(payload, str):
        raise NodeError("payload must be a string")
    return payload.encode("utf-8")


async def _handle(node: Node, request: dict[str, Any], stream: trio.SocketStream) -> None:
    op = request.get("op")
    if op == "status":
        await _send(stream, {"ok": True, "status": node.status()})
    elif op == "topic_create":
        name = request.get("name", "")
        if not isinstance(name, str):
            raise NodeError("name must be a string")
        d_max = request.get("d_max")
        access = request.get("access", "open")
        try:
            topic = await node.create_topic(name, d_max=d_max, access=str(access))
        except ValueError as exc:
            raise NodeError(str(exc)) from None
        await _send(stream, {"ok": True, "topic": topic.id_hex})
    elif op == "topic_join":
        topic = await node.join(parse_topic_id(str(request.get("topic", ""))))
        await _send(stream, {"ok": True, "topic": topic.id_hex, "ready": topic.ready})
    elif op == "topic_leave":
        await node.leave(parse_topic_id(str(request.get("topic", ""))))
        await _send(stream, {"ok": True})
    elif op == "publish":
        topic = node.topic(parse_topic_id(str(request.get("topic", ""))))
        event_id = await topic.publish(_payload_of(request))
        await _send(stream, {"ok": True, "id": event_id.hex()})
    elif op == "publish_batch":
        topic = node.topic(parse_topic_id(str(request.get("topic", ""))))
        payloads = request.get("payloads")
        if not isinstance(payloads, list) or not all(isinstance(p, str) for p in payloads):
            raise NodeError("payloads must be a list of strings")
        if len(payloads) > MAX_PUBLISH_BATCH:
            raise NodeError(f"at most {MAX_PUBLISH_BATCH} payloads per batch")
        ids = await topic.publish_many([p.encode("utf-8") for p in payloads])
        await _send(stream, {"ok": True, "ids": [i.hex() for i in ids]})
    elif op == "subscribe":
        topic = node.topic(parse_topic_id(str(request.get("topic", ""))))
        since, count = request.get("since", 0), request.get("count")
        order = request.get("order", "causal")
        if type(since) is not int or since < 0:
            raise NodeError("since must be a non-negative integer")
        if count is not None and (type(count) is not int or count < 1):
            raise NodeError("count must be a positive integer")
        await _send(stream, {"ok": True})
        sent = 0
        async for delivered in topic.subscribe(since=since, order=str(order)):
            if isinstance(delivered, Rewind):  # tentative view: truncate, then replay
                await _send(stream, {"rewind": delivered.to_length})
                continue
            await _send(stream, event_json(delivered.position, delivered.event))
            sent += 1
            if count is not None and sent >= count:
                raise _StreamDone
    elif op == "state":
        topic = node.topic(parse_topic_id(str(request.get("topic", ""))))
        if not topic.ready or not topic.replica.authorizing:
            raise NodeError("this topic has no state yet (not synced, or a pure MEG topic)")
        await _send(stream, {"ok": True, "state": topic.state()})
    elif op == "set_state":
        topic = node.topic(parse_topic_id(str(request.get("topic", ""))))
        kind, key, content = request.get("type"), request.get("state_key", ""), request.get("content")
        if not isinstance(kind, str) or not isinstance(key, str) or not isinstance(content, dict):
            raise NodeError("set_state needs a type, a state_key and a JSON object content")
        event_id = await topic.set_state(kind, key, content)
        await _send(stream, {"ok": True, "id": event_id.hex()})
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
        await _send(stream, {"ok": True, "id": None if event_id is None else event_id.hex(),
                             "changed": event_id is not None})
    elif op == "backup":
        path = request.get("path")
        if not isinstance(path, str) or not os.path.isabs(path):
            raise NodeError("backup needs an absolute path")
        await _send(stream, {"ok": True} | await node.backup(path))
    elif op == "connect":
        peer = await node.connect(str(request.get("address", "")))
        await _send(stream, {"ok": True, "peer": peer})
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


async def _serve_client(node: Node, stream: trio.SocketStream, limiter: trio.CapacityLimiter) -> None:
    async with limiter, stream:
        reader = _Reader(stream)
        try:
            while True:
                with trio.move_on_after(CLIENT_IDLE_TIMEOUT_S) as idle:
                    line = await reader.line()
                if idle.cancelled_caught or line is None:
                    return
                try:
                    request = json.loads(line)
                    if not isinstance(request, dict):
                        raise ValueError("a request is a JSON object")
                except ValueError as exc:
                    await _send(stream, {"ok": False, "error": f"bad request: {exc}"})
                    continue
                try:
                    await _handle(node, request, stream)
                except _StreamDone:
                    return  # a finished subscription ends the connection: the client reads to EOF
                except NodeError as exc:
                    await _send(stream, {"ok": False, "error": str(exc)})
                except StoreError as exc:  # a damaged or full store: its message says which
                    logger.error("control request %r: %s", request.get("op"), exc)
                    if isinstance(exc, DamagedTopicError):
                        _stop_serving(node, request, exc)
                    await _send(stream, {"ok": False, "error": str(exc)})
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    raise
                except Exception as exc:  # a bug must cost one request, never the daemon
                    logger.exception("control request %r failed", request.get("op"))
                    if is_damaged_record(exc):
                        await _send(stream, {"ok": False,
                                             "error": damaged_store_message(node, exc)})
                        continue
                    await _send(stream, {"ok": False,
                                         "error": f"internal error: {type(exc).__name__}: {exc}"})
        except (trio.BrokenResourceError, trio.ClosedResourceError, ValueError):
            return  # the client went away or sent an oversized line


async def serve_control(node: Node, path: Path, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
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
    sock.listen(MAX_CONTROL_CLIENTS)
    listener = trio.SocketListener(sock)
    limiter = trio.CapacityLimiter(MAX_CONTROL_CLIENTS)
    task_status.started()
    try:
        async with trio.open_nursery() as nursery:
            while True:
                stream = await listener.accept()
                nursery.start_soon(_serve_client, node, stream, limiter)
    finally:
        with trio.CancelScope(shield=True):
            await listener.aclose()
        try:
            path.unlink()
        except FileNotFoundError:
            pass
