"""Read-only views of the topics a node replicates: `megnode topic list | members | info`.

Each view is a bounded JSON-able dict read from the node's topic handles on the
trio thread (no await, so it never interleaves with a committer step). Kept out
of the control socket's request loop so the views read at once, and out of
`Topic` so the handle stays what an application needs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from node.errors import NodeError
from node.topic_handle import Topic, parse_topic_id

MAX_MEMBERS_LISTED = 1_000  # `topic members`: entries listed (their count is always given)
MEMBER_EVENT = "m.room.member"


class NodeView(Protocol):
    """What the views read of a `node.runtime.Node`."""

    @property
    def topics(self) -> dict[bytes, Topic]: ...

    def topic(self, topic_id: bytes) -> Topic: ...

    @property
    def disseminator(self) -> Any: ...


def _topic_of(node: NodeView, request: Mapping[str, Any]) -> Topic:
    return node.topic(parse_topic_id(str(request.get("topic", ""))))


def topic_list(node: NodeView, request: Mapping[str, Any]) -> dict[str, Any]:
    """Every topic replicated here: id, name, ready, this node's membership, delivered."""
    topics = []
    for topic in sorted(node.topics.values(), key=lambda t: t.id_hex):
        status = topic.status()
        topics.append({key: status[key] for key in
                       ("topic", "name", "ready", "membership", "delivered", "acks")})
    return {"topics": topics}


def members(topic: Topic) -> list[dict[str, Any]]:
    """Every member event's subject in the current state: key, membership, role."""
    replica = topic.replica
    if not replica.ready or not replica.authorizing:
        return []
    out = []
    for (kind, key), event in sorted(replica.state().items()):
        if kind != MEMBER_EVENT:
            continue
        try:
            content = event.content()
            member = bytes.fromhex(key)
        except (ValueError, TypeError):
            continue  # a state key that is not a node id: not a member of this node's kind
        membership = content.get("membership") if isinstance(content, dict) else None
        out.append({"member": key, "membership": membership,
                    "role": replica.role_of(member).value})
    return out


def topic_members(node: NodeView, request: Mapping[str, Any]) -> dict[str, Any]:
    listed = members(_topic_of(node, request))
    return {"count": len(listed), "members": listed[:MAX_MEMBERS_LISTED]}


def topic_info(node: NodeView, request: Mapping[str, Any]) -> dict[str, Any]:
    """The topic's status plus its access, member counts and the connected peers in it."""
    topic = _topic_of(node, request)
    listed = members(topic)
    joined = {m["member"] for m in listed if m["membership"] == "join"}
    ready = topic.replica.ready and topic.replica.authorizing
    return {"info": topic.status() | {
        "access": None if not ready else ("invite" if topic.private else "open"),
        "members": dict(Counter(str(m["membership"]) for m in listed)),
        "peers": sorted(str(p) for p in node.disseminator.peers if str(p) in joined),
    }}


TOPIC_VIEWS: dict[str, Callable[[NodeView, Mapping[str, Any]], dict[str, Any]]] = {
    "topic_list": topic_list,
    "topic_members": topic_members,
    "topic_info": topic_info,
}
