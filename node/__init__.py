"""megnode: the embedding API is importable from the package itself.

    from node import Node, NotAMember, PayloadTooLarge, TopicNotFound

The errors are a leaf module and load at once; `Node` (and `Topic`, `Delivered`)
pull in trio and libp2p, so they load on first use (PEP 562): importing
`node.core.event` or the CLI's light modules does not start the runtime.
"""

from __future__ import annotations

from typing import Any

from node.errors import (Banned, BadPayload, JoinRefusedError, JoinTimeout, NodeError,
                         NotAMember, NotAWriter, PayloadTooLarge, TopicLeft, TopicNotFound)

__all__ = ["BadPayload", "Banned", "Delivered", "JoinRefusedError", "JoinTimeout", "Node",
           "NodeError", "NotAMember", "NotAWriter", "PayloadTooLarge", "Topic", "TopicLeft",
           "TopicNotFound"]

_LAZY = {"Node": "node.runtime", "Topic": "node.topic_handle", "Delivered": "node.topic_handle"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'node' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(module), name)
