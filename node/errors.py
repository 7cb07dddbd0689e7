"""The runtime's error for users, and unwrapping a lone exception from a nursery's group.

`NodeError` is what every part of the running node (the `Node`, its topic
handles, the dialer, the control socket) raises when it cannot do what was
asked: its message is for people, not tracebacks. It lives in its own leaf
module so those parts can raise it without importing each other.

The subclasses name the user mistakes an application (or the CLI, through the
control socket's `code` field) tells apart: each has a stable `code` string,
which the CLI maps to its exit status (docs/control.md, "Error codes").
"""

from __future__ import annotations


class NodeError(Exception):
    """The node cannot do what was asked; the message says why (for users, not tracebacks)."""

    code = "error"  # the control socket's `code` for this kind of failure


class TopicNotFound(NodeError):
    """This node does not replicate the topic (never joined here, or left)."""

    code = "topic_not_found"


class NotAMember(NodeError):
    """The topic's rules refuse this node: it is not a joined member (never joined, only
    invited, left, or banned) or, joined, it may not write (`NotAWriter`)."""

    code = "not_allowed"


class NotAWriter(NotAMember):
    """A joined member whose role does not let it publish (an invite topic's reader)."""


class Banned(NotAMember):
    """This node is banned from the topic: it receives and may write nothing more there."""

    code = "banned"


class TopicLeft(NodeError):
    """The topic was left while waiting on it (a subscription, a join, a publish)."""

    code = "topic_left"


class PayloadTooLarge(NodeError):
    """A payload over `node.core.event.MAX_PAYLOAD_BYTES`: no event could carry it."""

    code = "payload_too_large"


class BadPayload(NodeError):
    """A payload that cannot be what was asked (not UTF-8 text, not base64)."""

    code = "encoding"


class JoinTimeout(NodeError):
    """`join(wait=True)` / `Topic.joined()` did not see this node joined within its bound;
    the message says what the topic's rules said last."""

    code = "timeout"


class JoinRefusedError(TopicNotFound):
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
