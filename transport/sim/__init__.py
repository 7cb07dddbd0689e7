"""Deterministic simulator: many replicas, one process, a simulated network, one seed.

Theory of operation
-------------------
A `Cluster` (world.py) holds n nodes, each a `Disseminator` over one
`Replica` (memory store) of a single topic with its `PeerPolicy`, on a
simulated `Network` (network.py): a heap of timed deliveries on a virtual
clock. The real protocol engine runs unchanged; the cluster only carries
out its effects. Every random choice - latencies, losses, duplicates,
reordering, the neighbour graph, who writes when, the engines' own choices,
the misbehaving peer's frames (adversary.py) - comes from one
`random.Random(seed)`, and every iteration is over sorted or
insertion-ordered collections, so a seed replays a run bit for bit in any
process (whatever PYTHONHASHSEED is).

A run has two phases, as in TigerBeetle's VOPR: a fault phase (writers
publish on a schedule while loss, duplication, reordering, partitions and
crashes apply), then a liveness phase (healed) until convergence or a bound.
The checkers (checks.py): identical graphs, nothing accepted lost, a
confirmed prefix never changes, one confirmed order everywhere, the
misbehaving peer banned, no honest peer banned. A failure raises
AssertionError naming the seed and the command that replays it (scenario.py):

    python -m transport.sim --seed 7 --nodes 50 --loss 0.2 --partition-at 1000 --heal-at 5000

`--sweep N` runs N seeds of one scenario (cli.py).
"""

from transport.sim.checks import OrderWatch
from transport.sim.cli import main, scenario_from_args, sweep
from transport.sim.network import Network, Partition
from transport.sim.scenario import DEFAULT_INDEXERS, LIVENESS_BOUND_MS, Scenario
from transport.sim.summary import Summary
from transport.sim.simnode import SimNode
from transport.sim.world import Cluster, run_scenario

__all__ = [
    "DEFAULT_INDEXERS",
    "LIVENESS_BOUND_MS",
    "Cluster",
    "Network",
    "OrderWatch",
    "Partition",
    "Scenario",
    "SimNode",
    "Summary",
    "main",
    "run_scenario",
    "scenario_from_args",
    "sweep",
]
