"""SPEC section 2, Definitions: display form, key and the one-edit test, table by table.

Every expectation below is worked out from the spec's wording, not from the implementation.
"""

from __future__ import annotations

import pytest

from identity_server.normalize import display_form, key, one_edit_apart

# -- display form ----------------------------------------------------------------------------------
# "apply NFKC; delete every character of Unicode category Cc or Cf that is not White_Space ...;
#  apply NFKC again; replace each run of White_Space characters by one space; trim."

DISPLAY_CASES: list[tuple[str, str, str]] = [
    # (id, raw, display form)
    ("plain", "Ada Lovelace", "Ada Lovelace"),
    ("nfkc-fullwidth-letters", "\uff21\uff44\uff41", "Ada"),
    ("nfkc-fullwidth-digits", "GPT\uff0d\uff14", "GPT-4"),
    ("nfkc-ligature-fi", "\ufb01le", "file"),
    ("nfkc-ligature-ff", "e\ufb00ect", "effect"),
    ("nfkc-superscript-two", "x\u00b2", "x2"),
    ("nfkc-subscript", "H\u2082O", "H2O"),
    ("nfkc-roman-numeral", "Henry \u216b", "Henry XII"),
    ("nfkc-circled-digit", "\u2460", "1"),
    ("nfkc-composes-accent", "cafe\u0301", "caf\u00e9"),
    ("zero-width-space", "Ada\u200bLovelace", "AdaLovelace"),
    ("zero-width-joiner", "a\u200db", "ab"),
    ("zero-width-non-joiner", "a\u200cb", "ab"),
    ("word-joiner", "a\u2060b", "ab"),
    ("bom", "\ufeffAda", "Ada"),
    ("bidi-override-rlo", "\u202eAda\u202c", "Ada"),
    ("bidi-isolate", "\u2067Ada\u2069", "Ada"),
    ("lrm", "Ada\u200e", "Ada"),
    ("soft-hyphen-cf", "co\u00adop", "coop"),
    ("mongolian-vowel-separator-cf-not-space", "a\u180eb", "ab"),
    ("nul-cc", "a\x00b", "ab"),
    ("bell-cc", "a\x07b", "ab"),
    ("del-cc", "a\x7fb", "ab"),
    ("c1-control-cc", "a\x9bb", "ab"),
    ("info-separator-1c-deleted-not-space", "a\x1cb", "ab"),
    ("info-separator-1d-deleted-not-space", "a\x1db", "ab"),
    ("info-separator-1e-deleted-not-space", "a\x1eb", "ab"),
    ("info-separator-1f-deleted-not-space", "a\x1fb", "ab"),
    ("tab", "Ada\tLovelace", "Ada Lovelace"),
    ("tabs-run", "Ada\t\t\tLovelace", "Ada Lovelace"),
    ("newline", "Ada\nLovelace", "Ada Lovelace"),
    ("crlf", "Ada\r\nLovelace", "Ada Lovelace"),
    ("vertical-tab-and-form-feed", "a\x0b\x0cb", "a b"),
    ("nel-cc-but-white-space", "a\x85b", "a b"),
    ("nbsp", "Ada\u00a0Lovelace", "Ada Lovelace"),
    ("narrow-nbsp", "a\u202fb", "a b"),
    ("ideographic-space", "Ada\u3000Lovelace", "Ada Lovelace"),
    ("ogham-space", "a\u1680b", "a b"),
    ("em-space", "a\u2003b", "a b"),
    ("line-separator", "a\u2028b", "a b"),
    ("paragraph-separator", "a\u2029b", "a b"),
    ("mixed-space-run", "a \t\u00a0\u3000\n b", "a b"),
    ("deleted-char-inside-space-run", "a \u200b b", "a b"),
    ("deleted-info-separator-inside-space-run", "a \x1f b", "a b"),
    ("trim-leading-trailing", "  \t Ada \n ", "Ada"),
    ("trim-nbsp-ideographic", "\u00a0\u3000Ada\u3000\u00a0", "Ada"),
    ("trim-after-deletion", "\u200b Ada \u200b", "Ada"),
    ("second-nfkc-after-deletion", "e\u200b\u0301", "\u00e9"),
    ("empty", "", ""),
    ("only-spaces", " \t\n\u3000", ""),
    ("only-format-chars", "\u200b\u200d\u202e\ufeff", ""),
    ("punctuation-kept-in-display", "Mem-Castle!", "Mem-Castle!"),
    ("case-kept-in-display", "MemCastle", "MemCastle"),
    ("emoji-kept", "a\U0001f600b", "a\U0001f600b"),
]


