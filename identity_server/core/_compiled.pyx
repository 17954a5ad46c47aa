# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled core: the per-mention hot loop of `identity_server.core.reference`, in Cython.

Each function here gives the reference's answer on every input (the differential test,
tests/unit/test_core_differential.py, holds it to that). Text that is not printable ASCII goes
to the reference: the rules for the rest of Unicode (NFKC, categories, casefolding) are the
reference's alone, and printable ASCII is nearly every name a paper mentions.

Nothing here releases the GIL, so the typo table's shards cannot change under a probe.
"""

from cpython.buffer cimport PyBuffer_IsContiguous
from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport free, malloc

from identity_server import matching, normalize
from identity_server.domain import OTHER, NameKind, Rule, Status

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object)
    const unsigned char *PyUnicode_1BYTE_DATA(object)
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    int PyUnicode_KIND(object)
    const void *PyUnicode_DATA(object)
    Py_UCS4 PyUnicode_READ(int kind, const void *data, Py_ssize_t index)
    bint PyMemoryView_Check(object)
    Py_buffer *PyMemoryView_GET_BUFFER(object)

cdef extern from *:
    void __builtin_prefetch(const void *address)

# -- display form and key ---------------------------------------------------------------------

# For each ASCII character: 1 when a key deletes it unless it stands between two digits
# (punctuation but `#`), 2 when a key always deletes it (White_Space). Built from the
# reference's own definitions, so the two cannot disagree on what punctuation is.
cdef unsigned char _DELETED[128]
for _c in range(128):
    _DELETED[_c] = (2 if chr(_c) in normalize.WHITE_SPACE
                    else 1 if normalize._deleted_punctuation(chr(_c)) else 0)


cdef inline bint _digit(unsigned char c) noexcept:
    return 48 <= c <= 57


cdef inline bint _printable_ascii(str text) noexcept:
    if not PyUnicode_IS_ASCII(text):
        return False
    cdef const unsigned char *s = PyUnicode_1BYTE_DATA(text)
    cdef Py_ssize_t i
    for i in range(PyUnicode_GET_LENGTH(text)):
        if s[i] < 32 or s[i] > 126:
            return False
    return True


def normalize_text(str text):
    """(display form, key) of text: `ReferenceCore.normalize`."""
    if not _printable_ascii(text):
        display = normalize.display_form(text)
        return display, normalize.key(display)
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(text), i, d = 0, k = 0
    cdef const unsigned char *s = PyUnicode_1BYTE_DATA(text)
    cdef char *out = <char *>malloc(2 * n + 2)
    if out == NULL:
        raise MemoryError()
    cdef char *disp = out
    cdef char *key = out + n + 1
    cdef unsigned char c, low, kind
    cdef bint space = False
    try:
        # The display form: printable ASCII's only White_Space is the space; runs become one.
        for i in range(n):
            c = s[i]
            if c == 32:
                space = d > 0
                continue
            if space:
                disp[d] = 32
                d += 1
                space = False
            disp[d] = c
            d += 1
        # The key of the display form: lower case, spaces and punctuation deleted, a mark
        # between two digits kept (the neighbours are the display form's).
        for i in range(d):
            c = <unsigned char>disp[i]
            low = c + 32 if 65 <= c <= 90 else c
            kind = _DELETED[c]
            if kind == 2:
                continue
            if kind == 1 and not (0 < i < d - 1 and _digit(<unsigned char>disp[i - 1])
                                  and _digit(<unsigned char>disp[i + 1])):
                continue
            key[k] = <char>low
            k += 1
        if d == n:
            display = text
        else:
            display = disp[:d].decode("ascii")
        return display, key[:k].decode("ascii")
    finally:
        free(out)


# -- the one-edit test ------------------------------------------------------------------------

cdef inline bint _guarded(const unsigned char *s, Py_ssize_t n, Py_ssize_t i) noexcept:
    if _digit(s[i]):
        return True
    return 0 < i < n - 1 and _digit(s[i - 1]) and _digit(s[i + 1])


cdef bint _one_edit_ascii(const unsigned char *a, Py_ssize_t la,
                          const unsigned char *b, Py_ssize_t lb) noexcept:
    cdef Py_ssize_t i, j, first = -1, second = -1, diffs = 0
    cdef const unsigned char *longer
    cdef const unsigned char *shorter
    cdef Py_ssize_t n_long, n_short
    if la == lb:
        for i in range(la):
            if a[i] != b[i]:
                diffs += 1
                if diffs == 1:
                    first = i
                elif diffs == 2:
                    second = i
                else:
                    return False
        if diffs == 1:
            return not (_guarded(a, la, first) or _guarded(b, lb, first))
        if diffs == 2 and second == first + 1 and a[first] == b[second] \
                and a[second] == b[first]:
            return not (_digit(a[first]) or _digit(a[second]))
        return False
    if la - lb != 1 and lb - la != 1:
        return False
    if la > lb:
        longer, n_long, shorter, n_short = a, la, b, lb
    else:
        longer, n_long, shorter, n_short = b, lb, a, la
    i = 0
    while i < n_short and longer[i] == shorter[i]:
        i += 1
    for j in range(i, n_short):
        if longer[j + 1] != shorter[j]:
            return False
    # Every deletion in the run of equal characters ending at i aligns the two; the pair is a
    # typo when any of them is an edit that counts.
    j = i
    while True:
        if not _guarded(longer, n_long, j):
            return True
        if j == 0 or longer[j - 1] != longer[i]:
            return False
        j -= 1


def one_edit_apart(str a, str b):
    """`normalize.one_edit_apart`."""
    if PyUnicode_IS_ASCII(a) and PyUnicode_IS_ASCII(b):
        return _one_edit_ascii(PyUnicode_1BYTE_DATA(a), PyUnicode_GET_LENGTH(a),
                               PyUnicode_1BYTE_DATA(b), PyUnicode_GET_LENGTH(b))
    return normalize.one_edit_apart(a, b)


# -- the typo table's loops -------------------------------------------------------------------

def variant_hashes(str key, uint64_t base, uint64_t seed):
    """The hash of key, then of each string one deletion away from it, the last character's
    deletion first (`ReferenceCore.variant_hashes`): without key[i] the hash is
    prefix(i) * base**(n-1-i) + suffix(i+1), so one pass gives them all."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(key), i
    cdef int kind = PyUnicode_KIND(key)
    cdef const void *data = PyUnicode_DATA(key)
    cdef uint64_t *prefix = <uint64_t *>malloc((n + 1) * sizeof(uint64_t))
    if prefix == NULL:
        raise MemoryError()
    cdef uint64_t h = seed, suffix = 0, power = 1
    cdef list out
    try:
        prefix[0] = h
        for i in range(n):
            h = h * base + <uint64_t>PyUnicode_READ(kind, data, i)
            prefix[i + 1] = h
        out = [h]
        for i in range(n - 1, -1, -1):
            out.append(prefix[i] * power + suffix)
            suffix += <uint64_t>PyUnicode_READ(kind, data, i) * power
            power *= base
        return out
    finally:
        free(prefix)


