"""The deletion-variant table behind typo lookup, packed so that millions of names fit in memory.

Every anchor key is filed under itself and each string one deletion away from it (about 19
variants for a typical name). Held as Python strings in a dict, those variants cost ~1.8 KB per
entity, most of the index. Here the bulk of them lives in one sorted numpy array of 8-byte words,
`(high bits of hash(variant)) | anchor number`: a lookup hashes its len(k) + 1 probes and finds
each one's run with a binary search, so its cost still depends on the key's length, not on the
entity count. A hash collision can only add a false candidate, never hide a true one, and callers
verify every candidate with `one_edit_apart` anyway.

Anchors added after the last `rebuild` go to a small exact overlay (a dict keyed by the variant
strings). Removing an anchor takes it out of the overlay only: entries left in the packed array
are stale, and callers skip anchors that no longer have any entity.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

_U64 = (1 << 64) - 1


def deletion_variants(k: str) -> set[str]:
    """The key itself and every string one deletion away from it."""
    return {k} | {k[:i] + k[i + 1 :] for i in range(len(k))}


class DeletionVariantTable:
    """Variant -> anchor keys: a packed, sorted base plus an exact overlay for later additions."""

    def __init__(self) -> None:
        self._anchors: list[str] = []  # anchor number -> anchor key, for the packed base
        self._packed: npt.NDArray[np.uint64] = np.empty(0, dtype=np.uint64)
        self._number_mask = 0  # low bits of a packed word: the anchor number
        self._overlay: dict[str, str | set[str]] = {}  # variant -> anchor key(s) added since

    def rebuild(self, anchors: Iterable[str]) -> None:
        """Pack every variant of `anchors` (distinct keys) into the base; clear the overlay."""
        listed = list(anchors)
        number_bits = max(1, len(listed).bit_length())
        number_mask = (1 << number_bits) - 1
        hash_mask = _U64 ^ number_mask
        words = array("Q")
        for number, k in enumerate(listed):
            words.extend(
                [(hash(k[:i] + k[i + 1 :]) & hash_mask) | number for i in range(len(k) + 1)]
            )
        packed = np.frombuffer(words, dtype=np.uint64)
        packed.sort()  # in place, on the array's own buffer: no second copy
        self._anchors = listed
        self._packed = packed
        self._number_mask = number_mask
        self._overlay = {}

    def add(self, k: str) -> None:
        """File a new anchor key under its variants (in the overlay)."""
        overlay = self._overlay
        for i in range(len(k) + 1):
            variant = k[:i] + k[i + 1 :]
            found = overlay.get(variant)
            if found is None:
                overlay[variant] = k
            elif isinstance(found, str):
                if found != k:
                    overlay[variant] = {found, k}
            else:
                found.add(k)

    def remove(self, k: str) -> None:
        """Forget an anchor key's overlay entries (packed entries go stale; see the module doc)."""
        overlay = self._overlay
        for variant in deletion_variants(k):
            found = overlay.get(variant)
            if found is None:
                continue
            if isinstance(found, str):
                if found == k:
                    del overlay[variant]
            else:
                found.discard(k)
                if len(found) == 1:
                    overlay[variant] = next(iter(found))

    def anchors_near(self, k: str) -> set[str]:
        """Anchor keys sharing a deletion variant with k, plus rare hash-collision extras."""
        probes = deletion_variants(k)
        found: set[str] = set()
        overlay = self._overlay
        if overlay:
            for variant in probes:
                hit = overlay.get(variant)
                if hit is not None:
                    if isinstance(hit, str):
                        found.add(hit)
                    else:
                        found.update(hit)
        packed = self._packed
        if packed.size:
            number_mask = self._number_mask
            hash_mask = _U64 ^ number_mask
            first = np.fromiter(
                [hash(v) & hash_mask for v in probes], dtype=np.uint64, count=len(probes)
            )
            starts = np.searchsorted(packed, first, side="left")
            ends = np.searchsorted(packed, first | np.uint64(number_mask), side="right")
            anchors = self._anchors
            for start, end in zip(starts.tolist(), ends.tolist()):
                if start != end:
                    for word in packed[start:end].tolist():
                        found.add(anchors[word & number_mask])
        return found

    def packed_bytes(self) -> int:
        """Memory held by the packed base (the array and the anchor list's slots)."""
        return int(self._packed.nbytes) + 8 * len(self._anchors)


__all__ = ["DeletionVariantTable", "deletion_variants"]
