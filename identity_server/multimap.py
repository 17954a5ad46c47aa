"""String-keyed tables whose entries hold one value or, rarely, several.

A plain str for the common single value saves a set per entry, which halves the index's memory
and build time.
"""

from __future__ import annotations

MultiMap = dict[str, "str | set[str]"]


def values(table: MultiMap, k: str) -> tuple[str, ...] | set[str]:
    found = table.get(k)
    if found is None:
        return ()
    return (found,) if isinstance(found, str) else found


def add(table: MultiMap, k: str, value: str) -> None:
    found = table.get(k)
    if found is None:
        table[k] = value
    elif isinstance(found, str):
        if found != value:
            table[k] = {found, value}
    else:
        found.add(value)


def remove(table: MultiMap, k: str, value: str) -> None:
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
