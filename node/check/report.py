"""What `megnode check` reports: kinds of damage, findings, per-topic and store verdicts.

Values only (no store access), shared by the graph walk (`node.check`) and
the walks of the other tables (`node.check.tables`). A finding names the
table and the key (without the topic prefix) where the damage is, and what
is wrong; a topic lists at most MAX_FINDINGS_LISTED of them and counts the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

# Findings listed per topic; beyond this only the count grows (a wrecked
# topic of a million events must not print a million lines).
MAX_FINDINGS_LISTED = 20
KEY_TEXT_CHARS = 48  # hex characters of a key shown in a finding


class Damage(StrEnum):
    """What a finding says is wrong. Stable strings: the report and the tests use them."""

    MISSING_TABLE = "missing_table"  # store-wide: a named database is absent
    UNKNOWN_TABLE = "unknown_table"  # store-wide: a named database this build does not know
    UNREADABLE = "unreadable"  # store-wide: LMDB failed mid-walk (a corrupt page)
    BAD_TOPIC_RECORD = "bad_topic_record"  # store-wide: a node's topic record is malformed
    BAD_KEY = "bad_key"  # a key of the wrong length or shape for its table
    BAD_RECORD = "bad_record"  # a value that does not decode as its table's record
    UNDECODABLE = "undecodable"  # the raw event does not decode
    WRONG_TOPIC = "wrong_topic"  # the event belongs to another topic
    BAD_SIGNATURE = "bad_signature"
    ID_MISMATCH = "id_mismatch"  # the id a key or index names is not the event's id
    MISSING_PARENT = "missing_parent"  # a parent is not applied
    PARENT_NOT_BEFORE = "parent_not_before"  # a parent is applied at a later position
    BAD_DEPTH = "bad_depth"
    DELIVERY_HOLE = "delivery_hole"  # a position missing from 0..n-1
    COUNTER_MISMATCH = "counter_mismatch"  # a stored counter disagrees with the records
    INDEX_DANGLING = "index_dangling"  # an index entry without the record it points at
    EXTREMITY_MISSING = "extremity_missing"  # a forward extremity that is not applied
    CHILD_MISSING = "child_missing"  # a children entry naming an unapplied event
    EVENT_MISSING = "event_missing"  # a record (authors, state, order) names an unapplied event
    BUFFERED_APPLIED = "buffered_applied"  # a buffered event that is applied already
    UNINDEXED = "unindexed"  # an applied or buffered event missing from an index of it
    REJECTED_APPLIED = "rejected_applied"  # a remembered rejection of an applied event
    GROUP_MISSING = "group_missing"  # a state record names a state group with no record
    CONFIRMED_HOLE = "confirmed_hole"  # the confirmed prefix is not 0..n-1
    ORDER_MISMATCH = "order_mismatch"  # position and node records of the order disagree


def key_text(rest: bytes) -> str:
    """A key without its topic prefix, readable: `g|0000000000000005`, or hex."""
    if rest[:1].isalpha():
        return rest[:1].decode("ascii") + "|" + rest[1:].hex()[:KEY_TEXT_CHARS]
    return rest.hex()[:KEY_TEXT_CHARS]


@dataclass(slots=True)
class Finding:
    damage: Damage
    position: int | None = None
    detail: str = ""
    table: str = ""
    key: str = ""

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"damage": str(self.damage)}
        if self.table:
            out["table"] = self.table
        if self.key:
            out["key"] = self.key
        if self.position is not None:
            out["position"] = self.position
        if self.detail:
            out["detail"] = self.detail
        return out


@dataclass(slots=True)
class TopicReport:
    """One topic's verdict: how many events it holds and what is damaged."""

    topic: bytes
    recorded: bool  # the node's topic record names it (else: left, events kept)
    events: int = 0
    findings: list[Finding] = field(default_factory=list)
    damage_count: int = 0

    @property
    def ok(self) -> bool:
        return self.damage_count == 0

    def add(self, damage: Damage, position: int | None = None, detail: str = "", *,
            table: str = "", key: bytes | None = None) -> None:
        """Count a finding; list it while fewer than MAX_FINDINGS_LISTED are listed.

        `key`: the damaged key without the topic prefix.
        """
        self.damage_count += 1
        if len(self.findings) < MAX_FINDINGS_LISTED:
            text = "" if key is None else key_text(key)
            self.findings.append(Finding(damage, position, detail, table, text))

    def as_json(self) -> dict[str, Any]:
        return {"topic": self.topic.hex(), "recorded": self.recorded, "events": self.events,
                "ok": self.ok, "damage_count": self.damage_count,
                "damage": [f.as_json() for f in self.findings]}


@dataclass(slots=True)
class StoreReport:
    """The whole store's verdict: store-wide findings and one report per topic."""

    path: Path
    store_findings: list[Finding] = field(default_factory=list)
    topics: list[TopicReport] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.store_findings and all(t.ok for t in self.topics)

    def summary_json(self) -> dict[str, Any]:
        return {"store": str(self.path), "ok": self.ok, "topics": len(self.topics),
                "damaged_topics": [t.topic.hex() for t in self.topics if not t.ok],
                "store_damage": [f.as_json() for f in self.store_findings]}
