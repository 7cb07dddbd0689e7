"""Core throughput: local append and remote ingest, each against its crypto baseline.

Ratios, not absolute rates: the machine is shared, so each figure is set
against the raw ed25519 rate measured in the same run.

* append/sign  = (sign + encode + store with group commit) / raw sign rate  (target >= 0.5)
* ingest/verify = (decode + Reference Monitor + store)      / raw verify rate (target >= 0.6)
"""

import random
import time

import nacl.bindings
import nacl.signing

from node.core.replica import Replica
from storage.lmdb_store import LmdbStore
from tests.helpers import identity

EVENTS = 20_000
BATCH = 1_024  # events per group commit (one fsync each)
PAYLOAD = b"x" * 200


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


# The baselines call libsodium through the same binding the node uses, on a
# message of an event's size: the ratio then isolates our own overhead.
MESSAGE = b"m" * 330


def raw_sign_rate(n: int = EVENTS) -> float:
    secret = nacl.signing.SigningKey(b"k" * 32)._signing_key
    start = time.perf_counter()
    for _ in range(n):
        nacl.bindings.crypto_sign(MESSAGE, secret)
    return rate(n, time.perf_counter() - start)


def raw_verify_rate(n: int = EVENTS) -> float:
    key = nacl.signing.SigningKey(b"k" * 32)
    signed = nacl.bindings.crypto_sign(MESSAGE, key._signing_key)
    public = bytes(key.verify_key)
    start = time.perf_counter()
    for _ in range(n):
        nacl.bindings.crypto_sign_open(signed, public)
    return rate(n, time.perf_counter() - start)


def test_local_append_and_remote_ingest(tmp_path, record_figures):
    sign_rate = raw_sign_rate()
    origin = Replica.create_topic(LmdbStore(tmp_path / "origin"), identity("alice"), 1_000)
    rng = random.Random(1)
    start = time.perf_counter()
    events = []
    for n in range(EVENTS):
        event, _ = origin.publish(PAYLOAD, 1_000 + n, rng)
        events.append(event.raw)
        if n % BATCH == BATCH - 1:
            origin.commit()
    origin.commit()
    append_rate = rate(EVENTS, time.perf_counter() - start)

    verify_rate = raw_verify_rate()
    receiver = Replica(LmdbStore(tmp_path / "receiver"), origin.topic_id, identity("bob"))
    receiver.receive(origin.graph.get(origin.topic_id).raw, 10**12)
    receiver.commit()
    start = time.perf_counter()
    for n, raw in enumerate(events):
        outcome = receiver.receive(raw, 10**12)
        assert outcome.status == "applied"
        if n % BATCH == BATCH - 1:
            receiver.commit()
    receiver.commit()
    ingest_rate = rate(EVENTS, time.perf_counter() - start)

    figures = {
        "events": EVENTS,
        "batch": BATCH,
        "sign_per_s": round(sign_rate),
        "append_per_s": round(append_rate),
        "append_over_sign": round(append_rate / sign_rate, 3),
        "verify_per_s": round(verify_rate),
        "ingest_per_s": round(ingest_rate),
        "ingest_over_verify": round(ingest_rate / verify_rate, 3),
        "targets": {"append_over_sign": 0.5, "ingest_over_verify": 0.6},
    }
    record_figures("core", figures)
