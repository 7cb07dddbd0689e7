"""`python -m deploy`: run N megnode daemons on this machine until Ctrl-C.

Plain 127.0.0.1 by default (`deploy.cluster.LocalCluster`), or each node in a
network namespace of its own with `--netns` (`deploy.netns_cluster`, root).
A module of its own because it picks between the two clusters: inside
`deploy.cluster` it would import its own subclass (an import cycle).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from deploy.cluster import LocalCluster
from deploy.netns_cluster import NetnsCluster
from deploy.netwire import Netem


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy",
                                     description="Run N megnode daemons on 127.0.0.1 until Ctrl-C.")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--dir", default="cluster-run")
    parser.add_argument("--fast-path", default="push", choices=("push", "gossipsub", "none"))
    parser.add_argument("--netns", action="store_true",
                        help="each node in its own network namespace (root; see deploy.netns)")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="with --netns: per-node delay")
    parser.add_argument("--loss-percent", type=float, default=0.0, help="with --netns: per-node loss")
    args = parser.parse_args(argv)
    cluster: LocalCluster
    if args.netns:
        cluster = NetnsCluster(Path(args.dir), args.nodes, fast_path=args.fast_path,
                               netem=Netem(delay_ms=args.delay_ms, loss_percent=args.loss_percent))
    else:
        cluster = LocalCluster(Path(args.dir), args.nodes, fast_path=args.fast_path)
    with cluster:
        for node in cluster.nodes:
            print(f"node{node.index}: {node.address}  (data dir {node.data_dir})", flush=True)
        print("all connected; Ctrl-C stops the cluster", flush=True)
        try:
            while all(cluster.alive(n.index) for n in cluster.nodes):
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
