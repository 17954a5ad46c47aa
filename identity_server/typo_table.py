"""The deletion-variant table behind typo lookup, packed so that millions of names fit in memory.

Every anchor key is filed under itself and each string one deletion away from it (about 19
variants for a typical name). Held as Python strings in a dict, those variants cost ~1.8 KB per
entity, most of the index. Here the bulk of them lives in one sorted array of 8-byte words,
`(high bits of hash(variant)) | anchor number`, with a directory of bucket starts indexed by the
hash's top bits (about four words a bucket): a lookup hashes its len(k) + 1 probes and reads one
short bucket for each, so its cost depends on the key's length, not on the entity count (a binary
search would not do: its cache misses grow with the table). A hash collision can only add a false
candidate, never hide a true one, and callers verify every candidate with `one_edit_apart`.
numpy sorts and sizes the table at build time; lookups read it through memoryviews (`.data`), which return
plain ints faster than numpy scalars for a handful of reads.

Anchors added after the last `rebuild` go to a small exact overlay (a dict keyed by the variant
strings). Nothing is ever removed: an anchor key whose last name or alias is gone stays filed
(callers check each candidate's names anyway), so the overlay grows only with the distinct anchor
keys a process files after start-up, and the next start-up packs everything afresh.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from identity_server import multimap
from identity_server.multimap import MultiMap

_U64 = (1 << 64) - 1
_WORDS_PER_BUCKET = 4  # the directory costs 4 bytes per bucket: ~1 byte a variant
_DIRECTORY_CHUNK = 1 << 20  # bucket starts found this many at a time (bounded scratch memory)
_BUILD_CHUNK = 1 << 16  # anchors hashed per slice of the packed array


def deletion_variants(k: str) -> set[str]:
    """The key itself and every string one deletion away from it."""
    return {k} | {k[:i] + k[i + 1 :] for i in range(len(k))}


class DeletionVariantTable:
    """Variant -> anchor keys: a packed, sorted base plus an exact overlay for later additions."""

    def __init__(self) -> None:
        self._anchors: list[str] = []  # anchor number -> anchor key, for the packed base
        self._packed: npt.NDArray[np.uint64] = np.empty(0, dtype=np.uint64)
        self._starts: npt.NDArray[Any] = np.zeros(2, dtype=np.uint32)
        self._words = self._packed.data
        self._bucket_starts = self._starts.data
        self._bucket_shift = 63  # bucket of a word: word >> _bucket_shift
        self._number_mask = 0  # low bits of a packed word: the anchor number
        self._overlay: MultiMap = {}  # variant -> anchor key(s) added since

    def rebuild(self, anchors: Iterable[str]) -> None:
        """Pack every variant of `anchors` (distinct keys) into the base; clear the overlay."""
        listed = list(anchors)
        number_bits = max(1, len(listed).bit_length())
        number_mask = (1 << number_bits) - 1
        hash_mask = _U64 ^ number_mask
        # Sized first and filled a slice at a time: no growing buffer copied at twice its size.
        packed = np.empty(sum(map(len, listed)) + len(listed), dtype=np.uint64)
        filled = 0
        for first in range(0, len(listed), _BUILD_CHUNK):
            words = [
                (hash(k[:i] + k[i + 1 :]) & hash_mask) | number
                for number, k in enumerate(listed[first : first + _BUILD_CHUNK], first)
                for i in range(len(k) + 1)
            ]
            packed[filled : filled + len(words)] = words
            filled += len(words)
        packed.sort()
        bucket_bits = max(1, (len(packed) // _WORDS_PER_BUCKET).bit_length())
        bucket_bits = min(bucket_bits, 64 - number_bits)  # buckets split the hash bits only
        shift = 64 - bucket_bits
        buckets = 1 << bucket_bits
        starts = np.empty(buckets + 1, dtype=np.uint32 if len(packed) < 1 << 32 else np.uint64)
        for first in range(0, buckets, _DIRECTORY_CHUNK):
            last = min(buckets, first + _DIRECTORY_CHUNK)
            bounds = np.arange(first, last, dtype=np.uint64) << np.uint64(shift)
            starts[first:last] = np.searchsorted(packed, bounds)
        starts[buckets] = len(packed)
        self._anchors = listed
        self._packed = packed
        self._starts = starts
        self._words = packed.data
        self._bucket_starts = starts.data
        self._bucket_shift = shift
        self._number_mask = number_mask
        self._overlay = {}

    def add(self, k: str) -> None:
        """File a new anchor key under its variants (in the overlay)."""
        for i in range(len(k) + 1):
            multimap.add(self._overlay, k[:i] + k[i + 1 :], k)

    def holds(self, k: str) -> bool:
        """Whether anchor key k is filed (each key is filed under itself, so one probe tells)."""
        if k in multimap.values(self._overlay, k):
            return True
        if self._anchors:
            number_mask = self._number_mask
            hash_mask = _U64 ^ number_mask
            hashed = hash(k) & hash_mask
            bucket = hashed >> self._bucket_shift
            words, anchors = self._words, self._anchors
            for i in range(self._bucket_starts[bucket], self._bucket_starts[bucket + 1]):
                word = words[i]
                if word & hash_mask == hashed and anchors[word & number_mask] == k:
                    return True
        return False

    def anchors_near(self, k: str) -> set[str]:
        """Anchor keys sharing a deletion variant with k, plus rare hash-collision extras."""
        probes = deletion_variants(k)
        found: set[str] = set()
        overlay = self._overlay
        if overlay:
            for variant in probes:
                found.update(multimap.values(overlay, variant))
        if self._anchors:
            words, starts, shift = self._words, self._bucket_starts, self._bucket_shift
            anchors, number_mask = self._anchors, self._number_mask
            hash_mask = _U64 ^ number_mask
            for variant in probes:
                hashed = hash(variant) & hash_mask
                bucket = hashed >> shift
                for i in range(starts[bucket], starts[bucket + 1]):
                    word = words[i]
                    if word & hash_mask == hashed:
                        found.add(anchors[word & number_mask])
        return found

    def packed_bytes(self) -> int:
        """Memory held by the packed base (the array and the anchor list's slots)."""
        return int(self._packed.nbytes + self._starts.nbytes) + 8 * len(self._anchors)


__all__ = ["DeletionVariantTable", "deletion_variants"]