cdef enum:
    SHARD_SHIFT = 60
    CHUNK = 32

ctypedef struct _Probe:
    const uint64_t *words
    Py_ssize_t n_words
    const uint32_t *starts32
    const uint64_t *starts64
    uint64_t hash_mask, number_mask, wanted, bucket, first, last


cdef int _locate(_Probe *p, uint64_t hashed, list shards) except -1:
    """The probe of one hash: its shard's arrays and masks, and its bucket. The shard is a
    typo_table._Shard: (words, bucket starts, shift, bucket mask, hash mask, number mask, ...),
    memoryviews over C-contiguous uint64 words and uint32 or uint64 starts."""
    cdef Py_ssize_t s = <Py_ssize_t>(hashed >> SHARD_SHIFT)
    if s >= len(shards):
        raise ValueError("probe: fewer shards than the hash bits name")
    item = shards[s]
    if not isinstance(item, tuple) or len(item) < 6:
        raise TypeError("probe: a shard is not a _Shard")
    # Read as a plain tuple: indexing a tuple subclass goes through its Python-level slot.
    cdef tuple shard = <tuple>item
    if not PyMemoryView_Check(shard[0]) or not PyMemoryView_Check(shard[1]):
        raise TypeError("probe: a shard is not a _Shard")
    cdef Py_buffer *words = PyMemoryView_GET_BUFFER(shard[0])
    cdef Py_buffer *starts = PyMemoryView_GET_BUFFER(shard[1])
    cdef uint64_t shift = shard[2], bucket_mask = shard[3]
    p.hash_mask = shard[4]
    p.number_mask = shard[5]
    if (words.itemsize != 8 or (starts.itemsize != 4 and starts.itemsize != 8)
            or not PyBuffer_IsContiguous(words, c'C') or not PyBuffer_IsContiguous(starts, c'C')
            or shift > 63):
        raise TypeError("probe: unexpected shard layout")
    p.words = <const uint64_t *>words.buf
    p.n_words = words.len // 8
    if starts.itemsize == 4:
        p.starts32, p.starts64 = <const uint32_t *>starts.buf, NULL
    else:
        p.starts32, p.starts64 = NULL, <const uint64_t *>starts.buf
    p.wanted = hashed & p.hash_mask
    p.bucket = (p.wanted >> shift) & bucket_mask
    if <Py_ssize_t>p.bucket + 1 >= starts.len // starts.itemsize:
        raise IndexError("probe: bucket beyond the directory")
    return 0


