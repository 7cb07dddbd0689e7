"""Catch-up at ingest speed (issue 14): pipelined pages, no budget on asked-for pages, timeouts.

Two engines wired by hand (`tests.transport.pair`): "b" holds thousands of
events "a" lacks, and "a" catches up one page (`MAX_EVENTS_PER_MESSAGE`) per
answer. What must hold:

* with `prefetch` (the driver calls it as a frame arrives, before its step)
  the next page is asked for while the last is verified, and still every
  event crosses once: no page is asked for twice;
* the pages a trusted peer sends in answer to our own open exchange are not
  charged to its intake event budget (they are bounded by our offers), so a
  catch-up longer than the burst is not throttled; a stranger's stay budgeted;
* an exchange times out on the peer's silence as of when the tick was due,
  not on our own backlog.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from storage.memory import MemoryStore
from tests.transport.pair import NodePair, identity, lagging
from node.core.parents import DepletionPolicy
from node.replica.replica import Replica, ReplicaConfig
from node.state.types import RULE_PUBLIC
from transport.anti_entropy import LONG_ABSENCE_MS, MAX_SESSION_TIMEOUT_MS, RESUME_PATIENCE_MS
from transport.dissemination import Disseminator
from transport.dissemination_config import DisseminationConfig
from transport.effects import Send
from transport.eager_lazy import GRAFT_TIMEOUT_MS
from transport.messages import (MAX_EVENTS_PER_MESSAGE, Events, Graft, IHave, Offer, Push, Reply,
                                Want, decode, encode)

MISSED = 3_500  # four pages of 1,024
BASE_CONFIG = DisseminationConfig(push=False, log=False, depletion=False)


def run_flights(pair: NodePair, flight: list[tuple[str, Send]], pipelined: bool = True,
                drop_to: str | None = None, max_flights: int = 200,
                observe: Callable[[str, object], None] | None = None) -> dict[str, int]:
    """Deliver `flight` (sender, Send) and every answer to quiescence; events sent to "a".

    With `pipelined`, every frame reaching `a` goes through `a.prefetch` first
    (what `node.committer.Committer.receive` does), and what it asks ahead
    travels in the same flight as the answers of the step. With `drop_to`,
    frames to that node are lost and it answers nothing (a peer that went away
    mid-stream). `observe(sender, message)` sees every message delivered.
    """
    events_to_a = 0
    pages_from: dict[str, int] = {}
    flights = 0
    while flight:
        flights += 1
        assert flights <= max_flights, "catch-up does not terminate"
        next_flight = []
        for sender, effect in flight:
            if not isinstance(effect, Send) or effect.peer == drop_to:
                continue
            receiver = effect.peer
            pair.now_ms += 1
            message = decode(effect.data)
            if observe is not None:
                observe(sender, message)
            if receiver == "a" and isinstance(message, (Reply, Events)):
                events_to_a += len(message.events)
                if isinstance(message, Reply) and message.events:
                    pages_from[sender] = pages_from.get(sender, 0) + 1
            engine = pair.engines[receiver]
            if pipelined and receiver == "a":
                next_flight += [("a", e) for e in engine.prefetch(sender, effect.data,
                                                                  pair.now_ms)]
            next_flight += [(receiver, e) for e in engine.on_message(sender, effect.data,
                                                                      pair.now_ms)]
            if receiver == "a":
                engine.offers_sent_at(pair.now_ms)
        flight = next_flight
    return {"flights": flights, "events_to_a": events_to_a, **{
        f"pages_from_{name}": count for name, count in pages_from.items()}}


def catch_up(pair: NodePair, pipelined: bool, max_flights: int = 200,
             filters: list[int] | None = None) -> dict[str, int]:
    """`a` opens an exchange with `b` and both run to quiescence, flight by flight
    (`run_flights`): the flights, b's pages and the events in them; with `filters`,
    the size of each of a's offers' filters is appended to it."""
    counts = {"pages": 0, "events_sent": 0}

    def observe(sender: str, message: object) -> None:
        if sender == "a" and isinstance(message, Offer) and filters is not None:
            filters.append(len(message.bloom.bits))
        if sender == "b" and isinstance(message, Reply):
            counts["pages"] += 1
            counts["events_sent"] += len(message.events)

    flight = [("a", e) for e in pair.engines["a"].sync_with("b", pair.topic, pair.now_ms)]
    figures = run_flights(pair, flight, pipelined, max_flights=max_flights, observe=observe)
    return {"flights": figures["flights"], **counts}


def test_pipelined_catch_up_asks_ahead_and_sends_every_event_once():
    pair = lagging(MISSED, config=BASE_CONFIG)
    figures = catch_up(pair, pipelined=True)
    a = pair.engines["a"]
    assert pair.same()
    assert a.stats["offers_ahead"] >= 2  # the pages after the first were asked for ahead
    assert figures["events_sent"] == MISSED  # no page was asked for twice
    assert a.stats["duplicates"] == 0
    assert a.stats["stale_replies"] == 0


def test_without_pipelining_the_same_pages_cross():
    pair = lagging(MISSED, config=replace(BASE_CONFIG, pipeline=False))
    figures = catch_up(pair, pipelined=True)  # prefetch is off in the config: a no-op
    assert pair.same()
    assert pair.engines["a"].stats["offers_ahead"] == 0
    assert figures["events_sent"] == MISSED


def test_continuation_filters_stay_small_after_a_long_lag():
    # a and b reconciled (each remembers the other's heads), then b wrote MISSED events.
    # Before, every offer of a's catch-up held all it had applied since that exchange.
    for pipelined in (False, True):
        pair = NodePair(config=replace(BASE_CONFIG, pipeline=pipelined))
        pair.write("a", 20)
        pair.sync("a")
        pair.write("b", MISSED)
        filters: list[int] = []
        catch_up(pair, pipelined=pipelined, filters=filters)
        assert pair.same()
        assert len(filters) >= 4
        # bytes: the first covers the 20 events before the lag, the rest a few ids, not thousands
        assert filters[0] <= 64 and max(filters[1:]) <= 16, (pipelined, filters)


def test_prefetch_ignores_what_is_not_a_streaming_answer():
    pair = lagging(10, config=BASE_CONFIG)
    a = pair.engines["a"]
    assert a.prefetch("b", b"", pair.now_ms) == []
    assert a.prefetch("b", b"\x93junk", pair.now_ms) == []
    # An answer to no open exchange of ours: nothing is asked ahead.
    stray = Reply(pair.topic, 77, (), False, True, ())
    assert a.prefetch("b", encode(stray), pair.now_ms) == []
    assert a.stats["offers_ahead"] == 0


def test_a_trusted_peers_catch_up_is_not_throttled_by_the_event_budget():
    # A burst smaller than the catch-up and next to no refill: before, the pages
    # after the burst were dropped unread (`intake_throttled`) and the peer blamed.
    config = replace(BASE_CONFIG, peer_events_burst=1_500, peer_events_per_s=1)
    for pipelined in (False, True):
        pair = lagging(MISSED, config=replace(config, pipeline=pipelined))
        catch_up(pair, pipelined=pipelined)
        a = pair.engines["a"]
        assert pair.same(), pipelined
        assert a.stats["intake_throttled"] == 0


def test_a_strangers_answers_stay_budgeted():
    # b never handed a an applied event: its answer to a's own exchange is charged.
    config = replace(BASE_CONFIG, peer_events_burst=500, peer_events_per_s=1)
    pair = lagging(MISSED, config=config)
    a, b = pair.engines["a"], pair.engines["b"]
    (offer,) = a.sync_with("b", pair.topic, pair.now_ms)
    (reply,) = b.on_message("a", offer.data, pair.now_ms)
    assert len(decode(reply.data).events) > 500
    a.on_message("b", reply.data, pair.now_ms)
    assert a.stats["intake_throttled"] == 1
    assert pair.replicas["a"].graph.delivered_count < MISSED


def opened_exchange() -> tuple[NodePair, Disseminator, int]:
    """a, 10 events behind b, has just offered to b: (the pair, a's engine, when)."""
    pair = lagging(10, config=BASE_CONFIG)
    a = pair.engines["a"]
    start = pair.now_ms
    assert a.sync_with("b", pair.topic, start)
    return pair, a, start


def tick_until_timed_out(engine: Disseminator, at: int, deadline: int, step_ms: int = 50,
                         sending: str | None = None, topic: bytes = b"") -> int:
    """Tick `engine` every `step_ms` from `at` until one more exchange times out, by
    `deadline` at the latest; returns when. `sending`: a peer whose frames (empty
    pushes on `topic`) keep reaching the engine meanwhile."""
    before = engine.stats["sessions_timed_out"]
    while engine.stats["sessions_timed_out"] == before:
        at += step_ms
        if sending is not None:
            engine.prefetch(sending, encode(Push(topic, ())), at)
        engine.tick(at, due_ms=at)
        assert at <= deadline
    return at


def test_exchange_times_out_on_silence_as_of_the_due_time():
    pair, a, start = opened_exchange()
    timeout = BASE_CONFIG.session_timeout_ms
    # The tick waited behind a long step: due 1 s after the offer, run 5 s after.
    a.tick(start + 5 * timeout, due_ms=start + timeout // 2)
    assert a.stats["sessions_timed_out"] == 0
    a.tick(start + 5 * timeout)
    assert a.stats["sessions_timed_out"] == 1


def test_an_offer_times_out_from_when_it_left():
    pair, a, start = opened_exchange()
    a.offers_sent_at(start + 3 * BASE_CONFIG.session_timeout_ms)  # a long step ended
    a.tick(start + 3 * BASE_CONFIG.session_timeout_ms + 1)
    assert a.stats["sessions_timed_out"] == 0


def test_time_the_node_was_not_running_is_not_the_peers_silence():
    pair = lagging(10, config=BASE_CONFIG)
    a = pair.engines["a"]
    start = pair.now_ms
    a.tick(start, due_ms=start)
    assert a.sync_with("b", pair.topic, start + 1)
    # The loop stalled 1.5 s (a loaded machine): the first tick after it does not
    # expire the exchange (its answer waits in our socket) ...
    stall = BASE_CONFIG.session_timeout_ms * 3 // 4
    a.tick(start + stall, due_ms=start + stall)
    assert a.stats["sessions_timed_out"] == 0 and a.stats["absences"] == 1
    # ... but silence while we run does.
    for at in range(start + stall + 50, start + stall + 3_000, 50):
        a.tick(at, due_ms=at)
    assert a.stats["sessions_timed_out"] == 1


def test_a_long_absence_ends_the_exchanges_open_before_it_and_a_late_answer_still_counts():
    pair = lagging(10, config=BASE_CONFIG)
    a, b = pair.engines["a"], pair.engines["b"]
    start = pair.now_ms
    a.tick(start, due_ms=start)
    (offer,) = a.sync_with("b", pair.topic, start + 1)
    (reply,) = b.on_message("a", offer.data, start + 2)
    # SIGSTOPped for a minute: the peer may have reset its stream to us, answer and all.
    back = start + 60_000
    a.tick(back, due_ms=back)
    assert a.stats["sessions_interrupted"] == 1 and a.stats["sessions_timed_out"] == 0
    a.on_message("b", reply.data, back + 10)  # the answer survived after all: used
    assert pair.same() and a.stats["stale_replies"] == 1


def test_an_answer_waiting_in_our_queue_is_no_silence():
    # The answer reached the node (prefetch sees every frame as it arrives) but waits
    # behind our backlog: its exchange must not time out before the step applies it.
    pair = lagging(10, config=BASE_CONFIG)
    a, b = pair.engines["a"], pair.engines["b"]
    start = pair.now_ms
    timeout = BASE_CONFIG.session_timeout_ms
    (offer,) = a.sync_with("b", pair.topic, start)
    (reply,) = b.on_message("a", offer.data, start)
    assert a.prefetch("b", reply.data, start + timeout - 1) == []  # not streaming: nothing ahead
    a.tick(start + timeout + 10, due_ms=start + timeout + 10)
    assert a.stats["sessions_timed_out"] == 0
    a.on_message("b", reply.data, start + timeout + 20)
    assert pair.same() and a.stats["stale_replies"] == 0


def test_a_node_streaming_a_catch_up_defers_offers_that_would_duplicate_it():
    pair = lagging(MISSED, config=BASE_CONFIG)
    a, b = pair.engines["a"], pair.engines["b"]
    a.on_peer_up("c", pair.now_ms)  # a third peer, as far ahead as b
    # Run a's catch-up from b until it streams (the first page applied, `more`).
    flight = [("a", e) for e in a.sync_with("b", pair.topic, pair.now_ms)]
    while not a._streaming(pair.topic, pair.now_ms):
        next_flight = []
        for sender, effect in flight:
            if isinstance(effect, Send) and effect.peer in ("a", "b"):
                engine = a if effect.peer == "a" else b
                next_flight += [(effect.peer, e) for e in engine.on_message(
                    sender, effect.data, pair.now_ms)]
        flight = next_flight
        assert flight, "the catch-up ended before it streamed"
    # c offers heads a lacks: answering would make c send the pages b is streaming.
    (offer,) = b.sync_with("a", pair.topic, pair.now_ms)
    assert a.on_message("c", offer.data, pair.now_ms) == []
    assert a.stats["offers_deferred"] == 1
    # A peer a is ahead of is still served (a holds all its heads).
    behind = Offer(pair.topic, 9, (pair.topic,), (), 0, False,
                   decode(offer.data).bloom)
    answers = a.on_message("c", encode(behind), pair.now_ms)
    assert answers and isinstance(decode(answers[0].data), Reply)
    assert a.stats["offers_deferred"] == 1


def test_a_second_stream_ends_once_one_runs():
    pair = lagging(MISSED, config=BASE_CONFIG)
    a, b = pair.engines["a"], pair.engines["b"]
    a.on_peer_up("c", pair.now_ms)
    (offer,) = a.sync_with("b", pair.topic, pair.now_ms)
    # c is asked too (a resumed node offers to several peers before any streams) ...
    (offer_c,) = a.sync_with("c", pair.topic, pair.now_ms)
    (page,) = b.on_message("a", offer.data, pair.now_ms)
    (offer2,) = a.on_message("b", page.data, pair.now_ms)  # applied; streams from b now
    assert a._streaming(pair.topic, pair.now_ms)
    # ... and answers with the next page: it is applied, but the exchange with c
    # does not go on. No new exchange with c starts meanwhile either.
    assert a.sync_with("c", pair.topic, pair.now_ms) == []
    (page2,) = b.on_message("a", offer2.data, pair.now_ms)
    reply = decode(page2.data)
    from_c = Reply(reply.topic, decode(offer_c.data).xid, reply.heads, False, True,
                   reply.events)
    before = pair.replicas["a"].graph.delivered_count
    assert a.on_message("c", encode(from_c), pair.now_ms) == []
    assert pair.replicas["a"].graph.delivered_count > before
    assert a.stats["continuations_deferred"] == 1
    assert ("c", pair.topic) not in a._sessions and ("b", pair.topic) in a._sessions


def with_third(pair: NodePair) -> NodePair:
    """Add "c", a real engine holding everything "b" holds, linked to "a" and "b"."""
    b = pair.replicas["b"]
    c = Replica(MemoryStore(), pair.topic, identity("c"), b.config)
    for _, event in b.graph.deliveries(0, b.graph.delivered_count):
        c.receive(event.raw, pair.now_ms)
    c.commit()
    engine = Disseminator(c.identity.public_key.hex(), pair.rng, pair.config)
    engine.add_topic(c)
    pair.replicas["c"], pair.engines["c"] = c, engine
    for name in ("a", "b"):
        pair.engines[name].on_peer_up("c", pair.now_ms)
        engine.on_peer_up(name, pair.now_ms)
    return pair


def test_a_resumed_node_takes_the_pages_of_one_of_the_offers_waiting_for_it():
    # a was stopped while b and c moved on; both offered meanwhile, and their offers
    # wait in a's sockets. a answers b's; c's would draw the same pages: deferred.
    pair = with_third(lagging(MISSED, config=BASE_CONFIG))
    a, b, c = (pair.engines[n] for n in "abc")
    a.tick(pair.now_ms, due_ms=pair.now_ms)
    pair.now_ms += LONG_ABSENCE_MS - 1_000  # stopped briefly: b's and c's exchanges wait on
    a.note_due(pair.now_ms)  # the committer: a tick is queued with the waiting frames
    (offer_b,) = b.sync_with("a", pair.topic, pair.now_ms)
    (offer_c,) = c.sync_with("a", pair.topic, pair.now_ms)
    answers = [("a", e) for e in a.on_message("b", offer_b.data, pair.now_ms)]
    assert a.on_message("c", offer_c.data, pair.now_ms) == []
    assert a.stats["offers_deferred"] == 1
    # No exchange of a's own opens a second stream meanwhile either.
    assert a.sync_with("c", pair.topic, pair.now_ms) == []
    assert a.stats["syncs_deferred"] == 1
    figures = run_flights(pair, answers)
    assert pair.replicas["a"].graph.delivered_count == pair.replicas["b"].graph.delivered_count
    assert figures["events_to_a"] == MISSED  # every missed event crossed once
    assert a.stats["duplicates"] == 0


def test_after_a_long_absence_the_offers_that_waited_do_not_hold_our_own_exchange_back():
    # Stopped a minute: b's and c's offers waited in a's sockets, their exchanges long
    # timed out at b and c, so replies to them would bring nothing (and a live one
    # would bring the first pages again). Expecting pages from them held a's own
    # exchanges back for a session timeout (a 50k catch-up idled 2.3 s): they are
    # left unanswered, and a's own exchange brings the pages once.
    pair = with_third(lagging(MISSED, config=BASE_CONFIG))
    a, b, c = (pair.engines[n] for n in "abc")
    a.tick(pair.now_ms, due_ms=pair.now_ms)
    (offer_b,) = b.sync_with("a", pair.topic, pair.now_ms)
    (offer_c,) = c.sync_with("a", pair.topic, pair.now_ms)
    pair.now_ms += 60_000
    b.tick(pair.now_ms)
    c.tick(pair.now_ms)
    assert b.stats["sessions_timed_out"] == c.stats["sessions_timed_out"] == 1
    a.note_due(pair.now_ms)
    replies = [("a", e) for e in a.on_message("b", offer_b.data, pair.now_ms)]
    replies += [("a", e) for e in a.on_message("c", offer_c.data, pair.now_ms)]
    assert replies == [] and a.stats["offers_deferred"] == 2
    own = [("a", e) for e in a.sync_with("b", pair.topic, pair.now_ms)]
    assert own and a.stats["syncs_deferred"] == 0
    figures = run_flights(pair, own)
    assert pair.replicas["a"].graph.delivered_count == pair.replicas["b"].graph.delivered_count
    assert figures["events_to_a"] == MISSED  # every missed event crossed once
    assert a.stats["sessions_timed_out"] == 0


def test_an_exchange_whose_link_was_lost_is_offered_again_at_once():
    # b aborted its connection to a while a was stopped and redialled; a's offer went
    # out on the old connection. Once that one closes (the new one remains), a offers
    # again at once instead of waiting out the timeout.
    pair, a, start = opened_exchange()
    again = a.on_link_lost("b", start + 10)
    assert a.stats["sessions_relinked"] == 1 and a.stats["links_lost"] == 1
    assert [type(decode(e.data)) for e in again] == [Offer]
    run_flights(pair, [("a", e) for e in again])
    assert pair.same() and a.stats["sessions_timed_out"] == 0
    assert a.on_link_lost("z", start + 20) == []  # not a peer of ours: nothing


def test_pages_that_two_peers_start_at_once_cross_once():
    # Both peers answered an exchange at once (a resumed node offers to several,
    # a peer reconnects): the second stream ends at its first page.
    pair = with_third(lagging(MISSED, config=BASE_CONFIG))
    a = pair.engines["a"]
    flight = [("a", e) for e in a.sync_with("b", pair.topic, pair.now_ms)]
    flight += [("a", e) for e in a.sync_with("c", pair.topic, pair.now_ms)]
    figures = run_flights(pair, flight)
    assert pair.replicas["a"].graph.delivered_count == pair.replicas["b"].graph.delivered_count
    # One page of 1,024 at most crosses twice (both first pages left before either came).
    assert figures["events_to_a"] <= MISSED + 1_024
    assert a.stats["continuations_deferred"] >= 1
    assert a.stats["sessions_abandoned"] == 0


def test_an_answer_lost_while_the_peer_sends_other_frames_times_out_as_heard():
    pair, a, start = opened_exchange()
    a.prefetch("b", encode(Push(pair.topic, ())), start + 10)  # b is up, the answer is not
    tick_until_timed_out(a, start, start + BASE_CONFIG.session_timeout_ms + 100)
    assert a.stats["sessions_timed_out:opening:heard"] == 1


def test_just_resumed_a_peer_still_sending_its_backlog_is_not_timed_out():
    """Back from a stop, the peer's queued pushes keep coming: our exchange with it
    waits (bounded); once the peer falls silent, or past RESUME_PATIENCE_MS, it times out."""
    pair = lagging(10, config=BASE_CONFIG)
    a = pair.engines["a"]
    timeout = BASE_CONFIG.session_timeout_ms
    a.tick(pair.now_ms, due_ms=pair.now_ms)
    start = pair.now_ms + 8_000  # stopped for 8 s
    a.note_due(start)
    assert a.stats["absences"] == 1
    assert a.sync_with("b", pair.topic, start)
    at = start
    while at - start < 3 * timeout:  # b's backlog keeps arriving: not silent
        at += 50
        a.prefetch("b", encode(Push(pair.topic, ())), at)
        a.tick(at, due_ms=at)
    assert a.stats["sessions_timed_out"] == 0
    # The backlog is through, no answer: silent.
    at = tick_until_timed_out(a, at, at + timeout + 100)
    # Past the patience a peer that keeps sending but never answers times out too.
    assert a.sync_with("b", pair.topic, at)
    tick_until_timed_out(a, at, start + RESUME_PATIENCE_MS + timeout + 100,
                         sending="b", topic=pair.topic)


def test_a_silent_peer_still_times_out():
    pair, a, start = opened_exchange()
    tick_until_timed_out(a, start, start + BASE_CONFIG.session_timeout_ms + 100)
    assert a.stats["sessions_timed_out:opening"] == 1


def trusted_trio(missed: int, base: int = 20,
                 config: DisseminationConfig = BASE_CONFIG) -> NodePair:
    """b and c hold `missed` events a lacks; a took their shared past from both by push,
    so it trusts both (a catch-up asks pages only of trusted peers)."""
    pair = NodePair(config=config)
    past = pair.write("b", base)
    with_third(pair)
    a = pair.engines["a"]
    for sender, part in (("b", past[:base // 2]), ("c", past[base // 2:])):
        a.on_message(sender, encode(Push(pair.topic, tuple(e.raw for e in part))), pair.now_ms)
    for event in pair.write("b", missed):
        pair.replicas["c"].receive(event.raw, pair.now_ms)
    pair.replicas["c"].commit()
    assert pair.replicas["a"].graph.delivered_count == base + 1
    return pair


def streaming_from_b_with_c_ahead(missed: int, config: DisseminationConfig = BASE_CONFIG
                                  ) -> tuple[NodePair, list[tuple[str, Send]]]:
    """a streams a catch-up from b; c, as far ahead, offered meanwhile (deferred)."""
    pair = trusted_trio(missed, config=config)
    a, b, c = (pair.engines[n] for n in "abc")
    (offer,) = a.sync_with("b", pair.topic, pair.now_ms)
    (page,) = b.on_message("a", offer.data, pair.now_ms)
    pending = [("a", e) for e in a.prefetch("b", page.data, pair.now_ms)]
    pending += [("a", e) for e in a.on_message("b", page.data, pair.now_ms)]
    assert a._streaming(pair.topic, pair.now_ms)
    (offer_c,) = c.sync_with("a", pair.topic, pair.now_ms)
    assert a.on_message("c", offer_c.data, pair.now_ms) == []  # deferred: c holds what a lacks
    return pair, pending


def test_a_catch_up_asks_its_pages_of_several_peers_in_turn():
    pair, pending = streaming_from_b_with_c_ahead(3 * MISSED)
    a = pair.engines["a"]
    figures = run_flights(pair, pending)
    assert pair.replicas["a"].graph.delivered_count == pair.replicas["b"].graph.delivered_count
    assert figures.get("pages_from_b", 0) >= 2 and figures.get("pages_from_c", 0) >= 2, figures
    assert a.stats["pages_asked_of_others"] >= 2
    # Each page was asked of one peer: every event crossed once (the first page, from
    # b, before the flights counted here).
    assert figures["events_to_a"] == 3 * MISSED - MAX_EVENTS_PER_MESSAGE
    assert a.stats["duplicates"] == 0 and a.stats["sessions_timed_out"] == 0


def test_a_catch_up_finishes_when_one_of_its_peers_is_lost_mid_stream():
    pair, pending = streaming_from_b_with_c_ahead(3 * MISSED)
    a = pair.engines["a"]
    # c goes away: what is sent to it is lost, and a sees it go down a little later.
    figures = run_flights(pair, pending, drop_to="c")
    a.on_peer_down("c", pair.now_ms)
    assert pair.replicas["a"].graph.delivered_count < pair.replicas["b"].graph.delivered_count
    # The stream is broken (its page in flight was c's): the next exchange resumes it
    # with b within one sync interval, no timeout needed.
    assert not a._streaming(pair.topic, pair.now_ms)
    interval = BASE_CONFIG.sync_interval_ms + BASE_CONFIG.sync_jitter_ms
    start = pair.now_ms
    while pair.replicas["a"].graph.delivered_count < pair.replicas["b"].graph.delivered_count:
        pair.now_ms += 100
        assert pair.now_ms - start <= 3 * interval, "the catch-up stalled"
        run_flights(pair, [("a", e) for e in a.tick(pair.now_ms)], drop_to="c")
    assert a.stats["pages_asked_of_others"] >= 1  # the page lost with c was c's to send
    assert figures.get("pages_from_c", 0) == 0
    assert a.stats["sessions_timed_out"] == 0


def test_while_a_catch_up_streams_nothing_is_fetched_by_id():
    """The ids c announces and the parents of what c pushes are the stream's newest
    events: fetched by id they would come ahead of their parents and wait in the
    buffer (a 50k catch-up buffered 11,000 so, evicting and fetching again). They
    come with the stream, parents first."""
    tree = replace(BASE_CONFIG, push=True, tree=True)
    pair, pending = streaming_from_b_with_c_ahead(3 * MISSED, config=tree)
    a, topic = pair.engines["a"], pair.topic
    graph_b = pair.replicas["b"].graph
    (_, newest), = graph_b.deliveries(graph_b.delivered_count - 1, graph_b.delivered_count)
    a.on_message("c", encode(IHave(topic, (newest.id,))), pair.now_ms)
    a.on_message("c", encode(Push(topic, (newest.raw,))), pair.now_ms)  # buffered
    assert pair.replicas["a"].graph.buffered_count == 1
    asked: list[object] = []
    for _ in range(3):  # past the graft timeout and a want round, within the exchange's
        pair.now_ms += GRAFT_TIMEOUT_MS
        asked += [decode(e.data) for e in a.tick(pair.now_ms) if isinstance(e, Send)]
    # (A Graft naming no ids only declares our place in the tree.)
    assert not [m for m in asked if isinstance(m, (Want, Graft)) and m.ids]
    assert a.stats["tree_fetches_deferred"] >= 1 and a.stats["wants_while_streaming"] >= 1
    run_flights(pair, pending)
    assert pair.replicas["a"].graph.delivered_count == graph_b.delivered_count
    assert a.stats["wants_sent"] == 0 and a.stats["tree_fetch_ids_sent"] == 0


def test_a_peer_that_announces_what_we_lack_serves_pages_too():
    # On the tree a resumed node's lazy links announce the events it missed; they
    # need not offer to it. Such a peer is ahead of us: the catch-up asks it for pages.
    served = {}
    for announcing in (False, True):
        pair = trusted_trio(3 * MISSED, config=replace(BASE_CONFIG, push=True, tree=True))
        a, b = pair.engines["a"], pair.engines["b"]
        (offer,) = a.sync_with("b", pair.topic, pair.now_ms)
        (page,) = b.on_message("a", offer.data, pair.now_ms)
        if announcing:
            graph_c = pair.replicas["c"].graph
            (_, newest), = graph_c.deliveries(graph_c.delivered_count - 1, graph_c.delivered_count)
            a.on_message("c", encode(IHave(pair.topic, (newest.id,))), pair.now_ms)
        pending = [("a", e) for e in a.prefetch("b", page.data, pair.now_ms)]
        pending += [("a", e) for e in a.on_message("b", page.data, pair.now_ms)]
        figures = run_flights(pair, pending)
        assert pair.replicas["a"].graph.delivered_count == pair.replicas["b"].graph.delivered_count
        served[announcing] = figures.get("pages_from_c", 0)
    assert served[False] == 0 and served[True] >= 2, served


def test_in_steady_state_offers_naming_heads_we_lack_are_all_answered():
    # Without an absence such offers are the norm and their answers overlap little:
    # deferring them slowed a lossy anti-entropy world's convergence 3x.
    pair = with_third(lagging(5, config=BASE_CONFIG))
    a, b, c = (pair.engines[n] for n in "abc")
    (offer_b,) = b.sync_with("a", pair.topic, pair.now_ms)
    (offer_c,) = c.sync_with("a", pair.topic, pair.now_ms)
    assert a.on_message("b", offer_b.data, pair.now_ms)
    assert a.on_message("c", offer_c.data, pair.now_ms)
    assert a.stats["offers_deferred"] == 0


def test_the_timeout_follows_how_long_the_peer_takes_to_answer_and_stays_bounded():
    # A loaded peer took 3 s to answer: 2 s would time its next exchange out while it
    # is answering. A silent peer still times out, by MAX_SESSION_TIMEOUT_MS.
    pair = lagging(10, config=BASE_CONFIG)
    a, b = pair.engines["a"], pair.engines["b"]
    start = pair.now_ms
    (offer,) = a.sync_with("b", pair.topic, start)
    (reply,) = b.on_message("a", offer.data, start)
    slow = 3_000
    a.prefetch("b", reply.data, start + slow)  # the answer reaches us 3 s after the offer
    a.on_message("b", reply.data, start + slow)
    assert pair.same() and a.stats["sessions_timed_out"] == 0
    again = start + slow + 10
    assert a.sync_with("b", pair.topic, again)
    # b is silent now.
    at = tick_until_timed_out(a, again, again + MAX_SESSION_TIMEOUT_MS + 200, step_ms=100)
    assert at - again > 2 * BASE_CONFIG.session_timeout_ms


def member_trio(missed: int, base: int = 20) -> NodePair:
    """An authorized open topic: a created it; b and c joined. a took the shared past
    from b alone (b is trusted by a new event); c, a member that never handed a
    anything new, holds the `missed` events b wrote since, as b does."""
    pair = NodePair(config=BASE_CONFIG)
    config = ReplicaConfig(depletion=DepletionPolicy(enabled=False))
    a = Replica.create_topic(MemoryStore(), identity("a"), pair.now_ms, name="members",
                             config=config, authorization=True, join_rule=RULE_PUBLIC,
                             members_write=True)
    pair.topic = a.topic_id
    pair.replicas = {"a": a}
    for name in "bc":
        replica = Replica(MemoryStore(), a.topic_id, identity(name), config)
        pair.replicas[name] = replica
        pair.copy("a", name)
    for name in "bc":
        pair.replicas[name].join(pair.now_ms, pair.rng)
        pair.replicas[name].commit()
        for other in "abc":
            if other != name:
                pair.copy(name, other)
    past = pair.write("b", base)
    pair.copy("b", "c")
    def key_of(peer: str) -> bytes | None:  # the pair's peers are named, not keyed
        return identity(peer).public_key if peer in ("a", "b", "c") else None

    pair.engines = {name: Disseminator(pair.replicas[name].identity.public_key.hex(), pair.rng,
                                       pair.config, peer_key=key_of) for name in "abc"}
    for name, engine in pair.engines.items():
        engine.add_topic(pair.replicas[name])
        for other in "abc":
            if other != name:
                engine.on_peer_up(other, pair.now_ms)
    pair.engines["a"].on_message("b", encode(Push(pair.topic, tuple(e.raw for e in past))),
                                 pair.now_ms)
    pair.write("b", missed)
    pair.copy("b", "c")
    return pair


def test_a_members_first_page_is_asked_ahead_like_a_trusted_peers():
    # Pages are asked of the members ahead of us (`_page_peer`); the first page of
    # one that never handed us a new event waited a round trip (`prefetch` trusted
    # only such peers): 4-6 pages of a 50k catch-up on the bench machine.
    pair = member_trio(3 * MISSED)
    a, b, c = (pair.engines[n] for n in "abc")
    assert not a._answers.is_trusted("c") and a._is_member("c", pair.replicas["a"])
    (offer,) = a.sync_with("b", pair.topic, pair.now_ms)
    (page,) = b.on_message("a", offer.data, pair.now_ms)
    pending = [("a", e) for e in a.prefetch("b", page.data, pair.now_ms)]
    pending += [("a", e) for e in a.on_message("b", page.data, pair.now_ms)]
    (offer_c,) = c.sync_with("a", pair.topic, pair.now_ms)
    assert a.on_message("c", offer_c.data, pair.now_ms) == []  # deferred: c is ahead
    asked_ahead = a.stats["offers_ahead"]
    figures = run_flights(pair, pending)
    assert pair.replicas["a"].graph.delivered_count == pair.replicas["b"].graph.delivered_count
    assert figures.get("pages_from_c", 0) >= 1, figures
    pages = figures.get("pages_from_b", 0) + figures.get("pages_from_c", 0)
    # Every page but the stream's last was asked for ahead, c's first one included.
    assert a.stats["offers_ahead"] - asked_ahead == pages - 1, (figures, a.stats["offers_ahead"])
    assert a.stats["duplicates"] == 0 and a.stats["sessions_timed_out"] == 0
