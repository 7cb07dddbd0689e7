"""The state vocabulary's enums keep their exact strings.

`Membership` and `AuthReason` are StrEnums so that event content, stored
rejection records, logs, counters and the relay's replies carry the same
strings as before they were enums; these tests pin those strings and the
round trips that depend on them.
"""

from __future__ import annotations

from node.core.event import pack_payload
from node.state.store import EventState, StateGroups
from node.state.types import AuthReason, Membership

# The reasons as stored and logged (the auth_rules docstring lists them).
REASONS = {
    "no_create", "wrong_topic", "bad_content", "bad_create", "create_has_parents",
    "sender_not_joined", "insufficient_power", "state_key_owned_by_other",
    "third_party_invite_unsupported", "bad_state_key", "no_membership", "unknown_membership",
    "join_for_other", "banned", "not_invited", "join_rule_forbids", "target_joined_or_banned",
    "not_a_member", "knock_for_other", "already_member", "bad_power_levels",
    "auth_ref_missing", "auth_ref_not_state", "auth_ref_other_topic", "duplicate_auth_type",
    "unexpected_auth_ref", "no_create_ref", "auth_refs_not_selected", "state_unresolvable",
    "soft_failed",
}


def test_membership_values_are_the_matrix_strings() -> None:
    assert [m.value for m in Membership] == ["join", "leave", "ban", "invite", "knock"]
    assert Membership("join") is Membership.JOIN
    # Content built with a member packs to the very bytes of the raw string.
    assert pack_payload({"membership": Membership.BAN}) == pack_payload({"membership": "ban"})


def test_auth_reasons_keep_their_strings() -> None:
    assert {r.value for r in AuthReason} == REASONS
    for reason in AuthReason:
        assert reason == reason.value and str(reason) == reason.value
        assert f"rejected.{reason}" == f"rejected.{reason.value}"  # the counters' keys


def test_a_stored_rejection_reads_back_as_its_reason() -> None:
    table = _DictTable()
    groups = StateGroups(table, 4)
    groups.record_event(b"e" * 32, EventState(0, 0, AuthReason.NOT_INVITED))
    assert any(value.endswith(b"not_invited") for value in table.data.values())  # as before
    groups.clear_caches()  # read it from the table, not the cache
    record = groups.event_state(b"e" * 32)
    assert record is not None and record.reason == AuthReason.NOT_INVITED
    assert AuthReason(record.reason) is AuthReason.NOT_INVITED


class _DictTable:
    """The smallest table `StateGroups` writes to: a dict."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self.data[key] = value

    def delete(self, key: bytes) -> None:
        self.data.pop(key, None)

    def scan(self, prefix: bytes = b""):
        return sorted((k, v) for k, v in self.data.items() if k.startswith(prefix))
