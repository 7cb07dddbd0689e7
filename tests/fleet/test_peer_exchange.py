"""Peer exchange: what a request and an answer may carry, bounded; what an answer reveals."""

from __future__ import annotations

import msgpack
import trio

from node.core.peer_book import MAX_BOOK_ADDRESSES, PeerBook
from node.core.peer_exchange import (MAX_PX_PEERS, MAX_PX_TOPICS, PX_RECENT_MS, PxPeer,
                                     decode_answer, decode_request, encode_answer,
                                     encode_request, select)
from node.core.peer_exchange import PROTOCOL_PX
from node.runtime import Node

T1, T2 = bytes([1]) * 32, bytes([2]) * 32
WAIT_S = 15.0
POLL_S = 0.05


def addr(peer: str, port: int = 1) -> str:
    return f"/ip4/10.0.0.1/tcp/{port}/p2p/{peer}"


def test_requests_and_answers_round_trip_and_junk_is_refused() -> None:
    assert decode_request(encode_request([T1, T2])) == (T1, T2)
    assert decode_request(b"\xc1") is None
    assert decode_request(msgpack.packb([1, [b"short", 7, T1]])) == (T1,)
    assert len(decode_request(encode_request([T1] * 1000))) == MAX_PX_TOPICS
    peers = [PxPeer("p", (addr("p"),), (T1.hex(),))]
    assert decode_answer(encode_answer(peers), [T1.hex()]).peers == tuple(peers)
    assert decode_answer(b"garbage", [T1.hex()]) is None


def test_an_answer_with_thousands_of_entries_is_bounded() -> None:
    huge = [[f"p{i}", [addr(f"p{i}", port) for port in range(1, 50)], [T1.hex(), T2.hex()]]
            for i in range(3000)]
    data = msgpack.packb([1, huge])
    assert decode_answer(data, [T1.hex()]) is None  # larger than MAX_PX_BYTES: unread
    many = [[f"p{i}", [addr(f"p{i}", port) for port in range(1, 13)], [T1.hex(), T2.hex()]]
            for i in range(60)]
    answer = decode_answer(msgpack.packb([1, many]), [T1.hex()])
    assert len(answer.peers) == MAX_PX_PEERS and answer.dropped == 60 - MAX_PX_PEERS
    assert all(len(p.addresses) == MAX_BOOK_ADDRESSES for p in answer.peers)
    assert all(p.topics == (T1.hex(),) for p in answer.peers)  # only topics we asked about
    bad = msgpack.packb([1, [["p", ["/ip4/0.0.0.0/tcp/1/p2p/p", addr("q")], [T1.hex()]],
                             "junk", ["p2", [addr("p2")], [T2.hex()]]]])
    answer = decode_answer(bad, [T1.hex()])
    assert answer.peers == () and answer.dropped == 3


def test_an_answer_lists_only_peers_of_topics_the_asker_named() -> None:
    book = PeerBook()
    now = 10 * PX_RECENT_MS
    book.connected("live", [addr("live")], now)
    book.served("live", [T1.hex()], now)
    book.connected("other-topic", [addr("other-topic")], now)
    book.served("other-topic", [T2.hex()], now)
    book.connected("long-gone", [addr("long-gone")], now - 2 * PX_RECENT_MS)
    book.served("long-gone", [T1.hex()], now)
    book.connected("asker", [addr("asker")], now)
    book.served("asker", [T1.hex()], now)
    book.connected("banned", [addr("banned")], now)
    book.served("banned", [T1.hex()], now)
    listed = select(book, "asker", [T1.hex()], ["live", "asker", "banned"], now,
                    may_list=lambda p: p != "banned")
    assert [p.peer_id for p in listed] == ["live"]
    assert listed[0].topics == (T1.hex(),)
    assert select(book, "asker", [], ["live"], now) == []  # named nothing: learns nothing


async def test_a_non_member_learns_nothing_of_an_invite_topic(tmp_path) -> None:
    """Node b is a member of a's invite topic, c is not: c's ask about it is answered empty,
    and a never names the topic to c."""
    async with Node.open(tmp_path / "a", seed=1) as a, \
            Node.open(tmp_path / "b", seed=2) as b, \
            Node.open(tmp_path / "c", seed=3) as c:
        topic = await a.create_topic("private", access="invite")
        await a.topic(topic.topic_id).invite(b.identity.public_key)
        await b.connect(a.addresses[0])
        await b.join(topic.topic_id)
        assert a._peer_exchange.topics_for(b.host.peer_id) == [topic.topic_id]
        await c.connect(a.addresses[0])
        assert a._peer_exchange.topics_for(c.host.peer_id) == []
        with trio.fail_after(WAIT_S):  # b asked a: a knows b serves it
            while not (a.peer_book.get(b.host.peer_id) or None) or \
                    a.peer_book.get(b.host.peer_id).topics != (topic.topic_id.hex(),):
                await trio.sleep(POLL_S)
        answer = await c.host.request(a.host.peer_id, PROTOCOL_PX,
                                      encode_request([topic.topic_id]))
        assert decode_answer(answer, [topic.topic_id.hex()]).peers == ()


def test_a_late_peer_exchange_request_is_not_a_fault() -> None:
    from node.peer_executor import PeerExecutor
    from transport.libp2p_streams import REQUEST_READ_TIMEOUT, Misbehaviour

    assert PeerExecutor._spurious(Misbehaviour("p", PROTOCOL_PX, REQUEST_READ_TIMEOUT))
    assert not PeerExecutor._spurious(Misbehaviour("p", "/megnode/relay/1", REQUEST_READ_TIMEOUT))
    assert not PeerExecutor._spurious(Misbehaviour("p", PROTOCOL_PX, "malformed_frame"))
