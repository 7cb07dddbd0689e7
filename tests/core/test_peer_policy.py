"""The peer policy on explicit clocks: bans, fault windows, redial backoff, bounds.

Pure: every input names its `now_ms`, so nothing here sleeps; the jitter
comes from a seeded `random.Random`.
"""

from __future__ import annotations

import random

import pytest

from transport.defaults import MISBEHAVIOUR_THRESHOLD
from node.core.peer_policy import (
    BAN_DURATION_MS,
    BOOTSTRAP_BACKOFF,
    REDIAL_FIRST_MS,
    REDIAL_GIVE_UP_MS,
    REDIAL_JITTER,
    REDIAL_MAX_MS,
    TRANSPORT_FAULT_WINDOW_MS,
    TRANSPORT_FAULTS_BEFORE_BAN,
    Abort,
    Backoff,
    Banned,
    Count,
    Dial,
    GaveUp,
    PeerPolicy,
    PolicyConfig,
    Redial,
)

T0 = 1_000_000


def policy(**changes) -> PeerPolicy:
    return PeerPolicy(random.Random(1), PolicyConfig(**changes))


def kinds(effects, kind):
    return [e for e in effects if isinstance(e, kind)]


def counts(effects) -> list[str]:
    return [e.name for e in effects if isinstance(e, Count)]


def test_one_misbehaviour_default_for_the_node_and_the_engine():
    from node.config import DEFAULT_PEER_MISBEHAVIOUR_LIMIT, NodeConfig
    from transport.dissemination import DisseminationConfig

    assert DEFAULT_PEER_MISBEHAVIOUR_LIMIT == MISBEHAVIOUR_THRESHOLD
    assert NodeConfig().peer_misbehaviour_limit == MISBEHAVIOUR_THRESHOLD
    assert DisseminationConfig().misbehaviour_threshold == MISBEHAVIOUR_THRESHOLD


# ------------------------------------------------------------------ bans


def test_misbehaviour_bans_for_the_ban_duration_and_aborts():
    p = policy()
    out = p.misbehaviour("bad", "bad_signature", T0)
    assert kinds(out, Banned) == [Banned("bad", T0 + BAN_DURATION_MS, "bad_signature")]
    assert kinds(out, Abort) == [Abort("bad", "bad_signature")]
    assert p.is_banned("bad", T0 + BAN_DURATION_MS - 1)
    assert not p.is_banned("bad", T0 + BAN_DURATION_MS)


def test_a_banned_peer_coming_up_is_aborted_until_the_ban_expires():
    p = policy()
    p.misbehaviour("bad", "x", T0)
    assert p.peer_up("bad", T0 + 1) == [Abort("bad", "banned")]
    assert p.peer_up("bad", T0 + BAN_DURATION_MS) == []


def test_tick_aborts_connected_banned_peers_and_forgets_expired_bans():
    p = policy()
    p.misbehaviour("bad", "x", T0)
    p.record_ban("old", until_ms=T0 + 5, now_ms=T0, reason="test")
    assert p.tick(T0 + 1, connected=["good", "bad", "old"]) == [
        Abort("bad", "banned"), Abort("old", "banned")]
    assert p.tick(T0 + 5, connected=["good", "bad", "old"]) == [Abort("bad", "banned")]
    assert set(p.bans()) == {"bad"}
    assert p.tick(T0 + BAN_DURATION_MS, connected=["bad"]) == []
    assert p.bans() == {}


def test_a_ban_is_extended_never_shortened():
    p = policy()
    p.record_ban("bad", T0 + 100, T0, "long")
    p.record_ban("bad", T0 + 10, T0, "short")
    assert p.bans() == {"bad": T0 + 100}


