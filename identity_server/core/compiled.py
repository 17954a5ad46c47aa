"""The compiled core: the reference's hot loop in Cython (`identity_server/core/_compiled.pyx`,
built by setup.py where the install has a C compiler). Importing this module fails where the
extension was not built."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from identity_server.core import _compiled

if TYPE_CHECKING:
    from identity_server.domain import Mention
    from identity_server.matching import Decision, IndexView


class CompiledCore:
    name = "compiled"

    def normalize(self, text: str) -> tuple[str, str]:
        return _compiled.normalize_text(text)

    def decide(self, index: IndexView, mention: Mention) -> Decision:
        return _compiled.decide(index, mention.display, mention.entity_type, mention.key)

    def one_edit_apart(self, a: str, b: str) -> bool:
        return _compiled.one_edit_apart(a, b)

    def variant_hashes(self, key: str, base: int, seed: int) -> list[int]:
        return _compiled.variant_hashes(key, base, seed)

    def probe_shards(self, hashes: list[int], shards: list[Any], anchors: list[str],
                     found: set[str]) -> None:
        _compiled.probe_shards(hashes, shards, anchors, found)

    def probe_overlay(self, hashes: list[int], overlay: dict[int, str | set[str]],
                      found: set[str]) -> None:
        _compiled.probe_overlay(hashes, overlay, found)


__all__ = ["CompiledCore"]
