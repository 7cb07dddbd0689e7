"""Peer scoring and the anti-entropy amplification bound (issue 16), in the engine.

Engines wired by hand (`NodePair`, `Mesh`): an offer flood gets at most
`amplification_factor` times its bytes back (plus the allowance), the forged
"512 unknown heads, empty filter" offer is not answered and gets the peer
dropped, an honest laggard still catches up, and the weighted faults
(a non-member's own unauthorized events, stray traffic beyond the allowance)
reach the threshold while an honest relay is never blamed.
"""

from __future__ import annotations

import os
import random
from dataclasses import replace

from node.core.identity import sign_event
from node.core.peer_policy import (
    BAN_DURATION_MS,
    BAN_GROWTH,
    MAX_BAN_DURATION_MS,
    OVERSIZED_FRAME_REASON,
    PeerPolicy,
)
from tests.transport.mesh import Mesh
from tests.transport.pair import PAIR_NOW_MS, lagging
from transport.dissemination_config import DisseminationConfig
from transport.effects import Disconnect, Send
from transport.libp2p_streams import OVERSIZED_FRAME
from transport.messages import BLOOM_SALT_BYTES, BloomFilter, Offer, Push, encode
from transport.misbehaviour import (
    STRAY_ALLOWANCE_BURST,
    UNAUTHORIZED_WEIGHT,
    UNKNOWN_TOPIC_WEIGHT,
)
from transport.peer_budget import AMPLIFICATION_FACTOR, AnswerBudget

ATTACKER = "ff" * 32  # a peer id no replica of these worlds has as a key


def flood(pair, offers: int, config: DisseminationConfig, heads_of=None,
          step_ms: int = 200) -> tuple[int, int, list]:
    """`offers` offers from ATTACKER to b's engine; (bytes in, bytes out, effects)."""
    engine = pair.engines["b"]
    engine.config = config
    engine.__init__(engine.node_id, random.Random(1), config)  # fresh budgets for this config
    engine.add_topic(pair.replicas["b"])
    engine.on_peer_up(ATTACKER, pair.now_ms)
    graph = pair.replicas["b"].graph
    heads = heads_of(graph) if heads_of else (pair.topic,)  # the root: "send me everything"
    bytes_in = bytes_out = 0
    effects = []
    for xid in range(1, offers + 1):
        pair.now_ms += step_ms
        bloom = BloomFilter.build([], os.urandom(BLOOM_SALT_BYTES), 10, 7)
        data = encode(Offer(pair.topic, xid, tuple(heads), (), 0, False, bloom))
        bytes_in += len(data)
        out = engine.on_message(ATTACKER, data, pair.now_ms)
        effects += out
        bytes_out += sum(len(e.data) for e in out if isinstance(e, Send))
    return bytes_in, bytes_out, effects


UNBOUNDED = DisseminationConfig(push=False, log=False, depletion=False, sync_on_connect=False,
                                amplification_factor=10**9, offers_per_s=10**6,
                                offer_burst=10**6)


def test_an_offer_flood_gets_at_most_the_factor_times_its_bytes_plus_the_allowance():
    pair = lagging(2_000, payload_bytes=300)  # b holds ~660 KB the attacker asks for again and again
    config = replace(UNBOUNDED, amplification_factor=AMPLIFICATION_FACTOR, offers_per_s=10,
                     offer_burst=100, answer_allowance_bytes=256 * 1024)
    before_in, before_out, _ = flood(pair, 500, UNBOUNDED)
    after_in, after_out, _ = flood(pair, 500, config)
    assert before_out > 1_000 * before_in  # the unbounded engine: ~3,900 bytes out per byte in
    assert after_out <= AMPLIFICATION_FACTOR * after_in + config.answer_allowance_bytes
    assert after_out < 2 * before_out // 1_000


