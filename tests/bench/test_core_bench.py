"""Core throughput: local append and remote ingest, each against its crypto baseline.

Ratios, not absolute rates: the machine is shared, so each figure is set
against the raw ed25519 rate measured in the same run.

* append/sign  = (sign + encode + store with group commit) / raw sign rate  (target >= 0.5)
* ingest/verify = (decode + Reference Monitor + store)      / raw verify rate (target >= 0.6)

Side by side means interleaved: each batch of BATCH events is timed right
after BATCH raw signatures (or verifications) of an event-sized message, so
a neighbour's load that comes and goes weighs on both sides of a ratio
alike. The figures also say how much of each event's time was the group
commit (LMDB puts, page writes and fsync), the part no Python change touches.
"""

import random
import time

import nacl.bindings
import nacl.signing

from node.core.replica import Replica
from storage.lmdb_store import LmdbStore
from tests.helpers import identity

EVENTS = 20_480
BATCH = 1_024  # events per group commit (one fsync each)
PAYLOAD = b"x" * 200
FAR_FUTURE_MS = 10**12

# The baselines call libsodium through the same binding the node uses, on a
# message of an event's size: the ratio then isolates our own overhead.
MESSAGE = b"m" * 330
SECRET = nacl.signing.SigningKey(b"k" * 32)._signing_key
PUBLIC = bytes(nacl.signing.SigningKey(b"k" * 32).verify_key)
SIGNED = nacl.bindings.crypto_sign(MESSAGE, SECRET)


def raw_signs(count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        nacl.bindings.crypto_sign(MESSAGE, SECRET)
    return time.perf_counter() - start


def raw_verifies(count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        nacl.bindings.crypto_sign_open(SIGNED, PUBLIC)
    return time.perf_counter() - start


def us_per_event(seconds: float) -> float:
    return round(seconds / EVENTS * 1e6, 1)


def test_local_append_and_remote_ingest(tmp_path, record_figures):
    origin = Replica.create_topic(LmdbStore(tmp_path / "origin"), identity("alice"), 1_000)
    rng = random.Random(1)
    events: list[bytes] = []
    sign_s = append_s = append_commit_s = 0.0
    for first in range(0, EVENTS, BATCH):
        sign_s += raw_signs(BATCH)
        start = time.perf_counter()
        for n in range(first, first + BATCH):
            event, _ = origin.publish(PAYLOAD, 1_000 + n, rng)
            events.append(event.raw)
        committing = time.perf_counter()
        origin.commit()
        end = time.perf_counter()
        append_s += end - start
        append_commit_s += end - committing

    receiver = Replica(LmdbStore(tmp_path / "receiver"), origin.topic_id, identity("bob"))
    receiver.receive(origin.graph.get(origin.topic_id).raw, FAR_FUTURE_MS)
    receiver.commit()
    verify_s = ingest_s = ingest_commit_s = 0.0
    for first in range(0, EVENTS, BATCH):
        verify_s += raw_verifies(BATCH)
        start = time.perf_counter()
        for raw in events[first:first + BATCH]:
            assert receiver.receive(raw, FAR_FUTURE_MS).status == "applied"
        committing = time.perf_counter()
        receiver.commit()
        end = time.perf_counter()
        ingest_s += end - start
        ingest_commit_s += end - committing

    figures = {
        "events": EVENTS,
        "batch": BATCH,
        "sign_per_s": round(EVENTS / sign_s),
        "append_per_s": round(EVENTS / append_s),
        "append_over_sign": round(sign_s / append_s, 3),
        "verify_per_s": round(EVENTS / verify_s),
        "ingest_per_s": round(EVENTS / ingest_s),
        "ingest_over_verify": round(verify_s / ingest_s, 3),
        "us_per_event": {
            "raw_sign": us_per_event(sign_s),
            "append": us_per_event(append_s),
            "append_commit": us_per_event(append_commit_s),
            "raw_verify": us_per_event(verify_s),
            "ingest": us_per_event(ingest_s),
            "ingest_commit": us_per_event(ingest_commit_s),
        },
        "targets": {"append_over_sign": 0.5, "ingest_over_verify": 0.6},
    }
    record_figures("core", figures)
