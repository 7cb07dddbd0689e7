"""A LocalCluster whose nodes each run in a network namespace of their own.

Same API as `deploy.cluster.LocalCluster` (cli, status, wait_connected,
wait_delivered, kill, stop, start_node ...), plus `lan`: the `NetnsLan` the
nodes sit on, for delay, loss and partitions. Each daemon runs under
`ip netns exec <its namespace>` and listens on its namespace address; the
CLI reaches it through the control socket in its data dir (a Unix socket is
a file, not a network address, so it works across network namespaces).

    with NetnsCluster(Path("run"), nodes=3, netem=Netem(delay_ms=50, loss_percent=10)) as c:
        c.cli(0, "topic", "create", "kitchen")
        c.lan.partition([[0], [1, 2]])
        ...
        c.lan.heal()

The namespaces are removed when the cluster closes, after the daemons stop
(also when starting or connecting failed).
"""

from __future__ import annotations

from pathlib import Path

from deploy.cluster import LocalCluster
from deploy.netns import NetnsLan
from deploy.netwire import Netem


class NetnsCluster(LocalCluster):
    def __init__(self, base_dir: Path, nodes: int, *, netem: Netem | None = None,
                 seed: int = 0, connect: bool = True, **kwargs) -> None:
        """`netem` applies to every node from the start; `connect=False` starts
        every node without bootstrap addresses (for discovery tests) and does
        not wait for them to connect."""
        super().__init__(base_dir, nodes, **kwargs)
        self.lan = NetnsLan(nodes, seed=seed)
        self.netem = netem
        self.connect = connect

    def __enter__(self) -> "NetnsCluster":
        try:
            self.lan.create()
            if self.netem is not None:
                self.lan.set_netem(self.netem.delay_ms, self.netem.loss_percent,
                                   self.netem.jitter_ms)
            if self.connect:
                self.start()
                self.wait_connected()
            else:
                for node in self.nodes:
                    self.start_node(node.index, bootstrap=[])
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.lan.close()

    def listen_address(self, index: int) -> str:
        return f"/ip4/{self.lan.address(index)}/tcp/0"

    def run_command(self, index: int, command: list[str]) -> list[str]:
        return [*self.lan.exec_prefix(index), *command]
