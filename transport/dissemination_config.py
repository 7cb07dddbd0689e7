"""How the dissemination engine behaves: `DisseminationConfig` and its named limits.

One frozen value per engine, checked when built, so a bad setting fails at
start-up rather than as a stuck exchange. The defaults a deployed node shares
with the simulator (sync interval, misbehaviour threshold) live in
`transport.defaults`; the reconciliation's own knobs (depth window, Bloom
filter) in `transport.reconcile`; the dummy backoff in `transport.depletion`.
What is left here are the fast path's shape (random push or the eager/lazy
tree of `transport.eager_lazy`, whose timers live there), the push fan-outs, the timers, the per-peer budgets
(defaults in `transport.peer_budget` and `transport.misbehaviour`) and the
memory bounds of the engine (`transport.dissemination`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from transport.defaults import (
    DEFAULT_SYNC_INTERVAL_MS,
    DEFAULT_SYNC_JITTER_MS,
    MISBEHAVIOUR_THRESHOLD,
)
from transport.depletion import DEFAULT_DEPLETION_BACKOFF_MS, DepletionMode
from transport.eager_lazy import (
    GRAFT_TIMEOUT_MS,
    IHAVE_FLUSH_MS,
    PRUNE_AFTER_DUPLICATES,
    SYNC_HOLD_MS,
)
from transport.intake_budget import (PEER_BYTES_BURST, PEER_BYTES_PER_S, PEER_EVENTS_BURST,
                                     PEER_EVENTS_PER_S, WANTS_IN_FLIGHT_PER_PEER)
from transport.misbehaviour import STRAY_ALLOWANCE_BURST, STRAY_ALLOWANCE_PER_S
from transport.messages import (
    FRAME_HEADROOM_BYTES,
    MAX_BLOOM_HASHES,
    MAX_EVENTS_PER_MESSAGE,
    MAX_FRAME_BYTES,
)
from transport.peer_budget import (
    AMPLIFICATION_FACTOR,
    ANSWER_ALLOWANCE_BYTES,
    ANSWER_REFILL_BYTES_PER_S,
    OFFER_BURST,
    OFFERS_PER_S,
)
from transport.reconcile import (
    BLOOM_BITS_PER_ITEM,
    BLOOM_HASHES,
    INITIAL_WINDOW_DEPTH,
    MAX_BLOOM_ITEMS,
    WINDOW_GROWTH,
)

DEFAULT_PUSH_FANOUT: Final = 6  # GossipSub's D: copies of each new event its author sends
# Copies a relay sends of an event it accepted first by push (once per event).
# Infect-and-die with fanout k reaches the fraction z = 1 - exp(-k z) of a
# large mesh by push alone (k=3: ~94%, plus the author's wider first hop);
# each replica then receives about k copies of each event, so duplicates per
# event grow as n·(k-1) instead of n·(push_fanout-1). docs/anti-entropy.md
# has the simulator's figures for 5..50 replicas.
DEFAULT_FORWARD_FANOUT: Final = 3
# Lazy links an event's id is announced on (transport.eager_lazy), at random among
# them. Plumtree announces on all; each node has several lazy links, and each id
# costs ~40 bytes on each: with a few per event a node missing a push still hears
# of it from about that many neighbours (anti-entropy covers the rest), at a
# fraction of the bytes. docs/anti-entropy.md has the figures.
DEFAULT_LAZY_FANOUT: Final = 2
DEFAULT_WANT_RETRY_MS: Final = 500  # > a few one-way latencies: gives push a chance first
# An exchange with no answer for this long counts as lost and the peer may be
# offered to again (a late answer's events are still used). Far above a
# round trip, but short enough that lost replies do not idle a node's peers.
DEFAULT_SESSION_TIMEOUT_MS: Final = 2_000
DEFAULT_MAX_SESSION_ROUNDS: Final = 16  # fruitless offers in one exchange (window growth, FP retries)
DEFAULT_WIDTH_SAMPLE_MS: Final = 1_000
REPLY_MAX_BYTES: Final = MAX_FRAME_BYTES - FRAME_HEADROOM_BYTES  # event bytes in one answer
MAX_WANT_SOURCES: Final = 65_536  # remembered "who sent the child of this missing parent"
MAX_PEER_STATES: Final = 65_536  # remembered (peer, topic) -> last common heads
# Ids a peer was last seen holding, per (peer, topic): it pushed, announced or
# offered them. The next offer to it names them in `since` (its filter then covers
# only what the peer has not shown it holds); deepest first, the newest of them.
MAX_WITNESSED_IDS: Final = 16
MAX_WITNESSED_STATES: Final = 4_096  # (peer, topic) pairs with witnessed ids
# Catch-up pages received and not yet applied for which the next page is already
# asked for (`AntiEntropy.prefetch`): 2 pages of up to 1,024 events are a few
# hundred ms of verifying and storing, more than a round trip on any link the
# node serves, so the peer is never idle while we verify; few enough that what
# is asked ahead stays what the node can take in (the committer's queue bounds
# the bytes).
PAGES_AHEAD: Final = 2
MAX_JOIN_ASKS: Final = 16  # peers one `request_join` asks (transport.join_handshake)
# A join its sponsor never passed on (transport.join_handshake): a member that refused
# a frame of a peer it counts as only invited tells it so (`JoinMissing`) at most
# this often per (topic, peer), and the peer resubmits its join to that member at
# most this often. Rare (a sponsor banned or gone before passing a join on), cheap
# (one small frame, one event), and a frame a second would be no faster: the member
# that takes the join in serves the rest by exchange.
JOIN_NUDGE_MS: Final = 5_000
MAX_JOIN_NUDGES: Final = 1_024  # (topic, peer) pairs remembered for that, oldest dropped
# Unasked, a joined member tells each connected peer its state counts as invited only
# that it lacks its join: at first after JOIN_NUDGE_MS, then twice as long each time, up
# to this. Two members each joined in a view without the other's join send each other
# nothing, so only this starts their repair; an invitee that never joins costs one
# small frame this often.
MAX_JOIN_NUDGE_INTERVAL_MS: Final = 60_000
INVITED_SCAN_MS: Final = 1_000  # how often a topic's connected invitees are looked at for it
# A resubmitted join whose past the member lacks: it asks the joiner (only it holds
# that past for sure) for the missing parents, wave after wave, while each wave
# brings something, for at most this long without progress, in at most this many
# waves, for this many joiners at once.
JOIN_FETCH_MS: Final = 10_000
MAX_JOIN_FETCH_WAVES: Final = 256
MAX_JOIN_FETCHES: Final = 64
# Buffered events the walk of a join's missing past visits (one Want's ids at most).
MAX_JOIN_PAST_WALK: Final = 4_096
# A member banned or kicked may still fetch the past of its removal, which it was
# joined to read, so that its node can apply the removal and tell its app
# (`Disseminator._on_removed_want`). The walk down from the removal that checks each
# asked id visits at most this many events; ids it does not reach are not served.
MAX_REMOVAL_PAST_WALK: Final = 4_096


@dataclass(frozen=True, slots=True)
class DisseminationConfig:
    """Every knob of one engine; `__post_init__` rejects values the wire or the timers cannot honour."""

    push: bool = True
    # With `push`: the eager/lazy tree (transport.eager_lazy) instead of random push:
    # new events go in full along a tree of eager links, their ids on the lazy ones.
    tree: bool = False
    graft_timeout_ms: int = GRAFT_TIMEOUT_MS  # an announced id not received by then is fetched
    prune_after: int = PRUNE_AFTER_DUPLICATES  # pushes over a lazy link before the prune is repeated
    lazy_fanout: int = DEFAULT_LAZY_FANOUT  # lazy links each new event's id is announced on
    announce_every_ms: int = IHAVE_FLUSH_MS  # (tree) pending announcements are sent this often
    sync_hold_ms: int = SYNC_HOLD_MS  # exchanges hold back events applied within this (tree)
    # The tree's timers (graft timeout, sync hold, parent silence) stretch to the measured
    # lateness of its copies when that is more (transport.tree_lateness).
    adaptive_timers: bool = True
    announce: bool = False  # emit `Announce` for local events (an external fast path)
    push_fanout: int = DEFAULT_PUSH_FANOUT
    forward_pushed: bool = True  # relay events first received by push
    forward_fanout: int = DEFAULT_FORWARD_FANOUT  # peers a relay forwards such an event to
    sync_interval_ms: int = DEFAULT_SYNC_INTERVAL_MS
    sync_jitter_ms: int = DEFAULT_SYNC_JITTER_MS
    sync_on_connect: bool = True
    sync_on_news: bool = True  # an exchange that brought events triggers one more (rumor mongering)
    want_retry_ms: int = DEFAULT_WANT_RETRY_MS
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS
    max_session_rounds: int = DEFAULT_MAX_SESSION_ROUNDS
    initial_window_depth: int = INITIAL_WINDOW_DEPTH
    window_growth: int = WINDOW_GROWTH
    use_peer_state: bool = True  # KH Algorithm 2's per-peer common heads
    # An offer's `since` also names ids the peer pushed, announced or offered
    # (`AntiEntropy._witness`): its filter covers what the fast path has not shown.
    since_from_fast_path: bool = True
    pipeline: bool = True  # ask for a catch-up's next page when one arrives (`prefetch`)
    bloom_bits_per_item: int = BLOOM_BITS_PER_ITEM
    bloom_hashes: int = BLOOM_HASHES
    max_bloom_items: int = MAX_BLOOM_ITEMS
    reply_max_events: int = MAX_EVENTS_PER_MESSAGE
    reply_max_bytes: int = REPLY_MAX_BYTES
    depletion: bool = True  # emit dummy events when the width is over the replica's threshold
    depletion_backoff_ms: int = DEFAULT_DEPLETION_BACKOFF_MS  # DepletionMode.BACKOFF's first wait
    depletion_mode: DepletionMode = DepletionMode.COORDINATED  # who writes the dummy
    width_sample_ms: int = DEFAULT_WIDTH_SAMPLE_MS
    misbehaviour_threshold: int = MISBEHAVIOUR_THRESHOLD
    # Per-peer budgets (transport.peer_budget, transport.misbehaviour say why).
    amplification_factor: float = AMPLIFICATION_FACTOR
    answer_allowance_bytes: int = ANSWER_ALLOWANCE_BYTES
    answer_refill_bytes_per_s: int = ANSWER_REFILL_BYTES_PER_S
    offers_per_s: float = OFFERS_PER_S
    offer_burst: int = OFFER_BURST
    stray_allowance_per_s: float = STRAY_ALLOWANCE_PER_S
    stray_allowance_burst: int = STRAY_ALLOWANCE_BURST
    peer_bytes_per_s: float = PEER_BYTES_PER_S  # transport.intake_budget
    peer_bytes_burst: int = PEER_BYTES_BURST
    peer_events_per_s: float = PEER_EVENTS_PER_S
    peer_events_burst: int = PEER_EVENTS_BURST
    wants_in_flight_per_peer: int = WANTS_IN_FLIGHT_PER_PEER
    log: bool = True  # build Log effects (the simulator turns this off when nobody reads them)

    def __post_init__(self) -> None:
        if not 1 <= self.reply_max_events <= MAX_EVENTS_PER_MESSAGE:
            raise ValueError("reply_max_events must be in [1, MAX_EVENTS_PER_MESSAGE]")
        if not 0 < self.reply_max_bytes <= REPLY_MAX_BYTES:
            raise ValueError("reply_max_bytes must be in (0, REPLY_MAX_BYTES]")
        if not 1 <= self.bloom_hashes <= MAX_BLOOM_HASHES or self.bloom_bits_per_item < 1:
            raise ValueError("Bloom filter needs >= 1 bit per item and 1..MAX_BLOOM_HASHES hashes")
        if self.max_bloom_items < 1:
            raise ValueError("max_bloom_items must be >= 1")
        if self.window_growth < 2 or self.initial_window_depth < 1:
            raise ValueError("the depth window must start >= 1 and grow by >= 2")
        if self.sync_jitter_ms < 0 or self.sync_jitter_ms >= self.sync_interval_ms:
            raise ValueError("sync_jitter_ms must be in [0, sync_interval_ms)")
        if self.graft_timeout_ms < 1 or self.prune_after < 1:
            raise ValueError("graft_timeout_ms and prune_after must be >= 1")
        if not 0 <= self.announce_every_ms < self.graft_timeout_ms:
            raise ValueError("announce_every_ms must be in [0, graft_timeout_ms): "
                             "an announcement must leave before a lost copy is fetched")
        if self.depletion_backoff_ms < 1:
            raise ValueError("depletion_backoff_ms must be >= 1")
        if self.amplification_factor < 0 or self.answer_allowance_bytes < 0:
            raise ValueError("amplification_factor and answer_allowance_bytes must be >= 0")
        if min(self.peer_bytes_per_s, self.peer_events_per_s) <= 0 \
                or min(self.peer_bytes_burst, self.peer_events_burst) < 1:
            raise ValueError("the intake budgets' rates must be > 0 and bursts >= 1")
        if self.wants_in_flight_per_peer < 1:
            raise ValueError("wants_in_flight_per_peer must be >= 1")
        if self.offers_per_s <= 0 or self.offer_burst < 1:
            raise ValueError("offers_per_s must be > 0 and offer_burst >= 1")
        if self.push_fanout < 0 or self.forward_fanout < 0 or self.lazy_fanout < 0:
            raise ValueError("push_fanout, forward_fanout and lazy_fanout must be >= 0")
