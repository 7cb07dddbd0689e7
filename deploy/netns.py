"""A private virtual LAN of Linux network namespaces, with delay, loss and partitions.

The end-to-end tests want real packets between real processes, but on a
network they control: delay and loss, and partitions that cut some links
and later heal. `NetnsLan` gives each node a network namespace of its own
(`mn<pid>x<k>-<i>`: lo and eth0 with 10.77.<subnet>.<i + 10>/24), where eth0
is a TAP device whose other end is `deploy.netwire.Wire`, a userspace switch
in this process that applies each node's delay and loss and the partition.

Why TAPs and not veths on a bridge with `tc netem`: sch_netem is an optional
kernel module, missing from many VM and CI kernels (and from this project's
dev VM); TAPs need only CONFIG_TUN and behave the same everywhere. The
switch also makes partitions silent (frames vanish as on a cut cable: no
resets, so TCP connections survive and resume after `heal()`).

Everything is in namespaces created for this run, never in the root
namespace, so parallel runs (the `<pid>x<k>` prefix) cannot collide and the
host's own network is untouched. Deleting a namespace deletes its eth0:
teardown is stop the switch, `ip netns del` each namespace — idempotent, and
run from `__exit__` even when the caller failed.

    with NetnsLan(nodes=3) as lan:
        lan.set_netem(delay_ms=50, loss_percent=10)
        subprocess.run([*lan.exec_prefix(0), "megnode", "run", ...])
        lan.partition([[0], [1, 2]])
        lan.heal()

`python -m deploy.netns --cleanup` removes namespaces left by runs whose
process is gone (a SIGKILLed test run cannot tear down).
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence

from deploy.netwire import TUN_DEVICE, Netem, Wire, open_tap

NAME_PREFIX = "mn"  # every namespace this module creates starts with it
NODE_INTERFACE = "eth0"
SUBNET_BASE = "10.77"  # 10.77.<subnet>.0/24; private, and only inside our namespaces
HOST_OFFSET = 10  # node i gets .<i + 10>
PREFIX_LENGTH = 24
MAX_LAN_NODES = 200  # .10 .. .209 fit in the /24
IP_TIMEOUT_S = 10.0  # one `ip` command
_NAMESPACE_NAME = re.compile(rf"^{NAME_PREFIX}(\d+)x\d+-\d+$")
_lan_counter = itertools.count()  # several LANs in one process get distinct names

__all__ = ["NetnsError", "NetnsLan", "Netem", "cleanup_stale", "existing_namespaces",
           "unavailable_reason"]


class NetnsError(Exception):
    """Namespaces cannot be built or changed; the message says which command and why."""


def unavailable_reason() -> str | None:
    """Why namespaces cannot be used here, or None if they can (for test skips)."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    if not os.path.exists(TUN_DEVICE):
        return f"{TUN_DEVICE} is missing (kernel without CONFIG_TUN?)"
    probe = f"{NAME_PREFIX}{os.getpid()}x{next(_lan_counter)}-probe"
    try:
        _run(["ip", "netns", "add", probe])
        _run(["ip", "-n", probe, "link", "set", "lo", "up"])
        # `ip netns exec` also remounts /sys, which some containers forbid.
        _run(["ip", "netns", "exec", probe, sys.executable, "-c", "pass"])
    except NetnsError as exc:
        return f"cannot create network namespaces here: {exc}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return None


def _run(command: list[str], check: bool = True) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    except FileNotFoundError:
        raise NetnsError(f"`{command[0]}` is not installed (iproute2)") from None
    except subprocess.TimeoutExpired:
        raise NetnsError(f"`{' '.join(command)}` took over {IP_TIMEOUT_S} s") from None
    if check and result.returncode != 0:
        hint = " (are you root?)" if "Operation not permitted" in result.stderr else ""
        raise NetnsError(f"`{' '.join(command)}` failed: {result.stderr.strip()}{hint}")
    return result


