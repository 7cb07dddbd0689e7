"""The peer book: bounded, least useful evicted, stored through the committer, dialled at start."""

from __future__ import annotations

import trio

from node.core.peer_book import (MAX_BOOK_ADDRESSES, MAX_BOOK_TOPICS, PEER_RECORD_PREFIX,
                                 PeerBook, valid_address)
from node.core.store import TABLE_META, Put
from node.runtime import Node
from storage.memory import MemoryStore

WAIT_S = 15.0
POLL_S = 0.05
PEER = "12D3KooWA"


def address(peer: str, port: int = 1) -> str:
    return f"/ip4/10.0.0.1/tcp/{port}/p2p/{peer}"


def test_addresses_are_checked() -> None:
    assert valid_address(address(PEER), PEER)
    assert valid_address(f"/dns4/example.org/tcp/4001/p2p/{PEER}", PEER)
    assert not valid_address(address("other"), PEER)  # names another peer
    assert not valid_address(f"/ip4/0.0.0.0/tcp/1/p2p/{PEER}", PEER)
    assert not valid_address(f"/ip4/10.0.0.1/udp/1/p2p/{PEER}", PEER)
    assert not valid_address("/ip4/10.0.0.1/tcp/1/p2p/" + PEER + "x" * 300, PEER)
    assert not valid_address(7, PEER)  # type: ignore[arg-type]


def test_entries_are_bounded_and_the_least_useful_goes() -> None:
    book = PeerBook(max_peers=3)
    book.connected("good", [address("good")], 100)
    book.served("good", ["t1"], 100)
    book.connected("ok", [address("ok")], 50)
    book.heard("rumour", [address("rumour")], 200)  # never connected: least useful
    book.heard("new", [address("new")], 300)
    assert {e.peer_id for e in book.entries()} == {"good", "ok", "new"}
    assert book.evicted == 1
    many = [address("good", port) for port in range(100)]
    book.connected("good", many, 400)
    assert len(book.get("good").addresses) == MAX_BOOK_ADDRESSES
    book.heard("good", [], 401, topics=[f"t{i}" for i in range(1000)])
    assert len(book.get("good").topics) == MAX_BOOK_TOPICS
    assert [e.peer_id for e in book.most_useful(500, 2)] == ["good", "ok"]


def test_the_book_survives_a_restart_and_skips_damaged_records() -> None:
    store = MemoryStore()
    book = PeerBook()
    book.connected("a", [address("a")], 10)
    book.failed("a", 11)
    book.heard("b", [address("b")], 12, topics=["t"])
    store.apply(book.ops())
    store.apply([Put(TABLE_META, PEER_RECORD_PREFIX + b"junk", b"\xc1not msgpack")])
    assert book.ops() == []  # nothing changed since
    again = PeerBook.load(store)
    assert again.get("a") == book.get("a") and again.get("b") == book.get("b")
    assert again.get("junk") is None and again.changed  # the damaged record is deleted
    store.apply(again.ops())
    assert len(list(store.scan(TABLE_META, PEER_RECORD_PREFIX))) == 2


async def test_a_node_restarted_without_bootstrap_rejoins_from_its_book(tmp_path) -> None:
    async with Node.open(tmp_path / "a", seed=1) as a:
        async with Node.open(tmp_path / "b", bootstrap=[a.addresses[0]], seed=2) as b:
            with trio.fail_after(WAIT_S):
                while a.host.peer_id not in b.host.peers() or \
                        not list(b.store.scan(TABLE_META, PEER_RECORD_PREFIX)):
                    await trio.sleep(POLL_S)
        async with Node.open(tmp_path / "b", seed=2) as b:  # no bootstrap list
            assert b.peer_book.get(a.host.peer_id) is not None
            with trio.fail_after(WAIT_S):
                while a.host.peer_id not in b.host.peers():
                    await trio.sleep(POLL_S)
