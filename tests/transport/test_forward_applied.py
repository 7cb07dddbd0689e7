"""Push passes on only what this node applied (transport.intake `_ingest`).

An event whose parents are unknown here is buffered, not judged, so it is not
pushed on when it arrives; once its past comes (a want's answer on the SYNC
channel) and the cascade applies it, it is pushed on then, as push would have.
"""

from __future__ import annotations

from node.core.identity import sign_event
from tests.transport.pair import PAIR_NOW_MS, lagging
from transport.dissemination_config import DisseminationConfig
from transport.effects import Send
from transport.messages import Push, Want, decode, encode

CONFIG = DisseminationConfig(log=False, depletion=False, push_fanout=6, forward_fanout=6)
OTHERS = ("p1", "p2", "p3")


def _pushes(effects: list) -> list[tuple[str, Push]]:
    return [(e.peer, m) for e in effects if isinstance(e, Send)
            and isinstance(m := decode(e.data), Push)]


def test_a_buffered_event_is_pushed_on_only_once_its_past_is_applied():
    pair = lagging(2, config=CONFIG)
    a_engine, b_engine = pair.engines["a"], pair.engines["b"]
    for peer in OTHERS:
        a_engine.on_peer_up(peer, PAIR_NOW_MS)
    b_graph = pair.replicas["b"].graph
    newest = b_graph.get(b_graph.extremities()[0])
    pushed = a_engine.on_message("b", encode(Push(pair.topic, (newest.raw,))), PAIR_NOW_MS)
    assert pair.replicas["a"].graph.is_buffered(newest.id)
    assert _pushes(pushed) == []  # unjudged: not relayed

    now = PAIR_NOW_MS
    relayed: list[tuple[str, Push]] = []
    for _ in range(5):  # the want loop: one level of the missing past per round trip
        now += a_engine.config.want_retry_ms
        for effect in a_engine.tick(now):
            if isinstance(effect, Send) and isinstance(decode(effect.data), Want):
                for answer in b_engine.on_message("a", effect.data, now):
                    if isinstance(answer, Send):
                        relayed += _pushes(a_engine.on_message("b", answer.data, now))
        if pair.same():
            break
    assert pair.same()
    # The released child went on to the others, never back to the peers that hold it.
    assert {peer for peer, _ in relayed} == set(OTHERS)
    assert all(push.events == (newest.raw,) for _, push in relayed)
    assert a_engine.stats["forwarded_when_released"] == 1


def test_a_flood_on_made_up_parents_is_not_relayed():
    pair = lagging(0, config=CONFIG)
    a_engine = pair.engines["a"]
    for peer in OTHERS:
        a_engine.on_peer_up(peer, PAIR_NOW_MS)
    key = pair.replicas["b"].identity
    raws = tuple(sign_event(key, topic=pair.topic, seq=i + 1, parents=[bytes([i + 1]) * 32],
                            timestamp_ms=PAIR_NOW_MS, kind="message", payload=b"x",
                            auth=()).raw for i in range(50))
    effects = a_engine.on_message("b", encode(Push(pair.topic, raws)), PAIR_NOW_MS)
    assert pair.replicas["a"].graph.buffered_count == 50
    assert _pushes(effects) == []
