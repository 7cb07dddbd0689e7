"""The Disseminator: reconciliation cost, push, backstop wants, bad peers, durability."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.core.identity import sign_event
from node.core.outcomes import RejectReason
from node.replica.replica import Replica, ReplicaConfig
from storage.memory import MemoryStore
from tests.transport.pair import (
    PAIR_NOW_MS,
    NodePair,
    closure,
    diverged,
    identity,
    lagging,
    load,
    random_fork,
)
from transport.dissemination import Disseminator
from transport.dissemination_config import DisseminationConfig
from transport.effects import Disconnect, Log, Send
from transport.misbehaviour import (
    MAX_BLAMED_PEERS,
    MISBEHAVIOUR_REASONS,
    count_fault,
)
from transport.messages import (
    MessageError,
    Push,
    Want,
    decode,
    encode,
)

# Overhead = bytes on the wire that are not event bytes: msgpack framing of each
# event (3 bytes for a ~330-byte event), the filter (1.25 bytes per event of the
# offerer's since the common heads), heads and headers (a few hundred bytes).
OVERHEAD_FIXED_BYTES = 1_024
OVERHEAD_PER_EVENT_BYTES = 8


def overhead_bound(events: int) -> int:
    return OVERHEAD_FIXED_BYTES + OVERHEAD_PER_EVENT_BYTES * events


# ------------------------------------------------------------------ reconciliation cost


@pytest.mark.parametrize("m", [1, 10, 100, 500])
def test_a_lagging_peer_catches_up_in_one_round_trip(m):
    pair = lagging(m)
    exchange = pair.sync("a")  # the laggard offers its heads
    assert pair.same()
    assert exchange.round_trips == 1
    assert exchange.events == m
    assert exchange.overhead_bytes <= overhead_bound(m)


@pytest.mark.parametrize("m", [1, 10, 100, 500])
def test_a_peer_ahead_brings_the_laggard_up_in_one_and_a_half(m):
    pair = lagging(m)
    exchange = pair.sync("b")  # the one ahead offers: heads come back, then the events
    assert pair.same()
    assert exchange.round_trips == 1.5
    assert exchange.events == m


@pytest.mark.parametrize("m", [1, 10, 100, 500])
def test_two_partitions_of_m_reconcile_in_one_and_a_half_round_trips(m):
    """KH Algorithm 2 with the heads of the last exchange as per-peer state."""
    pair = diverged(m, synced_before=True)
    exchange = pair.sync("a")
    assert pair.same()
    assert exchange.round_trips == 1.5
    assert exchange.events == 2 * m  # nothing sent twice
    assert exchange.overhead_bytes <= overhead_bound(2 * m)


@pytest.mark.parametrize("m,max_round_trips", [(10, 1.5), (100, 2.5), (500, 3.5)])
def test_first_contact_partitions_reconcile_in_a_few_round_trips(m, max_round_trips):
    """Without per-peer state the depth window grows 32 -> 256 -> 2048 levels."""
    pair = diverged(m, synced_before=False)
    exchange = pair.sync("a")
    assert pair.same()
    assert exchange.round_trips <= max_round_trips
    assert exchange.events == 2 * m
    assert exchange.overhead_bytes <= overhead_bound(2 * m)


def test_second_exchange_of_synced_peers_costs_only_heads():
    pair = diverged(50)
    pair.sync("a")
    again = pair.sync("b")
    assert again.round_trips == 1 and again.events == 0
    assert again.bytes < 400


@pytest.mark.parametrize("initiator", ["a", "b"])
def test_a_long_lag_streams_in_bounded_messages(initiator):
    """Answers are cut at reply_max_events; `more` makes the laggard offer again."""
    budget = 40
    config = DisseminationConfig(push=False, log=False, depletion=False,
                                 reply_max_events=budget)
    pair = lagging(400, config=config)
    exchange = pair.sync(initiator)
    assert pair.same()
    assert exchange.events == 400  # nothing twice
    counts = [n for _, kind, _, n in exchange.log if kind in ("Reply", "Events")]
    assert max(counts) == budget
    assert len([n for n in counts if n]) == 400 // budget


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6))
def test_random_divergence_converges_whoever_starts(seed):
    pair = NodePair(seed)
    past, left, right = random_fork(seed, pair.replicas["a"], 25, 25)
    universe = past + left + right
    rng = random.Random(seed)
    for name, own in (("a", left), ("b", right)):
        chosen = {e.id for e in rng.sample(past, 2) + rng.sample(own, rng.randint(0, 3))}
        load(pair.replicas[name], closure(universe, chosen))
    exchange = pair.sync(rng.choice("ab"))
    assert pair.same()
    assert exchange.round_trips <= 2.5  # a window of 32 levels covers these forks


def test_bloom_false_positives_only_cost_extra_rounds():
    """A filter of 3 bits per event lies half the time; fresh salts recover what it hid."""
    config = DisseminationConfig(push=False, log=False, depletion=False, bloom_bits_per_item=3)
    for seed in range(5):
        pair = diverged(60, seed=seed, config=config)
        pair.sync("a")
        assert pair.same()


def test_joining_with_only_the_topic_id_fetches_everything():
    pair = lagging(30)
    joiner = Replica(MemoryStore(), pair.topic, identity("c"),
                     ReplicaConfig(authorization=False))
    engine = Disseminator("0c", random.Random(1), DisseminationConfig(push=False, log=False))
    engine.add_topic(joiner)
    flight = [("c", e) for e in engine.on_peer_up("b", PAIR_NOW_MS)]
    b = pair.engines["b"]
    for _ in range(6):
        answers = []
        for sender, effect in flight:
            if isinstance(effect, Send):
                target = b if sender == "c" else engine
                back = "b" if sender == "c" else "c"
                answers += [(back, x) for x in target.on_message(sender, effect.data, PAIR_NOW_MS)]
        flight = answers
    assert joiner.ready
    assert joiner.graph.extremities() == pair.replicas["b"].graph.extremities()


# ------------------------------------------------------------------ push and wants


def engine_with_peers(peers: list[str], config: DisseminationConfig, seed: int = 1):
    replica = Replica.create_topic(MemoryStore(), identity("hub"), PAIR_NOW_MS,
                                   config=ReplicaConfig(authorization=False))
    engine = Disseminator("00", random.Random(seed), replace(config, sync_on_connect=False))
    engine.add_topic(replica)
    for peer in peers:
        engine.on_peer_up(peer, PAIR_NOW_MS)
    return engine, replica


def sends(effects) -> list[Send]:
    return [e for e in effects if isinstance(e, Send)]


def test_publish_pushes_to_fanout_peers_after_commit():
    engine, replica = engine_with_peers([f"p{i}" for i in range(8)],
                                        DisseminationConfig(push_fanout=3, log=False))
    event, _ = replica.publish(b"hello", PAIR_NOW_MS, random.Random(2))
    effects = engine.on_publish(replica.topic_id, event, PAIR_NOW_MS)
    assert replica.graph.pending_ops == 0  # durable before anyone hears of it
    pushed = sends(effects)
    assert len({s.peer for s in pushed}) == 3
    assert all(decode(s.data) == Push(replica.topic_id, (event.raw,)) for s in pushed)


def test_push_disabled_sends_nothing_on_publish():
    engine, replica = engine_with_peers(["p1", "p2"], DisseminationConfig(push=False, log=False))
    event, _ = replica.publish(b"quiet", PAIR_NOW_MS, random.Random(2))
    assert sends(engine.on_publish(replica.topic_id, event, PAIR_NOW_MS)) == []


def test_new_pushed_events_are_forwarded_once_and_never_back():
    pair = lagging(1)
    event = pair.replicas["b"].graph.get(pair.replicas["b"].graph.extremities()[0])
    engine = Disseminator("00", random.Random(1), DisseminationConfig(push_fanout=6, log=False,
                                                                      sync_on_connect=False))
    engine.add_topic(pair.replicas["a"])
    for peer in ("p1", "p2", "p3"):
        engine.on_peer_up(peer, PAIR_NOW_MS)
    data = encode(Push(pair.topic, (event.raw,)))
    first = sends(engine.on_message("p1", data, PAIR_NOW_MS))
    assert pair.replicas["a"].graph.has(event.id)
    assert pair.replicas["a"].graph.pending_ops == 0  # committed before forwarding
    assert sorted(s.peer for s in first) == ["p2", "p3"]
    assert sends(engine.on_message("p2", data, PAIR_NOW_MS)) == []  # a duplicate stops here


def test_missing_parents_are_wanted_from_the_sender_and_applied():
    pair = lagging(3)
    a_engine, b_engine = pair.engines["a"], pair.engines["b"]
    b_graph = pair.replicas["b"].graph
    newest = b_graph.get(b_graph.extremities()[0])
    out = a_engine.on_message("b", encode(Push(pair.topic, (newest.raw,))), PAIR_NOW_MS)
    assert pair.replicas["a"].graph.is_buffered(newest.id)
    wanted = []
    now = PAIR_NOW_MS
    for _ in range(10):  # the needs loop: one level per round trip
        now += a_engine.config.want_retry_ms
        for effect in sends(a_engine.tick(now)):
            message = decode(effect.data)
            if isinstance(message, Want):
                wanted += message.ids
                assert effect.peer == "b"  # asked of the peer that sent the child
                for answer in sends(b_engine.on_message("a", effect.data, now)):
                    a_engine.on_message("b", answer.data, now)
        if pair.same():
            break
    assert pair.same()
    assert len(wanted) == 2


# ------------------------------------------------------------------ bad peers


def test_garbage_from_a_peer_is_counted_logged_and_ignored():
    config = DisseminationConfig(log=True, misbehaviour_threshold=5)
    engine, replica = engine_with_peers(["bad"], config)
    before = replica.graph.delivered_count
    rng = random.Random(3)
    disconnects = []
    for i in range(8):
        effects = engine.on_message("bad", rng.randbytes(rng.randint(0, 200)), PAIR_NOW_MS)
        logs = [e.record for e in effects if isinstance(e, Log)]
        assert logs and all(r["type"] == "rejected" and r["reason"].startswith("bad_message:")
                            for r in logs)
        disconnects += [e for e in effects if isinstance(e, Disconnect)]
    assert disconnects == [Disconnect("bad", disconnects[0].reason)]  # once, at the threshold
    assert engine.peer_misbehaviour["bad"] == 3  # counting starts again after the disconnect
    assert replica.graph.delivered_count == before and replica.graph.pending_ops == 0


def test_a_peer_that_comes_back_and_misbehaves_again_is_disconnected_again():
    config = DisseminationConfig(misbehaviour_threshold=3)
    engine, _ = engine_with_peers(["bad"], config)
    disconnects = [effect for _ in range(7)
                   for effect in engine.on_message("bad", b"\x93garbage", PAIR_NOW_MS)
                   if isinstance(effect, Disconnect)]
    assert len(disconnects) == 2  # at the 3rd and the 6th fault


def test_faults_in_frames_of_unverified_origin_are_never_held_against_that_origin():
    """A GossipSub message names its origin without proof: naming an honest peer
    must not get that peer disconnected."""
    config = DisseminationConfig(log=True, misbehaviour_threshold=2)
    engine, replica = engine_with_peers(["victim"], config)
    effects = [effect for _ in range(5)
               for effect in engine.on_message("victim", b"\x93garbage", PAIR_NOW_MS,
                                               accountable=False)]
    assert not any(isinstance(e, Disconnect) for e in effects)
    reasons = [e.record["reason"] for e in effects if isinstance(e, Log)]
    assert len(reasons) == 5 and all(r.startswith("bad_message:") for r in reasons)
    assert engine.peer_misbehaviour["victim"] == 0
    assert engine.stats["unattributed_faults"] == 5
    # The same frames from an accountable sender are held against it.
    effects = engine.on_batch([("victim", b"\x93garbage", True)] * 2, PAIR_NOW_MS)
    assert [e for e in effects if isinstance(e, Disconnect)] == [
        Disconnect("victim", effects[-1].reason)]


def test_an_event_with_a_bad_signature_is_blamed_and_the_rest_applied():
    pair = lagging(2)
    good = [pair.replicas["b"].graph.get(i) for i in pair.replicas["b"].graph.not_below(
        pair.replicas["a"].graph.extremities())]
    forged = bytearray(good[0].raw)
    forged[-1] ^= 1  # flip a signature bit
    engine = pair.engines["a"]
    engine.config = replace(engine.config, log=True)
    effects = engine.on_message("b", encode(Push(pair.topic, (bytes(forged), good[0].raw,
                                                               good[1].raw))), PAIR_NOW_MS)
    reasons = [e.record["reason"] for e in effects if isinstance(e, Log)
               and e.record["type"] == "rejected"]
    assert reasons == ["bad_signature"]
    assert engine.peer_misbehaviour["b"] == 1
    assert pair.same()


def test_an_event_from_the_future_is_rejected_without_blaming_the_relay():
    pair = NodePair(4)
    late = pair.replicas["b"]
    event, _ = late.publish(b"from the future", PAIR_NOW_MS + 10 * 60 * 1000, random.Random(1))
    engine = pair.engines["a"]
    engine.on_message("b", encode(Push(pair.topic, (event.raw,))), PAIR_NOW_MS)
    assert not pair.replicas["a"].graph.has(event.id)
    assert engine.peer_misbehaviour["b"] == 0


def test_messages_for_unknown_topics_are_ignored_without_blame():
    pair = NodePair(4)
    engine = pair.engines["a"]
    assert engine.on_message("b", encode(Push(b"\x01" * 32, (b"x",))), PAIR_NOW_MS) == []
    assert engine.peer_misbehaviour["b"] == 0


def test_a_truncated_frame_is_counted_against_the_peer_not_raised():
    pair = NodePair(4)
    truncated = encode(Push(pair.topic, (b"x" * 50,)))[:-10]
    with pytest.raises(MessageError):
        decode(truncated)
    assert pair.engines["a"].on_message("b", truncated, PAIR_NOW_MS) == []  # logging is off
    assert pair.engines["a"].peer_misbehaviour["b"] == 1


# Depletion (the dummy timers and their engine test): tests/transport/test_depletion.py.


def test_misbehaviour_reasons_are_the_cores_strings():
    """The blamed reasons are the core's own members, matching its plain strings in sets and logs."""
    assert "bad_signature" in MISBEHAVIOUR_REASONS
    assert RejectReason("wrong_topic") in MISBEHAVIOUR_REASONS
    assert all(type(reason) is RejectReason for reason in MISBEHAVIOUR_REASONS)
    assert f"{RejectReason.NOT_CANONICAL}" == "not_canonical"
    # Faults a correct relay can cause are not blamed.
    assert not {"timestamp_in_future", "buffer_full", "rejected"} & MISBEHAVIOUR_REASONS


