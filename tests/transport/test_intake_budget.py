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


def test_a_flood_of_events_on_unknown_parents_is_cut_at_the_buffered_budget():
    from transport.intake_budget import PEER_BUFFERED_BURST
    mesh = Mesh(["a", "b"], join_rule="public")
    mesh.pump(mesh.connect("a", "b"))
    key = mesh.replicas["b"].identity
    raws = tuple(sign_event(key, topic=mesh.topic, seq=i, parents=[bytes([i % 251]) * 32],
                            timestamp_ms=mesh.now_ms, kind="message", payload=b"x",
                            auth=(mesh.topic,)).raw
                 for i in range(PEER_BUFFERED_BURST + 50))
    engine = mesh.engines["a"]
    for start in range(0, len(raws), 500):  # frames of 500, as fast as they come
        engine.on_message(mesh.ids["b"], encode(Push(mesh.topic, raws[start:start + 500])),
                          mesh.now_ms)
    buffered = mesh.replicas["a"].graph.buffered_count
    assert buffered <= PEER_BUFFERED_BURST + 1  # the rest dropped unread
    assert engine.stats["intake_throttled_buffered"] >= 1


SMALL_BURST = 100  # a buffered burst below the buffer's bound per author (1,024)


def _reversed_catch_up(trusted: bool) -> tuple[object, object]:
    """b sends a, by Events (the SYNC channel), 100 at a time, newest first, a chain
    of more events than the buffered burst: all but the last frame only buffer."""
    from tests.transport.pair import lagging
    from transport.messages import Events
    pair = lagging(SMALL_BURST * 5 + 1)
    made = [e for _, e in pair.replicas["b"].graph.deliveries(0, pair.replicas["b"].graph
                                                                .delivered_count)
            if not pair.replicas["a"].graph.has(e.id)]
    engine = pair.engines["a"]
    engine.intake_budget = IntakeBudget(buffered_per_s=1, buffered_burst=SMALL_BURST)
    first, rest = made[0], made[1:]
    if trusted:  # b handed over an applied, new event: trusted (transport.peer_budget)
        engine.on_message("b", encode(Push(pair.topic, (first.raw,))), pair.now_ms)
        assert engine._answers.is_trusted("b")
    else:
        rest = made
    raws = [e.raw for e in reversed(rest)]
    for start in range(0, len(raws), SMALL_BURST):
        frame = Events(pair.topic, 1, False, tuple(raws[start:start + SMALL_BURST]))
        engine.on_message("b", encode(frame), pair.now_ms)
    return pair, engine


def test_a_catch_up_from_a_trusted_peer_is_not_cut_by_the_buffered_budget():
    pair, engine = _reversed_catch_up(trusted=True)
    assert engine.stats["intake_throttled_buffered"] == 0
    assert pair.same()  # the last frame released the whole chain


def test_answers_from_a_peer_not_trusted_count_against_the_buffered_budget():
    pair, engine = _reversed_catch_up(trusted=False)
    assert engine.stats["intake_throttled_buffered"] >= 1
    # Past the burst, each later frame buffers one event before the rest is cut.
    assert pair.replicas["a"].graph.buffered_count <= SMALL_BURST + 5
