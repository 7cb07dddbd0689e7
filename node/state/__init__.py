"""Topic state: Matrix room state, its authorization rules and state resolution v2.

Sans-IO core code (standard library + msgpack only): every function here is
pure and deterministic, and looks events up through an `EventSource`.

    types         state keys, state maps, user ids (hex of the author key)
    power_levels  effective power levels with Matrix's defaults
    view          reading membership / join rule / levels out of a state map
    auth_rules    Matrix v11 authorization rules adapted to megnode
                  (member_rules: rule 4, power_rules: rule 9)
    roles         indexer / writer / relayed writer, read from the state
    auth_chain    auth chain difference (bounded walks)
    ordering      reverse topological power ordering, mainline ordering
    resolution    state resolution v2
"""

from node.state.auth_rules import (
    EventFields,
    auth_types_for,
    auth_types_for_event,
    check_auth,
    check_auth_refs,
    select_auth_refs,
)
from node.state.resolution import resolve
from node.state.roles import Role, indexers, role_of
from node.state.types import EventSource, StateKey, StateMap, user_id

__all__ = [
    "EventFields", "EventSource", "Role", "StateKey", "StateMap", "auth_types_for",
    "auth_types_for_event", "check_auth", "check_auth_refs", "indexers", "resolve", "role_of",
    "select_auth_refs", "user_id",
]
