"""The relay under a Sybil flood (issue 16): keys are free, sources and verifications are not.

The attack replayed: a client takes a fresh key every REQUEST_BURST requests
(so no key's bucket ever empties) and submits member events of its own
key - the one kind a non-relayed key may send - on an open topic. Before,
the relay verified every one of them (143,360 events in 20 s). Now a key
nobody granted the writing level costs no signature check at all; the
requests of one source address are limited whatever key they carry; and
however many authorised keys there are, the relay verifies at most
VERIFY_PER_S events a second. `RelayServer` is sans-IO: the clock is an
argument and verifications are counted by wrapping the monitor's check.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

import node.core.monitor as monitor
from node.core.event import EVENT_VERSION, pack, pack_payload, signed_encoding
from node.relay import (
    REQUEST_BURST,
    RelayLimits,
    RelayServer,
    Rights,
    submit_rights,
)
from node.replica.replica import Replica
from node.state.types import RULE_PUBLIC, TYPE_MEMBER
from tests.helpers import authorized_topic, identity
from transport.relay import RelayReason, SubmitRequest, SubmitResult, decode, encode

NOW_MS = 10_000
EVENTS_PER_REQUEST = 32
SOURCE = "192.0.2.7"
JOIN = pack_payload({"membership": "join", "relayed": True})


@pytest.fixture
def verifications(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the Reference Monitor's signature checks (a list of one int)."""
    count = [0]
    real = monitor.verify_signature

    def counting(event):  # type: ignore[no-untyped-def]
        count[0] += 1
        return real(event)

    monkeypatch.setattr(monitor, "verify_signature", counting)
    yield count


def open_relay(limits: RelayLimits | None = None) -> tuple[Replica, RelayServer]:
    replica = authorized_topic(author="alice", join_rule=RULE_PUBLIC)
    replica.commit()
    server = RelayServer(lambda t: replica if t == replica.topic_id else None,
                         random.Random(5), limits or RelayLimits())
    return replica, server


def own_member_events(replica: Replica, key: bytes, first_seq: int) -> bytes:
    """A submit of EVENTS_PER_REQUEST distinct member events of `key`, signatures zeroed."""
    parents = sorted(replica.graph.extremities())
    events = tuple(signed_encoding(pack([EVENT_VERSION, replica.topic_id, key, first_seq + i,
                                         parents, [], 1, TYPE_MEMBER, key.hex(), JOIN]),
                                   bytes(64))
                   for i in range(EVENTS_PER_REQUEST))
    return encode(SubmitRequest(replica.topic_id, events))


def flood(replica: Replica, server: RelayServer, keys: int, per_key: int, source: str,
          spacing_ms: int) -> list[object]:
    replies = []
    for n in range(keys * per_key):
        key = identity(f"sybil-{n // per_key}").public_key
        handled = server.handle(key, own_member_events(replica, key, n * EVENTS_PER_REQUEST),
                                NOW_MS + n * spacing_ms, source)
        replica.commit()
        replies.append(decode(handled.response))
    return replies


def test_unauthorised_keys_cost_no_signature_verification(verifications: list[int]) -> None:
    replica, server = open_relay()
    replies = flood(replica, server, keys=4, per_key=REQUEST_BURST, source=SOURCE, spacing_ms=50)
    results = [r for r in replies if isinstance(r, SubmitResult)]
    assert results, "some requests pass the rate limits and reach the events"
    assert all(o.reason == RelayReason.NOT_RELAYED_WRITER for r in results for o in r.outcomes)
    assert verifications[0] == 0
    assert server.stats["verified"] == 0
    assert server.stats["unauthorised_unverified"] == len(results) * EVENTS_PER_REQUEST


def test_a_sybil_client_cycling_keys_from_one_source_gets_limited() -> None:
    replica, server = open_relay()
    keys, per_key, spacing_ms = 20, REQUEST_BURST, 5  # 200 requests/s, a fresh key each burst
    replies = flood(replica, server, keys, per_key, SOURCE, spacing_ms)
    served = sum(not getattr(r, "reason", None) == RelayReason.RATE_LIMITED for r in replies)
    limits = server.limits
    span_s = keys * per_key * spacing_ms / 1_000
    assert served <= limits.source_burst + limits.source_requests_per_s * span_s + 1
    assert served < len(replies) / 2
    # Another source is not held back by this one.
    stranger = identity("elsewhere").public_key
    reply = decode(server.handle(stranger, own_member_events(replica, stranger, 0),
                                 NOW_MS + keys * per_key * spacing_ms, "198.51.100.1").response)
    assert isinstance(reply, SubmitResult)


def test_authorised_keys_are_verified_within_the_node_wide_budget(
        verifications: list[int]) -> None:
    replica, server = open_relay(RelayLimits(verify_per_s=100, verify_burst=64))
    rng = random.Random(1)
    keys = [identity(f"granted-{i}").public_key for i in range(8)]
    for key in keys:  # an admin granted each the writing level: they may declare relayed
        replica.add_writer(key, NOW_MS, rng)
    replica.commit()
    assert all(submit_rights(replica, key) is Rights.OWN_MEMBER for key in keys)
    outcomes = []
    for n, key in enumerate(keys):  # one submit per key and per source, all at once
        handled = server.handle(key, own_member_events(replica, key, 0), NOW_MS, f"src-{n}")
        replica.commit()
        reply = decode(handled.response)
        assert isinstance(reply, SubmitResult)
        outcomes += reply.outcomes
    assert verifications[0] == 64  # the burst, whatever the number of keys and sources
    assert sum(o.reason == RelayReason.RATE_LIMITED for o in outcomes) == len(outcomes) - 64
    # A second later the budget has refilled by verify_per_s.
    key = keys[0]
    server.handle(key, own_member_events(replica, key, 100), NOW_MS + 1_000, "src-0")
    assert verifications[0] == 64 + EVENTS_PER_REQUEST


def test_submit_rights_follow_the_resolved_state() -> None:
    replica, _ = open_relay()
    rng = random.Random(2)
    stranger, granted = identity("stranger").public_key, identity("granted").public_key
    assert submit_rights(replica, stranger) is Rights.NONE  # open topic, but no grant
    replica.add_writer(granted, NOW_MS, rng)
    replica.commit()
    assert submit_rights(replica, granted) is Rights.OWN_MEMBER
    replica.ban(granted, NOW_MS + 1, rng)
    replica.commit()
    assert submit_rights(replica, granted) is Rights.NONE
