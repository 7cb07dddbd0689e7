"""A non-member's signed flood (issue 16): what the honest nodes keep and pass on.

Three engines wired by hand (`tests/transport/mesh.py`): a (the creator) and b
(a joined member) of a topic, and x, an outsider connected to a, that pushes
FLOOD_EVENTS signed messages of its own on the root. The flooder is never
dropped here (the threshold is out of reach), so every event reaches the
replica; then a few anti-entropy intervals pass. Measured on a and b: the
forward extremities, the flood's events held as vertices, and the flood's
events and bytes a passed on to b (push or anti-entropy).
`measure()` runs against whatever `node`/`transport` is on the path, so the
same code gives the figures before the change:

    cd /work/main && PYTHONPATH=/work/main $WT/.venv/bin/python -c "import importlib.util as u; \
        s = u.spec_from_file_location('b', '$WT/tests/bench/test_rejected_flood_bench.py'); \
        m = u.module_from_spec(s); s.loader.exec_module(m); print(m.measure())"

Measured (2,000 events of ~234 bytes; before -> after the replica's gate):
public topic: a's extremities 1 -> 2,001 before, 1 -> 1 after; b's the same;
flood vertices at a and at b 2,000 -> 0; flood events a passed to b 2,000
(468,511 B) -> 0 (0 B); anti-entropy still busy after 5 intervals -> quiet;
a remembers 2,000 rejections (bounded, `GraphLimits.rejected_remembered`).
Invite topic: 0 and 0 (a drops frames from non-readers before any replica
sees them, node.replica.read_access).
`make bench` writes bench-results/rejected_flood.json.
"""

from __future__ import annotations

from dataclasses import replace

from node.core.identity import sign_event
from tests.transport.mesh import CONFIG, Mesh
from transport.messages import Push, encode

FLOOD_EVENTS = 2_000
SYNC_ROUNDS = 5  # anti-entropy intervals after the flood
UNREACHABLE_THRESHOLD = 10**9  # the flooder is never dropped: every event is judged


def _flood(join_rule: str) -> dict[str, int]:
    mesh = Mesh(["a", "b", "x"], join_rule=join_rule,
                config=replace(CONFIG, misbehaviour_threshold=UNREACHABLE_THRESHOLD))
    mesh.invite("a", "b")
    mesh.pump(mesh.connect("a", "b"))
    mesh.request_join("b")
    mesh.pump(mesh.connect("a", "x"))
    a, b = mesh.replicas["a"], mesh.replicas["b"]
    before = {"a_extremities_before": a.graph.width, "b_extremities_before": b.graph.width}
    flood: dict[bytes, int] = {}
    for seq in range(1, FLOOD_EVENTS + 1):
        event = sign_event(mesh.replicas["x"].identity, topic=mesh.topic, seq=seq,
                           parents=[mesh.topic], timestamp_ms=mesh.now_ms, kind="message",
                           payload=b"flood %d" % seq, auth=(mesh.topic,))
        flood[event.id] = len(event.raw)
        mesh.send("x", "a", encode(Push(mesh.topic, (event.raw,))))
    try:
        mesh.tick(times=SYNC_ROUNDS)
        quiesced = 1
    except AssertionError:  # anti-entropy still busy after MAX_FLIGHTS flights
        quiesced = 0
    passed_on = [i for i in flood if i in mesh.received["b"].events]
    return {
        **before,
        "anti_entropy_quiesced": quiesced,
        "a_extremities_after": a.graph.width,
        "b_extremities_after": b.graph.width,
        "a_flood_vertices": sum(a.graph.has(i) for i in flood),
        "b_flood_vertices": sum(b.graph.has(i) for i in flood),
        "flood_events_passed_to_b": len(passed_on),
        "flood_bytes_passed_to_b": sum(flood[i] for i in passed_on),
        "a_rejections_remembered": a.graph.rejected_count,
    }


def measure() -> dict[str, dict]:
    return {"invite_topic": _flood("invite"), "public_topic": _flood("public")}


def test_rejected_flood_bench(record_figures):
    figures = measure()
    record_figures("rejected_flood", figures)
    for topic in figures.values():
        assert topic["anti_entropy_quiesced"] == 1
        assert topic["flood_events_passed_to_b"] == 0 and topic["b_flood_vertices"] == 0
        assert topic["a_flood_vertices"] == 0
        assert topic["a_extremities_after"] <= topic["a_extremities_before"] + 1
