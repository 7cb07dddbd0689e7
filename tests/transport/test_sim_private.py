"""The seeded world of a private topic (issue 15): invitees join by the handshake,
non-members that know the topic id keep asking and are sent nothing of it.

The issue's target: an invite topic with 20 members and 10 non-member nodes
that know the id. A few seeds here (about 1 s each); the 200-seed sweep is
`python -m transport.sim --seed 0 --nodes 20 --outsiders 10 --invite --rounds 10
--writers 3 --sweep 200`.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from node.state.types import Membership
from transport.sim import Cluster, Scenario

PRIVATE = Scenario(seed=0, nodes=20, outsiders=10, invite=True, rounds=10, writers=3)
CI_SEEDS = range(3)


@pytest.mark.parametrize("seed", CI_SEEDS)
def test_members_converge_and_non_members_are_sent_nothing_of_the_topic(seed):
    cluster = Cluster.from_scenario(replace(PRIVATE, seed=seed))
    summary = cluster.run()  # raises on any checker, the exposure check included
    assert summary.converged
    assert all(m.replica.membership_of(m.identity.public_key) is Membership.JOIN
               for m in cluster.members)
    totals = cluster.totals()
    assert totals["joins_accepted"] >= len(cluster.members) - 1  # every invitee by the handshake
    assert totals["not_member_dropped"] > 0  # the outsiders kept asking ...
    assert totals["join_asks_refused"] > 0
    for index, seen in cluster.exposure.items():  # ... and got nothing of the topic
        assert seen.frames > 0  # refusals (and join asks) did reach them
        assert seen.events == set() and seen.ids == set()
        assert not cluster.nodes[index].replica.ready


def test_the_private_world_survives_loss_a_partition_crashes_and_the_adversary():
    summary = Cluster.from_scenario(replace(
        PRIVATE, seed=3, loss=0.1, partition_at_ms=500, heal_at_ms=2_000, adversary=True,
        crashes=2)).run()
    assert summary.converged


def test_the_exposure_check_fails_a_world_that_leaked():
    cluster = Cluster.from_scenario(replace(PRIVATE, seed=0))
    cluster.run()
    outsider = min(cluster.exposure)
    cluster.exposure[outsider].events.add(cluster.topic)
    with pytest.raises(AssertionError, match=f"non-member node {outsider} was sent 1 events"):
        cluster.check()


def test_the_private_scenario_replays_from_its_command_line():
    scenario = replace(PRIVATE, seed=5)
    assert "--invite" in scenario.argv() and "--outsiders" in scenario.argv()
    from transport.sim import scenario_from_args
    from transport.sim.cli import build_parser

    assert scenario_from_args(build_parser().parse_args(scenario.argv())) == scenario
