"""Which state changes can take a right away (node.state.restrictive): the guard of
the bans-that-hold checks skips its work until one of these was placed."""

from __future__ import annotations

from node.state.power_levels import PowerLevels
from node.state.restrictive import at_least_as_permissive


def test_raising_a_user_or_lowering_a_send_level_grants_only():
    old = PowerLevels(users={"a": 50}, users_default=0, events={"message": 10})
    assert at_least_as_permissive(PowerLevels(users={"a": 50, "b": 10}, events={"message": 10}),
                                  old)
    assert at_least_as_permissive(PowerLevels(users={"a": 60}, events={"message": 0}), old)


def test_lowering_a_user_or_raising_a_send_level_restricts():
    old = PowerLevels(users={"a": 50, "b": 10}, users_default=0, events={"message": 10})
    assert not at_least_as_permissive(PowerLevels(users={"a": 50}, events={"message": 10}), old)
    assert not at_least_as_permissive(
        PowerLevels(users={"a": 50, "b": 10}, events={"message": 20}), old)
    assert not at_least_as_permissive(
        PowerLevels(users={"a": 50, "b": 10}, events={"message": 10}, events_default=20), old)
    # a per-kind entry dropped falls back to a higher default: a raise too
    assert not at_least_as_permissive(
        PowerLevels(users={"a": 50, "b": 10}, events_default=50), old)