def test_the_ban_table_is_bounded_expired_then_soonest_to_expire_go_first():
    p = policy(max_bans=3)
    p.record_ban("expired", T0 + 1, T0, "x")
    p.record_ban("soon", T0 + 50, T0, "x")
    p.record_ban("late", T0 + 500, T0, "x")
    p.record_ban("later", T0 + 900, T0 + 10, "x")  # "expired" has expired by now
    assert set(p.bans()) == {"soon", "late", "later"}
    p.record_ban("latest", T0 + 1_000, T0 + 10, "x")
    assert set(p.bans()) == {"late", "later", "latest"}


# ------------------------------------------------------------------ transport faults


def test_protocol_faults_ban_at_the_threshold_within_the_window():
    p = policy()
    for n in range(1, TRANSPORT_FAULTS_BEFORE_BAN):
        out = p.protocol_fault("peer", "oversized", T0 + n)
        assert counts(out) == ["transport_faults"]
        assert not kinds(out, Abort)
        assert p.faults("peer") == n
    out = p.protocol_fault("peer", "oversized", T0 + TRANSPORT_FAULTS_BEFORE_BAN)
    assert counts(out) == ["transport_faults", "transport_bans"]
    assert kinds(out, Abort) == [Abort("peer", "transport:oversized")]
    assert p.is_banned("peer", T0 + TRANSPORT_FAULTS_BEFORE_BAN)
    assert p.faults("peer") == 0  # the count starts again after a ban


def test_faults_outside_the_window_do_not_add_up():
    p = policy()
    at = T0
    for _ in range(TRANSPORT_FAULTS_BEFORE_BAN * 3):
        out = p.protocol_fault("peer", "garbage", at)
        assert not kinds(out, Abort)
        at += TRANSPORT_FAULT_WINDOW_MS // (TRANSPORT_FAULTS_BEFORE_BAN - 1)
    assert not p.is_banned("peer", at)


def test_breakages_are_counted_never_held_against_the_peer():
    p = policy()
    for n in range(TRANSPORT_FAULTS_BEFORE_BAN * 5):
        out = p.breakage("peer", "incomplete", "cut")
        assert counts(out) == ["transport_breakages"]
    assert p.faults("peer") == 0 and not p.bans()


def test_the_fault_table_is_bounded_oldest_go_first():
    p = policy(max_fault_peers=2)
    for n, peer in enumerate(["a", "b", "c"]):
        p.protocol_fault(peer, "garbage", T0 + n)
    assert (p.faults("a"), p.faults("b"), p.faults("c")) == (0, 1, 1)


# ------------------------------------------------------------------ redial


def test_a_peer_that_went_down_is_redialled_with_jittered_doubling_backoff():
    p = policy()
    (redial,) = p.peer_down("peer", T0)
    first = redial.at_ms - T0
    assert REDIAL_FIRST_MS <= first <= REDIAL_FIRST_MS * (1 + REDIAL_JITTER)
    assert p.redial_due("peer", redial.at_ms - 1) == []  # not yet
    assert p.redial_due("peer", redial.at_ms) == [Dial("peer")]
    delays, now = [], redial.at_ms
    for _ in range(8):
        (redial,) = p.dial_failed("peer", now)
        delays.append(redial.at_ms - now)
        now = redial.at_ms
        assert p.redial_due("peer", now) == [Dial("peer")]
    assert delays[0] == min(2 * first, REDIAL_MAX_MS)
    assert all(b == min(2 * a, REDIAL_MAX_MS) for a, b in zip(delays, delays[1:]))
    assert delays[-1] == REDIAL_MAX_MS
    assert counts(p.dial_succeeded("peer")) == ["redials"]
    assert p.redialling() == ()


def test_the_jitter_comes_from_the_injected_random():
    firsts = {PeerPolicy(random.Random(seed)).peer_down("p", 0)[0].at_ms for seed in range(20)}
    assert len(firsts) > 10
    again = PeerPolicy(random.Random(3)).peer_down("p", 0)
    assert again == PeerPolicy(random.Random(3)).peer_down("p", 0)


