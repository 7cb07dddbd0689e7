"""The Reference Monitor: the one gate every event from outside passes.

It answers "may this byte string become an event of this topic?" with either
the decoded Event or a Rejection naming the reason. It never raises for bad
input and never touches the store: a rejected event leaves no trace but a
counter and a log line. Checks that need the event's ancestry (parents form
an antichain) run when the graph applies the event, because only then are
the parents known; checks that need topic state (authorization) run in the
state layer.

Reasons are `node.core.outcomes.RejectReason` members (stable strings; tests,
logs and metrics use them): the decoder's, this monitor's (bad_signature,
id_mismatch, wrong_topic, timestamp_in_future) and the graph's, given when
it applies or buffers the event (parents_not_antichain, parent_rejected,
buffer_full, wrong_topic).
A "bad_shape" whose detail starts with "unexpected" is no deliberate
verdict but a decoder bug caught here; the fuzz tests require there are none.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from node.core.event import Event, EventFormatError, decode_event
from node.core.identity import verify_signature
from node.core.outcomes import RejectReason

# An author's clock may run ahead of ours by this much before we refuse its
# events; Matrix servers use minutes too. Events from the future would
# otherwise let one writer sort itself after everyone in timestamp tie-breaks.
MAX_FUTURE_SKEW_MS = 5 * 60 * 1000
# Ids whose signature this monitor checked and that are not known to the graph yet,
# the oldest forgotten first. A GossipSub message is checked by the topic validator
# (node.replica.precheck) and moments later taken in by the committer: the second
# look at the same bytes skips the signature (an id hashes the bytes, so the same id
# is the same signed bytes). A validated message holds at most 1,024 events, and the
# committer takes queued ones in within a step or two; a forgotten id only costs the
# check again. ~100 bytes an entry: under 1 MB.
MAX_VERIFIED_IDS = 8_192


@dataclass(frozen=True, slots=True)
class Rejected:
    reason: RejectReason
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


class ReferenceMonitor:
    """Stateless validation of incoming events for one topic; counts rejections."""

    def __init__(self, topic_id: bytes, max_future_skew_ms: int = MAX_FUTURE_SKEW_MS) -> None:
        self.topic_id = topic_id
        self.max_future_skew_ms = max_future_skew_ms
        self.rejections: Counter[str] = Counter()
        self._verified: dict[bytes, None] = {}  # insertion order: the oldest first
        self.signatures_skipped = 0  # checks saved by `_verified`

    def check(self, raw: bytes, now_ms: int, expected_id: bytes | None = None,
              known: Callable[[bytes], bool] | None = None,
              remember: bool = False) -> Event | Rejected:
        """The decoded event, or why not.

        `known(id)` (the graph's `knows`) marks ids this replica already
        holds: such bytes are returned without a signature check. That is
        safe because an id is the hash of the very bytes checked when they
        first arrived, and it is most of the cost of gossip, which delivers
        each event once per neighbour. `remember`: a look that adds nothing
        (the gossip validator's precheck) keeps the id of a good signature,
        so the next check of it, the ingest, skips the signature
        (MAX_VERIFIED_IDS; the same id is the same bytes).
        """
        verdict = self._check(raw, now_ms, expected_id, known, remember)
        if isinstance(verdict, Rejected):
            self.rejections[verdict.reason] += 1
        return verdict

    def _check(self, raw: bytes, now_ms: int, expected_id: bytes | None,
               known: Callable[[bytes], bool] | None = None,
               remember: bool = False) -> Event | Rejected:
        try:
            event = decode_event(raw)
        except EventFormatError as error:
            return Rejected(error.reason, error.detail)
        except Exception as error:  # defence in depth: a decoder bug must not crash the node
            return Rejected(RejectReason.BAD_SHAPE, f"unexpected {type(error).__name__}")
        if expected_id is not None and event.id != expected_id:
            return Rejected(RejectReason.ID_MISMATCH, f"asked for {expected_id.hex()[:16]}")
        if known is not None and known(event.id):
            return event  # a duplicate: verified when it first came
        if event.topic_id() != self.topic_id:
            return Rejected(RejectReason.WRONG_TOPIC, event.topic_id().hex()[:16])
        if event.timestamp_ms > now_ms + self.max_future_skew_ms:
            return Rejected(RejectReason.TIMESTAMP_IN_FUTURE,
                            f"{event.timestamp_ms - now_ms} ms ahead (limit {self.max_future_skew_ms})")
        verified = self._verified
        if verified and verified.pop(event.id, False) is None:
            self.signatures_skipped += 1  # checked moments ago (MAX_VERIFIED_IDS)
            return event
        if not verify_signature(event):
            return Rejected(RejectReason.BAD_SIGNATURE)
        if remember:
            verified[event.id] = None
            if len(verified) > MAX_VERIFIED_IDS:
                del verified[next(iter(verified))]
        return event
