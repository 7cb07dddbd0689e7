"""The read filter of private topics: non-members and banned members are sent nothing."""

from __future__ import annotations

from dataclasses import replace

from node.core.identity import sign_event
from node.core.outcomes import AddStatus
from node.state.types import RULE_PUBLIC, Membership
from tests.transport.mesh import CONFIG, Mesh
from tests.transport.pair import identity
from transport.effects import Announce
from transport.messages import JoinAsk, Offer, Push, Want, encode
from transport.messages import BloomFilter


def joined_mesh(names: list[str], members: list[str], **kwargs) -> Mesh:
    mesh = Mesh(names, **kwargs)
    for name in members:
        mesh.invite("a", name)
    mesh.connect_all()
    for name in members:
        mesh.request_join(name)
        assert mesh.replicas[name].membership_of(mesh.key(name)) is Membership.JOIN
    return mesh


def pester(mesh: Mesh, outsider: str, target: str, known: list[bytes]) -> None:
    """Everything a non-member that knows the topic id (and some ids) can send."""
    topic = mesh.topic
    fake = sign_event(identity(outsider), topic=topic, seq=0, parents=(topic,),
                      timestamp_ms=mesh.now_ms, kind="message", payload=b"let me in",
                      auth=(topic,))
    bloom = BloomFilter.build([], bytes(16), 10, 7)
    for message in (Offer(topic, 1, (), (), 0, True, bloom),
                    Offer(topic, 2, (topic,), (), 0, True, bloom),
                    Want(topic, tuple([topic] + known)),
                    Push(topic, (fake.raw,)),
                    JoinAsk(topic)):
        mesh.send(outsider, target, encode(message))


def test_a_non_member_that_keeps_asking_receives_no_event_and_no_event_id():
    mesh = joined_mesh(["a", "b", "c", "z"], ["b", "c"])
    written = [mesh.publish(name, b"secret") for name in ("a", "b", "c")]
    for round_ in range(5):
        for target in ("a", "b", "c"):
            pester(mesh, "z", target, written)
        mesh.request_join("z")
        mesh.publish("abc"[round_ % 3], b"more")
        mesh.tick(times=2)  # z's own engine offers its (empty) heads to everyone too
    seen = mesh.received["z"]
    assert seen.events == set()
    assert seen.ids == set()
    assert seen.kinds["JoinRefused"] > 0
    assert set(seen.kinds) <= {"JoinRefused", "JoinAsk"}  # the invitees asked z too, once
    dropped = sum(mesh.engines[n].stats["not_member_dropped"] for n in "abc")
    assert dropped >= 5 * 3 * 4  # every Offer/Want/Push from z, on every member
    assert not any(mesh.replicas[n].graph.has(e) for n in "abc"
                   for e in mesh.replicas["z"].graph.extremities())
    assert mesh.same(["a", "b", "c"])


def test_an_open_topic_serves_anyone_as_before():
    mesh = Mesh(["a", "z"], join_rule=RULE_PUBLIC)
    written = mesh.publish("a", b"public")
    mesh.connect_all()
    mesh.tick(times=2)
    assert mesh.replicas["z"].graph.has(written)
    assert mesh.engines["a"].stats["not_member_dropped"] == 0
    assert mesh.engines["a"].stats["not_member_withheld"] == 0


def test_a_banned_member_is_sent_nothing_after_the_ban_and_its_events_are_rejected():
    mesh = joined_mesh(["a", "b", "c"], ["b", "c"])
    mesh.tick(times=2)
    ban, _ = mesh.replicas["a"].ban(mesh.key("c"), mesh.now_ms, mesh.rng)
    before = set(mesh.received["c"].events) | set(mesh.received["c"].ids)
    mesh.pump([("a", e) for e in mesh.engines["a"].on_publish(mesh.topic, ban, mesh.now_ms)])
    mesh.tick(times=2)
    assert mesh.replicas["b"].membership_of(mesh.key("c")) is Membership.BAN
    mesh.received["c"].events.clear()
    mesh.received["c"].ids.clear()
    after = [mesh.publish(name, b"after the ban") for name in ("a", "b", "a")]
    mesh.tick(times=3)
    # c may still ask (it does not know of the ban, or does and keeps its copy):
    # nobody answers with anything of the topic.
    assert mesh.received["c"].events == set()
    assert mesh.received["c"].ids == set()
    assert not any(mesh.replicas["c"].graph.has(e) for e in after)
    assert before  # it was a reader before the ban
    # c's own events from now on are rejected by everyone who knows of the ban.
    own = sign_event(identity("c"), topic=mesh.topic, seq=99,
                     parents=tuple(mesh.replicas["a"].graph.extremities()),
                     timestamp_ms=mesh.now_ms, kind="message", payload=b"still here",
                     auth=(mesh.topic,))
    for name in ("a", "b"):
        outcome = mesh.replicas[name].receive(own.raw, mesh.now_ms)
        assert outcome.status is AddStatus.REJECTED or mesh.replicas[name].is_rejected(own.id)


def test_no_announce_for_a_private_topic():
    mesh = Mesh(["a"], config=replace(CONFIG, announce=True))
    event, _ = mesh.replicas["a"].publish(b"private", mesh.now_ms, mesh.rng)
    effects = mesh.engines["a"].on_publish(mesh.topic, event, mesh.now_ms)
    assert not any(isinstance(e, Announce) for e in effects)
    public = Mesh(["a"], config=replace(CONFIG, announce=True), join_rule=RULE_PUBLIC)
    event, _ = public.replicas["a"].publish(b"open", public.now_ms, public.rng)
    effects = public.engines["a"].on_publish(public.topic, event, public.now_ms)
    assert any(isinstance(e, Announce) for e in effects)


def test_push_fanout_picks_readers_only():
    names = ["a", "b"] + [f"z{i}" for i in range(8)]
    mesh = joined_mesh(names, ["b"])
    event, _ = mesh.replicas["a"].publish(b"to members", mesh.now_ms, mesh.rng)
    effects = mesh.engines["a"].on_publish(mesh.topic, event, mesh.now_ms)
    assert {e.peer for e in effects if hasattr(e, "peer")} == {mesh.ids["b"]}
    assert mesh.engines["a"].stats["not_member_withheld"] == 0  # chosen among readers


def test_readers_are_the_joined_keys_and_cached_per_state_group():
    mesh = joined_mesh(["a", "b", "z"], ["b"])
    a = mesh.replicas["a"]
    assert a.readers() == frozenset({mesh.key("a"), mesh.key("b")})
    assert a.may_read(mesh.key("b")) and not a.may_read(mesh.key("z"))
    first = a.readers()
    mesh.publish("a", b"a message does not change the state")
    assert a.readers() is first
    assert mesh.replicas["z"].readers() is None  # not ready: reads from anyone, holds nothing
