"""Fast positional constructors for frozen, slotted dataclasses built once per delivered message.

A frozen dataclass's own ``__init__`` sets every field through ``object.__setattr__`` by name, which made building
deliveries (one per message, in the engine and again in the client library) a sizeable share of what a receiver
spends per message.  :func:`positional_maker` returns a function that fills the slots directly, taking every field
in declaration order; the instances are the same as the class's own constructor would make.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")


def positional_maker(cls: type[T]) -> Callable[..., T]:
    """``make(*values)`` for ``cls``: every field, in declaration order, no defaults, no checks.  Generated the
    way dataclasses generates ``__init__``, with each slot's setter bound once."""
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    namespace.update({f"_set_{name}": getattr(cls, name).__set__ for name in names})
    lines = [f"def make({', '.join(names)}):", "    obj = _new(_cls)"]
    lines += [f"    _set_{name}(obj, {name})" for name in names]
    lines.append("    return obj")
    exec("\n".join(lines), namespace)
    return namespace["make"]