def test_fault_counts_restart_at_the_threshold_and_stay_bounded():
    counts: Counter[str] = Counter()
    assert [count_fault(counts, "p", 3) for _ in range(4)] == [False, False, True, False]
    assert counts["p"] == 1  # counting starts again after the disconnect
    for i in range(MAX_BLAMED_PEERS + 10):
        count_fault(counts, f"q{i}", 3)
    assert len(counts) <= MAX_BLAMED_PEERS + 1


def test_a_parent_we_rejected_is_not_wanted_again():
    """A buffered child of an event rejected at application (parents not an antichain)."""
    pair = NodePair(7)
    root = pair.topic
    first = pair.write("a", 1)[0]
    pair.copy("a", "b")
    mallory = identity("mallory")
    bad = sign_event(mallory, topic=root, seq=1, parents=[root, first.id],
                     timestamp_ms=PAIR_NOW_MS, kind="message", auth=(root,))
    child = sign_event(mallory, topic=root, seq=2, parents=[bad.id],
                       timestamp_ms=PAIR_NOW_MS, kind="message", auth=(root,))
    engine = pair.engines["b"]
    engine.on_message("a", encode(Push(root, (child.raw, bad.raw))), PAIR_NOW_MS)
    graph = pair.replicas["b"].graph
    assert graph.rejected_reason(bad.id) is RejectReason.PARENTS_NOT_ANTICHAIN
    # The core no longer lists it, and the buffered child went with it (tests/core/test_rejections.py).
    assert graph.missing_parents() == []
    assert graph.rejected_reason(child.id) is RejectReason.PARENT_REJECTED
    assert graph.buffered_count == 0
    wants = [decode(s.data) for s in sends(engine.tick(PAIR_NOW_MS + 10_000))
             if isinstance(decode(s.data), Want)]
    assert wants == []
