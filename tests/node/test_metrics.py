"""The Prometheus exporter: real nodes in this process, scraped over loopback HTTP.

Two nodes (`Node.open`, real libp2p and LMDB) with `metrics_port` set; one
creates an open topic and publishes, the other joins and receives. Their
/metrics pages must name the documented metrics with the values the nodes'
own state holds. Every wait is bounded by `trio.fail_after` and waits on a
condition; the pure HTTP helpers are tested without sockets.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import random

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from node.config import NodeConfig
from node.metrics import (
    MAX_REQUEST_BYTES,
    RequestError,
    TopicLabels,
    accepted_counts,
    is_open,
    parse_request,
    request_complete,
    response,
)
from node.replica.replica import Replica
from node.runtime import Node, NodeError, Topic
from node.state.types import RULE_PUBLIC, TYPE_JOIN_RULES
from storage.memory import MemoryStore
from tests.helpers import authorized_topic, identity

TEST_TIMEOUT_S = 60.0
HTTP_TIMEOUT_S = 10.0
PUBLISHED = 25
LOOPBACK_LISTEN = ["/ip4/127.0.0.1/tcp/0"]
RECEIVE_CHUNK = 65_536
POLL_S = 0.02
BOOTSTRAP_EVENTS = 4  # create, the creator's join, power levels, join rule


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@asynccontextmanager
async def metrics_node(data_dir: Path, bootstrap: list[str] | None = None
                       ) -> AsyncIterator[Node]:
    config = NodeConfig(metrics_port=free_port())
    async with Node.open(data_dir, listen=LOOPBACK_LISTEN, bootstrap=bootstrap or [],
                         config=config) as node:
        yield node


async def http_get(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send a raw request to 127.0.0.1:port; (status, headers, body) of the reply."""
    with trio.fail_after(HTTP_TIMEOUT_S):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(request)
            data = b""
            while chunk := await stream.receive_some(RECEIVE_CHUNK):
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("ascii").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return status, headers, body


