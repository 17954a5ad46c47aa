"""The reference core: the per-mention hot loop in pure Python, the definition every other
core is tested against."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from identity_server import matching, normalize

if TYPE_CHECKING:
    from identity_server.domain import Mention
    from identity_server.matching import Decision, IndexView

_U64 = (1 << 64) - 1


class ReferenceCore:
    name = "reference"

    def normalize(self, text: str) -> tuple[str, str]:
        display = normalize.display_form(text)
        return display, normalize.key(display)

    def decide(self, index: IndexView, mention: Mention) -> Decision:
        return matching.decide(index, mention.display, mention.entity_type, mention.key)

    def one_edit_apart(self, a: str, b: str) -> bool:
        return normalize.one_edit_apart(a, b)

    def variant_hashes(self, key: str, base: int, seed: int) -> list[int]:
        """Without k[i], the hash is prefix(i) * base**(n-1-i) + suffix(i+1): every variant
        from one pass over the key, no string made."""
        n = len(key)
        prefix = [seed]
        h = seed
        for c in key:
            h = (h * base + ord(c)) & _U64
            prefix.append(h)
        out = [h]
        suffix, power = 0, 1
        for i in range(n - 1, -1, -1):
            out.append((prefix[i] * power + suffix) & _U64)
            suffix = (suffix + ord(key[i]) * power) & _U64
            power = power * base & _U64
        return out

    def probe_shards(self, hashes: list[int], shards: list[Any], anchors: list[str],
                     found: set[str]) -> None:
        from identity_server.typo_table import probe_shards
        probe_shards(hashes, shards, anchors, found)

    def probe_overlay(self, hashes: list[int], overlay: dict[int, str | set[str]],
                      found: set[str]) -> None:
        for h in hashes:
            filed = overlay.get(h)
            if filed is None:
                continue
            if isinstance(filed, str):
                found.add(filed)
            else:
                found.update(filed)


__all__ = ["ReferenceCore"]
