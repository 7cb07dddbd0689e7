"""The runtime's error for users, and unwrapping a lone exception from a nursery's group.

`NodeError` is what every part of the running node (the `Node`, its topic
handles, the dialer, the control socket) raises when it cannot do what was
asked: its message is for people, not tracebacks. It lives in its own leaf
module so those parts can raise it without importing each other.
"""

from __future__ import annotations


class NodeError(Exception):
    """The node cannot do what was asked; the message says why (for users, not tracebacks)."""


class JoinRefusedError(NodeError):
    """A join by id found no peer that would let this node in: the topic is unknown to
    every peer asked, or this node is not invited (a refusal does not say which, so it
    reveals nothing), or no answer came within the handshake timeout. Nothing of the
    topic is kept; joining again (after an invite) starts afresh."""


def sole_exception(group: BaseExceptionGroup) -> BaseException | None:
    """The one exception inside `group` (through nested groups), or None if there are more."""
    leaves: list[BaseException] = []

    def collect(error: BaseException) -> None:
        if isinstance(error, BaseExceptionGroup):
            for inner in error.exceptions:
                collect(inner)
        else:
            leaves.append(error)

    collect(group)
    return leaves[0] if len(leaves) == 1 else None
