"""A userspace Ethernet switch between TAP devices, with delay, loss and partitions.

`tc netem` is the usual way to add delay and loss, but it needs the kernel's
sch_netem, which many VM and CI kernels leave out (this project's dev VM has
`# CONFIG_NET_SCH_NETEM is not set`, and no gact drop action either). A TAP
device only needs CONFIG_TUN: every Ethernet frame a node's kernel sends comes
out of the TAP's file descriptor here, and what we write to a descriptor
arrives at that node. So `Wire` is the LAN: a small MAC-learning switch on
one thread that, per frame,

* drops it with the sender's loss probability (netem semantics: on egress),
* holds it for the sender's delay (± jitter) before forwarding it,
* forwards it only to ports in the sender's partition group.

The shaping is on the sender's side, as netem on each node's interface
would be: with delay D everywhere, a round trip takes 2·D. A full TAP queue
on the receiving side drops the frame, as a congested link would. Random
choices come from one seeded `random.Random`, so a loss pattern is
reproducible for a given frame sequence (the kernels' timing is not).
"""

from __future__ import annotations

import fcntl
import heapq
import os
import random
import select
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

TUN_DEVICE = "/dev/net/tun"
TUNSETIFF = 0x400454CA  # linux/if_tun.h
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000  # frames without the 4-byte packet-info header
MAX_FRAME_BYTES = 65_536  # more than any MTU we set; the kernel segments before the TAP
MAX_QUEUED_FRAMES = 100_000  # frames held for delay; beyond this new ones are dropped
MAX_DELAY_MS = 10_000
IDLE_WAIT_S = 0.5  # select timeout with nothing queued; stop() wakes it earlier
JOIN_TIMEOUT_S = 5.0
_BROADCAST_BIT = 0x01  # the I/G bit of the destination MAC: multicast or broadcast


@dataclass(frozen=True, slots=True)
class Netem:
    """One port's impairment on what its node sends; the default is a clean link."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_percent: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.delay_ms <= MAX_DELAY_MS:
            raise ValueError(f"delay_ms must be in [0, {MAX_DELAY_MS}]")
        if not 0 <= self.jitter_ms <= self.delay_ms:
            raise ValueError("jitter_ms must be in [0, delay_ms]")
        if not 0 <= self.loss_percent <= 100:
            raise ValueError("loss_percent must be in [0, 100]")


def open_tap(name: str) -> int:
    """Create TAP device `name` in the caller's namespace; its non-blocking descriptor."""
    fd = os.open(TUN_DEVICE, os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


class Wire:
    """The switch; `start()` runs it on a daemon thread, `stop()` ends it and closes the TAPs."""

    def __init__(self, tap_fds: Sequence[int], seed: int = 0) -> None:
        self._fds = list(tap_fds)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()  # guards the settings below against the control thread
        self._netem = [Netem() for _ in self._fds]
        self._group = [0] * len(self._fds)  # ports talk only within their group; None = cut off
        self._macs: dict[bytes, int] = {}  # learned source MAC -> port
        self._queue: list[tuple[float, int, int, bytes]] = []  # (due, seq, port, frame)
        self._seq = 0
        self._wake_read, self._wake_write = os.pipe()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.stats = {"forwarded": 0, "lost": 0, "cut": 0, "overflow": 0}

    # ------------------------------------------------------------------ control

    def set_netem(self, port: int, netem: Netem) -> None:
        with self._lock:
            self._netem[port] = netem

    def set_groups(self, groups: Sequence[int | None]) -> None:
        """Each port's group (None: isolated); frames cross only within a group."""
        if len(groups) != len(self._fds):
            raise ValueError("one group per port")
        with self._lock:
            self._group = list(groups)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="netwire", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        os.write(self._wake_write, b"x")
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT_S)
        for fd in (*self._fds, self._wake_read, self._wake_write):
            try:
                os.close(fd)
            except OSError:
                pass  # already closed by an earlier stop()
        self._fds = []

    # ------------------------------------------------------------------ the switch

    def _run(self) -> None:
        readers = [*self._fds, self._wake_read]
        port_of = {fd: port for port, fd in enumerate(self._fds)}
        while not self._stopping:
            timeout = IDLE_WAIT_S
            if self._queue:
                timeout = max(0.0, self._queue[0][0] - time.monotonic())
            try:
                ready, _, _ = select.select(readers, [], [], timeout)
            except (OSError, ValueError):
                return  # descriptors closed under us: stop() is running
            for fd in ready:
                if fd == self._wake_read:
                    continue
                self._read_port(port_of[fd], fd)
            self._flush_due()

    def _read_port(self, port: int, fd: int) -> None:
        while True:
            try:
                frame = os.read(fd, MAX_FRAME_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # the TAP went away (namespace deleted); nothing more to read
            if len(frame) < 14:
                continue  # not an Ethernet frame
            self._accept(port, frame)

    def _accept(self, port: int, frame: bytes) -> None:
        with self._lock:
            netem = self._netem[port]
            groups = self._group
            self._macs[frame[6:12]] = port
            if netem.loss_percent and self._rng.random() * 100 < netem.loss_percent:
                self.stats["lost"] += 1
                return
            destinations = self._destinations(port, frame[0:6])
            allowed = [p for p in destinations
                       if groups[port] is not None and groups[p] == groups[port]]
            self.stats["cut"] += len(destinations) - len(allowed)
            delay_s = netem.delay_ms / 1_000
            if netem.jitter_ms:
                delay_s += self._rng.uniform(-netem.jitter_ms, netem.jitter_ms) / 1_000
        due = time.monotonic() + delay_s
        for destination in allowed:
            if len(self._queue) >= MAX_QUEUED_FRAMES:
                self.stats["overflow"] += 1
                continue
            self._seq += 1
            heapq.heappush(self._queue, (due, self._seq, destination, frame))

    def _destinations(self, port: int, mac: bytes) -> list[int]:
        if not mac[0] & _BROADCAST_BIT and mac in self._macs:
            known = self._macs[mac]
            return [] if known == port else [known]
        return [p for p in range(len(self._fds)) if p != port]  # flood, as a switch does

    def _flush_due(self) -> None:
        now = time.monotonic()
        while self._queue and self._queue[0][0] <= now:
            _, _, port, frame = heapq.heappop(self._queue)
            try:
                os.write(self._fds[port], frame)
                self.stats["forwarded"] += 1
            except BlockingIOError:
                self.stats["overflow"] += 1  # the node's receive queue is full: dropped
            except OSError:
                pass  # the TAP went away during teardown
