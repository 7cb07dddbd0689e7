"""A local cluster of real `megnode run` processes on 127.0.0.1.

Used by the end-to-end tests, the benchmarks and `make demo`: it starts N
daemons, each in its own data dir under one base dir, each dialling the
nodes started before it (a full mesh for small N), waits until every node
sees the others, and tears everything down — even when the caller fails.

    with LocalCluster(Path("run"), nodes=3) as cluster:
        topic = cluster.cli(0, "topic", "create", "kitchen")["topic"]
        for i in (1, 2):
            cluster.cli(i, "topic", "join", topic)
        cluster.cli(1, "publish", topic, "hello")

Every wait is bounded (named timeouts); a node that dies is reported with
the tail of its stderr. `python -m deploy.cluster --nodes 5 [--dir D]` (or
`python -m deploy`, which adds `--netns --delay-ms 50 --loss-percent 10`: each
node in a network namespace, deploy.netns_cluster) starts a cluster and keeps
it up until SIGTERM, SIGINT (Ctrl-C) or SIGHUP: the signal is forwarded to
every daemon (SIGHUP as SIGTERM; the daemons run in sessions of their own, so
nothing else reaches them) and the command waits for them to stop, SIGKILL
after STOP_TIMEOUT_S. It writes only into the directory named by `--dir`
(default: a new one under the temp dir, printed first), never into the
current directory. Subclasses change where nodes listen and how they are
executed through `listen_address` and `run_command`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.control_client import CONTROL_SOCKET, ControlError, control_call
from node.config import FAST_PATHS

START_TIMEOUT_S = 30.0  # one daemon from exec to its "started" line
CONNECT_TIMEOUT_S = 30.0  # all nodes seeing each other
CLI_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0  # SIGTERM to exit before SIGKILL
POLL_INTERVAL_S = 0.1
STDERR_TAIL_BYTES = 4_000
MAX_NODES = 64
MAX_PARALLEL_DIALS = 16  # control-socket `connect` calls in flight while a cluster starts
# A dial the node gave up on (its own connect timeout) is tried again this many times
# in all: over a lossy link (the netns tests' netem: 10 % loss, 50 ms) on a loaded
# machine, a lost SYN or handshake segment waits out TCP's backoff (1 s, 2 s, 4 s...),
# and one dial in a full `make test` ran past the node's 10 s.
DIAL_ATTEMPTS = 3
WATCH_INTERVAL_S = 1.0  # `python -m deploy.cluster`: how often it checks its daemons are alive
# Signals that stop a running cluster, and what each daemon is sent for them
# (`megnode run` stops cleanly on SIGTERM and SIGINT only).
FORWARDED_SIGNALS = {signal.SIGTERM: signal.SIGTERM, signal.SIGINT: signal.SIGINT,
                     signal.SIGHUP: signal.SIGTERM}
DIR_PREFIX = "megnode-cluster-"  # the default directory, under the temp dir


class ClusterError(Exception):
    """A node failed to start, connect or answer; the message includes its stderr tail."""


class Interrupted(BaseException):
    """A stop signal arrived (a BaseException, like KeyboardInterrupt: it must unwind
    whatever the cluster was doing, start-up included, so the daemons are stopped)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class NodeProcess:
    index: int
    data_dir: Path
    process: subprocess.Popen | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return self.info["addresses"][0]

    @property
    def node_id(self) -> str:
        return self.info["node"]

    def stderr_tail(self) -> str:
        path = self.data_dir / "stderr.log"
        try:
            return path.read_bytes()[-STDERR_TAIL_BYTES:].decode("utf-8", "replace")
        except OSError:
            return ""


def megnode_command(*args: str) -> list[str]:
    """The command line running this checkout's megnode with the current interpreter."""
    return [sys.executable, "-m", "node.cli", *args]


