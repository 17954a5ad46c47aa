"""The deletion-variant table behind typo lookup, packed so that millions of names fit in memory.

Every anchor key is filed under itself and each string one deletion away from it (about 19
variants for a typical name). Held as Python strings in a dict, those variants would be most of
the index's memory. Here the bulk of them lives in sorted arrays of 8-byte words,
`(high bits of the variant's hash) | anchor number`, one array per shard (the hash's top 4
bits), each with a directory of bucket starts indexed by the next bits of the hash (about four
words a bucket): a lookup hashes its len(k) + 1 probes and reads one short bucket for each, so
its cost depends on the key's length, not on the entity count (a binary search would not do:
its cache misses grow with the table). A hash collision can only add a false candidate, never
hide a true one, and callers verify every candidate with `one_edit_apart`. numpy sorts and
sizes the arrays at build time; lookups read them through memoryviews (`.data`), which return
plain ints faster than numpy scalars for a handful of reads. A lookup's hashing and probes run
in the resolve core (`identity_server.core`): compiled (Cython) where the install could build
it, else the reference loops (`probe_shards` below and `core.reference`), which its tests
compare it with.

The hash is a polynomial over code points, `h = h * BASE + ord(c)` from a seed, modulo 2**64,
with a base and seed drawn at random in each process (the table is never stored). Unlike
`hash()` of each variant string, it gives every variant of a key from one pass over the key,
with no string made: the deletion of k[i] hashes to `prefix(i) * BASE**(n-1-i) + suffix(i+1)`;
and numpy computes a whole table's at once.

Anchors added after the last `rebuild` go to an exact overlay (a dict keyed by the variants'
hashes). A pack moves them into the packed shards in steps, so neither readers nor writers wait
for the slow part and the extra memory is one shard's, not a second table: `begin_pack` sets the
overlay aside (lookups still read it) and starts an empty one; `build` merges the set-aside
anchors into each shard in turn and swaps the shard in (a reader sees old or new shards, and
either way the set-aside overlay still holds what they differ in); `install` drops the set-aside
overlay, which the caller then frees off the lock (`release`). Nothing is ever removed: an anchor
key whose last name or alias is gone stays filed (callers check each candidate's names anyway).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from identity_server import multimap
from identity_server.core import selected

_U64 = (1 << 64) - 1
_SHARD_BITS = 4  # 16 shards: a pack's scratch memory is a sixteenth of the table
_SHARD_SHIFT = 64 - _SHARD_BITS
_WORDS_PER_BUCKET = 4  # the directory costs 4 bytes per bucket: ~1 byte a variant
_DIRECTORY_CHUNK = 1 << 20  # bucket starts found this many at a time (bounded scratch memory)
_BUILD_CHUNK = 1 << 16  # anchors encoded at a time
_HASH_CHUNK = 1 << 14  # anchors hashed at a time in numpy (bounds the scratch arrays)
_SHARD_STARTS = np.arange(1 << _SHARD_BITS, dtype=np.uint64) << np.uint64(_SHARD_SHIFT)

Words = npt.NDArray[np.uint64]
Overlay = dict[int, "str | set[str]"]  # variant hash -> anchor key(s)

_BASE = secrets.randbits(64) | 1  # odd: every power of it is invertible modulo 2**64
_SEED = secrets.randbits(64)


def variant_hash(s: str) -> int:
    """The table's hash of one string."""
    h = _SEED
    for c in s:
        h = (h * _BASE + ord(c)) & _U64
    return h


def variant_hashes(k: str) -> list[int]:
    """`variant_hash` of k and of each string one deletion away from k (k first), from one pass
    over k (the core's loop)."""
    return selected().variant_hashes(k, _BASE, _SEED)


class _Shard(NamedTuple):
    """One shard's sorted words and bucket directory; replaced whole, never changed."""

    words: memoryview  # array.data and starts.data: plain-int reads
    bucket_starts: memoryview
    shift: int  # bucket of a word: (word >> shift) & bucket_mask
    bucket_mask: int
    hash_mask: int  # high bits of a word: the variant's hash
    number_mask: int  # low bits of a word: the anchor number
    array: Words
    starts: npt.NDArray[Any]


@dataclass(slots=True, eq=False)
class OverlayPack:
    """The overlay set aside by `begin_pack`, on its way into the shards it was taken beside."""

    shards: list[_Shard]
    anchors: list[str]  # the table's anchor list (number -> key) when the pack began
    overlay: Overlay
    absorbed: list[str]
    built: bool = field(default=False)

    def release(self) -> None:
        """Free the set-aside overlay an entry at a time (other threads run in between)."""
        overlay = self.overlay
        for _ in range(len(overlay)):
            overlay.popitem()
        return_free_memory()


