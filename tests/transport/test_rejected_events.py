"""Rejected events stay with the node that rejected them (issue 16, docs/state.md).

A non-member pushes signed events of its own to a member of a public topic:
the auth rules refuse them, so they never become vertices, never widen the
graph, are never passed on to the other member (push or anti-entropy), and
are kept only as a bounded diagnostic record (id, reason, peer). Sent again,
a remembered refusal costs no signature check.
"""

from __future__ import annotations

from dataclasses import replace

from node.core.identity import sign_event
from node.state.types import AuthReason
from tests.transport.mesh import CONFIG, Mesh
from transport.messages import Push, encode

FLOOD = 50


def test_a_non_members_events_are_refused_kept_out_of_the_graph_and_not_passed_on():
    mesh = Mesh(["a", "b", "x"], join_rule="public",
                config=replace(CONFIG, misbehaviour_threshold=10**9))
    mesh.invite("a", "b")
    mesh.pump(mesh.connect("a", "b"))
    mesh.request_join("b")
    mesh.pump(mesh.connect("a", "x"))
    a, b = mesh.replicas["a"], mesh.replicas["b"]
    heads = a.graph.extremities()
    raws = [sign_event(mesh.replicas["x"].identity, topic=mesh.topic, seq=seq,
                       parents=[mesh.topic], timestamp_ms=mesh.now_ms, kind="message",
                       payload=b"flood %d" % seq, auth=(mesh.topic,)).raw
            for seq in range(1, FLOOD + 1)]
    for raw in raws:
        mesh.send("x", "a", encode(Push(mesh.topic, (raw,))))
    mesh.tick(times=3)
    assert a.graph.extremities() == heads and b.graph.extremities() == heads
    engine = mesh.engines["a"]
    refused = list(engine.refusals)
    assert len(refused) == FLOOD and engine.stats["unauthorized"] == FLOOD
    assert {r.peer for r in refused} == {mesh.ids["x"]}
    assert {r.reason for r in refused} == {str(AuthReason.SENDER_NOT_JOINED)}
    assert all(not a.graph.has(r.event_id) and a.is_rejected(r.event_id) for r in refused)
    assert not {r.event_id for r in refused} & mesh.received["b"].events
    assert mesh.same(["a", "b"])
    # Again: refused from memory, before any signature check.
    mesh.send("x", "a", encode(Push(mesh.topic, (raws[0],))))
    assert engine.stats["rejected_again"] == 1 and len(engine.refusals) == FLOOD
    # A member's event built on a refused one is refused too (never a vertex).
    on_refused = sign_event(mesh.replicas["b"].identity, topic=mesh.topic, seq=99,
                            parents=[refused[0].event_id], timestamp_ms=mesh.now_ms,
                            kind="message", payload=b"", auth=(mesh.topic,))
    assert a.receive(on_refused.raw, mesh.now_ms).reason == "parent_rejected"
