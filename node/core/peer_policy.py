"""The peer policy: who is banned, which faults count, when to redial. Sans-IO.

Theory of operation
-------------------
A node judges its peers on what they did, and this module holds every such
judgement, so that the trio runtime and the seeded simulator make the very
same decisions. It never reads a clock, sleeps, dials or opens a socket:
each input carries its `now_ms`, randomness (the redial jitter) comes from an
injected `random.Random`, and each method returns a list of effects for the
caller to carry out:

    input (with now_ms)                       effects
    ----------------------------------------  -----------------------------------
    misbehaviour(peer, reason)   (the core's   Banned, Abort
        `Disconnect` effect)
    protocol_fault(peer, reason)              Count; at the window threshold
                                              Count("transport_bans"), Banned, Abort
    breakage(peer, reason)                    Count, Note (never a ban)
    peer_up(peer)                             Abort if banned, else nothing
    peer_down(peer, dialable)                 Redial(peer, at_ms) if wanted
    redial_due(peer)                          Dial(peer), or nothing (up / banned /
                                              given up)
    dial_failed(peer) / dial_succeeded(peer)  Redial later or GaveUp / nothing
    reset(peer)   (news that the peer is      Dial(peer) now if it is being redialled;
        reachable: a fresh address)           its backoff and give-up clock start over
    tick(connected peers)                     Abort for every connected banned peer;
                                              expired bans are forgotten

Peers are named by one string the caller chooses (the runtime uses node
ids, the hex of the ed25519 key); the policy never converts names.

Why each rule:

* A peer the core reports (`Disconnect`: its misbehaviour score reached the
  threshold) or that breaks our stream framing TRANSPORT_FAULTS_BEFORE_BAN
  times within TRANSPORT_FAULT_WINDOW_MS is banned for BAN_DURATION_MS the
  first time, BAN_GROWTH times longer at each repeat offence, up to
  MAX_BAN_DURATION_MS: a peer that comes back from its ban and misbehaves
  again is a deliberate one, and a fixed ban would let it return every ten
  minutes. Offences are forgotten OFFENCE_MEMORY_MS after the last one.
  An oversized frame weighs OVERSIZED_FRAME_WEIGHT faults: our own encoder
  never makes one (`MAX_FRAME_BYTES`), so one is enough to ban. Framing faults
  come over an authenticated channel, so they are the peer's code, not line
  noise; still one could be our own bug, and a ban splits the fleet, so one
  fault is not enough. Breakages (a stream cut mid-frame by its dying
  connection) are what a dead connection looks like and never count.
* A ban is enforced on every tick against the peers connected then, not only
  on "peer up": a banned peer that dials again while its old connection is
  being torn down gets no new "up".
* A wanted peer whose connection died is redialled with exponential backoff
  from REDIAL_FIRST_MS (jittered: both sides of a dead connection redial, and
  the jitter keeps their dials from crossing every time) to REDIAL_MAX_MS,
  until it is up, banned, or REDIAL_GIVE_UP_MS passed since it went down.
  The backoff is per outage: a connection that comes up (we dialled, or it
  dialled us: an inbound connection, an explicit `connect`) ends the
  redial, so the next outage starts again from REDIAL_FIRST_MS. News that
  the peer is reachable (peer exchange or mDNS naming an address for it)
  `reset`s a running redial: dialled at once, backoff from the start.
* Every table is bounded by a named constant; when full, expired entries go
  first, then the oldest.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

TRANSPORT_FAULTS_BEFORE_BAN = 3
TRANSPORT_FAULT_WINDOW_MS = 10 * 60 * 1_000
BAN_DURATION_MS = 10 * 60 * 1_000  # a peer disconnected for misbehaviour stays out this long
BAN_GROWTH = 4  # each repeat offence bans this many times longer: 10 min, 40 min, 2 h 40, ...
MAX_BAN_DURATION_MS = 24 * 60 * 60 * 1_000  # ... up to a day
OFFENCE_MEMORY_MS = 7 * 24 * 60 * 60 * 1_000  # a peer's offences are forgotten a week after the last
# Transport faults one frame counts for, by the transport's reason string
# (`transport.libp2p_streams.OVERSIZED_FRAME`; a test checks they agree).
OVERSIZED_FRAME_REASON = "oversized_frame"
OVERSIZED_FRAME_WEIGHT = TRANSPORT_FAULTS_BEFORE_BAN
FAULT_WEIGHTS = {OVERSIZED_FRAME_REASON: OVERSIZED_FRAME_WEIGHT}  # any other reason: 1

REDIAL_FIRST_MS = 1_000
REDIAL_JITTER = 1.0  # the first delay is REDIAL_FIRST_MS * (1 + up to this fraction)
REDIAL_MAX_MS = 30_000
REDIAL_GIVE_UP_MS = 15 * 60 * 1_000  # a peer gone this long has left; bootstrap/mDNS bring it back

# Bootstrap addresses are dialled until they answer, without jitter (one side dials).
BOOTSTRAP_RETRY_MS = 2_000
BOOTSTRAP_RETRY_MAX_MS = 30_000

MAX_BANS = 4_096  # banned peers remembered (expired first, then the soonest to expire, go)
MAX_FAULT_PEERS = 4_096  # peers whose recent protocol faults are remembered (oldest go)
MAX_REDIALS = 4_096  # peers being redialled at once (the longest-pursued go)
MAX_OFFENDERS = 4_096  # peers whose past offences are remembered (the oldest go)


class Reason(str, Enum):
    """Why the policy dropped or banned a peer (the string is what logs show)."""

    BANNED = "banned"  # still banned: a connection that came up is aborted at once
    MISBEHAVIOUR = "misbehaviour"  # the core counted too many invalid events
    TRANSPORT = "transport"  # too many protocol faults on our streams


@dataclass(frozen=True, slots=True)
class Abort:
    """Drop every connection to `peer` now (no goodbye it could stall)."""

    peer: str
    reason: str


@dataclass(frozen=True, slots=True)
class Banned:
    """`peer` is banned until `until_ms` (recorded here; for logs and metrics)."""

    peer: str
    until_ms: int
    reason: str


@dataclass(frozen=True, slots=True)
class Redial:
    """Call `redial_due(peer, now)` at `at_ms`."""

    peer: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class Dial:
    """Dial `peer` now (each known address once), then report dial_failed/dial_succeeded."""

    peer: str


@dataclass(frozen=True, slots=True)
class GaveUp:
    """Redialling `peer` stopped: it stayed away longer than REDIAL_GIVE_UP_MS."""

    peer: str


@dataclass(frozen=True, slots=True)
class Count:
    """Add `by` to the node's stat `name`."""

    name: str
    by: int = 1