class LocalCluster:
    def __init__(self, base_dir: Path, nodes: int, *, fast_path: str | None = None,
                 extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes must be in [1, {MAX_NODES}]")
        self.base_dir = Path(base_dir)
        self.fast_path = fast_path
        self.extra_args = extra_args
        self.env = {**os.environ, **(env or {})}
        self.nodes = [NodeProcess(i, self.base_dir / f"node{i}") for i in range(nodes)]
        self.stop_signal = signal.SIGTERM  # what close() sends (a forwarded signal changes it)

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> "LocalCluster":
        try:
            self.start()
            self.wait_connected()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, Interrupted):
            self.stop_signal = FORWARDED_SIGNALS.get(signal.Signals(exc.signum), signal.SIGTERM)
        self.close()

    def start(self) -> None:
        """Start every daemon at once, then connect each to the nodes started before it.

        A daemon's start-up is mostly interpreter and import time, so the
        daemons start side by side; each then dials the earlier ones over its
        control socket (the `connect` op): the same mesh as bootstrapping
        each from the earlier ones, without starting them one after another.
        """
        for node in self.nodes:
            self._spawn(node.index, bootstrap=[])
        for node in self.nodes:
            node.info = self._read_started(node)
        dials = [(node.index, earlier.address) for node in self.nodes
                 for earlier in self.nodes[:node.index]]
        if dials:  # side by side too: on a slow or lossy link each dial takes round trips
            with ThreadPoolExecutor(max_workers=min(len(dials), MAX_PARALLEL_DIALS)) as pool:
                list(pool.map(lambda dial: self.dial(*dial), dials))

    def dial(self, index: int, address: str) -> str:
        """Have node `index` dial `address` now; the peer id it reached."""
        path = self.nodes[index].data_dir / CONTROL_SOCKET
        for attempt in range(1, DIAL_ATTEMPTS + 1):
            try:
                return control_call(path, {"op": "connect", "address": address},
                                    timeout_s=CLI_TIMEOUT_S)["peer"]
            except ControlError as exc:
                if attempt == DIAL_ATTEMPTS or "timed out" not in str(exc):
                    raise ClusterError(f"node {index} cannot dial {address}: {exc}") from None
        raise AssertionError("unreachable")  # (the last attempt returns or raises)

    def start_node(self, index: int, bootstrap: list[str] | None = None) -> NodeProcess:
        """(Re)start node `index`, bootstrapping from `bootstrap` (default: the running nodes)."""
        node = self._spawn(index, bootstrap)
        node.info = self._read_started(node)
        return node

    def _spawn(self, index: int, bootstrap: list[str] | None) -> NodeProcess:
        node = self.nodes[index]
        node.data_dir.mkdir(parents=True, exist_ok=True)
        if bootstrap is None:
            bootstrap = [n.address for n in self.nodes if n.info and n.index != index
                         and n.process is not None and n.process.poll() is None]
        args = ["run", "--data-dir", str(node.data_dir), "--listen", self.listen_address(index),
                *(("--fast-path", self.fast_path) if self.fast_path else ()), *self.extra_args]
        for address in bootstrap:
            args += ["--bootstrap", address]
        stderr = open(node.data_dir / "stderr.log", "ab")  # noqa: SIM115 - owned by the child
        node.process = subprocess.Popen(self.run_command(index, megnode_command(*args)),
                                        stdout=subprocess.PIPE, stderr=stderr, env=self.env,
                                        start_new_session=True)
        stderr.close()
        return node

    def listen_address(self, index: int) -> str:
        """Where node `index` listens; subclasses put nodes on other networks."""
        return "/ip4/127.0.0.1/tcp/0"

    def run_command(self, index: int, command: list[str]) -> list[str]:
        """The daemon's command line as executed; subclasses wrap it (e.g. `ip netns exec`)."""
        return command

    def _read_started(self, node: NodeProcess) -> dict[str, Any]:
        assert node.process is not None and node.process.stdout is not None
        os.set_blocking(node.process.stdout.fileno(), False)
        deadline = time.monotonic() + START_TIMEOUT_S
        buffer = b""
        while time.monotonic() < deadline:
            chunk = node.process.stdout.read()
            if chunk:
                buffer += chunk
                for line in buffer.split(b"\n"):
                    if line.startswith(b"{"):
                        info = json.loads(line)
                        if info.get("event") == "started":
                            return info
            if node.process.poll() is not None:
                raise ClusterError(f"node {node.index} exited with {node.process.returncode}:\n"
                                   f"{node.stderr_tail()}")
            time.sleep(POLL_INTERVAL_S)
        raise ClusterError(f"node {node.index} did not start within {START_TIMEOUT_S} s:\n"
                           f"{node.stderr_tail()}")

    def wait_connected(self, timeout_s: float = CONNECT_TIMEOUT_S,
                       indices: list[int] | None = None) -> None:
        """Wait until each running node has every other running node as a peer."""
        running = indices if indices is not None else [n.index for n in self.nodes if self.alive(n.index)]
        peer_ids = {self.nodes[i].info["peer_id"] for i in running}
        deadline = time.monotonic() + timeout_s
        while True:
            missing = {}
            for i in running:
                peers = set(self.status(i)["peers"])
                lacking = peer_ids - {self.nodes[i].info["peer_id"]} - peers
                if lacking:
                    missing[i] = len(lacking)
            if not missing:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"nodes not connected after {timeout_s} s: {missing}")
            time.sleep(POLL_INTERVAL_S * 3)

    def alive(self, index: int) -> bool:
        process = self.nodes[index].process
        return process is not None and process.poll() is None

    def signal(self, index: int, sig: int) -> None:
        process = self.nodes[index].process
        if process is not None and process.poll() is None:
            process.send_signal(sig)

    def kill(self, index: int) -> None:
        """SIGKILL: no clean shutdown, as a power cut or OOM kill would do."""
        process = self.nodes[index].process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)

    def stop(self, index: int) -> None:
        process = self.nodes[index].process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGCONT)  # a stopped process cannot handle SIGTERM
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)

    def close(self) -> None:
        """Send every daemon `stop_signal` once, wait for each; SIGKILL one that overstays.

        Once: a daemon that got its stop signal restores the default action, so a
        second one would kill it in the middle of closing its store.
        """
        for node in self.nodes:  # ask all first, so their shutdowns overlap
            if self.alive(node.index):
                self.signal(node.index, signal.SIGCONT)  # a stopped process cannot handle it
                self.signal(node.index, self.stop_signal)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for node in self.nodes:
            if node.process is not None:
                try:
                    node.process.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait(timeout=STOP_TIMEOUT_S)
                if node.process.stdout is not None:
                    node.process.stdout.close()

    # ------------------------------------------------------------------ driving nodes

    def cli(self, index: int, *args: str, timeout_s: float = CLI_TIMEOUT_S) -> dict[str, Any]:
        """Run a `megnode` command against node `index`; its JSON output (last line)."""
        result = self.cli_raw(index, *args, timeout_s=timeout_s)
        if result.returncode != 0:
            raise ClusterError(f"megnode {' '.join(args)} on node {index} failed "
                               f"({result.returncode}): {result.stderr.strip()}")
        text = result.stdout.strip()
        try:
            try:
                return json.loads(text)  # one JSON document (possibly indented)
            except json.JSONDecodeError:
                return json.loads(text.splitlines()[-1])  # JSON lines: the last one
        except (json.JSONDecodeError, IndexError):
            raise ClusterError(f"megnode {' '.join(args)} printed non-JSON: {text[:500]}") from None

    def cli_raw(self, index: int, *args: str, timeout_s: float = CLI_TIMEOUT_S,
                input_text: str | None = None) -> subprocess.CompletedProcess:
        command = megnode_command(*args, "--data-dir", str(self.nodes[index].data_dir))
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              env=self.env, input=input_text)

    def status(self, index: int) -> dict[str, Any]:
        """What `megnode status` prints, asked over the control socket from this process.

        The waits poll it many times a second across all nodes: a CLI process per poll
        would spend most of the test's time starting interpreters.
        """
        path = self.nodes[index].data_dir / CONTROL_SOCKET
        try:
            return control_call(path, {"op": "status"}, timeout_s=CLI_TIMEOUT_S)["status"]
        except ControlError as exc:
            raise ClusterError(f"status of node {index} failed: {exc}") from None

    def topic_status(self, index: int, topic: str) -> dict[str, Any]:
        for entry in self.status(index)["topics"]:
            if entry["topic"] == topic:
                return entry
        raise ClusterError(f"node {index} is not in topic {topic}")

    def wait_joined(self, topic: str, timeout_s: float, indices: list[int] | None = None) -> None:
        """Wait until the nodes' own membership in `topic` is "join"."""
        indices = indices if indices is not None else [n.index for n in self.nodes if self.alive(n.index)]
        deadline = time.monotonic() + timeout_s
        while True:
            states = {i: self.topic_status(i, topic).get("membership") for i in indices}
            if all(state == "join" for state in states.values()):
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"memberships {states} not all 'join' after {timeout_s} s")
            time.sleep(POLL_INTERVAL_S * 3)

    def wait_delivered(self, topic: str, count: int, timeout_s: float,
                       indices: list[int] | None = None) -> float:
        """Wait until the given (default: all running) nodes delivered `count` events.

        Acknowledgements (empty "ack" events the indexers add for the total
        order) are not counted: `count` is about the events the caller made.
        """
        indices = indices if indices is not None else [n.index for n in self.nodes if self.alive(n.index)]
        start = time.monotonic()
        while True:
            counts = {}
            for i in indices:
                status = self.topic_status(i, topic)
                counts[i] = status["delivered"] - status.get("acks", 0)
            if all(c >= count for c in counts.values()):
                return time.monotonic() - start
            if time.monotonic() - start > timeout_s:
                raise ClusterError(f"delivered counts {counts} short of {count} after {timeout_s} s")
            time.sleep(POLL_INTERVAL_S * 3)


