"""Auth chains and the auth chain difference of state resolution v2.

The auth chain of an event is everything reachable through `event.auth`
links. The *auth difference* of state sets S1..Sn is ∪Ci − ∩Ci, where Ci is
the auth chain of all events of Si. It holds the state events some fork knew
of and another did not: they must be replayed during resolution so that an
event can be authorised whichever fork it came from.

Like Synapse (and unlike the spec's literal wording), Ci includes the events
of Si themselves, not only their ancestors. The two definitions differ only in
whether an unconflicted state event cited by some forks' events but not by
others joins the full conflicted set; Synapse's test suite pins the inclusive
form, and matching Synapse is what we test against.

Cost. The events present in every Si (the unconflicted state) and their whole
auth chains - call it U - lie in every Ci, so they never belong to the
difference, and U is closed under auth links. So each Ci − U is found by a
walk from Si's other events that stops on entering U, and the difference is
computed over those small remainders. Every walk is bounded by
`MAX_AUTH_CHAIN_EVENTS` visits per resolution: a graph that needs more is
refused with `AuthChainTooLarge` rather than stalling the node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set

from node.state.types import EventSource, StateMap

# Visits per resolution, over all walks. Generous for real topics (an auth
# chain grows with power level and membership changes, not with messages),
# small enough that a resolution cannot run away on a hostile graph.
MAX_AUTH_CHAIN_EVENTS = 1_000_000


class AuthChainTooLarge(Exception):
    """An auth chain walk exceeded `MAX_AUTH_CHAIN_EVENTS`."""


class _Budget:
    """Counts visits across the walks of one resolution."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit

    def spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise AuthChainTooLarge(f"auth chain walk exceeded {self.limit} events")


def _closure(
    start: Iterable[bytes], source: EventSource, stop: Set[bytes], budget: _Budget
) -> set[bytes]:
    """`start` and every event reachable from it through auth links, minus `stop`.

    `stop` must be closed under auth links (a walk never needs to pass through
    it). Events the source does not hold are kept as ids but not walked.
    """
    seen: set[bytes] = set()
    todo = [e for e in start if e not in stop]
    while todo:
        event_id = todo.pop()
        if event_id in seen:
            continue
        budget.spend()
        seen.add(event_id)
        event = source.get(event_id)
        if event is not None:
            todo.extend(a for a in event.auth if a not in stop and a not in seen)
    return seen


def auth_chain_difference(
    state_sets: Sequence[StateMap], common: Set[bytes], source: EventSource,
    limit: int = MAX_AUTH_CHAIN_EVENTS,
) -> set[bytes]:
    """∪Ci − ∩Ci for the state sets; `common` = ids present in every set."""
    budget = _Budget(limit)
    shared = _closure(common, source, frozenset(), budget)
    remainders = [
        _closure((e for e in s.values() if e not in shared), source, shared, budget)
        for s in state_sets
    ]
    if not remainders:
        return set()
    union = set().union(*remainders)
    return union - set.intersection(*remainders)
