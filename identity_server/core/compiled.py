"""The compiled core: the typo table's loops in C (`identity_server/_typo_native.c`, built by
setup.py where the install has a C compiler); the rest is the reference's until it is compiled
too. Importing this module fails where the C module was not built."""

from __future__ import annotations

from typing import Any

from identity_server import _typo_native
from identity_server.core.reference import ReferenceCore


class CompiledCore(ReferenceCore):
    name = "compiled"

    def variant_hashes(self, key: str, base: int, seed: int) -> list[int]:
        return _typo_native.variant_hashes(key, base, seed)

    def probe_shards(self, hashes: list[int], shards: list[Any], anchors: list[str],
                     found: set[str]) -> None:
        _typo_native.probe(hashes, shards, anchors, found)

    def probe_overlay(self, hashes: list[int], overlay: dict[int, str | set[str]],
                      found: set[str]) -> None:
        _typo_native.probe_overlay(hashes, overlay, found)


__all__ = ["CompiledCore"]
