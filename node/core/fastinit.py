"""A cheaper `__init__` for the frozen, slotted dataclasses built once per event.

Why: a frozen dataclass's generated `__init__` sets every field through
`object.__setattr__(self, name, value)` — a generic attribute lookup per
field — which made building the small result records of `Graph.add` and
`Replica.receive` cost more than the graph update they describe. A slot's
member descriptor can set it directly; `fast_init` rebuilds `__init__` that
way. The class is otherwise untouched: same signature and defaults, still
frozen (assignment after construction raises), same eq/hash/repr.

Only what these records use is supported: plain defaults, no
default_factory, no `__post_init__`, no init=False fields.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

T = TypeVar("T")


def fast_init(cls: type[T]) -> type[T]:
    """Replace the `__init__` of a frozen, slotted dataclass (see the module docstring)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a frozen, slotted dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has __post_init__, which fast_init does not call")
    namespace: dict[str, object] = {}
    args: list[str] = []
    body: list[str] = []
    for index, item in enumerate(dataclasses.fields(cls)):  # type: ignore[arg-type]
        if not item.init or item.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{item.name}: unsupported field for fast_init")
        namespace[f"_set{index}"] = cls.__dict__[item.name].__set__
        if item.default is dataclasses.MISSING:
            args.append(item.name)
        else:
            namespace[f"_default{index}"] = item.default
            args.append(f"{item.name}=_default{index}")
        body.append(f"    _set{index}(self, {item.name})")
    source = f"def __init__(self, {', '.join(args)}):\n" + "\n".join(body or ["    pass"])
    exec(source, namespace)  # noqa: S102 - the same technique dataclasses itself uses
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"  # type: ignore[attr-defined]
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[misc]
    return cls
