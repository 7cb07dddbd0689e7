"""Small DAGs written the way the design document draws them: "a0", "b1", ...

`node("c1", "b0", "a1")` is writer c's node 1 referencing b0 and a1. Ids are
the names, so assertions read like the document.
"""

from __future__ import annotations

from node.core.order import Linearizer, OrderNode, OrderUpdate


def node(name: str, *deps: str, writer: str | None = None) -> OrderNode:
    """Writer = the letters of the name, seq = its digits (or `writer` if given)."""
    letters = name.rstrip("0123456789'")
    digits = name[len(letters) :].rstrip("'")
    refs = tuple(d.encode() for d in deps)
    return OrderNode(name.encode(), (writer or letters).encode(), int(digits), refs)


def keys(*names: str) -> frozenset[bytes]:
    return frozenset(n.encode() for n in names)


def names(ids: tuple[bytes, ...]) -> list[str]:
    return [i.decode() for i in ids]


def feed(linearizer: Linearizer, *nodes: OrderNode) -> OrderUpdate:
    update = None
    for n in nodes:
        update = linearizer.add(n)
    assert update is not None
    return update


def full(linearizer: Linearizer) -> list[str]:
    return names(linearizer.confirmed + linearizer.tentative)