def test_a_flood_of_made_up_heads_is_not_answered_and_the_peer_is_dropped():
    """The issue's attack: 512 heads nobody has and an empty filter, a full reply each time."""
    pair = lagging(200)
    made_up = [os.urandom(32) for _ in range(512)]
    config = replace(UNBOUNDED, amplification_factor=AMPLIFICATION_FACTOR)
    bytes_in, bytes_out, effects = flood(pair, 40, config, heads_of=lambda _: made_up, step_ms=0)
    assert bytes_out == 0
    disconnects = [e for e in effects if isinstance(e, Disconnect)]
    assert len(disconnects) == 2  # at the 20th and the 40th: MISBEHAVIOUR_THRESHOLD of weight 1
    assert pair.engines["b"].stats["offers_impossible"] == 40


def test_honest_offers_are_never_impossible():
    """Every offer an honest engine makes, first contact or with per-peer heads, is answered."""
    for synced in (False, True):
        pair = lagging(300)
        if synced:
            pair.sync("a")
            pair.write("a", 5)
            pair.write("b", 50)
        exchange = pair.sync("a")
        assert pair.same()
        for engine in pair.engines.values():
            assert engine.stats["offers_impossible"] == 0
            assert not engine.peer_misbehaviour


def test_offers_beyond_the_rate_are_dropped_unanswered():
    pair = lagging(5)
    config = replace(UNBOUNDED, offers_per_s=10, offer_burst=20)
    _, _, effects = flood(pair, 100, config, step_ms=0)
    assert len([e for e in effects if isinstance(e, Send)]) == 20
    assert pair.engines["b"].stats["offers_throttled"] == 80


def test_an_untrusted_laggard_catches_up_within_the_allowance_and_a_small_one_in_pages():
    """The laggard (a) wrote nothing b lacks: not trusted. Under the default allowance
    it catches up at full speed; under an allowance smaller than the history it
    still catches up once it has written one event b applies (useful traffic)."""
    pair = lagging(3_000, payload_bytes=300)  # ~1 MB
    exchange = pair.sync("a")
    assert pair.same() and exchange.round_trips <= 3 * 1.5

    small = replace(DisseminationConfig(push=False, log=False, depletion=False,
                                        sync_on_connect=False), answer_allowance_bytes=64 * 1024)
    pair = lagging(3_000, payload_bytes=300, config=small)
    pair.sync("a")
    assert not pair.same()  # 64 KiB of ~1 MB, then b stops answering
    assert pair.engines["b"].stats["answers_cut"] + pair.engines["b"].stats["answers_throttled"]
    pair.write("a", 1)  # a writes: its event is useful to b, so b trusts it
    pair.now_ms += 10_000  # a's unanswered exchange times out (its tick's offers are lost)
    pair.engines["a"].tick(pair.now_ms)
    pair.sync("b")
    assert pair.engines["b"]._answers.is_trusted("a")
    pair.now_ms += 10_000
    pair.engines["a"].tick(pair.now_ms)
    pair.sync("a")
    assert pair.same()


def test_a_member_catches_up_in_full_whatever_the_allowance():
    """In a private topic every reader is a joined member: trusted, never cut."""
    config = replace(DisseminationConfig(log=False, depletion=False, sync_on_connect=False),
                     answer_allowance_bytes=0)
    mesh = Mesh(["a", "b"], config=config)
    mesh.connect_all()
    mesh.invite("a", "b")
    mesh.request_join("b")
    mesh.links.clear()  # b goes offline
    for i in range(300):
        mesh.publish("a", b"m%d" % i)
    mesh.links.add(frozenset(("a", "b")))
    mesh.tick(times=5)
    assert mesh.same(["a", "b"])
    assert mesh.engines["a"].stats["answers_throttled"] == 0


# ------------------------------------------------------------------ weighted faults


