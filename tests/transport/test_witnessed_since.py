"""An offer names in `since` what the peer was seen holding, not only the last exchange's heads.

Between two exchanges with a peer, the fast path shows what that peer holds:
the events it pushes, the ids it announces, the heads it offers. The next
offer to it names those (`AntiEntropy._witness`, `_offer_since`), so its
filter covers only what the peer has not shown, instead of every event since
the last exchange. Checked here on a `NodePair`: the offer shrinks, the
exchange still ends with both replicas equal, and a peer that claims to hold
what it does not still gets every event it lacks.
"""

from __future__ import annotations

from dataclasses import replace

from tests.transport.pair import NodePair
from transport.dissemination_config import DisseminationConfig
from transport.effects import Send
from transport.messages import IHave, Offer, Push, decode, encode

BASE_CONFIG = DisseminationConfig(push=False, log=False, depletion=False)


def shared_past(witness: bool, events: int = 500, **config) -> NodePair:
    """a and b exchanged once, then both got `events` more of a's (b by the fast path)."""
    pair = NodePair(7, config=replace(BASE_CONFIG, since_from_fast_path=witness, **config))
    pair.write("a", 20)
    pair.sync("a")  # common heads from here on
    pair.write("a", events)
    pair.copy("a", "b")
    return pair


def first_offer(pair: NodePair) -> tuple[Offer, int]:
    """a's next offer to b, and its size in bytes (the exchange is not carried on)."""
    sends = [e for e in pair.engines["a"].sync_with("b", pair.topic, pair.now_ms)
             if isinstance(e, Send)]
    assert len(sends) == 1
    offer = decode(sends[0].data)
    assert isinstance(offer, Offer)
    return offer, len(sends[0].data)


def push_from_b(pair: NodePair, event_ids: list[bytes]) -> None:
    """b pushes these events (which both hold) to a, as the fast path does."""
    raws = tuple(pair.replicas["b"].graph.get(i).raw for i in event_ids)
    pair.now_ms += 1
    pair.engines["a"].on_message("b", encode(Push(pair.topic, raws)), pair.now_ms)


def test_a_push_from_the_peer_narrows_the_next_offer_to_it():
    before, with_push = shared_past(witness=False), shared_past(witness=True)
    for pair in (before, with_push):
        push_from_b(pair, pair.replicas["b"].graph.extremities())
    old, old_bytes = first_offer(before)
    new, new_bytes = first_offer(with_push)
    latest = with_push.replicas["a"].graph.extremities()
    assert new.since[0] == latest[0] and new.floor == 0
    assert latest[0] not in old.since
    assert any(old.bloom.bits)  # every event since the exchange: 500 ids
    assert not any(new.bloom.bits)  # nothing of a's lies above what b showed
    assert new_bytes < old_bytes / 4


def test_what_the_peer_announced_and_offered_counts_too():
    pair = shared_past(witness=True, push=True, tree=True)
    graph = pair.replicas["a"].graph
    head = graph.extremities()[0]
    older = graph.parents_of(head)[0]
    pair.engines["a"].on_message("b", encode(IHave(pair.topic, (older,))), pair.now_ms)
    offer, _ = first_offer(pair)
    assert offer.since[0] == older
    pair.engines["a"]._sessions.clear()
    # b's own offer names its heads: a names them back, and leaves out what lies below.
    b_offer = [e for e in pair.engines["b"].sync_with("a", pair.topic, pair.now_ms)
               if isinstance(e, Send)][0]
    pair.engines["a"].on_message("b", b_offer.data, pair.now_ms)
    pair.engines["a"]._sessions.clear()
    offer, _ = first_offer(pair)
    assert offer.since[0] == head and older not in offer.since


def test_the_exchange_still_ends_equal_after_the_peer_showed_events():
    pair = shared_past(witness=True)
    push_from_b(pair, pair.replicas["b"].graph.extremities())
    pair.write("a", 30)
    pair.write("b", 40)
    pair.sync("a")
    assert pair.same()


def test_a_peer_claiming_events_it_lacks_still_gets_all_it_lacks():
    """`since` only narrows the offerer's filter: a false claim costs bytes, never events."""
    pair = NodePair(8, config=BASE_CONFIG)
    pair.write("a", 50)
    pair.copy("a", "b")
    pair.write("a", 200)  # b lacks these
    pair.write("b", 20)  # a lacks these
    claimed = pair.replicas["a"].graph.extremities()  # b claims a's newest event
    pair.engines["a"]._witness("b", pair.topic, claimed)
    offer, _ = first_offer(pair)
    assert offer.since[0] in claimed
    pair.engines["a"]._sessions.clear()
    pair.sync("a")
    assert pair.same()