class DeletionVariantTable:
    """Variant -> anchor keys: packed, sorted shards plus an exact overlay for later additions."""

    def __init__(self) -> None:
        self._anchors: list[str] = []  # anchor number -> key, for the shards
        self._shards = _shards_of([np.empty(0, dtype=np.uint64)] * (1 << _SHARD_BITS), 0)
        self._overlay: Overlay = {}  # variant hash -> anchor key(s) filed since the last pack began
        self._overlay_anchors: list[str] = []  # those anchor keys, in filing order
        self._packing: Overlay = {}  # the overlay set aside while a pack is built
        self._pack: OverlayPack | None = None

    @property
    def overlay_anchors(self) -> int:
        """Anchors filed since the last pack began (set-aside ones are on their way)."""
        return len(self._overlay_anchors)

    @property
    def packed_anchors(self) -> int:
        return len(self._anchors)

    def rebuild(self, anchors: Iterable[str]) -> None:
        """Pack every variant of `anchors` (distinct keys; a list is kept, not copied) into new
        shards; clear the overlay.

        The words go into one array sized first and filled a slice at a time, sorted in place,
        then cut into shards from the end, each cut handing the tail back (`resize`): the
        scratch memory beyond the finished table is one shard, and no freed pieces are left
        scattered over the heap to keep the process's memory up.
        """
        listed = anchors if isinstance(anchors, list) else list(anchors)  # kept: number -> key
        bits = _number_bits(len(listed))
        array = np.empty(_variant_count(listed), dtype=np.uint64)
        filled = 0
        for first in range(0, len(listed), _BUILD_CHUNK):
            hashes, numbers = _variant_hashes(listed[first : first + _BUILD_CHUNK], first)
            array[filled : filled + len(hashes)] = _encoded(hashes, numbers, bits)
            filled += len(hashes)
            del hashes, numbers
        array.sort()
        bounds = [0, *np.searchsorted(array, _SHARD_STARTS[1:]).tolist(), len(array)]
        arrays: list[Words] = []
        for s in reversed(range(1 << _SHARD_BITS)):
            arrays.append(array[bounds[s] : bounds[s + 1]].copy())
            array.resize(bounds[s], refcheck=False)  # the copied tail goes back to the system
        del array
        arrays.reverse()
        return_free_memory()
        self._anchors = listed
        self._shards = _shards_of(arrays, bits)
        self._overlay = {}
        self._overlay_anchors = []
        self._packing = {}
        self._pack = None

    def add(self, k: str) -> None:
        """File a new anchor key under its variants (in the overlay)."""
        for hashed in variant_hashes(k):
            multimap.add(self._overlay, hashed, k)
        self._overlay_anchors.append(k)

    def begin_pack(self) -> OverlayPack:
        """Set the overlay aside for a pack and start an empty one (under the writers' lock;
        quick). Lookups read the set-aside overlay until `install` or a `rebuild`."""
        if self._pack is not None:
            raise RuntimeError("a pack is already under way")
        pack = OverlayPack(self._shards, self._anchors, self._overlay, self._overlay_anchors)
        self._packing = pack.overlay  # before the swap: a reader never misses both
        self._overlay, self._overlay_anchors = {}, []
        self._pack = pack
        return pack

    @staticmethod
    def build(pack: OverlayPack) -> None:
        """Merge the set-aside anchors into each shard and swap it in, one shard at a time.

        Needs no lock: it changes only the shards and anchor list the pack began beside (a
        `rebuild` meanwhile replaces those, and `install` then refuses the pack), each swap is
        one list store, and numbers are appended before any shard uses them. Each merge is
        linear: the shard is sorted, and so are its new words before they join it.
        """
        first = len(pack.anchors)
        total = first + len(pack.absorbed)
        hashes, numbers = _variant_hashes(pack.absorbed, first)
        shard_of = hashes >> np.uint64(_SHARD_SHIFT)
        pack.anchors.extend(pack.absorbed)
        for s, shard in enumerate(pack.shards):
            bits = shard.number_mask.bit_length()
            old = shard.array
            mine = shard_of == s
            merged = np.empty(len(old) + int(np.count_nonzero(mine)), dtype=np.uint64)
            merged[: len(old)] = old
            if total > shard.number_mask + 1:  # numbers need more bits: take them from the hash
                bits = _number_bits(total)
                taken = ((1 << bits) - 1) ^ shard.number_mask
                np.bitwise_and(merged[: len(old)], np.uint64(_U64 ^ taken), out=merged[: len(old)])
            new = merged[len(old) :]
            new[:] = _encoded(hashes[mine], numbers[mine], bits)
            new.sort()
            merged.sort(kind="stable")  # timsort: two sorted runs (nearly, after taking bits)
            pack.shards[s] = _shard(merged, s, bits)
        pack.built = True

    def install(self, pack: OverlayPack) -> bool:
        """Drop the set-aside overlay once `build` has moved it into the shards (under the
        writers' lock; quick). False, and nothing changed, when the table was rebuilt since
        `begin_pack`. Then call `pack.release()`."""
        if self._pack is not pack or not pack.built:
            return False
        self._packing = {}
        self._pack = None
        return True

    def abandon(self, pack: OverlayPack) -> None:
        """Give up a pack that failed: its anchors go back into the overlay (under the lock)."""
        if self._pack is not pack:
            return
        for k in pack.absorbed:
            self.add(k)
        self._packing = {}
        self._pack = None

    def holds(self, k: str) -> bool:
        """Whether anchor key k is filed (each key is filed under itself, so one probe tells)."""
        hashed = variant_hashes(k)[0]  # the core's loop: k's own hash comes first
        for overlay in (self._overlay, self._packing):
            if k in multimap.values(overlay, hashed):
                return True
        filed_under: set[str] = set()  # k's own bucket: k, and any key its hash collides with
        selected().probe_shards([hashed], self._shards, self._anchors, filed_under)
        return k in filed_under

    def anchors_near(self, k: str) -> set[str]:
        """Anchor keys sharing a deletion variant with k, plus rare hash-collision extras."""
        core = selected()
        hashes = core.variant_hashes(k, _BASE, _SEED)
        found: set[str] = set()
        for overlay in (self._overlay, self._packing):  # read in the order begin_pack sets them
            if overlay:
                core.probe_overlay(hashes, overlay, found)
        core.probe_shards(hashes, self._shards, self._anchors, found)  # after the overlays: see build
        return found

    def packed_bytes(self) -> int:
        """Memory held by the packed shards (arrays, directories, the anchor list's slots)."""
        held = sum(int(s.array.nbytes + s.starts.nbytes) for s in self._shards)
        return held + 8 * len(self._anchors)


