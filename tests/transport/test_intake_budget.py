"""Per-peer intake budgets (transport.intake_budget): over budget, frames are dropped
unread and counted, sustained abuse gets the peer dropped, and the wants we send one
peer per round are bounded. That honest traffic stays far under the budgets is
asserted on the 100-node world (tests/transport/test_sim_world.py)."""

from __future__ import annotations

import math
from dataclasses import replace

from node.core.identity import sign_event
from tests.transport.mesh import CONFIG, Mesh
from transport.effects import Disconnect, Send
from transport.intake_budget import IntakeBudget
from transport.messages import Push, Want, decode, encode
from transport.misbehaviour import OVER_BUDGET_WEIGHT, UNAUTHORIZED_WEIGHT


def test_buckets_refill_and_report_their_low_water():
    budget = IntakeBudget(bytes_per_s=1_000, bytes_burst=2_000, events_per_s=10, events_burst=20)
    assert budget.take_events("p", 20, now_ms=0)
    assert not budget.take_events("p", 1, now_ms=0)
    assert budget.take_events("p", 10, now_ms=1_000)  # refilled at 10/s
    assert budget.take_bytes("q", 1_500, now_ms=0) and not budget.take_bytes("q", 600, now_ms=0)
    assert budget.low_water() == (0.25, 0.0)


def _flooder(threshold: float, events_burst: int) -> Mesh:
    config = replace(CONFIG, misbehaviour_threshold=threshold, peer_events_per_s=10,
                     peer_events_burst=events_burst)
    mesh = Mesh(["a", "b"], join_rule="public", config=config)
    mesh.pump(mesh.connect("a", "b"))
    return mesh


def _push(mesh: Mesh, seq: int) -> bytes:
    raw = sign_event(mesh.replicas["b"].identity, topic=mesh.topic, seq=seq,
                     parents=[mesh.topic], timestamp_ms=mesh.now_ms, kind="message",
                     payload=b"%d" % seq, auth=(mesh.topic,)).raw
    return encode(Push(mesh.topic, (raw,)))


def test_a_peer_over_its_event_budget_is_dropped_unread_then_disconnected():
    mesh = _flooder(threshold=2, events_burst=5)
    engine = mesh.engines["a"]
    b = mesh.ids["b"]
    disconnected_at = None
    frame = _push(mesh, 1)  # a non-member's event: refused once, then from memory
    for seq in range(1, 100):
        effects = engine.on_message(b, frame, mesh.now_ms)
        if any(isinstance(e, Disconnect) for e in effects):
            disconnected_at = seq
            break
    assert engine.stats["intake_throttled_events"] == disconnected_at - 5
    # The refusal weighed UNAUTHORIZED_WEIGHT; each dropped frame OVER_BUDGET_WEIGHT.
    assert disconnected_at == 5 + math.ceil((2 - UNAUTHORIZED_WEIGHT) / OVER_BUDGET_WEIGHT - 1e-9)
    # Dropped unread: only the burst's frames were looked at.
    assert engine.stats["unauthorized"] + engine.stats["rejected_again"] == 5


def test_wants_to_one_peer_per_round_are_bounded():
    config = replace(CONFIG, wants_in_flight_per_peer=3)
    mesh = Mesh(["a", "b"], join_rule="public", config=config)
    mesh.pump(mesh.connect("a", "b"))
    a = mesh.replicas["a"]
    for seq in range(10):  # events naming parents nobody has
        raw = sign_event(mesh.replicas["b"].identity, topic=mesh.topic, seq=seq + 1,
                         parents=[bytes([seq + 1]) * 32], timestamp_ms=mesh.now_ms,
                         kind="message", payload=b"", auth=(mesh.topic,)).raw
        a.receive(raw, mesh.now_ms)
    a.commit()
    engine = mesh.engines["a"]
    sent = engine.tick(mesh.now_ms + 10_000)
    wants = [decode(e.data) for e in sent if isinstance(e, Send)
             and isinstance(decode(e.data), Want)]
    assert sum(len(w.ids) for w in wants) == 3
    assert engine.stats["wants_deferred"] == 7
