"""The timeline run is the simulator's run, with a line per step (transport.sim.timeline)."""

import io

from transport.sim import Cluster, Scenario
from transport.sim.timeline import TimelineCluster

TINY = Scenario(seed=2, nodes=8, loss=0.1, rounds=3, writers=2, partition_at_ms=300,
                heal_at_ms=900)


def test_stepping_the_clock_changes_nothing_and_reports_each_step():
    plain = Cluster.from_scenario(TINY).run()
    stepped = TimelineCluster.from_scenario(TINY)
    stepped.every_ms, stepped.out = 250, io.StringIO()
    summary = stepped.run()
    assert summary.digest == plain.digest and summary.confirmed == plain.confirmed
    lines = stepped.out.getvalue().splitlines()
    assert lines[0].startswith("t 250 ms: width mean ") and "events held" in lines[0]
    assert len(lines) >= 4
