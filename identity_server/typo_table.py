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

Anchors added after the last `rebuild` go to an exact overlay (a dict keyed by the variant
strings). A pack moves them into the packed base in three steps, so neither readers nor writers
wait for the slow part: `begin_pack` sets the overlay aside (lookups still read it) and starts an
empty one, `pack` builds the merged base from the set-aside anchors, and `install` swaps the new
base in and forgets the set-aside overlay, which the caller then frees off the lock (`release`).
Nothing is ever removed: an anchor key whose last name or alias is gone stays filed (callers
check each candidate's names anyway).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from identity_server import multimap
from identity_server.multimap import MultiMap

_U64 = (1 << 64) - 1
_WORDS_PER_BUCKET = 4  # the directory costs 4 bytes per bucket: ~1 byte a variant
_DIRECTORY_CHUNK = 1 << 20  # bucket starts found this many at a time (bounded scratch memory)
_BUILD_CHUNK = 1 << 16  # anchors hashed per slice of the packed array

Words = npt.NDArray[np.uint64]


def deletion_variants(k: str) -> set[str]:
    """The key itself and every string one deletion away from it."""
    return {k} | {k[:i] + k[i + 1 :] for i in range(len(k))}


@dataclass(frozen=True, slots=True, eq=False)
class _Packed:
    """One packed base, replaced whole so that a reader never mixes the fields of two."""

    anchors: list[str]  # anchor number -> key; later bases extend this same list
    array: Words
    starts: npt.NDArray[Any]
    words: memoryview  # array.data and starts.data: plain-int reads
    bucket_starts: memoryview
    shift: int  # bucket of a word: word >> shift
    number_mask: int  # low bits of a word: the anchor number


@dataclass(slots=True, eq=False)
class OverlayPack:
    """The overlay set aside by `begin_pack`, and the packed base made from it by `pack`."""

    replaces: _Packed
    overlay: MultiMap
    anchors: list[str]
    packed: _Packed | None = None

    def release(self) -> None:
        """Free the set-aside overlay a slice at a time (other threads run between slices)."""
        overlay = self.overlay
        for _ in range(len(overlay)):
            overlay.popitem()


class DeletionVariantTable:
    """Variant -> anchor keys: a packed, sorted base plus an exact overlay for later additions."""

    def __init__(self) -> None:
        self._base = _pack(np.empty(0, dtype=np.uint64), [], _number_bits(0))
        self._overlay: MultiMap = {}  # variant -> anchor key(s) filed since the base was packed
        self._overlay_anchors: list[str] = []  # those anchor keys, in filing order
        self._packing: MultiMap = {}  # the overlay set aside while a pack is built
        self._pack: OverlayPack | None = None

    @property
    def overlay_anchors(self) -> int:
        """Anchors filed since the last pack began (set-aside ones are on their way)."""
        return len(self._overlay_anchors)

    @property
    def packed_anchors(self) -> int:
        return len(self._base.anchors)

    def rebuild(self, anchors: Iterable[str]) -> None:
        """Pack every variant of `anchors` (distinct keys) into the base; clear the overlay."""
        listed = list(anchors)
        bits = _number_bits(len(listed))
        array = np.empty(_variant_count(listed), dtype=np.uint64)
        _fill_words(array, listed, 0, bits)
        array.sort()
        self._base = _pack(array, listed, bits)
        self._overlay = {}
        self._overlay_anchors = []
        self._packing = {}
        self._pack = None

    def add(self, k: str) -> None:
        """File a new anchor key under its variants (in the overlay)."""
        for i in range(len(k) + 1):
            multimap.add(self._overlay, k[:i] + k[i + 1 :], k)
        self._overlay_anchors.append(k)

    def begin_pack(self) -> OverlayPack:
        """Set the overlay aside for a pack and start an empty one (under the writers' lock;
        quick). Lookups read the set-aside overlay until `install` or a `rebuild`."""
        if self._pack is not None:
            raise RuntimeError("a pack is already under way")
        pack = OverlayPack(self._base, self._overlay, self._overlay_anchors)
        self._packing = pack.overlay  # before the swap: a reader never misses both
        self._overlay, self._overlay_anchors = {}, []
        self._pack = pack
        return pack

    @staticmethod
    def pack(pack: OverlayPack) -> None:
        """Build the base with the set-aside anchors merged in (no lock needed: it reads only
        what `begin_pack` froze, and numpy does the bulk of it without the GIL). The merge is
        linear: the base is sorted, and so are the new words before they join it."""
        base, absorbed = pack.replaces, pack.anchors
        first = len(base.anchors)
        bits = base.number_mask.bit_length()
        total = first + len(absorbed)
        old = len(base.array)
        merged = np.empty(old + _variant_count(absorbed), dtype=np.uint64)
        merged[:old] = base.array
        if total > base.number_mask + 1:  # numbers need more bits: take them from the hash
            bits = _number_bits(total)
            taken = ((1 << bits) - 1) ^ base.number_mask
            np.bitwise_and(merged[:old], np.uint64(_U64 ^ taken), out=merged[:old])
        _fill_words(merged[old:], absorbed, first, bits)
        merged[old:].sort()
        merged.sort(kind="stable")  # timsort: two sorted runs (nearly, after taking bits) merge
        pack.packed = _pack(merged, base.anchors, bits)

    def install(self, pack: OverlayPack) -> bool:
        """Swap in the base `pack` built (under the writers' lock; quick). False, and nothing
        changed, when the table was rebuilt since `begin_pack`. Then call `pack.release()`."""
        if self._pack is not pack or pack.packed is None:
            return False
        pack.packed.anchors.extend(pack.anchors)  # numbers the old base's words never use
        self._base = pack.packed  # before the set-aside overlay goes: never missing both
        self._packing = {}
        self._pack = None
        return True

    def abandon(self, pack: OverlayPack) -> None:
        """Give up a pack that failed: its anchors go back into the overlay (under the lock)."""
        if self._pack is not pack:
            return
        for k in pack.anchors:
            self.add(k)
        self._packing = {}
        self._pack = None

    def holds(self, k: str) -> bool:
        """Whether anchor key k is filed (each key is filed under itself, so one probe tells)."""
        if k in multimap.values(self._overlay, k) or k in multimap.values(self._packing, k):
            return True
        base = self._base
        number_mask = base.number_mask
        hash_mask = _U64 ^ number_mask
        hashed = hash(k) & hash_mask
        bucket = hashed >> base.shift
        words, anchors = base.words, base.anchors
        for i in range(base.bucket_starts[bucket], base.bucket_starts[bucket + 1]):
            word = words[i]
            if word & hash_mask == hashed and anchors[word & number_mask] == k:
                return True
        return False

    def anchors_near(self, k: str) -> set[str]:
        """Anchor keys sharing a deletion variant with k, plus rare hash-collision extras."""
        probes = deletion_variants(k)
        found: set[str] = set()
        for overlay in (self._overlay, self._packing):  # read in the order begin_pack sets them
            if overlay:
                for variant in probes:
                    found.update(multimap.values(overlay, variant))
        base = self._base  # read after the overlays: an install swaps the base in first
        words, starts, shift = base.words, base.bucket_starts, base.shift
        anchors, number_mask = base.anchors, base.number_mask
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
        base = self._base
        return int(base.array.nbytes + base.starts.nbytes) + 8 * len(base.anchors)


def _number_bits(anchors: int) -> int:
    """Bits for anchor numbers, with room to double before a pack must take more."""
    return max(1, (2 * anchors).bit_length())


def _variant_count(anchors: Sequence[str]) -> int:
    return sum(map(len, anchors)) + len(anchors)


def _fill_words(out: Words, anchors: Sequence[str], first: int, bits: int) -> None:
    """Write the words of every variant of `anchors`, numbered from `first`, into `out`
    (sized by _variant_count), a slice at a time: no growing buffer copied at twice its size."""
    hash_mask = _U64 ^ ((1 << bits) - 1)
    filled = 0
    for start in range(0, len(anchors), _BUILD_CHUNK):
        words = [
            (hash(k[:i] + k[i + 1 :]) & hash_mask) | number
            for number, k in enumerate(anchors[start : start + _BUILD_CHUNK], first + start)
            for i in range(len(k) + 1)
        ]
        out[filled : filled + len(words)] = words
        filled += len(words)


def _pack(array: Words, anchors: list[str], bits: int) -> _Packed:
    """A base over sorted `array`, with its bucket directory."""
    bucket_bits = max(1, (len(array) // _WORDS_PER_BUCKET).bit_length())
    bucket_bits = min(bucket_bits, 64 - bits)  # buckets split the hash bits only
    shift = 64 - bucket_bits
    buckets = 1 << bucket_bits
    starts = np.empty(buckets + 1, dtype=np.uint32 if len(array) < 1 << 32 else np.uint64)
    for first in range(0, buckets, _DIRECTORY_CHUNK):
        last = min(buckets, first + _DIRECTORY_CHUNK)
        bounds = np.arange(first, last, dtype=np.uint64) << np.uint64(shift)
        starts[first:last] = np.searchsorted(array, bounds)
    starts[buckets] = len(array)
    return _Packed(anchors, array, starts, array.data, starts.data, shift, (1 << bits) - 1)


__all__ = ["DeletionVariantTable", "OverlayPack", "deletion_variants"]
