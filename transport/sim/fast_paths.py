"""The fast paths side by side: one scenario run with random push and with the eager/lazy tree.

Issue 14's simulated figures, per node and per event (the world's distinct
events, dummies and acks included, each of about `event_bytes` encoded):

* `bytes_received`: every byte a node was handed (all message kinds,
  anti-entropy included), against one copy of the event;
* `payload_sent`: event bytes sent to a node in any message (fast path and
  repair), and `push_sent` those of the fast path alone;
* `announce_sent`: the lazy announcements' bytes (`IHave` frames; 0 for push),
  and `control_sent` the tree's grafts and prunes;
* `duplicates`: copies of events a node already held;
* `convergence_ms`: from the end of the fault phase to every node holding
  everything (the checkers' `converged`).

"Sent" figures count what was sent to a node, lost copies included (the
world's loss is applied after sending); `bytes_received` counts what arrived.

`python -m transport.sim.fast_paths --seed 1 --nodes 100 --loss 0.1 ...`
takes the simulator's flags (transport.sim.cli) and prints one JSON object,
keyed by fast path; `--out FILE` also writes it there. `--phases K` measures
the steady state instead (`phases`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from transport.sim.cli import build_parser, scenario_from_args
from transport.sim.scenario import Scenario
from transport.sim.world import Cluster

FAST_PATHS = ("push", "tree")
SETTLE_MS = 1_000  # after a phase's last write round (phases)


def figures(cluster: Cluster, convergence_ms: int | None) -> dict[str, Any]:
    """Issue 14's per-node-per-event figures of a finished world (module docstring)."""
    totals = cluster.totals()
    graph = cluster.members[0].replica.graph
    raws = [e.raw for _, e in graph.deliveries(0, graph.delivered_count)]
    events = max(len(raws), 1)
    event_bytes = sum(map(len, raws)) / events
    per = len(cluster.members) * events

    def ratio(key: str) -> float:
        return round(totals.get(key, 0) / per / event_bytes, 3)

    return {
        "nodes": len(cluster.members), "events": events, "event_bytes": round(event_bytes, 1),
        "bytes_received_per_node_event": round(totals.get("bytes_received", 0) / per, 1),
        "bytes_received_x_event": ratio("bytes_received"),
        "payload_sent_x_event": ratio("event_bytes_sent"),
        "push_sent_x_event": ratio("bytes_sent_push"),
        "announce_sent_per_node_event": round(totals.get("bytes_sent_ihave", 0) / per, 1),
        "announce_sent_x_event": ratio("bytes_sent_ihave"),
        "control_sent_x_event": round((totals.get("bytes_sent_graft", 0)
                                       + totals.get("bytes_sent_prune", 0)) / per / event_bytes, 4),
        "duplicates_per_node_event": round(totals.get("duplicates", 0) / per, 3),
        "grafts": totals.get("grafts_sent", 0), "prunes": totals.get("prunes_sent", 0),
        "convergence_ms": convergence_ms,
    }


def run_path(scenario: Scenario, path: str) -> dict[str, Any]:
    """Run `scenario` with fast path `path` (push, tree, none); checked, then measured."""
    scenario = replace(scenario, push=path != "none", tree=path == "tree")
    started = time.perf_counter()
    cluster = Cluster.from_scenario(scenario)
    end, converged_at = cluster.run_scenario_phases()
    cluster.check(converged_at is not None)  # raises (naming the replay) unless right
    out = figures(cluster, None if converged_at is None else converged_at - end)
    out["wall_s"] = round(time.perf_counter() - started, 1)
    out["replay"] = scenario.replay_command()
    return out


def compare(scenario: Scenario, paths: tuple[str, ...] = FAST_PATHS) -> dict[str, Any]:
    return {path: run_path(scenario, path) for path in paths}


PHASE_KEYS = ("bytes_received", "bytes_sent_push", "bytes_sent_ihave", "duplicates",
              "received_gossip", "received_sync", "prunes_sent", "grafts_sent",
              "tree_held_back", "wants_sent", "bytes_sent_events", "bytes_sent_reply")


def phases(scenario: Scenario, path: str, count: int) -> list[dict[str, Any]]:
    """The steady state: `count` phases of `scenario.rounds` write rounds (and 1 s to settle)
    in one authorized world, each phase's counters per node and per event (and the
    phase's mean encoded event, `event_bytes`, as node 0 applied them).

    A short run measures mostly the start, where every link is eager and every
    node's join is a new source; the later phases show what the fast path costs
    once formed. Every flag of the scenario holds (loss, duplication, d_max,
    depletion, indexers, the adversary...), but its schedule does not: no
    partition, no crash; anti-entropy on as always.
    """
    s = replace(scenario, push=path != "none", tree=path == "tree")
    cluster = Cluster.built_for(s)  # every flag of the scenario, none of its schedule
    out = []
    graph = cluster.members[0].replica.graph
    for _ in range(count):
        before, events_before = dict(cluster.totals()), len(cluster.event_ids(0))
        delivered_before = graph.delivered_count
        cluster.write(rounds=s.rounds, writers=s.writers, round_ms=s.round_ms)
        cluster.run_until(cluster.fault_phase_end() + SETTLE_MS)
        totals, events = cluster.totals(), len(cluster.event_ids(0)) - events_before
        per = max(1, events * s.nodes)
        sizes = [len(e.raw) for _, e in graph.deliveries(
            delivered_before, graph.delivered_count - delivered_before)]
        out.append({"events": events,
                    "event_bytes": round(sum(sizes) / max(1, len(sizes)), 1)} | {
            key: round((totals.get(key, 0) - before.get(key, 0)) / per, 3) for key in PHASE_KEYS})
        # Progress for long runs (1000 nodes: tens of minutes a phase); the JSON is on stdout.
        print(f"fast_paths: {path}, phase {len(out)} of {count}: {json.dumps(out[-1])}",
              file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser("python -m transport.sim.fast_paths")
    parser.add_argument("--paths", default=",".join(FAST_PATHS),
                        help="fast paths to compare, comma-separated (push, tree, none)")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    parser.add_argument("--phases", type=int, default=0,
                        help="instead: this many phases of --rounds each in one world, "
                             "counters per node and event per phase (the steady state)")
    ns = parser.parse_args(argv)
    scenario = scenario_from_args(ns)
    if scenario.fleet:
        print("fast_paths: the fleet world is not compared here", file=sys.stderr)
        return 2
    try:
        paths = tuple(p for p in ns.paths.split(",") if p)
        result = ({path: phases(scenario, path, ns.phases) for path in paths} if ns.phases
                  else compare(scenario, paths))
    except AssertionError as failure:
        print(failure, file=sys.stderr)
        return 1
    text = json.dumps(result, indent=1, sort_keys=True)
    print(text)
    if ns.out:
        Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
