"""Tables whose entries hold one string value or, rarely, several.

A plain str for the common single value saves a set per entry, which halves the index's memory
and build time. Keyed by strings (`MultiMap`) or by any hashable key (the typo overlay's are
ints).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
MultiMap = dict[str, "str | set[str]"]


def values(table: dict[K, str | set[str]], k: K) -> tuple[str, ...] | set[str]:
    found = table.get(k)
    if found is None:
        return ()
    return (found,) if isinstance(found, str) else found


def add(table: dict[K, str | set[str]], k: K, value: str) -> None:
    found = table.get(k)
    if found is None:
        table[k] = value
    elif isinstance(found, str):
        if found != value:
            table[k] = {found, value}
    else:
        found.add(value)


def remove(table: dict[K, str | set[str]], k: K, value: str) -> None:
    found = table.get(k)
    if found is None:
        return
    if isinstance(found, str):
        if found == value:
            del table[k]
        return
    found.discard(value)
    if len(found) == 1:
        table[k] = next(iter(found))


__all__ = ["MultiMap", "add", "remove", "values"]