def test_a_non_members_own_events_get_it_dropped_and_a_relay_is_never_blamed():
    """An open-join topic: x is not joined, so its events fail the auth rules
    (`sender_not_joined`). Sent by x itself they count UNAUTHORIZED_WEIGHT each;
    the same events forwarded by c (an honest member) are never held against c."""
    mesh = Mesh(["a", "c", "x"], join_rule="public")
    mesh.connect_all()
    c = mesh.ids["c"]
    x_replica = mesh.replicas["x"]
    x_replica.receive(mesh.replicas["a"].graph.get(mesh.topic).raw, mesh.now_ms)
    key = mesh.key("x")
    raws = []
    for seq in range(1, 200):
        event = sign_event(x_replica.identity, topic=mesh.topic, seq=seq, parents=[mesh.topic],
                           timestamp_ms=mesh.now_ms, kind="message", payload=b"spam%d" % seq,
                           auth=(mesh.topic,))
        raws.append(event.raw)
    engine = mesh.engines["a"]
    # Relayed by c: not c's events, never blamed.
    for raw in raws[:100]:
        engine.on_message(c, encode(Push(mesh.topic, (raw,))), mesh.now_ms)
    assert engine.peer_misbehaviour[c] == 0
    # Sent by their author: dropped after threshold / weight events.
    needed = round(engine.config.misbehaviour_threshold / UNAUTHORIZED_WEIGHT)
    disconnects = []
    for raw in raws[100:]:
        disconnects += [e for e in engine.on_message(key.hex(), encode(Push(mesh.topic, (raw,))),
                                                     mesh.now_ms) if isinstance(e, Disconnect)]
    assert engine.stats["misbehaviour_unauthorized"] == 99
    assert len(disconnects) == 1 and needed == 80  # at the 80th of the author's own events
    assert engine.peer_misbehaviour[c] == 0


def test_stray_traffic_is_free_within_the_allowance_then_counts():
    pair = lagging(1)
    engine = pair.engines["a"]
    unknown = encode(Push(b"\x01" * 32, (b"x",)))
    now = PAIR_NOW_MS
    for _ in range(STRAY_ALLOWANCE_BURST):
        assert engine.on_message("b", unknown, now) == []
    assert engine.peer_misbehaviour["b"] == 0
    needed = round(engine.config.misbehaviour_threshold / UNKNOWN_TOPIC_WEIGHT)
    effects = [e for _ in range(needed) for e in engine.on_message("b", unknown, now)]
    assert [type(e) for e in effects] == [Disconnect]
    # An honest rate (within STRAY_ALLOWANCE_PER_S) never counts.
    for i in range(5_000):
        assert engine.on_message("c", unknown, now + i * 50) == []
    assert engine.peer_misbehaviour["c"] == 0


# ------------------------------------------------------------------ bans and budgets


def test_bans_grow_with_repeat_offences_up_to_the_cap():
    policy = PeerPolicy(random.Random(1))
    now = PAIR_NOW_MS
    lengths = []
    for _ in range(8):
        until = policy.misbehaviour("bad", "x", now)[0].until_ms
        lengths.append(until - now)
        now = until
    assert lengths[:3] == [BAN_DURATION_MS, BAN_DURATION_MS * BAN_GROWTH,
                           BAN_DURATION_MS * BAN_GROWTH ** 2]
    assert lengths[-1] == MAX_BAN_DURATION_MS and policy.offences("bad") == 8


def test_one_oversized_frame_bans_and_the_reason_is_the_transports():
    assert OVERSIZED_FRAME_REASON == OVERSIZED_FRAME
    policy = PeerPolicy(random.Random(1))
    assert policy.is_banned("big", PAIR_NOW_MS) is False
    policy.protocol_fault("big", OVERSIZED_FRAME, PAIR_NOW_MS)
    assert policy.is_banned("big", PAIR_NOW_MS + 1)
    policy.protocol_fault("odd", "malformed_frame", PAIR_NOW_MS)
    assert not policy.is_banned("odd", PAIR_NOW_MS + 1)


def test_the_answer_budget_counts_earned_bytes_first_and_trust_lifts_it():
    budget = AnswerBudget(factor=2, allowance=100, refill_per_s=0)
    assert budget.room("p", 0) == 100
    budget.received("p", 50, 0)
    assert budget.room("p", 0) == 200
    budget.spend("p", 150, 0)
    assert budget.room("p", 0) == 50
    budget.spend("p", 1_000, 0)
    assert budget.room("p", 0) == 0
    budget.trust("p")
    assert budget.is_trusted("p") and not budget.is_trusted("q")
