"""The checks on ids and types callers send (identity_server.checks), against the Unicode
categories they are defined by."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from identity_server.checks import MAX_ID_LENGTH, checked_id, has_dropped_characters
from identity_server.errors import InvalidArgument
from identity_server.normalize import WHITE_SPACE, display_form

FAST = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Any code point, lone surrogates included, with the categories in question made common.
any_char = st.one_of(st.characters(codec=None), st.characters(categories=["Cs"]),
                     st.characters(categories=["Cc", "Cf", "Zs", "Zl", "Zp"]))
any_text = st.text(any_char, max_size=30)


def _refused(value: str) -> str | None:
    try:
        checked_id(value, "context id", "a paper id")
    except InvalidArgument as e:
        return str(e)
    return None


@FAST
@given(any_text)
def test_an_id_is_refused_exactly_when_it_has_a_cc_cf_or_cs_character(text: str) -> None:
    bad = [(i, c) for i, c in enumerate(text) if unicodedata.category(c) in ("Cc", "Cf", "Cs")]
    refused = _refused(text)
    if not bad:
        assert refused is None
        return
    assert refused is not None
    i, c = bad[0]  # the first one is named, with its position
    assert f"U+{ord(c):04X}" in refused and f"position {i}" in refused


def test_the_refusal_says_what_and_where() -> None:
    assert _refused("paper\x1b[31m") == ("context id: control character U+001B at position 5; "
                                         "a context id is an identifier (a paper id)")
    assert _refused("p\u2066x") == ("context id: format character U+2066 at position 1; "
                                    "a context id is an identifier (a paper id)")
    assert _refused("p\udc00") == ("context id contains a lone surrogate (U+DC00 at position 1): "
                                   "not valid Unicode")
    with pytest.raises(InvalidArgument, match="an id is an identifier$"):
        checked_id("a\x00")


def test_length_is_checked_first_and_not_echoed_whole() -> None:
    refused = _refused("\x1b" * (MAX_ID_LENGTH + 1))
    assert refused is not None and "characters long" in refused and "\x1b" not in refused
    assert _refused("p" * MAX_ID_LENGTH) is None


@FAST
@given(any_text)
def test_dropped_characters_are_the_ones_display_form_drops(text: str) -> None:
    dropped = [c for c in text
               if c not in WHITE_SPACE and unicodedata.category(c) in ("Cc", "Cf")]
    assert has_dropped_characters(text) == bool(dropped)
    assert not has_dropped_characters(display_form(text))  # what is stored has none left