async def scrape(node: Node) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The node's /metrics as {(sample name, sorted labels): value}."""
    assert node.metrics is not None
    status, headers, body = await http_get(node.metrics.port,
                                           b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert int(headers["content-length"]) == len(body)
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


async def wait_holds(topic: Topic, event_ids: list[bytes]) -> None:
    """Wait (the caller bounds it) until all `event_ids` are in the topic's graph.

    Counts are not enough: the joiner's own join event counts too.
    """
    while not all(topic.replica.graph.has(event_id) for event_id in event_ids):
        await trio.sleep(POLL_S)


# --------------------------------------------------------------------------- real nodes


async def test_scrape_reports_topic_peer_traffic_and_latency_figures(tmp_path):
    with trio.fail_after(TEST_TIMEOUT_S):
        async with metrics_node(tmp_path / "a") as a:
            async with metrics_node(tmp_path / "b", bootstrap=[a.addresses[0]]) as b:
                topic_a = await a.create_topic("metrics")
                topic_b = await b.join(topic_a.topic_id)
                await topic_b.wait_ready(TEST_TIMEOUT_S)
                ids = await topic_a.publish_many([f"m{i}".encode() for i in range(PUBLISHED)])
                await wait_holds(topic_b, ids)

                label = topic_a.id_hex
                at_a, at_b = await scrape(a), await scrape(b)

                # Topic figures equal the replicas' own state.
                delivered = value(at_b, "megnode_events_delivered_total", topic=label)
                assert BOOTSTRAP_EVENTS + PUBLISHED <= delivered
                assert delivered <= topic_b.replica.graph.delivered_count  # read after: grown
                assert value(at_a, "megnode_events_accepted_total",
                             topic=label, origin="local") >= PUBLISHED
                assert value(at_b, "megnode_events_accepted_total",
                             topic=label, origin="remote") >= PUBLISHED
                assert not [k for k in at_b if k[0] == "megnode_events_rejected_total"]
                assert value(at_b, "megnode_topic_extremities", topic=label) >= 1
                assert ("megnode_topic_buffered_events", (("topic", label),)) in at_b
                assert value(at_a, "megnode_topics") == value(at_b, "megnode_topics") == 1

                # Peers and wire traffic.
                assert value(at_a, "megnode_peers") == value(at_b, "megnode_peers") == 1
                assert value(at_a, "megnode_bytes_sent_total") > 0
                assert value(at_b, "megnode_bytes_received_total") > 0
                assert value(at_a, "megnode_bytes_sent_by_message_total", message="push") > 0
                assert value(at_b, "megnode_anti_entropy_sessions_total") >= 1
                for name in ("megnode_peer_misbehaviour_total", "megnode_outbox_dropped_total",
                             "megnode_transport_faults_total"):
                    assert value(at_b, name) == 0

                # Latency: one observation per remote event delivered at b, none at a
                # for its own events; every one well under the test's bound.
                observed = sum(v for (name, _), v in at_b.items()
                               if name == "megnode_dissemination_latency_seconds_count")
                assert observed >= PUBLISHED
                total_s = sum(v for (name, _), v in at_b.items()
                              if name == "megnode_dissemination_latency_seconds_sum")
                assert 0 <= total_s <= observed * TEST_TIMEOUT_S
                own = sum(v for (name, _), v in at_a.items()
                          if name == "megnode_dissemination_latency_seconds_count")
                assert own < observed  # a saw b's join at most, never its own events


async def test_invite_topics_are_labelled_by_alias_never_by_id(tmp_path):
    with trio.fail_after(TEST_TIMEOUT_S):
        async with metrics_node(tmp_path / "a") as a:
            invite = [await a.create_topic(f"secret {n}", access="invite") for n in range(2)]
            public = await a.create_topic("public")
            await invite[0].publish(b"x")
            assert a.metrics is not None
            body = (await http_get(a.metrics.port,
                                   b"GET /metrics HTTP/1.0\r\n\r\n"))[2].decode()
            for topic in invite:  # neither the id nor the name, in any case
                assert topic.id_hex not in body.lower() and "secret" not in body
            samples = await scrape(a)
            by_id = sorted(invite, key=lambda t: t.topic_id)  # aliases follow id order
            for n, topic in enumerate(by_id, start=1):
                label = f"private-{n}"
                assert value(samples, "megnode_events_delivered_total", topic=label) == \
                    topic.replica.graph.delivered_count
            assert value(samples, "megnode_topic_extremities", topic=public.id_hex) >= 1
            assert value(samples, "megnode_topics") == 3
            assert (await scrape(a)).keys() == samples.keys()  # the same aliases each scrape


async def test_latency_is_delivery_time_minus_event_timestamp(tmp_path):
    with trio.fail_after(TEST_TIMEOUT_S):
        async with metrics_node(tmp_path / "a") as a:
            async with metrics_node(tmp_path / "b", bootstrap=[a.addresses[0]]) as b:
                topic_a = await a.create_topic("latency")
                topic_b = await b.join(topic_a.topic_id)
                await topic_b.wait_ready(TEST_TIMEOUT_S)
                event_id = await topic_a.publish(b"timed")
                await wait_holds(topic_b, [event_id])
                event = topic_b.replica.graph.get(event_id)
                assert event is not None and b.metrics is not None
                record = {"type": "delivered", "ts_ms": event.timestamp_ms + 1_500,
                          "topic": topic_a.id_hex, "event": event_id.hex(),
                          "author": event.author.hex(), "channel": "relay"}

                b.metrics.on_log(record)
                b.metrics.on_log(record | {"author": b.node_id})  # own event: ignored
                b.metrics.on_log(record | {"type": "received"})  # not a delivery: ignored
                b.metrics.on_log(record | {"ts_ms": event.timestamp_ms - 10})  # skew: 0

                samples = await scrape(b)
                name = "megnode_dissemination_latency_seconds"
                assert value(samples, f"{name}_count", channel="relay") == 2
                assert value(samples, f"{name}_sum", channel="relay") == pytest.approx(1.5)
                assert value(samples, f"{name}_bucket", channel="relay", le="1.0") == 1
                assert value(samples, f"{name}_bucket", channel="relay", le="2.5") == 2


async def test_http_errors_are_answered_and_bounded(tmp_path):
    with trio.fail_after(TEST_TIMEOUT_S):
        async with metrics_node(tmp_path / "a") as a:
            assert a.metrics is not None
            port = a.metrics.port
            assert (await http_get(port, b"GET /nope HTTP/1.0\r\n\r\n"))[0] == 404
            assert (await http_get(port, b"POST /metrics HTTP/1.0\r\n\r\n"))[0] == 405
            assert (await http_get(port, b"hello\r\n\r\n"))[0] == 400
            oversized = b"GET /metrics HTTP/1.0\r\nX: " + b"a" * MAX_REQUEST_BYTES
            assert (await http_get(port, oversized))[0] == 431
            status, headers, body = await http_get(port, b"HEAD /metrics HTTP/1.0\r\n\r\n")
            assert status == 200 and body == b"" and int(headers["content-length"]) > 0


async def test_a_taken_metrics_port_fails_the_start_with_a_clear_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with trio.fail_after(TEST_TIMEOUT_S):
            # A plain NodeError (not inside an exception group): the CLI prints one line.
            with pytest.raises(NodeError, match=f"cannot serve metrics on port {port}"):
                async with Node.open(tmp_path / "a", listen=LOOPBACK_LISTEN,
                                     config=NodeConfig(metrics_port=port)):
                    pass


async def test_metrics_off_by_default(tmp_path):
    with trio.fail_after(TEST_TIMEOUT_S):
        async with Node.open(tmp_path / "a", listen=LOOPBACK_LISTEN) as node:
            assert node.metrics is None


# --------------------------------------------------------------------------- pure helpers


def test_parse_request_accepts_get_and_head_of_the_metrics_paths():
    assert parse_request(b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n").path == "/metrics"
    assert parse_request(b"HEAD /?x=1 HTTP/1.0\n\n").method == "HEAD"
    for raw, status in ((b"PUT /metrics HTTP/1.1\r\n\r\n", 405),
                        (b"GET /other HTTP/1.1\r\n\r\n", 404),
                        (b"GET /metrics\r\n\r\n", 400),
                        (b"\x00\xff garbage\r\n\r\n", 400)):
        with pytest.raises(RequestError) as caught:
            parse_request(raw)
        assert caught.value.status == status


def test_request_complete_needs_the_blank_line():
    assert not request_complete(b"GET /metrics HTTP/1.1\r\nHost: a\r\n")
    assert request_complete(b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n")


def test_response_has_length_and_closes():
    raw = response(200, b"abc", "text/plain")
    assert raw.startswith(b"HTTP/1.0 200 OK\r\n") and raw.endswith(b"\r\n\r\nabc")
    assert b"Content-Length: 3\r\n" in raw and b"Connection: close\r\n" in raw
    assert response(200, b"abc", "text/plain", include_body=False).endswith(b"\r\n\r\n")


def test_accepted_counts_split_local_and_remote():
    counters = {"created": 3, "applied": 10, "buffered": 2, "unauthorized": 1, "duplicate": 7}
    assert accepted_counts(counters) == (3, 8)
    assert accepted_counts({}) == (0, 0)


def test_topic_labels_hide_every_topic_anyone_may_not_read():
    rng = random.Random(1)
    labels = TopicLabels()
    invite = authorized_topic(author="alice")
    public = authorized_topic(author="bob", join_rule=RULE_PUBLIC)
    stateless = Replica.create_topic(MemoryStore(), identity("carol"), 1_000)
    waiting = Replica(MemoryStore(), b"\x07" * 32, identity("dave"))  # no create event yet
    assert not is_open(invite) and not is_open(waiting)
    assert is_open(public) and is_open(stateless)
    assert labels.label(public.topic_id, public) == public.topic_id.hex()
    assert labels.label(stateless.topic_id, stateless) == stateless.topic_id.hex()
    assert labels.label(invite.topic_id, invite) == "private-1"
    assert labels.label(waiting.topic_id, waiting) == "private-2"
    assert labels.label(invite.topic_id, invite) == "private-1"  # stable
    # The join rule decides, as resolved now: made public, the id is no secret any more;
    # back to invite, the topic gets its old alias again.
    invite.set_state(TYPE_JOIN_RULES, "", {"join_rule": RULE_PUBLIC}, 2_000, rng)
    assert labels.label(invite.topic_id, invite) == invite.topic_id.hex()
    invite.set_state(TYPE_JOIN_RULES, "", {"join_rule": "invite"}, 3_000, rng)
    assert labels.label(invite.topic_id, invite) == "private-1"