@pytest.mark.parametrize(("raw", "expected"), [c[1:] for c in DISPLAY_CASES],
                         ids=[c[0] for c in DISPLAY_CASES])
def test_display_form(raw: str, expected: str) -> None:
    """display_form follows the five steps of the spec's definition."""
    assert display_form(raw) == expected


@pytest.mark.parametrize(("raw", "expected"), [c[1:] for c in DISPLAY_CASES],
                         ids=[c[0] for c in DISPLAY_CASES])
def test_display_form_is_a_fixed_point(raw: str, expected: str) -> None:
    """A stored name is "kept in display form": normalising it again changes nothing."""
    assert display_form(display_form(raw)) == display_form(raw)


# -- key ----------------------------------------------------------------------------------------
# "casefold the display form, then delete every White_Space character and every punctuation
#  character (Unicode category P*) except # and except one standing between two digits ...
#  Symbols (S*) stay. ... Accents are not folded."

KEY_CASES: list[tuple[str, str, str]] = [
    # (id, raw mention, key of its display form)
    ("spec-mem-castle-hyphen", "Mem-Castle", "memcastle"),
    ("spec-mem-castle-space", "mem castle", "memcastle"),
    ("spec-memcastle", "MemCastle", "memcastle"),
    ("spec-c-sharp", "C#", "c#"),
    ("c-space-sharp", "C #", "c#"),
    ("spec-c-plus-plus", "C++", "c++"),
    ("c-dot", "C.", "c"),
    ("hashtag", "#MeToo", "#metoo"),
    ("casefold-eszett", "Stra\u00dfe", "strasse"),
    ("casefold-capital-eszett", "STRA\u1e9eE", "strasse"),
    ("casefold-greek-final-sigma", "\u039f\u0394\u039f\u03a3", "\u03bf\u03b4\u03bf\u03c3"),
    ("accent-not-folded", "Caf\u00e9", "caf\u00e9"),
    ("accent-decomposed-input-composed", "Cafe\u0301", "caf\u00e9"),
    ("spec-version-dot-kept", "3.11", "3.11"),
    ("spec-windows-1.0", "Windows 1.0", "windows1.0"),
    ("spec-windows-10", "Windows 10", "windows10"),
    ("several-dots-between-digits", "1.2.3", "1.2.3"),
    ("double-dot-neither-between-digits", "1..1", "11"),
    ("hyphen-between-digits-kept", "3-4", "3-4"),
    ("covid-hyphen-not-between-digits", "COVID-19", "covid19"),
    ("comma-between-digits-kept", "1,000", "1,000"),
    ("trailing-dot-after-digit", "Version 2.", "version2"),
    ("leading-dot-before-digit", ".5", "5"),
    ("arabic-indic-decimal-separator", "\u0661\u066b\u0665", "\u0661\u066b\u0665"),
    ("underscore-pc-deleted", "snake_case", "snakecase"),
    ("quotes-pi-pf-deleted", "\u00abquoted\u00bb", "quoted"),
    ("inverted-punct-deleted", "\u00bfQu\u00e9?", "qu\u00e9"),
    ("brackets-deleted", "(BERT)", "bert"),
    ("slash-deleted", "TCP/IP", "tcpip"),
    ("apostrophe-deleted", "O'Neil", "oneil"),
    ("at-deleted", "a@b", "ab"),
    ("em-dash-deleted", "a\u2014b", "ab"),
    ("plus-symbol-kept", "a+b", "a+b"),
    ("euro-symbol-kept", "\u20ac5", "\u20ac5"),
    ("dollar-symbol-kept", "$HOME", "$home"),
    ("tilde-symbol-kept", "a~b", "a~b"),
    ("caret-symbol-kept", "x^2", "x^2"),
    ("pipe-symbol-kept", "a|b", "a|b"),
    ("degree-symbol-kept", "90\u00b0", "90\u00b0"),
    ("emoji-symbol-kept", "I \u2764 NY", "i\u2764ny"),
    ("white-space-deleted", "a b\tc", "abc"),
    ("nbsp-deleted", "a\u00a0b", "ab"),
    ("fullwidth-via-display-form",
     "\uff2d\uff45\uff4d\uff0d\uff23\uff41\uff53\uff54\uff4c\uff45", "memcastle"),
    ("ligature-via-display-form", "\ufb01ne-tuning", "finetuning"),
    ("superscript-via-display-form", "E=mc\u00b2", "e=mc2"),
    ("zero-width-via-display-form", "Mem\u200bCastle", "memcastle"),
    ("punctuation-only", "?!...", ""),
    ("sharp-only-is-not-empty", "#", "#"),
]