class NetnsLan:
    """N node namespaces on one switch; use as a context manager."""

    def __init__(self, nodes: int, seed: int = 0) -> None:
        if not 1 <= nodes <= MAX_LAN_NODES:
            raise ValueError(f"nodes must be in [1, {MAX_LAN_NODES}]")
        serial = next(_lan_counter)
        self.prefix = f"{NAME_PREFIX}{os.getpid()}x{serial}"
        # The subnet only has to be unique inside this LAN; varying it per run
        # keeps the addresses in logs of parallel runs apart.
        self.subnet = (os.getpid() + serial) % 256
        self.namespaces = [f"{self.prefix}-{i}" for i in range(nodes)]
        # TAPs are born in our namespace before moving: short, unique names (<= 15 bytes).
        self._tap_names = [f"mt{os.getpid():x}{serial:x}-{i}" for i in range(nodes)]
        self.seed = seed
        self.wire: Wire | None = None
        self._created: list[str] = []

    def address(self, index: int) -> str:
        """Node `index`'s IPv4 address."""
        return f"{SUBNET_BASE}.{self.subnet}.{index + HOST_OFFSET}"

    def exec_prefix(self, index: int) -> list[str]:
        """Prepend to a command to run it inside node `index`'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[index]]

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> "NetnsLan":
        try:
            self.create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def create(self) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise NetnsError(reason)
        fds: list[int] = []
        try:
            for i, ns in enumerate(self.namespaces):
                _run(["ip", "netns", "add", ns])
                self._created.append(ns)
                try:
                    fds.append(open_tap(self._tap_names[i]))
                except OSError as exc:
                    raise NetnsError(f"cannot create TAP {self._tap_names[i]}: {exc}") from None
                _run(["ip", "link", "set", self._tap_names[i], "netns", ns])
                _run(["ip", "-n", ns, "link", "set", self._tap_names[i], "name", NODE_INTERFACE])
                _run(["ip", "-n", ns, "addr", "add", f"{self.address(i)}/{PREFIX_LENGTH}",
                      "dev", NODE_INTERFACE])
                _run(["ip", "-n", ns, "link", "set", NODE_INTERFACE, "up"])
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        self.wire = Wire(fds, seed=self.seed)
        self.wire.start()

    def close(self) -> None:
        """Stop the switch and delete every namespace this LAN made; idempotent."""
        if self.wire is not None:
            self.wire.stop()
            self.wire = None
        for ns in reversed(self._created):
            _run(["ip", "netns", "del", ns], check=False)
        self._created.clear()

    # ------------------------------------------------------------------ impairments

    def set_netem(self, delay_ms: float = 0.0, loss_percent: float = 0.0,
                  jitter_ms: float = 0.0, indices: Sequence[int] | None = None) -> None:
        """Shape what the given (default: all) nodes send; replaces earlier settings."""
        netem = Netem(delay_ms=delay_ms, jitter_ms=jitter_ms, loss_percent=loss_percent)
        wire = self._running_wire()
        for i in self._indices(indices):
            wire.set_netem(i, netem)

    def clear_netem(self, indices: Sequence[int] | None = None) -> None:
        self.set_netem(indices=indices)

    def partition(self, groups: Sequence[Sequence[int]]) -> None:
        """Only nodes in the same group can talk; nodes in no group are cut off entirely."""
        listed = [i for group in groups for i in group]
        if len(listed) != len(set(listed)):
            raise ValueError("a node is in more than one group")
        self._indices(listed)  # validates
        membership: list[int | None] = [None] * len(self.namespaces)
        for k, group in enumerate(groups):
            for i in group:
                membership[i] = k
        self._running_wire().set_groups(membership)

    def heal(self) -> None:
        """Every node can reach every other again."""
        self._running_wire().set_groups([0] * len(self.namespaces))

    def _running_wire(self) -> Wire:
        if self.wire is None:
            raise NetnsError("the LAN is not running (use `with NetnsLan(...)`)")
        return self.wire

    def _indices(self, indices: Sequence[int] | None) -> list[int]:
        if indices is None:
            return list(range(len(self.namespaces)))
        for i in indices:
            if not 0 <= i < len(self.namespaces):
                raise ValueError(f"no node {i} in a LAN of {len(self.namespaces)}")
        return list(indices)


def existing_namespaces() -> list[str]:
    """Names of the namespaces this module made that still exist (any run)."""
    result = _run(["ip", "netns", "list"], check=False)
    names = [line.split()[0] for line in result.stdout.splitlines() if line.strip()]
    return [name for name in names if _NAMESPACE_NAME.match(name)]


def cleanup_stale() -> list[str]:
    """Delete namespaces left by runs whose process no longer exists; their names."""
    removed = []
    for name in existing_namespaces():
        match = _NAMESPACE_NAME.match(name)
        assert match is not None
        if not os.path.exists(f"/proc/{match.group(1)}"):
            _run(["ip", "netns", "del", name], check=False)
            removed.append(name)
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.netns",
                                     description="List (or clean up) megnode test namespaces.")
    parser.add_argument("--cleanup", action="store_true",
                        help="delete namespaces left by test runs that are gone")
    args = parser.parse_args(argv)
    if args.cleanup:
        for name in cleanup_stale():
            print(f"deleted {name}")
        return 0
    for name in existing_namespaces():
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
