"""The simulator's command line: replay one run, or sweep a scenario over many seeds.

`python -m transport.sim --seed S ...` rebuilds the `Scenario` a failure
printed and runs it again (same run, bit for bit); `--sweep N` runs seeds
S..S+N-1 of one scenario, one line each and a total, and exits 1 if any
failed (`make sweep` runs issue 11's world over 200 seeds). `main` is also
what `megnode sim ...` calls.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace

from transport.depletion import DepletionMode
from transport.sim.scenario import PROGRAM, Scenario
from transport.sim.fleet import run_world


def build_parser(prog: str = PROGRAM) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description="Replay a deterministic megnode simulation.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog=f"example: {prog} --seed 1 --nodes 50 --loss 0.1 --partition-at 1000 "
               "--heal-at 4000")
    d = Scenario(seed=0)
    p.add_argument("--seed", type=int, required=True, help="the run's seed (replays it exactly)")
    p.add_argument("--nodes", type=int, default=d.nodes, help="replicas in the world")
    p.add_argument("--loss", type=float, default=d.loss, help="probability a message is lost")
    p.add_argument("--duplicate", type=float, default=d.duplicate,
                   help="probability a message is delivered twice")
    p.add_argument("--reorder", type=float, default=d.reorder,
                   help="probability a message is delayed past later ones")
    p.add_argument("--reordering-links", action="store_true",
                   help="each message draws its own latency, so a later one may overtake an "
                        "earlier one on its link (the default before 2026-11-27: runs recorded "
                        "before then replay with it); by default links keep order, as a libp2p "
                        "stream does")
    p.add_argument("--latency", type=int, nargs=2, default=list(d.latency_ms), metavar=("LO", "HI"),
                   help="link latency range in virtual ms")
    p.add_argument("--neighbours", type=int, default=d.neighbours, help="peers per node")
    p.add_argument("--rounds", type=int, default=d.rounds, help="publishing rounds")
    p.add_argument("--writers", type=int, default=d.writers, help="nodes publishing each round")
    p.add_argument("--round-ms", type=int, default=d.round_ms, help="virtual ms between rounds")
    p.add_argument("--partition-at", type=int, default=None,
                   help="virtual ms at which the network splits (with --heal-at)")
    p.add_argument("--heal-at", type=int, default=None, help="virtual ms at which it heals")
    p.add_argument("--groups", type=int, default=d.groups, help="sides of the partition")
    p.add_argument("--fanout", type=int, default=d.fanout, help="an author's push fanout")
    p.add_argument("--forward-fanout", type=int, default=d.forward_fanout,
                   help="a relay's fanout for an event first received by push")
    p.add_argument("--sync-interval", type=int, default=d.sync_interval_ms,
                   help="anti-entropy interval in virtual ms")
    p.add_argument("--d-max", type=int, default=d.d_max, help="parents per event")
    p.add_argument("--liveness-bound", type=int, default=d.liveness_bound_ms,
                   help="virtual ms after healing within which every node must hold everything")
    p.add_argument("--no-push", action="store_true", help="no push fast path: anti-entropy only")
    p.add_argument("--fast-path", choices=("push", "tree", "none"), default="push",
                   help="how new events travel first: random push, the eager/lazy tree "
                        "(transport.eager_lazy), or none (anti-entropy only; as --no-push)")
    p.add_argument("--no-peer-state", action="store_true",
                   help="no per-peer state in anti-entropy")
    p.add_argument("--no-witnessed-since", action="store_true",
                   help="offers name only the last exchange's common heads in `since`, not the "
                        "ids the peer pushed, announced or offered since (the old filter)")
    p.add_argument("--no-depletion", action="store_true", help="no depletion dummies")
    p.add_argument("--depletion-mode", choices=[m.value for m in DepletionMode],
                   default=d.depletion_mode,
                   help="who writes the dummies: the extremities' authors in turn, or the old "
                        "random backoff (transport.depletion)")
    p.add_argument("--clean-liveness", action="store_true",
                   help="no loss/duplication/reordering after healing")
    p.add_argument("--indexers", type=int, default=d.indexers,
                   help="nodes that acknowledge for the total order")
    p.add_argument("--crashes", type=int, default=d.crashes,
                   help="nodes that crash once in the fault phase and restart from their store")
    p.add_argument("--adversary", action="store_true",
                   help="add one misbehaving peer the honest nodes must ban")
    p.add_argument("--invite", action="store_true",
                   help="a private topic: invitees join by the join handshake")
    p.add_argument("--outsiders", type=int, default=d.outsiders,
                   help="non-member nodes that know the topic id and keep asking")
    p.add_argument("--history", choices=("shared", "joined"), default=d.history,
                   help="the private topic's history setting (with --invite)")
    p.add_argument("--late", type=int, default=d.late,
                   help="members (the last ones) invited only half-way through the rounds")
    p.add_argument("--banned-writer", action="store_true",
                   help="the last member is banned and keeps writing on pre-ban parents")
    p.add_argument("--fleet", action="store_true",
                   help="issue 12's fleet world: the overlay formed by peer exchange and the "
                        "connection manager from one bootstrap node, with churn")
    p.add_argument("--churn", type=float, default=d.churn,
                   help="(fleet) fraction of the nodes restarting per virtual minute")
    p.add_argument("--fleet-ms", type=int, default=d.fleet_ms,
                   help="(fleet) virtual ms of churn and writes before the liveness phase")
    p.add_argument("--kill-bootstrap-at", type=int, default=d.kill_bootstrap_at_ms,
                   help="(fleet) virtual ms at which node 0, everyone's bootstrap, dies for good")
    p.add_argument("--low-water", type=int, default=d.low_water,
                   help="(fleet) the connection manager's low water mark")
    p.add_argument("--high-water", type=int, default=d.high_water,
                   help="(fleet) the connection manager's high water mark")
    p.add_argument("--no-authorization", action="store_true",
                   help="a pure MEG: no topic state, no order, no acks")
    p.add_argument("--sweep", type=int, default=None, metavar="N",
                   help="run seeds SEED..SEED+N-1 of this scenario and report")
    p.add_argument("--log-dir", default=None, help="write dissemination logs (JSON lines) here")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def scenario_from_args(ns: argparse.Namespace) -> Scenario:
    if (ns.partition_at is None) != (ns.heal_at is None):
        raise SystemExit("--partition-at and --heal-at go together")
    return Scenario(
        seed=ns.seed, nodes=ns.nodes, loss=ns.loss, duplicate=ns.duplicate, reorder=ns.reorder,
        fifo_links=not ns.reordering_links,
        latency_ms=(ns.latency[0], ns.latency[1]), neighbours=ns.neighbours, rounds=ns.rounds,
        writers=ns.writers, round_ms=ns.round_ms, partition_at_ms=ns.partition_at,
        heal_at_ms=ns.heal_at, groups=ns.groups,
        push=not ns.no_push and ns.fast_path != "none", tree=ns.fast_path == "tree",
        fanout=ns.fanout,
        forward_fanout=ns.forward_fanout,
        sync_interval_ms=ns.sync_interval, peer_state=not ns.no_peer_state,
        witnessed_since=not ns.no_witnessed_since, d_max=ns.d_max,
        depletion=not ns.no_depletion, depletion_mode=ns.depletion_mode,
        lossy_liveness=not ns.clean_liveness,
        liveness_bound_ms=ns.liveness_bound, authorization=not ns.no_authorization,
        indexers=ns.indexers, adversary=ns.adversary, crashes=ns.crashes, invite=ns.invite,
        outsiders=ns.outsiders, banned_writer=ns.banned_writer, history=ns.history, late=ns.late,
        fleet=ns.fleet, churn=ns.churn, fleet_ms=ns.fleet_ms,
        kill_bootstrap_at_ms=ns.kill_bootstrap_at, low_water=ns.low_water,
        high_water=ns.high_water)


def sweep(scenario: Scenario, count: int) -> int:
    """Run `count` seeds from scenario.seed on; print one line each and a total."""
    started = time.perf_counter()
    failed: list[int] = []
    for seed in range(scenario.seed, scenario.seed + count):
        try:
            summary = run_world(replace(scenario, seed=seed))
            print(f"seed {seed}: ok, {summary.events} events, {summary.confirmed} confirmed, "
                  f"{summary.acks} acks, {summary.bans} bans, "
                  + (f"{summary.excluded} excluded, {summary.soft_failed} soft-failed, "
                     if summary.excluded or summary.soft_failed else "")
                  + "".join(f"{note}, " for note in summary.notes)
                  + f"converged "
                  f"{summary.convergence_ms} ms after faults, wall {summary.wall_s:.1f} s",
                  flush=True)
        except AssertionError as failure:
            failed.append(seed)
            print(failure, flush=True)
    wall = time.perf_counter() - started
    print(f"sweep: {count - len(failed)}/{count} seeds passed in {wall:.0f} s"
          + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


def main(argv: list[str] | None = None, prog: str = PROGRAM) -> int:
    ns = build_parser(prog).parse_args(argv)
    scenario = scenario_from_args(ns)
    if ns.sweep is not None:
        return sweep(scenario, ns.sweep)
    try:
        summary = run_world(scenario, ns.log_dir)
    except AssertionError as failure:
        print(failure, file=sys.stderr)
        return 1
    if ns.json:
        print(json.dumps(asdict(summary), sort_keys=True))
    else:
        print("\n".join(summary.lines()))
    return 0
