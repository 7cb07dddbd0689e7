"""`python -m deploy`: run N megnode daemons on this machine until SIGTERM or Ctrl-C.

Plain 127.0.0.1 by default (`deploy.cluster.LocalCluster`), or each node in a
network namespace of its own with `--netns` (`deploy.netns_cluster`, root).
A module of its own because it picks between the two clusters: inside
`deploy.cluster` it would import its own subclass (an import cycle).
"""

from __future__ import annotations

import argparse
import sys

from deploy.cluster import (MAX_NODES, LocalCluster, add_cluster_arguments, cluster_dir,
                            run_until_stopped)
from deploy.netns_cluster import NetnsCluster
from deploy.netwire import Netem


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy",
                                     description="Run N megnode daemons on this machine until "
                                                 "SIGTERM or Ctrl-C (forwarded to them).")
    add_cluster_arguments(parser)
    parser.add_argument("--netns", action="store_true",
                        help="each node in its own network namespace (root; see deploy.netns)")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="with --netns: per-node delay")
    parser.add_argument("--loss-percent", type=float, default=0.0, help="with --netns: per-node loss")
    args = parser.parse_args(argv)
    if not 1 <= args.nodes <= MAX_NODES:
        parser.error(f"--nodes must be in [1, {MAX_NODES}]")
    base_dir = cluster_dir(args.dir)
    cluster: LocalCluster
    if args.netns:
        cluster = NetnsCluster(base_dir, args.nodes, fast_path=args.fast_path,
                               netem=Netem(delay_ms=args.delay_ms, loss_percent=args.loss_percent))
    else:
        cluster = LocalCluster(base_dir, args.nodes, fast_path=args.fast_path)
    return run_until_stopped(cluster)


if __name__ == "__main__":
    sys.exit(main())
