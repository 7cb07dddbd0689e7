"""The topic state API of a Replica, between replicas that exchange raw events.

Alice creates an authorized topic; bob and carol run their own replicas and
join by topic id. Events move only as bytes (`tests.helpers.sync`), as they
would over the network.
"""

from __future__ import annotations

import random

import pytest

from node.core.event import KIND_DUMMY
from node.core.identity import sign_event
from node.core.outcomes import AddStatus
from node.core.parents import DepletionPolicy
from node.replica.replica import (
    NotAuthorizedError,
    Replica,
    ReplicaConfig,
    RoleError,
)
from node.state.actions import WRITER_LEVEL
from node.state.auth_rules import EventFields, select_auth_refs
from node.state.roles import Role
from node.state.types import JOIN_RULES_KEY, POWER_LEVELS_KEY, AuthReason, member_key
from storage.memory import MemoryStore
from tests.helpers import authorized_topic, identity, new_topic, sync

ALICE, BOB, CAROL = identity("alice"), identity("bob"), identity("carol")


class World:
    """Alice's topic, bob's and carol's replicas of it, a clock and a seeded rng."""

    def __init__(self) -> None:
        self.rng = random.Random(7)
        self.now_ms = 2_000
        self.alice = authorized_topic(author="alice", name="kitchen")
        self.bob = Replica(MemoryStore(), self.alice.topic_id, BOB)
        self.carol = Replica(MemoryStore(), self.alice.topic_id, CAROL)

    def tick(self) -> int:
        self.now_ms += 10
        return self.now_ms

    def everyone(self) -> list[Replica]:
        return [self.alice, self.bob, self.carol]

    def settle(self) -> None:
        """Every replica gets every event (two rounds: a -> b -> c and back)."""
        for _ in range(2):
            for source in self.everyone():
                for target in self.everyone():
                    if source is not target:
                        sync(source, target)
        for replica in self.everyone():
            replica.commit()

    def bob_writes(self) -> None:
        self.alice.add_writer(BOB.public_key, self.tick(), self.rng)
        self.settle()
        self.bob.join(self.tick(), self.rng)
        self.settle()


@pytest.fixture
def world() -> World:
    return World()


def test_a_new_topic_is_usable_at_once_by_its_creator(world: World) -> None:
    alice = world.alice
    state = alice.state()
    assert state[member_key(ALICE.public_key)].content() == {"membership": "join"}
    assert state[JOIN_RULES_KEY].content() == {"join_rule": "invite"}
    levels = state[POWER_LEVELS_KEY].content()
    assert levels["users"] == {ALICE.public_key.hex(): 100}
    assert levels["events_default"] == WRITER_LEVEL
    assert alice.role_of(ALICE.public_key) is Role.INDEXER
    assert alice.indexers() == {ALICE.public_key}
    event, outcome = alice.publish(b"hello", world.tick(), world.rng)
    assert outcome.unauthorized == () and alice.deliveries()[-1][1] == event


def test_invite_join_and_add_writer_between_two_replicas(world: World) -> None:
    alice, bob = world.alice, world.bob
    world.settle()
    assert bob.role_of(BOB.public_key) is Role.NONE
    with pytest.raises(NotAuthorizedError, match="not a joined member") as refused:
        bob.publish(b"let me in", world.tick(), world.rng)
    assert refused.value.reason == AuthReason.SENDER_NOT_JOINED
    made = alice.add_writer(BOB.public_key, world.tick(), world.rng)
    assert [e.kind for e, _ in made] == ["m.room.member", "m.room.power_levels"]
    world.settle()
    assert bob.role_of(BOB.public_key) is Role.NONE  # invited, not joined yet
    _, joined = bob.join(world.tick(), world.rng)
    assert joined.unauthorized == ()
    assert bob.role_of(BOB.public_key) is Role.WRITER
    message, _ = bob.publish(b"21.5C", world.tick(), world.rng)
    world.settle()
    for replica in world.everyone():
        assert replica.role_of(BOB.public_key) is Role.WRITER
        assert message.id in [e.id for _, e in replica.deliveries()]
        assert replica.counters["unauthorized"] == 0
    assert alice.add_writer(BOB.public_key, world.tick(), world.rng) == ()  # nothing to do