# ---------------------------------------------------------------------- command line


@contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """Within: SIGTERM, SIGINT and SIGHUP raise Interrupted, once; later ones are ignored
    until the block ends, so a second Ctrl-C cannot cut the daemons' shutdown short."""

    def interrupt(signum: int, _frame: object) -> None:
        for sig in FORWARDED_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, interrupt) for sig in FORWARDED_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=3, help="daemons to run (default: 3)")
    parser.add_argument("--dir", help="where the nodes' data dirs go (default: a new "
                        f"{DIR_PREFIX}* directory under the temp dir; never the current one)")
    parser.add_argument("--fast-path", default=None, choices=FAST_PATHS,
                        help="how new events spread (default: the node's, tree)")


def cluster_dir(requested: str | None) -> Path:
    """The directory named, or a new one under the temp dir."""
    if requested is not None:
        return Path(requested)
    return Path(tempfile.mkdtemp(prefix=DIR_PREFIX))


def run_until_stopped(cluster: LocalCluster) -> int:
    """Start `cluster`, print where it is, keep it up until a stop signal or a daemon dies.

    0 when stopped by a signal (every daemon stopped cleanly), 1 when a daemon
    died or would not stop, 2 when the cluster could not start.
    """
    print(f"cluster dir: {cluster.base_dir}", flush=True)
    try:
        with stop_signals_interrupt():
            with cluster:
                for node in cluster.nodes:
                    assert node.process is not None
                    print(f"node{node.index}: {node.address}  (pid {node.process.pid}, "
                          f"data dir {node.data_dir})", flush=True)
                print("all connected; Ctrl-C or SIGTERM stops the cluster", flush=True)
                while all(cluster.alive(n.index) for n in cluster.nodes):
                    time.sleep(WATCH_INTERVAL_S)
                dead = [n.index for n in cluster.nodes if not cluster.alive(n.index)]
                print(f"node(s) {dead} stopped on their own; stopping the others",
                      file=sys.stderr)
                return 1
    except Interrupted as stop:
        codes = {n.index: n.process.returncode for n in cluster.nodes if n.process is not None}
        unclean = {i: code for i, code in codes.items() if code != 0}
        print(f"{stop}: stopped {len(codes)} daemon(s)"
              + (f"; unclean exits {unclean}" if unclean else ""), flush=True)
        return 1 if unclean else 0
    except ClusterError as exc:
        print(f"python -m deploy.cluster: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.cluster",
                                     description="Run N megnode daemons on 127.0.0.1 until "
                                                 "SIGTERM or Ctrl-C (forwarded to them).")
    add_cluster_arguments(parser)
    args = parser.parse_args(argv)
    if not 1 <= args.nodes <= MAX_NODES:
        parser.error(f"--nodes must be in [1, {MAX_NODES}]")
    cluster = LocalCluster(cluster_dir(args.dir), args.nodes, fast_path=args.fast_path)
    return run_until_stopped(cluster)


if __name__ == "__main__":
    sys.exit(main())
