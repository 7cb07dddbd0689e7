"""Simulator throughput and the cost of one reconciliation (figures -> bench-results/sim.json).

Not run by CI (`make bench`). Nothing here asserts a speed: the figures are
written to the JSON file and printed. Measured side by side in one run:

* simulator throughput for 100 replicas, as replica-events per wall and per
  CPU second (every replica applying every event counts once), next to the
  raw ed25519 verify rate of the same process — each replica verifies each
  event once, so the CPU ratio says how close the whole pipeline comes to the
  crypto bound (wall figures suffer on a shared machine, CPU figures less);
* bytes and round trips of ONE reconciliation, m = 10, 100, 1000, for a peer
  lagging by m (the laggard asks; the one ahead asks) and two partitions of
  m events each (with KH per-peer state; first contact), engines wired
  directly (tests/transport/pair.py), event bytes and overhead separated.
"""

from __future__ import annotations

import time

import nacl.signing

from tests.transport.pair import diverged, lagging
from transport.sim import Cluster, Scenario

SIM_NODES = 100
SIM_ROUNDS = 40
SIM_WRITERS = 5  # 200 events, each applied by 100 replicas
RECONCILE_SIZES = (10, 100, 1000)
VERIFY_SAMPLES = 5_000
PAYLOAD_BYTES = 100  # events of ~330 bytes on the wire


def verify_rate() -> float:
    """Raw ed25519 verifications per CPU second (CPU time: robust to a shared machine)."""
    key = nacl.signing.SigningKey(b"\x01" * 32)
    signed = key.sign(b"x" * 200)
    verify = key.verify_key.verify
    started = time.process_time()
    for _ in range(VERIFY_SAMPLES):
        verify(signed)
    return VERIFY_SAMPLES / (time.process_time() - started)


def sim_run(**changes) -> dict:
    scenario = Scenario(seed=1, nodes=SIM_NODES, rounds=SIM_ROUNDS, writers=SIM_WRITERS,
                        **changes)
    cluster = Cluster.from_scenario(scenario)
    wall, cpu = time.perf_counter(), time.process_time()
    summary = cluster.run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    applied = summary.events * summary.nodes
    return {
        "scenario": " ".join(scenario.argv()),
        "events": summary.events,
        "replica_events": applied,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "replica_events_per_wall_s": round(applied / wall),
        "replica_events_per_cpu_s": round(applied / cpu),
        "messages": summary.messages,
        "bytes": summary.bytes,
        "event_bytes": summary.event_bytes,
        "convergence_ms_after_faults": summary.convergence_ms,
    }


def reconcile(make, initiator: str) -> dict:
    pair = make()
    exchange = pair.sync(initiator)
    assert pair.same()
    return {
        "round_trips": exchange.round_trips,
        "messages": exchange.messages,
        "events": exchange.events,
        "bytes": exchange.bytes,
        "event_bytes": exchange.event_bytes,
        "overhead_bytes": exchange.overhead_bytes,
        "overhead_per_event_bytes": round(exchange.overhead_bytes / max(1, exchange.events), 2),
    }


def test_sim_bench(record_figures):
    verify = verify_rate()
    clean = sim_run()
    faulty = sim_run(loss=0.2, partition_at_ms=1_000, heal_at_ms=5_000)
    anti_entropy_only = sim_run(loss=0.2, partition_at_ms=1_000, heal_at_ms=5_000, push=False)
    figures: dict = {
        "verify_per_cpu_s": round(verify),
        "sim": {"clean": clean, "loss_0.2_partition": faulty,
                "loss_0.2_partition_no_push": anti_entropy_only},
        # Both sides in CPU seconds of this one process: the share of the crypto bound
        # the whole pipeline (network sim, engine, monitor, graph, store) reaches.
        "sim_cpu_ratio_to_verify": round(clean["replica_events_per_cpu_s"] / verify, 3),
        "reconcile": {},
    }
    for m in RECONCILE_SIZES:
        figures["reconcile"][str(m)] = {
            "lagging_laggard_asks": reconcile(lambda: lagging(m, payload_bytes=PAYLOAD_BYTES), "a"),
            "lagging_ahead_asks": reconcile(lambda: lagging(m, payload_bytes=PAYLOAD_BYTES), "b"),
            "partitions_with_peer_state": reconcile(
                lambda: diverged(m, payload_bytes=PAYLOAD_BYTES), "a"),
            "partitions_first_contact": reconcile(
                lambda: diverged(m, synced_before=False, payload_bytes=PAYLOAD_BYTES), "a"),
        }
    record_figures("sim", figures)