def probe_shards(list hashes, list shards, list anchors, set found):
    """Add to `found` the anchors the packed shards file under any of `hashes`.

    A key's probes land in random places of a large table, so each costs cache misses, not
    instructions: they are taken a chunk at a time in three passes (each bucket's start, its
    words, then the words read), each pass prefetching what the next reads, so that the misses
    of a chunk's probes overlap. The shards are memoryviews over arrays that the typo table
    keeps alive while it is probed."""
    cdef _Probe chunk[CHUNK]
    cdef _Probe *p
    cdef Py_ssize_t count = len(hashes), n_anchors = len(anchors), done, i, size
    cdef uint64_t w, number
    done = 0
    while done < count:
        size = min(count - done, CHUNK)
        for i in range(size):
            p = &chunk[i]
            _locate(p, hashes[done + i], shards)
            if p.starts32 != NULL:
                __builtin_prefetch(p.starts32 + p.bucket)
            else:
                __builtin_prefetch(p.starts64 + p.bucket)
        for i in range(size):
            p = &chunk[i]
            if p.starts32 != NULL:
                p.first, p.last = p.starts32[p.bucket], p.starts32[p.bucket + 1]
            else:
                p.first, p.last = p.starts64[p.bucket], p.starts64[p.bucket + 1]
            if p.last > <uint64_t>p.n_words:
                p.last = p.n_words
            if p.first < p.last:
                __builtin_prefetch(p.words + p.first)
        for i in range(size):
            p = &chunk[i]
            for w in range(p.first, p.last):
                if (p.words[w] & p.hash_mask) != p.wanted:
                    continue
                number = p.words[w] & p.number_mask
                if number >= <uint64_t>n_anchors:
                    raise IndexError("probe: anchor number beyond the anchors")
                found.add(anchors[number])
        done += CHUNK


def probe_overlay(list hashes, dict overlay, set found):
    """Add to `found` the anchor keys the overlay (variant hash -> a key, or a set of keys)
    files under any of `hashes`."""
    for h in hashes:
        filed = overlay.get(h)
        if filed is None:
            continue
        if type(filed) is str:
            found.add(filed)
        else:
            found.update(filed)


# -- the rules (matching.decide) --------------------------------------------------------------

cdef object _CONVERGED = matching.Outcome.CONVERGED
cdef object _AMBIGUOUS = matching.Outcome.AMBIGUOUS
cdef object _WEAK = matching.Outcome.WEAK
cdef object _NEW_DECISION = matching.NEW_DECISION
cdef object _CANONICAL = Status.CANONICAL
cdef object _MERGED = Status.MERGED
cdef object _ALIAS = NameKind.ALIAS
cdef object _SURFACE = NameKind.SURFACE
cdef object _EXACT = Rule.EXACT
cdef object _CASE = Rule.CASE
cdef object _PUNCTUATION = Rule.PUNCTUATION
cdef object _TYPO = Rule.TYPO
cdef object _Candidate = matching.Candidate
cdef object _Decision = matching.Decision
cdef str _OTHER = OTHER
cdef Py_ssize_t STRONG_TYPO_KEY = matching.STRONG_TYPO_KEY
cdef Py_ssize_t WEAK_TYPO_KEY = matching.WEAK_TYPO_KEY
cdef Py_ssize_t MIN_PUNCTUATION_KEY = matching.MIN_PUNCTUATION_KEY

cdef enum:
    BY_DISPLAY, BY_FOLDED, BY_KEY, BY_ANCHOR_KEYS


cdef inline bint _compatible(entity, str mention_type):
    cdef str etype = entity.entity_type
    if entity.placeholder:
        return etype == mention_type
    return etype == mention_type or etype == _OTHER or mention_type == _OTHER