def test_a_joined_reader_cannot_write_until_made_a_writer(world: World) -> None:
    alice, carol = world.alice, world.carol
    alice.invite(CAROL.public_key, world.tick(), world.rng)
    world.settle()
    carol.join(world.tick(), world.rng)
    assert carol.role_of(CAROL.public_key) is Role.NONE
    with pytest.raises(NotAuthorizedError, match=r"needs power level 10 \(events_default\)"):
        carol.publish(b"hi", world.tick(), world.rng)
    # A reader may still send dummies: depletion keeps the graph narrow for everyone.
    dummy, _ = carol.publish(b"", world.tick(), world.rng, kind=KIND_DUMMY)
    world.settle()
    assert dummy.id in [e.id for _, e in alice.deliveries()]


def test_set_role_to_indexer_shows_in_indexers(world: World) -> None:
    world.bob_writes()
    alice, bob = world.alice, world.bob
    made = alice.set_role(BOB.public_key, Role.INDEXER, world.tick(), world.rng)
    assert [e.kind for e, _ in made] == ["m.room.power_levels"]
    world.settle()
    for replica in world.everyone():
        assert replica.indexers() == {ALICE.public_key, BOB.public_key}
        assert replica.role_of(BOB.public_key) is Role.INDEXER
    # Matrix rule 9: peers cannot demote peers; an indexer may step down itself.
    with pytest.raises(NotAuthorizedError, match="cannot be demoted"):
        alice.set_role(BOB.public_key, Role.WRITER, world.tick(), world.rng)
    bob.set_role(BOB.public_key, Role.WRITER, world.tick(), world.rng)
    world.settle()
    assert alice.indexers() == {ALICE.public_key}
    assert alice.role_of(BOB.public_key) is Role.WRITER


def test_relayed_is_declared_by_the_member_itself(world: World) -> None:
    world.bob_writes()
    alice, bob = world.alice, world.bob
    with pytest.raises(RoleError, match="relayed"):
        alice.set_role(BOB.public_key, Role.RELAYED, world.tick(), world.rng)
    made = bob.set_role(BOB.public_key, Role.RELAYED, world.tick(), world.rng)
    assert [e.kind for e, _ in made] == ["m.room.member"]
    world.settle()
    assert alice.role_of(BOB.public_key) is Role.RELAYED
    bob.set_role(BOB.public_key, Role.WRITER, world.tick(), world.rng)
    world.settle()
    assert alice.role_of(BOB.public_key) is Role.WRITER


