"""`history = joined`: a late member reads payloads from its join on; `shared`: all (issue 15).

Hand-wired meshes of Disseminators (tests/transport/mesh.py): the late member
catches up by anti-entropy after its join handshake, so these check the
serving paths a node takes history through (Reply and Events as well as Push),
and count what the late member was *sent*, not only what it shows.
"""

from __future__ import annotations

import pytest

from node.core.event import decode_event, event_id_of
from node.core.identity import verify_signature
from node.core.outcomes import AddStatus
from node.state.types import HISTORY_JOINED, HISTORY_SHARED, Membership
from tests.transport.mesh import Mesh


def late_join(history: str, before: int = 6, after: int = 4) -> tuple[Mesh, list[bytes], list[bytes]]:
    """a and b write `before` events; c is invited and joins; then `after` more events."""
    mesh = Mesh(["a", "b", "c"], history=history)
    mesh.invite("a", "b")
    mesh.connect("a", "b")
    mesh.pump(mesh.connect("a", "b"))
    mesh.request_join("b")
    early = [mesh.publish("a" if i % 2 else "b", b"early %d" % i) for i in range(before)]
    mesh.invite("a", "c")
    for other in ("a", "b"):
        mesh.pump(mesh.connect(other, "c"))
    mesh.request_join("c")
    assert mesh.replicas["c"].membership_of(mesh.key("c")) is Membership.JOIN
    mesh.tick(times=8)  # anti-entropy rounds: every path, not only the push
    late = [mesh.publish("b" if i % 2 else "a", b"late %d" % i) for i in range(after)]
    mesh.tick(times=4)
    return mesh, early, late


def delivered_payloads(mesh: Mesh, name: str) -> list[bytes]:
    return [e.payload for _, e in mesh.replicas[name].deliveries(limit=1_000)
            if e.kind == "message"]


def test_a_late_member_of_a_joined_topic_reads_only_from_its_join_on():
    mesh, early, late = late_join(HISTORY_JOINED)
    assert mesh.same(["a", "b", "c"])  # every vertex everywhere: the graph converges
    c = mesh.replicas["c"]
    assert delivered_payloads(mesh, "c") == [b"late %d" % i for i in range(4)]
    assert all(c.graph.get(i).withheld for i in early)
    assert not any(c.graph.get(i).withheld for i in late)
    assert mesh.received["c"].events >= set(early)  # the vertices came ...
    assert not mesh.received["c"].payloads & set(early)  # ... never their payloads, on any path
    assert mesh.engines["a"].stats["history_withheld"] + mesh.engines["b"].stats[
        "history_withheld"] > 0
    # Members who were there read everything.
    assert sorted(delivered_payloads(mesh, "b")) == sorted(
        [b"early %d" % i for i in range(6)] + [b"late %d" % i for i in range(4)])


def test_a_late_member_of_a_shared_topic_reads_the_whole_history():
    mesh, early, late = late_join(HISTORY_SHARED)
    assert mesh.same(["a", "b", "c"])
    assert sorted(delivered_payloads(mesh, "c")) == sorted(
        [b"early %d" % i for i in range(6)] + [b"late %d" % i for i in range(4)])
    assert mesh.received["c"].payloads >= set(early)


def test_the_order_and_state_agree_across_withheld_vertices():
    mesh, _, _ = late_join(HISTORY_JOINED)
    a, c = mesh.replicas["a"], mesh.replicas["c"]
    assert a.state() == c.state()
    assert a.graph.extremities() == c.graph.extremities()


def test_a_withheld_copy_is_never_served_as_history_to_a_member_who_may_read_it():
    mesh, early, _ = late_join(HISTORY_JOINED)
    c = mesh.replicas["c"]
    raws = [c.graph.get(i).raw for i in early]
    # To b (joined before those events) c offers nothing it only holds withheld ...
    assert c.served_to(mesh.key("b"), raws) == ()
    # ... and to a reader who may not read them, the withheld forms it holds.
    assert c.served_to(mesh.key("c"), raws) is None


def test_a_withheld_form_keeps_the_id_and_the_signature():
    mesh, early, late = late_join(HISTORY_JOINED, before=2, after=1)
    full = mesh.replicas["a"].graph.get(early[0])
    withheld = decode_event(full.withheld_form())
    assert withheld.withheld and withheld.payload == b""
    assert withheld.id == full.id == event_id_of(full.withheld_form()) == event_id_of(full.raw)
    assert verify_signature(withheld) and verify_signature(full)


def test_a_forged_withheld_form_fails_its_signature_and_is_rejected():
    mesh, early, _ = late_join(HISTORY_JOINED, before=2, after=1)
    full = mesh.replicas["a"].graph.get(early[-1])
    form = bytearray(full.withheld_form())
    form[-66 - 1] ^= 0xFF  # the digest's last byte: another payload claimed
    forged = decode_event(bytes(form))
    assert forged.id != full.id and not verify_signature(forged)
    fresh = Mesh(["x"]).replicas["x"]
    assert fresh.receive(bytes(form), mesh.now_ms).status is AddStatus.REJECTED


def test_a_state_event_is_never_withheld():
    mesh, _, _ = late_join(HISTORY_JOINED, before=1, after=1)
    c = mesh.replicas["c"]
    state_events = [e for _, e in c.graph.deliveries(0, limit=1_000) if e.is_state]
    assert state_events and not any(e.withheld for e in state_events)


def test_an_unknown_history_setting_is_refused():
    from node.state.types import RULE_PUBLIC
    with pytest.raises(ValueError):
        Mesh(["a"], join_rule=RULE_PUBLIC, history="sometimes")


def unsent(mesh: Mesh, name: str, payload: bytes):
    """An event `name` writes and sends to no one (its parents are everywhere)."""
    event, _ = mesh.replicas[name].publish(payload, mesh.now_ms, mesh.rng)
    return event


def test_a_withheld_form_of_a_payload_we_may_read_is_refused_then_the_full_event_taken():
    """No peer can hold back content from a reader by sending the withheld form first."""
    mesh, _, _ = late_join(HISTORY_JOINED, before=2, after=1)
    event = unsent(mesh, "a", b"for every member")
    c = mesh.replicas["c"]  # joined by now: it may read this payload
    refused = c.receive(event.withheld_form(), mesh.now_ms)
    assert refused.status is AddStatus.REJECTED and refused.reason == "withheld_readable"
    assert not c.graph.knows(event.id)  # not remembered as rejected ...
    assert c.receive(event.raw, mesh.now_ms).status is AddStatus.APPLIED  # ... the full one is


def test_an_open_topic_refuses_every_withheld_form():
    from node.state.types import RULE_PUBLIC
    mesh = Mesh(["a", "b"], join_rule=RULE_PUBLIC)
    mesh.connect_all()
    mesh.publish("a", b"open")
    event = unsent(mesh, "a", b"open too")
    outcome = mesh.replicas["b"].receive(event.withheld_form(), mesh.now_ms)
    assert outcome.reason == "withheld_readable"
    taken = mesh.replicas["b"].receive(event.raw, mesh.now_ms).status
    assert taken in (AddStatus.APPLIED, AddStatus.BUFFERED)  # the full event is welcome
