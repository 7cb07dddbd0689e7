"""The GossipSub topic validator's verdict (`Disseminator.check_gossip`, issue 16).

Engine level, on real replicas: a message is accepted only if no event in it
would be refused here, nothing is inserted while judging, and the peer that
handed over junk is blamed by the rules of `transport.misbehaviour`. The
same validator on real libp2p hosts: `tests/transport/test_gossip_validator_hosts.py`.
"""

from __future__ import annotations

from dataclasses import replace

from node.core.identity import sign_event
from node.replica.precheck import Verdict, precheck
from node.state.types import AuthReason
from tests.transport.mesh import CONFIG, Mesh
from transport.effects import Disconnect
from transport.messages import Push, Want, encode
from transport.misbehaviour import STRAY_ALLOWANCE_BURST, UNAUTHORIZED_WEIGHT


def _mesh(threshold: float = 10**9) -> Mesh:
    mesh = Mesh(["a", "b", "x"], join_rule="public",
                config=replace(CONFIG, misbehaviour_threshold=threshold))
    mesh.invite("a", "b")
    mesh.pump(mesh.connect("a", "b"))
    mesh.request_join("b")
    mesh.pump(mesh.connect("a", "x"))
    return mesh


def _non_member_event(mesh: Mesh, seq: int, parents: list[bytes] | None = None) -> bytes:
    return sign_event(mesh.replicas["x"].identity, topic=mesh.topic, seq=seq,
                      parents=parents or [mesh.topic], timestamp_ms=mesh.now_ms,
                      kind="message", payload=b"junk %d" % seq, auth=(mesh.topic,)).raw


def test_a_members_gossip_passes_and_nothing_is_inserted_while_judging():
    mesh = _mesh()
    b = mesh.replicas["b"]
    raw = b.publish(b"hello", mesh.now_ms, mesh.rng)[0].raw
    b.commit()
    a = mesh.replicas["a"]
    heads = a.graph.extremities()
    check = precheck(a, raw, mesh.now_ms)
    assert check.verdict is Verdict.VALID
    accepted, effects = mesh.engines["a"].check_gossip(mesh.ids["b"], encode(Push(mesh.topic, (raw,))),
                                                       mesh.now_ms)
    assert accepted and effects == []
    assert a.graph.extremities() == heads and not a.graph.has(check.event.id)
    assert not a.graph.pending_ops


def test_a_non_members_own_events_are_refused_and_count_against_it():
    mesh = _mesh()
    engine = mesh.engines["a"]
    x = mesh.ids["x"]
    data = encode(Push(mesh.topic, tuple(_non_member_event(mesh, seq) for seq in range(1, 4))))
    assert precheck(mesh.replicas["a"], _non_member_event(mesh, 1), mesh.now_ms).verdict \
        is Verdict.UNAUTHORIZED
    accepted, _ = engine.check_gossip(x, data, mesh.now_ms)
    assert not accepted
    assert engine.peer_misbehaviour[x] == UNAUTHORIZED_WEIGHT
    assert engine.stats[f"gossip_refused:unauthorized:{AuthReason.SENDER_NOT_JOINED}"] == 1
    assert not mesh.replicas["a"].graph.pending_ops


def test_a_flood_of_junk_gossip_gets_its_sender_dropped():
    mesh = _mesh(threshold=20)
    engine = mesh.engines["a"]
    x = mesh.ids["x"]
    dropped_after = None
    for seq in range(1, 200):
        accepted, effects = engine.check_gossip(
            x, encode(Push(mesh.topic, (_non_member_event(mesh, seq),))), mesh.now_ms)
        assert not accepted
        if any(isinstance(e, Disconnect) and e.peer == x for e in effects):
            dropped_after = seq
            break
    assert dropped_after == round(20 / UNAUTHORIZED_WEIGHT)


def test_hard_faults_weigh_one_and_undecodable_bytes_are_refused():
    mesh = _mesh()
    engine = mesh.engines["a"]
    x = mesh.ids["x"]
    raw = bytearray(_non_member_event(mesh, 1))
    raw[-1] ^= 0xFF  # the signature no longer verifies
    assert not engine.check_gossip(x, encode(Push(mesh.topic, (bytes(raw),))), mesh.now_ms)[0]
    assert not engine.check_gossip(x, b"\x93\x01\x02garbage", mesh.now_ms)[0]
    # Not a push: the fast path carries pushes alone.
    assert not engine.check_gossip(x, encode(Want(mesh.topic, (bytes(32),))), mesh.now_ms)[0]
    assert engine.peer_misbehaviour[x] == 3


def test_a_relay_is_not_blamed_for_someone_elses_events_within_its_allowance():
    mesh = _mesh()
    engine = mesh.engines["a"]
    b = mesh.ids["b"]  # an honest member relaying x's junk it could not judge yet
    for seq in range(1, STRAY_ALLOWANCE_BURST + 1):
        data = encode(Push(mesh.topic, (_non_member_event(mesh, seq),)))
        assert not engine.check_gossip(b, data, mesh.now_ms)[0]
    assert engine.peer_misbehaviour[b] == 0


def test_events_the_replica_cannot_judge_yet_pass():
    mesh = _mesh()
    b = mesh.replicas["b"]
    first = b.publish(b"one", mesh.now_ms, mesh.rng)[0].raw
    second = b.publish(b"two", mesh.now_ms, mesh.rng)[0].raw  # its parent is `first`
    b.commit()
    engine = mesh.engines["a"]
    # In one message, parents first: the second is judged undecided, not refused.
    assert engine.check_gossip(mesh.ids["b"], encode(Push(mesh.topic, (first, second))),
                               mesh.now_ms)[0]
    # Alone, its parent unknown here: undecided too (the buffer and wants deal with it).
    assert precheck(mesh.replicas["a"], second, mesh.now_ms).verdict is Verdict.UNDECIDED
    assert engine.check_gossip(mesh.ids["b"], encode(Push(mesh.topic, (second,))), mesh.now_ms)[0]
