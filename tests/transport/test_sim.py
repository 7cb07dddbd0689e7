"""The deterministic simulator: convergence under faults, width, replay, failure reports.

Convergence under faults and the width are properties of dissemination over
the event graph alone, so they run on the pure graph (authorization=False:
no topic state, no order, no acks), as the paper's model does; the one
seeded world with authorization, acks, bans and crashes is
tests/transport/test_sim_world.py. Determinism, replay and the failure
report are properties of the whole world, so they run it authorized.
A few seeds each here: more seeds repeat the same property, and
`make sweep` runs the authorized world over 200.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from transport.sim import Cluster, Scenario, main, run_scenario

REPO = Path(__file__).resolve().parents[2]

# The CI scenario of issue 2: 50 replicas, 20% loss, two groups partitioned for
# 4 s while 4 writers per round keep writing, then healed. Dissemination alone:
# the pure graph (state resolution and ordering would cost 3x the time and add
# nothing to what these tests check; the authorized world is test_sim_world.py).
LOSSY_PARTITION = Scenario(seed=0, nodes=50, loss=0.2, rounds=30, writers=4, round_ms=200,
                           partition_at_ms=1_000, heal_at_ms=5_000, authorization=False)
# Healed, the cluster must agree well within this (virtual) time; it takes
# ~1-4 s with push and ~4-8 s with anti-entropy alone.
CONVERGENCE_BOUND_MS = 20_000
CI_SEEDS = range(3)  # `python -m transport.sim --no-authorization ... --sweep N` for more


@pytest.mark.parametrize("seed", CI_SEEDS)
def test_fifty_replicas_with_loss_and_a_partition_converge(seed):
    """Push and anti-entropy together, on the pure graph (authorization=False)."""
    summary = run_scenario(replace(LOSSY_PARTITION, seed=seed))  # run() raises on any failure
    assert summary.converged
    assert summary.convergence_ms <= CONVERGENCE_BOUND_MS
    assert summary.events >= summary.created + 1  # root, every write (and any dummies)


@pytest.mark.parametrize("seed", [100])
def test_anti_entropy_alone_converges(seed):
    """No push: anti-entropy alone delivers everything, on the pure graph."""
    summary = run_scenario(replace(LOSSY_PARTITION, seed=seed, push=False))
    assert summary.converged
    assert summary.convergence_ms <= CONVERGENCE_BOUND_MS


def test_duplication_reordering_and_three_groups_converge():
    """Duplicated and reordered messages, three groups; dissemination on the pure graph."""
    summary = run_scenario(replace(LOSSY_PARTITION, seed=7, duplicate=0.1, reorder=0.2, groups=3))
    assert summary.converged


def test_anti_entropy_alone_converges_without_per_peer_state():
    """The first-contact path (depth windows) on every exchange; the pure graph."""
    summary = run_scenario(replace(LOSSY_PARTITION, seed=8, nodes=20, push=False,
                                   peer_state=False))
    assert summary.converged


# ------------------------------------------------------------------ width


def model_fixed_point(d: int, k: int) -> float | None:
    try:
        from analytics.model import fixed_point_width
    except ImportError:  # the model is another package's; the band below still holds
        return None
    return fixed_point_width(d, k)


@pytest.mark.parametrize("d,k", [(2, 8), (10, 4)])
def test_width_with_k_concurrent_writers_stays_near_k(d, k):
    """MEG paper, section VIII: each round k replicas add an event with d random parents.

    The urn model's width settles where the expected number of extremities
    removed per round equals k: u(1 - (1 - d/u)^k) = k. For k <= d that is
    exactly k (one writer alone takes every extremity); for d=2, k=8 it is
    9.37 (overlapping picks leave a few extra). Rounds are 200 ms and latency
    1-10 ms, so every round's events reach everyone before the next (the
    model's step 2); no dummies, so only the parent choice shapes the width.
    The band [k/2, 3k] is the issue's; the model band (+-15%; measured
    within 5% over seeds 11-16) is the sharper claim.
    """
    # The paper's model is a pure MEG: no state events, no acks (an indexer's ack
    # takes every extremity it can and would narrow the width the model predicts).
    scenario = Scenario(seed=11, nodes=20, latency_ms=(1, 10), rounds=40, writers=k,
                        round_ms=200, d_max=d, depletion=False, authorization=False)
    cluster = Cluster.from_scenario(scenario)
    cluster.run()
    steady = cluster.width_samples[10:]  # skip the first rounds: from width 1 up to the fixed point
    mean = sum(steady) / len(steady)
    assert k / 2 <= mean <= 3 * k
    expected = model_fixed_point(d, k)
    if expected is not None:
        assert abs(mean - expected) <= 0.15 * expected, (mean, expected)


# ------------------------------------------------------------------ replay and reports


# The whole world (authorized: state, acks, the peer policy), small: determinism
# and replay must hold for all of it, not only for dissemination.
SMALL = Scenario(seed=5, nodes=10, loss=0.2, duplicate=0.05, reorder=0.1, rounds=10, writers=3,
                 partition_at_ms=500, heal_at_ms=1_500)


def without_wall(summary) -> dict:
    values = asdict(summary)
    values.pop("wall_s")
    return values


def test_the_same_seed_gives_the_same_run():
    first, second = run_scenario(SMALL), run_scenario(SMALL)
    assert first.acks > 0 and first.confirmed > 0  # the whole world ran: state, acks, order
    assert without_wall(first) == without_wall(second)
    assert without_wall(run_scenario(replace(SMALL, seed=6))) != without_wall(first)


def test_replay_command_reproduces_the_run_in_any_process():
    """The printed command replays the run whatever PYTHONHASHSEED the process has."""
    expected = run_scenario(SMALL)
    digests = set()
    for hash_seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        argv = SMALL.replay_command().split()[1:]  # drop "python"
        done = subprocess.run([sys.executable, *argv, "--json"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120, check=True)
        digests.add(json.loads(done.stdout)["digest"])
    assert digests == {expected.digest}


def test_a_failing_run_names_its_seed_and_replay_command():
    never = replace(SMALL, seed=9, liveness_bound_ms=1)  # no time to converge after healing
    with pytest.raises(AssertionError) as failure:
        run_scenario(never)
    message = str(failure.value)
    assert "seed 9" in message
    assert "python -m transport.sim --seed 9 " in message
    assert "--liveness-bound 1" in message


def test_command_line_prints_a_summary(capsys):
    assert main(SMALL.argv()) == 0
    out = capsys.readouterr().out
    assert "seed 5: 10 nodes" in out and "converged" in out and "bytes" in out


def test_logs_are_valid_dissemination_records(tmp_path):
    logschema = pytest.importorskip("node.logschema")
    cluster = Cluster.from_scenario(SMALL, log_dir=tmp_path)
    cluster.run()
    assert cluster.invalid_log_records == 0
    types = set()
    files = sorted(tmp_path.glob("*.jsonl"))
    assert len(files) == SMALL.nodes
    for path in files:
        for line in path.read_text().splitlines():
            record, problem = logschema.parse_line(line)
            assert problem is None, line
            types.add(record["type"])
    assert {"created", "received", "delivered", "duplicate", "width", "peer_up"} <= types