@pytest.mark.parametrize(("raw", "expected"), [c[1:] for c in KEY_CASES],
                         ids=[c[0] for c in KEY_CASES])
def test_key(raw: str, expected: str) -> None:
    """key(display form) casefolds, drops spaces and P* except '#' and digit-flanked marks."""
    assert key(display_form(raw)) == expected


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Windows 1.0", "Windows 10"),
        ("C#", "C"),
        ("C++", "C"),
        ("caf\u00e9", "cafe"),
        ("3.11", "311"),
        ("a+b", "ab"),
    ],
    ids=["windows-1.0-vs-10", "c-sharp-vs-c", "c-plus-plus-vs-c", "accent", "dot-in-number",
         "symbol"],
)
def test_keys_that_must_differ(a: str, b: str) -> None:
    """'"Windows 1.0" is not "Windows 10"', '"C#" keeps c#', 'Accents are not folded'."""
    assert key(display_form(a)) != key(display_form(b))


def test_key_counts_code_points() -> None:
    """'Lengths and edits count code points': an emoji is one character of the key."""
    assert len(key(display_form("ab\U0001f600"))) == 3


# -- one edit -----------------------------------------------------------------------------------
# "one character inserted, deleted or substituted, or two adjacent characters swapped (optimal
#  string alignment distance 1), between two keys. An edit that inserts, deletes, substitutes or
#  swaps a digit (Unicode Nd), or a character whose two neighbours are digits, does not count."

