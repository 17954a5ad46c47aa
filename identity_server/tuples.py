"""Building NamedTuples on hot paths without their generated `__new__`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T", bound=tuple[Any, ...])


def maker(cls: type[T]) -> Callable[[tuple[Any, ...]], T]:
    """cls's constructor from a tuple of all its fields, in order.

    A NamedTuple's own `__new__` is a generated Python function, so each instance costs a
    Python frame (~350 ns warm, and its code fetched again where a served call finds the caches
    cold); `tuple.__new__` builds the same instance in C. Nothing checks the count of fields:
    callers pass every one, as the class declares them.
    """
    return functools.partial(tuple.__new__, cls)
