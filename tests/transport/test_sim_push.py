"""Push forwarding does not flood: duplicates per event stay bounded as the network grows.

Deterministic simulator, push alone (anti-entropy, wants and depletion off),
no loss, so every push is one receipt. Each replica relays an event at most
once, to `forward_fanout` peers, and its author sends `push_fanout` copies;
so per event

    receipts <= push_fanout + (n - 1) * forward_fanout
    duplicates = receipts - first receipts <= push_fanout + (n - 1) * (forward_fanout - 1)

about forward_fanout - 1 (2 by default) per replica, whatever n — where the
old flooding (every relay at push_fanout) cost n * (push_fanout - 1). Push
alone must still reach PUSH_DELIVERY_MIN of the replicas; anti-entropy
delivers the rest (the convergence tests in test_sim.py).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from transport.dissemination_config import DEFAULT_FORWARD_FANOUT, DEFAULT_PUSH_FANOUT, DisseminationConfig
from transport.sim import Cluster

NEVER_MS = 10**9
ROUNDS = 15
WRITERS = 2
ROUND_MS = 200
DRAIN_MS = 2_000  # far beyond the latency bound times the hop count
PUSH_DELIVERY_MIN = 0.95  # measured 0.97..1.0 for 5..50 replicas (docs/anti-entropy.md)

PUSH_ONLY = DisseminationConfig(log=False, sync_interval_ms=NEVER_MS, sync_jitter_ms=0,
                                sync_on_connect=False, sync_on_news=False,
                                want_retry_ms=NEVER_MS, depletion=False)


def push_run(n: int, seed: int, config: DisseminationConfig = PUSH_ONLY) -> dict[str, float]:
    cluster = Cluster(seed, n, neighbours=min(n - 1, 6), config=config, depletion=False)
    cluster.write(rounds=ROUNDS, writers=WRITERS, round_ms=ROUND_MS)
    cluster.run_until(cluster.fault_phase_end() + DRAIN_MS)
    totals = cluster.totals()
    events = len(cluster.created)
    return {
        "duplicates_per_event": totals.get("duplicates", 0) / events,
        "pushes_per_event": totals.get("messages_sent_push", 0) / events,
        "push_delivery": totals.get("received_gossip", 0) / (events * (n - 1)),
    }


@pytest.mark.parametrize("n", [5, 10, 20, 50])
def test_duplicates_per_event_are_bounded_and_push_still_delivers(n: int) -> None:
    figures = push_run(n, seed=n)
    bound = DEFAULT_PUSH_FANOUT + (n - 1) * (DEFAULT_FORWARD_FANOUT - 1)
    assert figures["duplicates_per_event"] <= bound, figures
    assert figures["pushes_per_event"] <= DEFAULT_PUSH_FANOUT + (n - 1) * DEFAULT_FORWARD_FANOUT
    assert figures["push_delivery"] >= PUSH_DELIVERY_MIN, figures


def test_flooding_at_the_author_fanout_costs_more_than_twice_as_much() -> None:
    n = 20
    bounded = push_run(n, seed=1)
    flooding = push_run(n, seed=1, config=replace(PUSH_ONLY, forward_fanout=DEFAULT_PUSH_FANOUT))
    assert flooding["duplicates_per_event"] > 2 * bounded["duplicates_per_event"]


def test_forward_fanout_zero_pushes_only_from_the_author() -> None:
    n = 10
    figures = push_run(n, seed=2, config=replace(PUSH_ONLY, forward_fanout=0))
    assert figures["pushes_per_event"] == pytest.approx(DEFAULT_PUSH_FANOUT)
    assert figures["duplicates_per_event"] == 0
