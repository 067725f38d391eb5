"""Immutable record classes that cost next to nothing to define.

``@frozen`` gives a class what ``@dataclass(frozen=True)`` gives it (an
``__init__`` over the annotated fields in order, defaults and
``dataclasses.field(default_factory=...)``, ``kw_only``, equality, hashing,
a readable ``repr`` and assignment refused with
:class:`dataclasses.FrozenInstanceError`), and type checkers read it as a
dataclass (:func:`typing.dataclass_transform`).

The reason it exists is start-up time. The standard decorator writes each
method as source text and compiles it, about 0.55 ms a class here; the ~40
record classes a cold ``sdplan plan`` defines cost 24 ms of a 190 ms run.
These methods are shared closures instead, so defining a class costs a few
microseconds and building an instance about a microsecond more than a
dataclass's. Mutable working state (a sweep in progress, a running server)
keeps :func:`dataclasses.dataclass`.

:func:`replace`, :func:`fields` and :func:`asdict` are this module's
counterparts of the :mod:`dataclasses` functions of the same names.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # Python 3.10: the marker only informs type checkers, so a no-op will do

    def dataclass_transform(**_: Any) -> Callable[[T], T]:
        return lambda decorated: decorated

#: The attribute a record class keeps its field names in, in order.
_FIELDS = "__frozen_fields__"


def _init_method(cls_name: str, names: tuple[str, ...], defaults: dict[str, Any],
                 factories: dict[str, Callable[[], Any]], kw_only: bool) -> Callable[..., None]:
    positional = 0 if kw_only else len(names)
    known = frozenset(names)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > positional:
            raise TypeError(f"{cls_name}() takes {positional} positional arguments but {len(args)} were given")
        values = self.__dict__
        for name, value in zip(names, args):
            if name in kwargs:
                raise TypeError(f"{cls_name}() got multiple values for argument '{name}'")
            values[name] = value
        for name in names[len(args):]:
            if name in kwargs:
                values[name] = kwargs[name]
            elif name in defaults:
                values[name] = defaults[name]
            elif name in factories:
                values[name] = factories[name]()
            else:
                raise TypeError(f"{cls_name}() missing required argument: '{name}'")
        if not known.issuperset(kwargs):
            unexpected = sorted(set(kwargs) - known)[0]
            raise TypeError(f"{cls_name}() got an unexpected keyword argument '{unexpected}'")

    return __init__


def _values(record: Any) -> tuple[Any, ...]:
    values = record.__dict__
    return tuple(values[name] for name in getattr(record, _FIELDS))


def _eq(self: Any, other: Any) -> Any:  # a bool, or NotImplemented for another class
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _values(self) == _values(other)


def _hash(self: Any) -> int:
    return hash(_values(self))


def _repr(self: Any) -> str:
    inner = ", ".join(f"{name}={self.__dict__[name]!r}" for name in getattr(self, _FIELDS))
    return f"{self.__class__.__qualname__}({inner})"


def _setattr(self: Any, name: str, value: Any) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field '{name}'")


def _delattr(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field '{name}'")


def _make_record(cls: type[T], kw_only: bool) -> type[T]:
    names = tuple(name for name, note in cls.__dict__.get("__annotations__", {}).items()
                  if not str(note).startswith(("ClassVar", "typing.ClassVar")))
    defaults: dict[str, Any] = {}
    factories: dict[str, Callable[[], Any]] = {}
    for name in names:
        if name not in cls.__dict__:
            if (defaults or factories) and not kw_only:
                raise TypeError(f"{cls.__name__}: field '{name}' without a default follows one with a default")
            continue
        given = cls.__dict__[name]
        if isinstance(given, dataclasses.Field):
            if given.default_factory is not dataclasses.MISSING:
                factories[name] = given.default_factory
                delattr(cls, name)
                continue
            given = given.default
        defaults[name] = given
        setattr(cls, name, given)
    setattr(cls, _FIELDS, names)
    methods = {"__init__": _init_method(cls.__name__, names, defaults, factories, kw_only), "__eq__": _eq,
               "__hash__": _hash, "__repr__": _repr, "__setattr__": _setattr, "__delattr__": _delattr}
    for method_name, method in methods.items():
        setattr(cls, method_name, method)
    return cls


@overload
def frozen(cls: type[T], /) -> type[T]: ...
@overload
def frozen(*, kw_only: bool = False) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, dataclasses.Field))
def frozen(cls: type[T] | None = None, /, *, kw_only: bool = False) -> type[T] | Callable[[type[T]], type[T]]:
    """Make ``cls`` an immutable record of its annotated fields (``@frozen`` or ``@frozen(kw_only=True)``)."""
    if cls is None:
        return lambda inner: _make_record(inner, kw_only)
    return _make_record(cls, kw_only)


def is_record(value: object) -> bool:
    """Whether ``value`` is an instance of a ``@frozen`` class."""
    return not isinstance(value, type) and hasattr(type(value), _FIELDS)


def fields(record: object) -> tuple[str, ...]:
    """The field names of a record or record class, in declaration order."""
    names: tuple[str, ...] = getattr(record, _FIELDS)
    return names


def replace(record: T, /, **changes: Any) -> T:
    """A copy of ``record`` with ``changes`` applied (checked as a new instance is)."""
    values = {name: record.__dict__[name] for name in getattr(record, _FIELDS)}
    return type(record)(**{**values, **changes})


def asdict(record: object) -> dict[str, Any]:
    """The fields of ``record`` as a dictionary, records, lists, tuples and dicts inside it converted too."""
    return {name: _plain(value) for name, value in zip(fields(record), _values(record))}


def _plain(value: Any) -> Any:
    if is_record(value):
        return asdict(value)
    if isinstance(value, (list, tuple)):
        items = [_plain(item) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value