def probe_shards(hashes: list[int], shards: list[_Shard], anchors: list[str],
                         found: set[str]) -> None:
    """Add to `found` the anchors the packed shards file under `hashes`: for each hash, the
    words of its bucket whose high bits are the hash's name an anchor number."""
    shard_shift = _SHARD_SHIFT
    for hashed in hashes:
        words, starts, shift, bucket_mask, hash_mask, number_mask, _, _ = shards[
            hashed >> shard_shift
        ]
        hashed &= hash_mask
        bucket = (hashed >> shift) & bucket_mask
        for word in words[starts[bucket] : starts[bucket + 1]]:  # the bucket, read as one slice
            if word & hash_mask == hashed:
                found.add(anchors[word & number_mask])


def _load_malloc_trim() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):  # not glibc: the allocator keeps its own ways
        return None


_MALLOC_TRIM = _load_malloc_trim()


def return_free_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc's malloc_trim).

    Builds and packs allocate and free large numpy temporaries; glibc keeps freed heap pages
    resident unless they sit at the top of the heap, so without this a long-running server's
    memory would carry every past pack's scratch.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _number_bits(anchors: int) -> int:
    """Bits for anchor numbers, with room to double before a pack must take more."""
    return max(1, (2 * anchors).bit_length())


def _variant_count(anchors: Sequence[str]) -> int:
    return sum(map(len, anchors)) + len(anchors)


def _variant_hashes(anchors: Sequence[str], first: int) -> tuple[Words, Words]:
    """The hash of every variant of `anchors` and its anchor number, numbered from `first`
    (each anchor's len + 1 variants together; worked out a slice of anchors at a time, so the
    scratch arrays stay a slice's)."""
    count = _variant_count(anchors)
    lengths = np.fromiter(map(len, anchors), dtype=np.int64, count=len(anchors)) + 1
    numbers = np.repeat(np.arange(first, first + len(anchors), dtype=np.uint64), lengths)
    hashes = np.empty(count, dtype=np.uint64)
    filled = 0
    for start in range(0, len(anchors), _HASH_CHUNK):
        chunk = _chunk_variant_hashes(anchors[start : start + _HASH_CHUNK])
        hashes[filled : filled + len(chunk)] = chunk
        filled += len(chunk)
    return hashes, numbers


