"""A run of the seeded world that says how it is going: one line per step of virtual time.

`python -m transport.sim.timeline [--every MS] <the simulator's flags>` runs the
same world as `python -m transport.sim` (same seed, same events, same
digest: stepping the clock changes nothing, the heap pops the same entries
in the same order) and prints to stderr, every MS virtual ms, the members'
mean and largest width, the events a member holds (mean), the dummies so
far, and the process's CPU seconds. Why: a 1000-node world runs for tens of
minutes, most of it in the join storm of its first virtual second, and the
summary arrives only at the end. The timeline shows how far a long run got,
and how long the join storm held the width near n before depletion brought
it under `d_max`.
"""

from __future__ import annotations

import resource
import sys
import time
from typing import TextIO

from transport.sim.cli import build_parser, scenario_from_args
from transport.sim.scenario import PROGRAM
from transport.sim.world import Cluster

DEFAULT_EVERY_MS = 100  # virtual ms between two timeline lines


class TimelineCluster(Cluster):
    """The fixed-overlay world, its clock advanced in steps with a line after each."""

    every_ms = DEFAULT_EVERY_MS
    out: TextIO = sys.stderr

    def run_until(self, end_ms: int) -> None:
        while True:
            step_end = min(end_ms, (self.now_ms // self.every_ms + 1) * self.every_ms)
            super().run_until(step_end)
            self.out.write(self.timeline_line() + "\n")
            self.out.flush()
            if step_end >= end_ms:
                return

    def timeline_line(self) -> str:
        widths = [n.replica.graph.width for n in self.members]
        held = sum(n.replica.graph.delivered_count for n in self.members) / len(self.members)
        dummies = sum(n.replica.counters["dummies"] for n in self.nodes)
        cpu = resource.getrusage(resource.RUSAGE_SELF).ru_utime
        return (f"t {self.now_ms} ms: width mean {sum(widths) / len(widths):.1f} max "
                f"{max(widths)}, events held {held:.0f}, dummies {dummies}, cpu {cpu:.0f} s, "
                f"wall {time.perf_counter() - _STARTED:.0f} s")


_STARTED = time.perf_counter()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    every = DEFAULT_EVERY_MS
    if "--every" in args:
        at = args.index("--every")
        every = int(args[at + 1])
        del args[at:at + 2]
    scenario = scenario_from_args(build_parser(f"{PROGRAM}.timeline").parse_args(args))
    if scenario.fleet:
        raise SystemExit("the timeline runs the fixed-overlay world, not --fleet")
    cluster = TimelineCluster.from_scenario(scenario)
    cluster.every_ms = every
    try:
        summary = cluster.run()
    except AssertionError as failure:
        print(failure, file=sys.stderr)
        return 1
    print("\n".join(summary.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