cdef inline tuple _rank(entity, str mention_type):
    return (0 if entity.entity_type == mention_type else 1,
            0 if entity.status is _CANONICAL else 1)


cdef object _matching_names(entity, int how, str text, object keys):
    """The entity's names that match at the rule, in `names` order."""
    cdef list found
    if how == BY_DISPLAY:
        return entity.with_display(text)
    if how == BY_FOLDED:
        return entity.with_folded(text)
    found = []
    if how == BY_KEY:
        for n in entity.names:
            if n.key == text:
                found.append(n)
        return found
    # BY_ANCHOR_KEYS: the name and aliases (surface forms come last) whose key is an anchor
    for n in entity.names:
        if n.kind is _SURFACE:
            break
        if n.key in keys:
            found.append(n)
    return found


cdef list _candidates(index, ids, str mention_type, int how, str text, object anchors):
    """Compatible entities among ids, each with its matching names; by rank, then age."""
    cdef list out = []
    cdef bint alias_only
    get = index.get
    for eid in ids:
        entity = get(eid)
        if entity is None or entity.status is _MERGED or not _compatible(entity, mention_type):
            continue
        matched = _matching_names(entity, how, text, None if anchors is None
                                  else anchors[entity.entity_id])
        if not matched:
            continue
        if len(matched) == 1:
            alias_only = matched[0].kind is _ALIAS
        else:
            alias_only = all(n.kind is _ALIAS for n in matched)
        out.append(tuple.__new__(_Candidate, (entity, matched[0].display, alias_only)))
    if len(out) > 1:
        out.sort(key=lambda c: (_rank(c.entity, mention_type), c.entity.ordinal))
    return out


cdef tuple _best(list found, str mention_type):
    if len(found) == 1:
        return (found[0],)
    top = _rank(found[0].entity, mention_type)
    return tuple([c for c in found if _rank(c.entity, mention_type) == top])


cdef object _decided(rule, list found, str mention_type):
    cdef tuple best = _best(found, mention_type)
    outcome = _CONVERGED if len(best) == 1 else _AMBIGUOUS
    return tuple.__new__(_Decision, (outcome, rule, tuple(found), best))


cdef object _weak(rule, list found, str mention_type):
    return tuple.__new__(_Decision, (_WEAK, rule, tuple(found), _best(found, mention_type)))


cdef object _typo(index, str k, str mention_type):
    """Rule 4 over names and aliases; strong pairs (shorter key 6+) outrank weak ones (4-5)."""
    cdef dict strong = {}
    cdef dict weak = {}
    cdef dict bucket
    cdef Py_ssize_t shorter, lk = len(k)
    cdef list found
    for anchor, ids in index.typo_neighbours(k):
        shorter = min(len(anchor), lk)
        if shorter < WEAK_TYPO_KEY or not one_edit_apart(k, anchor):
            continue
        bucket = strong if shorter >= STRONG_TYPO_KEY else weak
        for eid in ids:
            keys = bucket.get(eid)
            if keys is None:
                bucket[eid] = {anchor}
            else:
                keys.add(anchor)
    if strong:
        found = _candidates(index, strong, mention_type, BY_ANCHOR_KEYS, None, strong)
        if found:
            return _decided(_TYPO, found, mention_type)
    if weak:
        found = _candidates(index, weak, mention_type, BY_ANCHOR_KEYS, None, weak)
        if found:
            return _weak(_TYPO, found, mention_type)
    return _NEW_DECISION


def decide(index, str display, str mention_type, str k):
    """`matching.decide`: rules 1-4 in order; the first with a compatible candidate decides."""
    cdef list found
    same_key = index.with_key(k)
    if not same_key:
        return _typo(index, k, mention_type)
    found = _candidates(index, same_key, mention_type, BY_DISPLAY, display, None)
    if found:
        return _decided(_EXACT, found, mention_type)
    found = _candidates(index, same_key, mention_type, BY_FOLDED, normalize.fold(display), None)
    if found:
        return _decided(_CASE, found, mention_type)
    found = _candidates(index, same_key, mention_type, BY_KEY, k, None)
    if found:
        if len(k) >= MIN_PUNCTUATION_KEY:
            return _decided(_PUNCTUATION, found, mention_type)
        return _weak(_PUNCTUATION, found, mention_type)
    return _typo(index, k, mention_type)