def _chunk_variant_hashes(anchors: Sequence[str]) -> Words:
    """`variant_hashes` of every anchor, in numpy: for each anchor in turn, the hashes without
    each of its characters, first to last, then its own (len + 1 words an anchor).

    Prefix hashes go one character position at a time over the anchors still that long (the
    anchors in order of length, longest first, so those are a leading slice), suffix sums the
    same way from the end; uint64 arithmetic wraps modulo 2**64 as `variant_hashes` masks.
    """
    n = len(anchors)
    lengths = np.fromiter(map(len, anchors), dtype=np.int64, count=n)
    total = int(lengths.sum())
    out = np.empty(total + n, dtype=np.uint64)
    if n == 0:
        return out
    text = "".join(anchors).encode("utf-32-le", "surrogatepass")  # ord() of each character
    codes = np.frombuffer(text, dtype=np.uint32).astype(np.uint64)
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    order = np.argsort(-lengths, kind="stable")
    by_length, first_char = lengths[order], starts[order]
    longest = int(by_length[0])
    # How many anchors are longer than j, for each position j.
    longer = np.searchsorted(-by_length, -np.arange(longest), side="left")
    base = np.uint64(_BASE)
    before = np.empty(total, dtype=np.uint64)  # prefix hash of the characters before each one
    h = np.full(n, _SEED, dtype=np.uint64)
    for j in range(longest):
        m = int(longer[j])
        at = first_char[:m] + j
        before[at] = h[:m]
        h[:m] = h[:m] * base + codes[at]
    out[(starts + np.arange(n) + lengths)[order]] = h  # each anchor's own hash, after its others
    after = np.empty(total, dtype=np.uint64)  # the suffix sum of the characters after each one
    tail = np.zeros(n, dtype=np.uint64)
    power = np.ones(n, dtype=np.uint64)
    last_char = first_char + by_length - 1
    for j in range(longest):
        m = int(longer[j])
        at = last_char[:m] - j
        after[at] = tail[:m]
        tail[:m] += codes[at] * power[:m]
        power[:m] *= base
    del codes, tail, power
    owner = np.repeat(np.arange(n, dtype=np.int64), lengths)
    exponent = np.repeat(starts + lengths - 1, lengths) - np.arange(total, dtype=np.int64)
    powers = np.array([pow(_BASE, j, 1 << 64) for j in range(longest + 1)], dtype=np.uint64)
    out[np.arange(total, dtype=np.int64) + owner] = before * powers[exponent] + after
    return out


def _encoded(hashes: Words, numbers: Words, bits: int) -> Words:
    """Packed words: the hash's high bits above `bits` bits of anchor number."""
    return (hashes & np.uint64(_U64 ^ ((1 << bits) - 1))) | numbers


def _shard(array: Words, index: int, bits: int) -> _Shard:
    """Shard `index` over its sorted `array`, with its bucket directory."""
    bucket_bits = max(1, (len(array) // _WORDS_PER_BUCKET).bit_length())
    bucket_bits = min(bucket_bits, _SHARD_SHIFT - bits)  # buckets split the hash bits only
    shift = _SHARD_SHIFT - bucket_bits
    buckets = 1 << bucket_bits
    starts = np.empty(buckets + 1, dtype=np.uint32 if len(array) < 1 << 32 else np.uint64)
    base = np.uint64(index << _SHARD_SHIFT)
    for first in range(0, buckets, _DIRECTORY_CHUNK):
        last = min(buckets, first + _DIRECTORY_CHUNK)
        bounds = base | (np.arange(first, last, dtype=np.uint64) << np.uint64(shift))
        starts[first:last] = np.searchsorted(array, bounds)
    starts[buckets] = len(array)
    number_mask = (1 << bits) - 1
    return _Shard(array.data, starts.data, shift, buckets - 1, _U64 ^ number_mask, number_mask,
                  array, starts)


def _shards_of(arrays: Sequence[Words], bits: int) -> list[_Shard]:
    return [_shard(array, i, bits) for i, array in enumerate(arrays)]


__all__ = ["DeletionVariantTable", "OverlayPack", "variant_hash", "variant_hashes"]
