"""Frozen slotted dataclasses made at a fraction of the cost of their own ``__init__``.

A frozen dataclass's generated ``__init__`` stores each field through ``object.__setattr__`` (its own
``__setattr__`` refuses), and stage 1 makes an ``Access`` of 42 fields for every DB span of every closed trace and
a ``Request`` for every request. :func:`maker` returns a function that takes the same arguments as the class (the
same defaults) and fills a twin class with the same slots by plain stores, then makes the object one of the class
(the same layout: what ``processors.model.span`` does for spans). The object is the one ``cls(...)`` would make:
equal, hashing alike, frozen. Only for frozen slotted dataclasses without ``__post_init__`` or default factories
(checked).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def maker(cls: type[T]) -> Callable[..., T]:
    """A function making ``cls`` objects as ``cls(...)`` does (see the module docstring)."""
    params = getattr(cls, "__dataclass_params__", None)
    slots = cls.__dict__.get("__slots__")
    if params is None or not params.frozen or slots is None or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} is not a frozen slotted dataclass without __post_init__")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    names = tuple(f.name for f in fields)
    if names != tuple(slots) or any(not f.init for f in fields):
        raise TypeError(f"{cls.__name__}: its slots are not its init fields, in order")
    defaults: dict[str, Any] = {}
    args = []
    for f in fields:
        if f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{f.name} has a default factory")
        if f.default is dataclasses.MISSING:
            args.append(f.name)
        else:
            defaults[f"_d_{f.name}"] = f.default
            args.append(f"{f.name}=_d_{f.name}")
    body = "".join(f"    self.{n} = {n}\n" for n in names)
    namespace: dict[str, Any] = {}
    source = f"def __init__(self, {', '.join(args)}):\n{body}"
    exec(source, defaults, namespace)  # noqa: S102 - the dataclass's own field names, as dataclasses makes __init__
    twin: Any = type(f"_{cls.__name__}Maker", (), {"__slots__": names, "__init__": namespace["__init__"]})

    def make(*args: Any, **kwargs: Any) -> T:
        obj = twin(*args, **kwargs)
        obj.__class__ = cls
        return obj  # type: ignore[no-any-return]

    make.__doc__ = f"A {cls.__name__}, as ``{cls.__name__}(...)`` makes it (``processors.model.fast``)."
    return make