def test_one_redial_per_peer_and_none_without_an_address():
    p = policy()
    assert p.peer_down("peer", T0, dialable=False) == []
    assert len(p.peer_down("peer", T0)) == 1
    assert p.peer_down("peer", T0 + 1) == []  # already being redialled


def test_a_peer_that_comes_back_or_is_banned_is_not_redialled():
    p = policy()
    (redial,) = p.peer_down("back", T0)
    assert p.peer_up("back", T0 + 1) == []
    assert p.redial_due("back", redial.at_ms) == []  # a stale timer
    (redial,) = p.peer_down("dialled-us", T0)
    assert p.redial_due("dialled-us", redial.at_ms, connected=True) == []
    assert p.redialling() == ()
    (redial,) = p.peer_down("bad", T0)
    p.misbehaviour("bad", "x", T0 + 1)
    assert p.redial_due("bad", redial.at_ms) == []
    assert p.peer_down("bad", T0 + 2) == []  # banned: not wanted


def test_redialling_gives_up_after_the_give_up_time():
    p = policy()
    (redial,) = p.peer_down("gone", T0)
    now = redial.at_ms
    attempts = 0
    while True:
        assert p.redial_due("gone", now) == [Dial("gone")]
        attempts += 1
        out = p.dial_failed("gone", now)
        if kinds(out, GaveUp):
            break
        (redial,) = kinds(out, Redial)
        now = redial.at_ms
    assert now - T0 >= REDIAL_GIVE_UP_MS
    assert now - T0 < REDIAL_GIVE_UP_MS + REDIAL_MAX_MS
    assert attempts < REDIAL_GIVE_UP_MS // REDIAL_MAX_MS + 10
    assert p.redialling() == ()


def test_the_redial_table_is_bounded():
    p = policy(max_redials=2)
    for n, peer in enumerate(["a", "b", "c"]):
        p.peer_down(peer, T0 + n)
    assert p.redialling() == ("b", "c")


@pytest.mark.parametrize("backoff,expected", [
    (BOOTSTRAP_BACKOFF, [2_000, 4_000, 8_000, 16_000, 30_000, 30_000]),
    (Backoff(100, 250), [100, 200, 250, 250, 250, 250]),
])
def test_backoff_without_jitter_doubles_to_its_bound(backoff, expected):
    delays = [backoff.first()]
    for _ in range(len(expected) - 1):
        delays.append(backoff.next(delays[-1]))
    assert delays == expected


def test_an_outage_ends_the_backoff_the_next_one_starts_from_the_first_delay():
    p = policy()
    (redial,) = p.peer_down("peer", T0)
    now = redial.at_ms
    for _ in range(5):  # the delay grows to its bound
        p.redial_due("peer", now)
        (redial,) = p.dial_failed("peer", now)
        now = redial.at_ms
    assert redial.at_ms - now >= 0 and p.redialling() == ("peer",)
    assert p.peer_up("peer", now) == []  # it dialled us (inbound) or `connect` reached it
    (redial,) = p.peer_down("peer", now + 1)
    assert redial.at_ms - (now + 1) <= REDIAL_FIRST_MS * (1 + REDIAL_JITTER)


def test_news_of_a_reachable_peer_resets_its_redial():
    p = policy()
    assert p.reset("unknown", T0) == []
    (redial,) = p.peer_down("peer", T0)
    now = redial.at_ms
    for _ in range(6):
        p.redial_due("peer", now)
        (redial,) = p.dial_failed("peer", now)
        now = redial.at_ms
    assert p.reset("peer", now + 5) == [Dial("peer")]
    (redial,) = p.dial_failed("peer", now + 6)
    assert redial.at_ms - (now + 6) == 2 * REDIAL_FIRST_MS  # the backoff started over
    p.misbehaviour("peer", "x", now + 7)
    assert p.reset("peer", now + 8) == []  # banned: never dialled