def test_ban_gets_the_banned_members_next_event_rejected(world: World) -> None:
    world.bob_writes()
    alice, bob, carol = world.alice, world.bob, world.carol
    # Bob writes concurrently with the ban: allowed, it was authored before it.
    before_ban, _ = bob.publish(b"concurrent", world.tick(), world.rng)
    alice.ban(BOB.public_key, world.tick(), world.rng, reason="spam")
    world.settle()
    for replica in world.everyone():
        assert replica.role_of(BOB.public_key) is Role.NONE
        assert replica.graph.has(before_ban.id) and not replica.is_rejected(before_ban.id)
        # Soft fail (node.state.soft_fail): a replica that had the ban when bob's
        # concurrent event came keeps it out of its causal view; the others deliver it.
        delivered = before_ban.id in [e.id for _, e in replica.deliveries()]
        assert delivered != replica.is_soft_failed(before_ban.id)
    assert alice.is_soft_failed(before_ban.id) and not bob.is_soft_failed(before_ban.id)
    # An honest replica refuses to sign for a banned member...
    with pytest.raises(NotAuthorizedError) as refused:
        bob.publish(b"after the ban", world.tick(), world.rng)
    assert refused.value.reason == AuthReason.SENDER_NOT_JOINED
    # ...and a forged event on top of the ban is refused: never a vertex, never a head,
    # never delivered; the graph remembers why (docs/state.md, "Rejected events").
    heads = bob.graph.extremities()
    state = bob.tracker.state(bob.tracker.current_group())
    forged = sign_event(BOB, topic=alice.topic_id, seq=50, parents=heads,
                        timestamp_ms=world.tick(), kind="message", payload=b"still here",
                        auth=select_auth_refs(EventFields("message", BOB.public_key), state))
    outcome = alice.receive(forged.raw, world.tick())
    assert outcome.status is AddStatus.REJECTED and not alice.graph.has(forged.id)
    assert outcome.unauthorized == ((forged.id, AuthReason.SENDER_NOT_JOINED),)
    assert alice.counters["rejected.sender_not_joined"] == 1
    assert alice.is_rejected(forged.id) and alice.rejected_events() == [forged.id]
    assert forged.id not in alice.graph.extremities()
    # The next event does not build on it; sent again, it is refused from memory.
    reply, merged = alice.publish(b"bye", world.tick(), world.rng)
    assert forged.id not in reply.parents and merged.unauthorized == ()
    assert alice.receive(forged.raw, world.tick()).status is AddStatus.REJECTED
    sync(alice, carol)
    assert not carol.graph.has(forged.id) and carol.graph.has(reply.id)


def test_non_admins_get_a_clear_refusal(world: World) -> None:
    world.bob_writes()
    bob = world.bob
    with pytest.raises(NotAuthorizedError, match=r"needs power level 50 \(invite level\)"):
        bob.invite(CAROL.public_key, world.tick(), world.rng)
    with pytest.raises(NotAuthorizedError, match=r"50 \(ban level\).* has 10"):
        bob.ban(ALICE.public_key, world.tick(), world.rng)
    with pytest.raises(NotAuthorizedError, match="m.room.power_levels"):
        bob.set_role(CAROL.public_key, Role.INDEXER, world.tick(), world.rng)
    with pytest.raises(NotAuthorizedError, match=r"state_default"):
        bob.set_state("app.config", "sampling", {"every_ms": 100}, world.tick(), world.rng)
    assert bob.counters["created"] == 1  # only the join: nothing refused was signed


def test_set_state_holds_application_state(world: World) -> None:
    alice = world.alice
    alice.set_state("app.config", "sampling", {"every_ms": 100}, world.tick(), world.rng)
    alice.set_state("app.config", "sampling", {"every_ms": 250}, world.tick(), world.rng)
    world.settle()
    for replica in world.everyone():
        assert replica.state()[("app.config", "sampling")].content() == {"every_ms": 250}


def test_maybe_deplete_skips_quietly_when_not_a_member(world: World) -> None:
    config = ReplicaConfig(depletion=DepletionPolicy(threshold=0, interval_ms=1))
    stranger = Replica(MemoryStore(), world.alice.topic_id, identity("stranger"), config)
    sync(world.alice, stranger)
    assert stranger.maybe_deplete(world.tick(), world.rng) is None
    assert stranger.counters["dummies_not_authorized"] == 1


def test_pure_meg_topics_keep_todays_behaviour() -> None:
    origin = new_topic()
    stranger = Replica(MemoryStore(), origin.topic_id, identity("stranger"))
    sync(origin, stranger)
    event, outcome = stranger.publish(b"anyone writes", 5_000, random.Random(1))
    assert event.auth == (origin.topic_id,) and outcome.unauthorized == ()
    assert not stranger.authorizing
    with pytest.raises(ValueError, match="authorization"):
        Replica.create_topic(MemoryStore(), identity("x"), 1, authorization=True,
                             config=ReplicaConfig(authorization=False))
