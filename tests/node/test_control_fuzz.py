"""No input on the control socket crashes the daemon (issue 16): fuzzed and seeded.

Before, one line of `[` * 5000 + `]` * 5000 raised RecursionError in json.loads;
nothing caught it, it escaped the server's nursery and the daemon exited 1.
Here a real `Node` serves its real control socket in-process and takes a
seeded corpus of hostile lines (random bytes, deep or unbalanced nesting,
huge numbers, bad UTF-8, requests with random fields); every line gets one
error (or ok) line back and `status` still answers afterwards. Hypothesis
checks the parser itself: it returns the JSON object or raises BadRequest,
and its depth check agrees with the real depth of any JSON value.
"""

from __future__ import annotations

import json
import logging
import random
from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from node.control import (MAX_REQUEST_DEPTH, BadRequest, ControlServer, nesting_depth,
                          parse_request, serve_control)
from node.runtime import Node

SEED = 16  # the corpus is a function of this seed: a failure names the line that broke it
CORPUS_LINES = 300
STATUS_BOUND_S = 1.0
BOUND_S = 10.0
# Ops whose effects stay inside the node (backup writes files, connect dials, join waits
# for peers, leave would end the fuzzed topic): the fuzz gives them random fields.
FUZZED_OPS = ["status", "topic_create", "publish", "publish_batch", "subscribe",
              "state", "set_state", "invite", "add_writer", "set_role", "ban", "nope", None, 7]


def random_json(rng: random.Random, depth: int = 0) -> Any:
    """A random JSON value: scalars, strings with brackets and escapes, nested containers."""
    roll = rng.random()
    if depth > 6 or roll < 0.4:
        return rng.choice([None, True, False, rng.randint(-2**70, 2**70), rng.random() * 1e300,
                           "", "[{\"\\", "\u0000\ud7ff", "x" * rng.randint(0, 300)])
    if roll < 0.7:
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["op", "topic", "payload", "payloads", "since", "count", "order",
                        "name", "d_max", "access", "content", "member", "role", "k"]):
            random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def hostile_line(rng: random.Random, topic: str) -> bytes:
    """One request line (no newline inside) of a randomly chosen hostile shape."""
    shape = rng.randrange(9)
    if shape == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 2_000))).replace(b"\n", b" ")
    if shape == 1:
        n = rng.choice([MAX_REQUEST_DEPTH, MAX_REQUEST_DEPTH + 1, 1_000, 5_000, 100_000])
        return rng.choice([b"[" * n + b"]" * n, b'{"a":' * n + b"1" + b"}" * n, b"[" * n,
                           b"]" * n + b"[" * n, b'{"op":"status","x":' + b"[" * n + b"]" * n + b"}"])
    if shape == 2:
        return b'{"op":"publish","topic":"%s","payload":%s}' % (topic.encode(), b"9" * 5_000)
    if shape == 3:
        return rng.choice([b"\xff\xfe{}", b'{"op":"status"', b"NaN", b"[1,2", b'"\\ud800"',
                           b'{"op":"status"}\r', b"\x00" * 100, b"", b" ", b"{}" * 100,
                           '{"op":"st\u00e4tus"}'.encode("utf-16")])
    if shape == 4:
        return json.dumps(random_json(rng)).encode()
    request = {"op": rng.choice(FUZZED_OPS)}
    if rng.random() < 0.7:
        request["topic"] = rng.choice([topic, topic[:10], "zz" * 32, 5, None, [topic]])
    for _ in range(rng.randint(0, 4)):
        value = random_json(rng)
        request[rng.choice(["payload", "payload_b64", "payloads", "since", "count", "order",
                            "name", "d_max", "access", "type", "state_key", "content",
                            "member", "role", "reason"])] = value
    if request["op"] == "subscribe" and rng.random() < 0.5:
        request.pop("count", None)  # a streaming subscription: the client hangs up on it
    return json.dumps(request).encode()


async def one_reply(socket, line: bytes) -> dict[str, Any]:
    stream = await trio.open_unix_socket(socket)
    async with stream:
        await stream.send_all(line + b"\n")
        buffer = b""
        with trio.fail_after(BOUND_S):
            while b"\n" not in buffer:
                chunk = await stream.receive_some(65_536)
                assert chunk, f"no answer to {line[:120]!r}"
                buffer += chunk
    return json.loads(buffer.partition(b"\n")[0])


async def test_deep_json_line_gets_an_error_and_status_still_answers(tmp_path, caplog):
    async with Node.open(tmp_path / "n") as node:
        socket = tmp_path / "n" / "control.sock"
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_control, node, socket)
            answer = await one_reply(socket, b"[" * 5_000 + b"]" * 5_000)
            assert answer == {"ok": False, "error": "bad request: nested 5000 levels deep, "
                                                    f"at most {MAX_REQUEST_DEPTH} allowed"}
            assert "refused a request: nested 5000 levels deep" in caplog.text
            with trio.fail_after(STATUS_BOUND_S):
                assert (await one_reply(socket, b'{"op":"status"}'))["ok"]
            nursery.cancel_scope.cancel()


async def test_seeded_hostile_corpus_never_crashes_the_control_server(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="megnode.control")
    rng = random.Random(SEED)
    async with Node.open(tmp_path / "n") as node:
        socket = tmp_path / "n" / "control.sock"
        async with trio.open_nursery() as nursery:
            server: ControlServer = await nursery.start(serve_control, node, socket)
            topic = (await node.create_topic("fuzzed")).id_hex
            refused = 0
            for index in range(CORPUS_LINES):
                line = hostile_line(rng, topic)
                answer = await one_reply(socket, line)
                assert isinstance(answer.get("ok"), bool), (index, line[:120], answer)
                assert "internal error" not in answer.get("error", ""), (index, line[:120], answer)
                refused += not answer["ok"]
            assert refused > CORPUS_LINES // 2  # most of the corpus is not a valid request
            with trio.fail_after(BOUND_S):
                while server.connections:  # hung-up subscribers included
                    await trio.sleep(0.01)
            with trio.fail_after(STATUS_BOUND_S):
                status = await one_reply(socket, b'{"op":"status"}')
            assert status["ok"] and any(t["topic"] == topic for t in status["status"]["topics"])
            assert "a connection failed" not in caplog.text
            nursery.cancel_scope.cancel()


def json_depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(json_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(json_depth, value.values()), default=0)
    return 0


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=40)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_depth_check_agrees_with_the_real_depth_of_any_json(value):
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
        assert nesting_depth(text.encode()) == json_depth(value)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3_000) | JSON.map(lambda v: json.dumps(v).encode())
       | st.integers(1, 20_000).map(lambda n: b"[" * n + b"]" * n))
def test_parse_request_returns_an_object_or_raises_bad_request(line):
    try:
        request = parse_request(line)
    except BadRequest:
        return
    assert isinstance(request, dict) and request == json.loads(line)