@dataclass(frozen=True, slots=True)
class Note:
    """A line for the operator's log (`warning` for bans, otherwise info)."""

    message: str
    warning: bool = False


Effect = Abort | Banned | Redial | Dial | GaveUp | Count | Note


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential delays: `first_ms` (times 1 + up to `jitter`), doubling up to `max_ms`."""

    first_ms: int
    max_ms: int
    jitter: float = 0.0

    def first(self, rng: random.Random | None = None) -> int:
        spread = self.jitter * rng.random() if self.jitter and rng is not None else 0.0
        return int(self.first_ms * (1 + spread))

    def next(self, delay_ms: int) -> int:
        return min(delay_ms * 2, self.max_ms)


REDIAL_BACKOFF = Backoff(REDIAL_FIRST_MS, REDIAL_MAX_MS, REDIAL_JITTER)
BOOTSTRAP_BACKOFF = Backoff(BOOTSTRAP_RETRY_MS, BOOTSTRAP_RETRY_MAX_MS)


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    ban_ms: int = BAN_DURATION_MS
    ban_growth: int = BAN_GROWTH
    max_ban_ms: int = MAX_BAN_DURATION_MS
    offence_memory_ms: int = OFFENCE_MEMORY_MS
    max_offenders: int = MAX_OFFENDERS
    faults_before_ban: int = TRANSPORT_FAULTS_BEFORE_BAN
    fault_window_ms: int = TRANSPORT_FAULT_WINDOW_MS
    redial: Backoff = REDIAL_BACKOFF
    redial_give_up_ms: int = REDIAL_GIVE_UP_MS
    max_bans: int = MAX_BANS
    max_fault_peers: int = MAX_FAULT_PEERS
    max_redials: int = MAX_REDIALS


@dataclass(slots=True)
class _Redialling:
    down_ms: int  # when the peer went down: the give-up clock starts here
    delay_ms: int  # the wait before the next attempt after a failure
    due_ms: int


class PeerPolicy:
    """Bans, fault windows and redial backoff for one node's peers (see the module doc)."""

    def __init__(self, rng: random.Random, config: PolicyConfig = PolicyConfig()) -> None:
        self._rng = rng
        self.config = config
        self._bans: OrderedDict[str, int] = OrderedDict()  # peer -> banned until (ms)
        self._faults: OrderedDict[str, list[int]] = OrderedDict()  # peer -> recent fault times
        self._redials: OrderedDict[str, _Redialling] = OrderedDict()
        self._offences: OrderedDict[str, tuple[int, int]] = OrderedDict()  # peer -> (count, last ms)

    # ------------------------------------------------------------------ queries

    def is_banned(self, peer: str, now_ms: int) -> bool:
        return self._bans.get(peer, 0) > now_ms

    def bans(self) -> dict[str, int]:
        """A copy of the ban table: peer -> ms until which it is banned (expired ones too,
        until the next tick forgets them)."""
        return dict(self._bans)

    def redialling(self) -> tuple[str, ...]:
        return tuple(self._redials)

    def redial_state(self, peer: str) -> tuple[int, int, int] | None:
        """(down since, current backoff delay, next dial due), all ms; None if not redialled."""
        state = self._redials.get(peer)
        return None if state is None else (state.down_ms, state.delay_ms, state.due_ms)

    def faults(self, peer: str) -> int:
        """Protocol faults of `peer` still inside the window (as of its last fault)."""
        return len(self._faults.get(peer, ()))

    # ------------------------------------------------------------------ misbehaviour

    def record_ban(self, peer: str, until_ms: int, now_ms: int, reason: str) -> list[Effect]:
        """Ban `peer` until `until_ms` (extending, never shortening, a ban it has)."""
        until = max(until_ms, self._bans.get(peer, 0))
        self._bans[peer] = until
        self._bans.move_to_end(peer)
        self._redials.pop(peer, None)
        self._bound_bans(now_ms)
        return [Banned(peer, until, reason), Abort(peer, reason),
                Note(f"disconnecting peer {peer}: {reason}", warning=True)]

    def offences(self, peer: str) -> int:
        """Bans `peer` earned that are still remembered (OFFENCE_MEMORY_MS)."""
        return self._offences.get(peer, (0, 0))[0]

    def ban_duration(self, offence: int) -> int:
        """How long the `offence`-th ban (1, 2, ...) lasts: growing, capped."""
        config = self.config
        growth = config.ban_growth ** min(offence - 1, 64)  # bounded exponent: no huge ints
        return min(config.ban_ms * growth, config.max_ban_ms)

    def misbehaviour(self, peer: str, reason: str, now_ms: int) -> list[Effect]:
        """The core gave up on `peer` (its `Disconnect` effect): ban it, longer each time."""
        count, last = self._offences.pop(peer, (0, now_ms))
        if now_ms - last >= self.config.offence_memory_ms:
            count = 0
        count += 1
        self._offences[peer] = (count, now_ms)
        while len(self._offences) > self.config.max_offenders:
            self._offences.popitem(last=False)
        return self.record_ban(peer, now_ms + self.ban_duration(count), now_ms, reason)

    def protocol_fault(self, peer: str, reason: str, now_ms: int,
                       detail: str = "") -> list[Effect]:
        """A framing fault on `peer`'s stream: counted (FAULT_WEIGHTS times); the
        threshold-th in the window bans."""
        window = self.config.fault_window_ms
        recent = [t for t in self._faults.pop(peer, ()) if now_ms - t < window]
        recent += [now_ms] * FAULT_WEIGHTS.get(reason, 1)
        out: list[Effect] = [Count("transport_faults"),
                             Note(f"peer {peer}: transport fault {reason} ({detail})")]
        if len(recent) >= self.config.faults_before_ban:
            out.append(Count("transport_bans"))
            return out + self.misbehaviour(peer, f"transport:{reason}", now_ms)
        self._faults[peer] = recent  # re-inserted: the newest entry is at the end
        while len(self._faults) > self.config.max_fault_peers:
            self._faults.popitem(last=False)
        return out

    def breakage(self, peer: str, reason: str, detail: str = "") -> list[Effect]:
        """A stream cut mid-frame by its dying connection: logged and counted, never held
        against the peer."""
        return [Count("transport_breakages"),
                Note(f"peer {peer}: stream broke ({reason}: {detail}); not counted as a fault")]

    # ------------------------------------------------------------------ connections

    def peer_up(self, peer: str, now_ms: int) -> list[Effect]:
        """A connection to `peer` opened: aborted if banned; a redial of it stops."""
        if self.is_banned(peer, now_ms):
            return [Abort(peer, Reason.BANNED.value)]
        self._redials.pop(peer, None)
        return []

    def peer_down(self, peer: str, now_ms: int, dialable: bool = True) -> list[Effect]:
        """`peer`'s last connection closed: redial it if we can and still want it."""
        if not dialable or self.is_banned(peer, now_ms) or peer in self._redials:
            return []
        first = self.config.redial.first(self._rng)
        self._redials[peer] = _Redialling(now_ms, first, now_ms + first)
        while len(self._redials) > self.config.max_redials:
            self._redials.popitem(last=False)
        return [Redial(peer, now_ms + first)]

    def redial_due(self, peer: str, now_ms: int, connected: bool = False,
                   wanted: bool = True) -> list[Effect]:
        """A `Redial` time came: dial, unless the peer is back (`connected`: it dialled
        us), banned, no longer `wanted` (the caller's say: e.g. it is a relayed device),
        or was given up."""
        state = self._redials.get(peer)
        if state is None or now_ms < state.due_ms:
            return []  # stale timer: the peer came up (or was re-armed) meanwhile
        if connected or not wanted or self.is_banned(peer, now_ms):
            del self._redials[peer]
            return []
        return [Dial(peer)]

    def dial_failed(self, peer: str, now_ms: int) -> list[Effect]:
        """Every address of `peer` failed: wait longer, or give up."""
        state = self._redials.get(peer)
        if state is None:
            return []
        if now_ms - state.down_ms >= self.config.redial_give_up_ms:
            del self._redials[peer]
            return [GaveUp(peer), Note(f"gave up redialling {peer} after "
                                       f"{self.config.redial_give_up_ms} ms")]
        state.delay_ms = self.config.redial.next(state.delay_ms)
        state.due_ms = now_ms + state.delay_ms
        return [Redial(peer, state.due_ms)]

    def reset(self, peer: str, now_ms: int) -> list[Effect]:
        """News that `peer` is reachable: a running redial dials now, its backoff and
        give-up clock start over. Nothing for a peer not being redialled."""
        state = self._redials.get(peer)
        if state is None or self.is_banned(peer, now_ms):
            return []
        state.down_ms = now_ms
        state.delay_ms = self.config.redial.first_ms
        state.due_ms = now_ms
        return [Dial(peer)]

    def dial_succeeded(self, peer: str) -> list[Effect]:
        self._redials.pop(peer, None)
        return [Count("redials")]

    def tick(self, now_ms: int, connected: Iterable[str]) -> list[Effect]:
        """Forget expired bans; abort every connected peer that is banned."""
        for peer in [p for p, until in self._bans.items() if until <= now_ms]:
            del self._bans[peer]
        if not self._bans:
            return []
        return [Abort(peer, Reason.BANNED.value) for peer in connected if peer in self._bans]

    # ------------------------------------------------------------------ bounds

    def _bound_bans(self, now_ms: int) -> None:
        if len(self._bans) <= self.config.max_bans:
            return
        for peer in [p for p, until in self._bans.items() if until <= now_ms]:
            del self._bans[peer]
        while len(self._bans) > self.config.max_bans:
            del self._bans[min(self._bans, key=self._bans.__getitem__)]  # soonest to expire
