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

Each batch ends with `commit()`, the one synchronous group commit the
node's committer makes (node.committer), so an event counts only once it is
durable. (A pipelined commit in a writer thread was measured here too until
it was removed: nothing in the node used it.)
"""

import random
import time
from dataclasses import dataclass
from pathlib import Path

import nacl.bindings
import nacl.signing

from node.core.event import KIND_MESSAGE, SIGNING_DOMAIN, body_of_signed
from node.core.identity import sign_event
from node.core.outcomes import AddStatus
from node.replica.replica import Replica
from storage.lmdb_store import LmdbStore
from tests.helpers import identity

EVENTS = 20_480
BATCH = 1_024  # events per group commit (one fsync each)
PAYLOAD = b"x" * 200
FAR_FUTURE_MS = 10**12



def _signed_bytes() -> int:
    """How many bytes the node signs for one bench event (domain + packed body)."""
    event = sign_event(identity("alice"), topic=b"t" * 32, seq=EVENTS, parents=[b"p" * 32],
                       timestamp_ms=FAR_FUTURE_MS, kind=KIND_MESSAGE, payload=PAYLOAD,
                       auth=[b"t" * 32])
    return len(SIGNING_DOMAIN + body_of_signed(event.raw))


# The baselines call libsodium through the same binding the node uses, on a
# message as long as what the node signs: the ratio then isolates our own overhead.
EVENT_BYTES = _signed_bytes()
MESSAGE = b"m" * EVENT_BYTES
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


@dataclass
class Run:
    """Seconds spent by one side of a ratio: the baseline, the work, and its commits."""

    baseline_s: float = 0.0
    work_s: float = 0.0
    commit_s: float = 0.0

    def figures(self, name: str, baseline: str) -> dict:
        return {
            f"{name}_per_s": round(EVENTS / self.work_s),
            f"{name}_over_{baseline}": round(self.baseline_s / self.work_s, 3),
            f"us_{name}": us_per_event(self.work_s),
            f"us_{name}_commit": us_per_event(self.commit_s),
            f"us_raw_{baseline}": us_per_event(self.baseline_s),
        }


def batched(replica: Replica, run: Run, baseline, step) -> None:
    """EVENTS calls of `step(n)` in batches of BATCH, each side by side with BATCH baseline ops.

    Each batch ends with `commit()`, so its events are durable when the
    batch's time ends.
    """
    for first in range(0, EVENTS, BATCH):
        run.baseline_s += baseline(BATCH)
        start = time.perf_counter()
        for n in range(first, first + BATCH):
            step(n)
        committing = time.perf_counter()
        replica.commit()
        committed = time.perf_counter() - committing
        run.work_s += committing - start + committed
        run.commit_s += committed


def append_and_ingest(tmp_path: Path) -> tuple[Run, Run]:
    stores = [LmdbStore(tmp_path / "origin"), LmdbStore(tmp_path / "receiver")]
    origin = Replica.create_topic(stores[0], identity("alice"), 1_000)
    rng = random.Random(1)
    events: list[bytes] = []

    def publish(n: int) -> None:
        event, _ = origin.publish(PAYLOAD, 1_000 + n, rng)
        events.append(event.raw)

    appended = Run()
    batched(origin, appended, raw_signs, publish)

    receiver = Replica(stores[1], origin.topic_id, identity("bob"))
    receiver.receive(origin.graph.get(origin.topic_id).raw, FAR_FUTURE_MS)
    receiver.commit()

    def receive(n: int) -> None:
        assert receiver.receive(events[n], FAR_FUTURE_MS).status is AddStatus.APPLIED

    ingested = Run()
    batched(receiver, ingested, raw_verifies, receive)
    assert receiver.graph.delivered_count == origin.graph.delivered_count
    for store in stores:
        store.close()
    return appended, ingested


def test_local_append_and_remote_ingest(tmp_path, record_figures):
    figures: dict = {"events": EVENTS, "batch": BATCH, "signed_bytes": EVENT_BYTES}
    appended, ingested = append_and_ingest(tmp_path)
    figures.update(appended.figures("append", "sign"))
    figures.update(ingested.figures("ingest", "verify"))
    figures["targets"] = {"append_over_sign": 0.5, "ingest_over_verify": 0.6}
    record_figures("core", figures)