ONE_EDIT_CASES: list[tuple[str, str, str, bool]] = [
    # (id, key a, key b, one edit apart?)
    ("delete", "algorithm", "algoritm", True),
    ("insert", "algoritm", "algorithm", True),
    ("substitute", "algorithm", "algorythm", True),
    ("swap-adjacent", "algorithm", "algroithm", True),
    ("swap-first-two", "abcdef", "bacdef", True),
    ("swap-last-two", "abcdef", "abcdfe", True),
    ("insert-at-start", "bcdef", "abcdef", True),
    ("insert-at-end", "abcde", "abcdef", True),
    ("insert-into-run", "aple", "apple", True),
    ("short-mario-maria", "mario", "maria", True),
    ("equal-is-not-one-edit", "algorithm", "algorithm", False),
    ("empty-equal", "", "", False),
    ("two-substitutions", "algorithm", "alxorithx", False),
    ("substitute-and-delete", "algorithm", "algorytm", False),
    ("two-deletions", "algorithm", "algorim", False),
    ("non-adjacent-swap", "abcdef", "adcbef", False),
    ("rotation-is-two-edits", "abc", "cab", False),
    ("osa-not-damerau", "ca", "abc", False),
    ("unrelated", "transformer", "attention", False),
    ("spec-windows-10-11", "windows10", "windows11", False),
    ("spec-windows-1.0-10", "windows1.0", "windows10", False),
    ("spec-covid-19-18", "covid19", "covid18", False),
    ("insert-digit-at-end", "abcdef", "abcdef1", False),
    ("insert-digit-at-start", "abcdef", "1abcdef", False),
    ("insert-digit-in-middle", "abcdef", "abc1def", False),
    ("append-digit-to-number", "windows10", "windows100", False),
    ("delete-digit", "gpt4turbo", "gptturbo", False),
    ("substitute-letter-by-digit", "abcdel", "abcde1", False),
    ("substitute-digit-by-letter", "abcde1", "abcdel", False),
    ("insert-letter-between-digits", "windows10", "windows1x0", False),
    ("insert-dot-between-digits", "python311", "python3.11", False),
    ("delete-letter-between-digits", "v1a2xyz", "v12xyz", False),
    ("substitute-letter-between-digits", "v1a2xyz", "v1b2xyz", False),
    ("swap-digit-with-letter", "abc1def", "ab1cdef", False),
    ("swap-two-digits", "version12", "version21", False),
    ("swap-digit-with-dot", "python3.11", "python.311", False),
    ("arabic-indic-digits-are-nd", "model\u0661", "model\u0662", False),
    ("superscript-is-not-nd", "model\u00b2", "model\u00b3", True),
    ("letter-edit-next-to-one-digit", "covid19x", "covid19y", True),
    ("insert-letter-after-digit", "covid19", "covid19a", True),
    ("delete-letter-before-digit", "covidx19", "covid19", True),
    ("insert-letter-into-run-next-to-digits", "1aa2", "1a2", True),
    ("swap-letters-flanked-by-digits", "1ab2", "1ba2", True),
    ("substitute-emoji", "cat\U0001f600", "cat\U0001f601", True),
    ("delete-emoji-one-code-point", "cats\U0001f600", "cats", True),
    ("delete-two-code-point-emoji-is-two-edits", "cats\U0001f44d\U0001f3fd", "cats", False),
    ("delete-skin-tone-modifier", "cats\U0001f44d\U0001f3fd", "cats\U0001f44d", True),
    ("combining-mark-is-one-code-point", "cafe\u0301", "cafe", True),
    ("precomposed-vs-decomposed-is-two", "caf\u00e9", "cafe\u0301", False),
    ("swap-with-combining-mark", "cafe\u0301s", "caf\u0301es", True),
    ("accent-substitution", "caf\u00e9", "cafe", True),
    ("length-differs-by-two", "abcdef", "abcdefgh", False),
]


@pytest.mark.parametrize(("a", "b", "expected"), [c[1:] for c in ONE_EDIT_CASES],
                         ids=[c[0] for c in ONE_EDIT_CASES])
def test_one_edit_apart(a: str, b: str, expected: bool) -> None:
    """one_edit_apart is OSA distance 1, minus edits that touch digits or digit-flanked chars."""
    assert one_edit_apart(a, b) is expected
    assert one_edit_apart(b, a) is expected


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("Windows 10", "Windows 11", False),
        ("Windows 1.0", "Windows 10", False),
        ("COVID-19", "COVID-18", False),
        ("Transformer", "Transfomer", True),
        ("Mem-Castle", "mem kastle", True),
    ],
    ids=["windows-10-11", "windows-1.0-10", "covid-19-18", "typo", "typo-after-key"],
)
def test_one_edit_apart_on_keys_of_mentions(a: str, b: str, expected: bool) -> None:
    """The spec's examples, applied (as the spec does) to the keys of the two mentions."""
    assert one_edit_apart(key(display_form(a)), key(display_form(b))) is expected
