"""Display forms, keys and the one-edit test of SPEC section 2: pure functions, stdlib only.

Every stored name and every mention goes through `display_form`; the matching rules then compare
display forms, their casefolded forms and their keys. These functions are the contract's
definitions written out, so each step below names the sentence of the spec it implements.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata

# The Unicode White_Space property (PropList.txt). Not str.isspace(): that also accepts the
# information separators U+001C..U+001F, which are Cc but not White_Space.
WHITE_SPACE = frozenset(
    "\u0009\u000a\u000b\u000c\u000d\u0020\u0085\u00a0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)

# Punctuation that keys keep (SPEC: "except `#`").
_KEPT_PUNCTUATION = frozenset("#")


def _deleted_punctuation(char: str) -> bool:
    """Punctuation (Unicode category P*) that a key deletes, unless between two digits: all but
    `#`."""
    return unicodedata.category(char).startswith("P") and char not in _KEPT_PUNCTUATION


def _is_digit(char: str) -> bool:
    """A decimal digit: Unicode category Nd (not superscripts or other No numbers)."""
    return unicodedata.category(char) == "Nd"


def is_dropped(char: str) -> bool:
    """A character display forms drop: a control or format character (Cc, Cf) that is not
    White_Space."""
    return char not in WHITE_SPACE and unicodedata.category(char) in ("Cc", "Cf")


def display_form(text: str) -> str:
    """NFKC, drop non-space Cc/Cf characters, NFKC again, collapse White_Space runs, trim."""
    if text.isascii() and text.isprintable():
        # NFKC leaves printable ASCII alone, it has no Cc/Cf, and its only White_Space is " ".
        return " ".join(text.split())
    text = unicodedata.normalize("NFKC", text)
    text = "".join(c for c in text if not is_dropped(c))
    text = unicodedata.normalize("NFKC", text)
    out: list[str] = []
    in_space = False
    for c in text:
        if c in WHITE_SPACE:
            in_space = True
            continue
        if in_space and out:
            out.append(" ")
        in_space = False
        out.append(c)
    return "".join(out)


def fold(display: str) -> str:
    """The casefolded display form that rule 2 compares (the same object when already folded,
    so that a name already in lower case and its key can be one string)."""
    folded = display.casefold()
    return display if folded == display else folded


def key(display: str) -> str:
    """Casefold, then delete White_Space and punctuation, keeping `#` and a mark between digits.

    "Mem-Castle", "mem castle" and "MemCastle" share the key `memcastle`; "Windows 1.0" keeps its
    dot (`windows1.0`) so that it never equals "Windows 10".
    """
    return key_of_folded(display.casefold())


def key_of_folded(folded: str) -> str:
    """`key` of a display form already casefolded (the same object when nothing is deleted)."""
    if folded.isalnum():  # the common case: nothing to delete
        return folded
    if folded.isascii():  # most names: bytes.translate, several times faster than str's
        kept = folded.encode("ascii").translate(None, _ascii_deleted())
        if kept.isalpha():  # letters only: there were no digits, so no mark between two
            return kept.decode("ascii")
        return _ASCII_DELETED.sub("", folded)  # digits ("ResNet-50"), symbols ("C++")
    if _DIGIT.search(folded) is None:  # no digits: no mark can stand between two
        return folded.translate(_deletion_table())
    return _NOT_WORD.sub(_kept_in_key, folded)


_DIGIT = re.compile(r"\d")  # in a str pattern, exactly Unicode Nd
_NOT_WORD = re.compile(r"[\W_]")  # a superset of White_Space and P* (and symbols, kept below)
# What `key` deletes from an ASCII string, as one pattern (no Python callback): White_Space,
# and punctuation but `#` unless it stands between two digits.
_ASCII_PUNCTUATION = "".join(re.escape(chr(cp)) for cp in range(128)
                             if _deleted_punctuation(chr(cp)))
_ASCII_DELETED = re.compile(
    "[{}]|(?<![0-9])[{p}]|[{p}](?![0-9])".format(
        "".join(re.escape(c) for c in sorted(WHITE_SPACE) if c.isascii()), p=_ASCII_PUNCTUATION)
)


def _kept_in_key(match: re.Match[str]) -> str:
    c = match.group()
    if c in WHITE_SPACE:
        return ""
    if not _deleted_punctuation(c):
        return c
    s, i = match.string, match.start()
    if 0 < i < len(s) - 1 and _is_digit(s[i - 1]) and _is_digit(s[i + 1]):
        return c
    return ""


@functools.cache
def _deletion_table() -> dict[int, None]:
    """str.translate table deleting White_Space and punctuation but `#` (built on first use)."""
    table: dict[int, None] = dict.fromkeys(map(ord, WHITE_SPACE))
    for cp in range(sys.maxunicode + 1):
        if _deleted_punctuation(chr(cp)):
            table[cp] = None
    return table


@functools.cache
def _ascii_deleted() -> bytes:
    """The ASCII characters `_deletion_table` deletes, for bytes.translate."""
    table = _deletion_table()
    return bytes(cp for cp in range(128) if cp in table)


def warm_up() -> None:
    """Build the lazily made Unicode tables now (about half a second), not in a first request."""
    _ascii_deleted()


def _guarded(s: str, i: int) -> bool:
    """True when editing s[i] does not count as a typo: it is a digit, or both neighbours are."""
    if _is_digit(s[i]):
        return True
    return 0 < i < len(s) - 1 and _is_digit(s[i - 1]) and _is_digit(s[i + 1])


def one_edit_apart(a: str, b: str) -> bool:
    """True when keys a and b are one counting edit apart (optimal string alignment distance 1).

    An insertion, deletion, substitution or adjacent swap counts unless it touches a digit or a
    character standing between two digits: "windows10"/"windows11" and "covid19"/"covid18" are
    different things, not typos of each other.
    """
    la, lb = len(a), len(b)
    if la == lb:
        return _one_substitution_or_swap(a, b)
    if abs(la - lb) != 1:
        return False
    longer, shorter = (a, b) if la > lb else (b, a)
    # Every position whose deletion turns `longer` into `shorter` is a valid alignment; the pair is
    # a typo when any of them is an edit that counts. Such positions form one run of equal chars.
    i = 0
    while i < len(shorter) and longer[i] == shorter[i]:
        i += 1
    if longer[i + 1 :] != shorter[i:]:
        return False
    j = i
    while True:
        if not _guarded(longer, j):
            return True
        if j == 0 or longer[j - 1] != longer[i]:
            return False
        j -= 1


def _one_substitution_or_swap(a: str, b: str) -> bool:
    diffs = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(diffs) == 1:
        i = diffs[0]
        return not (_guarded(a, i) or _guarded(b, i))
    if len(diffs) == 2:
        i, j = diffs
        if j == i + 1 and a[i] == b[j] and a[j] == b[i]:
            return not (_is_digit(a[i]) or _is_digit(a[j]))
    return False
