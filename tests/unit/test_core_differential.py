"""Every resolve core against the reference core (identity_server.core): the same answers.

The install builds the compiled core where it finds a C compiler and runs the reference where it
does not; the rest of the suite runs whichever IDENTITY_CORE selects, so here the two are
compared directly, on the same inputs, tables and keys.
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from identity_server import core as core_module
from identity_server.core import Core, CoreUnavailable, load_core
from identity_server.core.reference import ReferenceCore
from identity_server.typo_table import _BASE, _SEED, DeletionVariantTable, _Shard, variant_hash
from tests.unit.test_normalize import DISPLAY_CASES, KEY_CASES, ONE_EDIT_CASES

try:
    from identity_server.core import _compiled as native
    from identity_server.core.compiled import CompiledCore
except ImportError:  # pragma: no cover - no C compiler where the install ran
    native = None  # type: ignore[assignment]
    CompiledCore = None  # type: ignore[assignment,misc]

reference = ReferenceCore()
needs_native = pytest.mark.skipif(native is None, reason="the compiled core was not built here")
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
any_char = st.one_of(st.characters(codec=None), st.characters(categories=["Cs"]))


def _compiled() -> Core:
    assert CompiledCore is not None
    return CompiledCore()


def test_the_compiled_core_is_built_where_ci_runs() -> None:
    """CI's machine has a C compiler: there the compiled core must have been built, or its loops
    would go untested while every other test passes on the reference."""
    if os.environ.get("CI"):
        assert native is not None, "identity_server.core._compiled was not built"
    elif native is None:
        pytest.skip("the compiled core was not built here (no compiler): the reference runs")


def test_identity_core_selects_the_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDENTITY_CORE", "reference")
    assert load_core().name == "reference"
    monkeypatch.setenv("IDENTITY_CORE", "fastest")
    with pytest.raises(CoreUnavailable, match="expected one of auto, reference, compiled"):
        load_core()
    monkeypatch.delenv("IDENTITY_CORE")
    assert load_core().name == ("compiled" if native is not None else "reference")


@needs_native
@FAST
@given(st.text(any_char, max_size=60))
def test_compiled_and_reference_normalize_alike(text: str) -> None:
    """Display form and key on any text (non-ASCII, controls, surrogates)."""
    assert _compiled().normalize(text) == reference.normalize(text)


# Printable ASCII takes the compiled core's own path (the rest goes to the reference): names
# over letters, digits, punctuation and spaces, where the digit rules and runs of spaces bite.
ascii_name = st.text(st.sampled_from("aAbBzZ019 -.,#+_'()/:&"), max_size=24)
near_ascii = st.text(st.one_of(st.sampled_from("aA09 -.#\t\n\x7f\x1f"), any_char), max_size=12)


@needs_native
@FAST
@given(st.one_of(ascii_name, near_ascii))
def test_compiled_and_reference_normalize_names_alike(text: str) -> None:
    assert _compiled().normalize(text) == reference.normalize(text)


@needs_native
@pytest.mark.parametrize(("raw", "display"), [c[1:] for c in DISPLAY_CASES],
                         ids=[c[0] for c in DISPLAY_CASES])
def test_compiled_core_gives_the_spec_display_forms(raw: str, display: str) -> None:
    assert _compiled().normalize(raw)[0] == display


@needs_native
@pytest.mark.parametrize(("raw", "k"), [c[1:] for c in KEY_CASES], ids=[c[0] for c in KEY_CASES])
def test_compiled_core_gives_the_spec_keys(raw: str, k: str) -> None:
    assert _compiled().normalize(raw)[1] == k


@needs_native
@pytest.mark.parametrize(("a", "b", "expected"), [c[1:] for c in ONE_EDIT_CASES],
                         ids=[c[0] for c in ONE_EDIT_CASES])
def test_compiled_core_gives_the_spec_typos(a: str, b: str, expected: bool) -> None:
    assert _compiled().one_edit_apart(a, b) is expected
    assert _compiled().one_edit_apart(b, a) is expected


@needs_native
@FAST
@given(st.text(st.sampled_from("ab19#."), max_size=7), st.text(st.sampled_from("ab19#."), max_size=7),
       st.text(any_char, max_size=6))
def test_compiled_and_reference_one_edit_alike(a: str, b: str, other: str) -> None:
    """Keys over a small alphabet (so that most pairs are a few edits apart), digits and marks
    included; and any text against them."""
    compiled = _compiled()
    for x, y in ((a, b), (b, a), (a, a[1:]), (a, a[::-1]), (a, other), (other, b)):
        assert compiled.one_edit_apart(x, y) is reference.one_edit_apart(x, y), (x, y)


@needs_native
@FAST
@given(st.one_of(st.text(any_char, max_size=40), st.text(any_char, min_size=60, max_size=700)))
def test_compiled_and_reference_variant_hashes_agree(k: str) -> None:
    """Any code point (surrogates, astral, combining), short keys and long ones."""
    from_c = _compiled().variant_hashes(k, _BASE, _SEED)
    assert from_c == reference.variant_hashes(k, _BASE, _SEED)
    assert from_c[0] == variant_hash(k)
    assert from_c[1:] == [variant_hash(k[:i] + k[i + 1 :]) for i in reversed(range(len(k)))]


def _keys(rng: random.Random, count: int) -> list[str]:
    """Keys over a small alphabet (so that many share deletion variants), a few non-ASCII."""
    alphabet = "abcdeé文\U0001f600"
    return list({"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9)))
                 for _ in range(count)})


def _near_both_ways(table: DeletionVariantTable, k: str,
                    monkeypatch: pytest.MonkeyPatch) -> tuple[set[str], set[str]]:
    with monkeypatch.context() as m:
        m.setattr(core_module, "_selected", _compiled())
        from_c = table.anchors_near(k)
    with monkeypatch.context() as m:
        m.setattr(core_module, "_selected", reference)
        from_python = table.anchors_near(k)
    return from_c, from_python


@needs_native
@pytest.mark.parametrize("seed", range(6))
def test_compiled_and_reference_lookups_find_the_same_anchors(seed: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Packed shards, the overlay and an overlay set aside for a pack, before and after the
    pack is built (shards merged, anchor numbers taking more bits)."""
    rng = random.Random(seed)
    keys = _keys(rng, 400)
    table = DeletionVariantTable()
    table.rebuild(keys[:250])
    for k in keys[250:320]:
        table.add(k)
    pack = table.begin_pack()
    for k in keys[320:]:
        table.add(k)
    queries = [*keys, *_keys(rng, 200)]
    for stage in ("set aside", "built", "installed"):
        if stage == "built":
            DeletionVariantTable.build(pack)
        elif stage == "installed":
            assert table.install(pack)
            pack.release()
        found_any = 0
        for q in queries:
            from_c, from_python = _near_both_ways(table, q, monkeypatch)
            assert from_c == from_python, (stage, q)
            found_any += bool(from_c)
            if q in keys:
                assert q in from_c, (stage, q)  # every anchor is filed under itself
        assert found_any > len(queries) // 2


@needs_native
def test_compiled_probe_reads_a_directory_of_8_byte_bucket_starts() -> None:
    """Shards of 2**32 words or more keep 8-byte bucket starts (too large to build here): the
    same shard with its directory widened answers the same."""
    rng = random.Random(7)
    keys = _keys(rng, 300)
    table = DeletionVariantTable()
    table.rebuild(keys)
    wide = []
    for shard in table._shards:
        starts = shard.starts.astype(np.uint64)
        wide.append(_Shard(shard.words, starts.data, shard.shift, shard.bucket_mask,
                           shard.hash_mask, shard.number_mask, shard.array, starts))
    for q in keys[:100]:
        hashes = native.variant_hashes(q, _BASE, _SEED)
        narrow_found: set[str] = set()
        wide_found: set[str] = set()
        native.probe_shards(hashes, table._shards, table._anchors, narrow_found)
        native.probe_shards(hashes, wide, table._anchors, wide_found)
        assert wide_found == narrow_found and q in wide_found


@needs_native
def test_compiled_probe_refuses_what_is_not_a_table() -> None:
    """A wrong argument is an exception, never a read out of bounds."""
    table = DeletionVariantTable()
    table.rebuild(["transformer", "attention"])
    hashes = native.variant_hashes("transformer", _BASE, _SEED)
    with pytest.raises(TypeError):
        native.probe_shards(tuple(hashes), table._shards, table._anchors, set())
    with pytest.raises(TypeError):
        native.probe_shards(hashes, [("not", "a", "shard")] * 16, table._anchors, set())
    with pytest.raises(ValueError, match="fewer shards"):
        native.probe_shards(hashes, table._shards[:1], table._anchors, set())
    with pytest.raises(IndexError, match="anchor number"):
        native.probe_shards(hashes, table._shards, [], set())
    with pytest.raises(OverflowError):
        native.probe_shards([-1], table._shards, table._anchors, set())
    with pytest.raises(TypeError):
        native.probe_overlay(hashes, {hashes[0]: 5}, set())
    found: set[str] = set()
    native.probe_overlay(hashes, {hashes[0]: "a", hashes[1]: {"b", "c"}, 12345: "d"}, found)
    assert found == {"a", "b", "c"}


_NAMES = ["Ada Lovelace", "ADA lovelace", "Mem-Castle", "MemCastle", "C#", "C++", "C.",
          "Windows 1.0", "Windows 10", "COVID-19", "Maria", "Mario", "Transformer", "Transfromer",
          "Café", "cafe", "Straße", "STRASSE", "ＡＢＣ", "a\u200bb\u200bc", "x y z", "Ｃ＃"]


def _index_of(core: Core) -> Any:
    from identity_server.domain import Entity, Name, NameKind, Status
    from identity_server.index import NameIndex

    index = NameIndex()
    types = ["person", "method", "other", "tool"]
    for i, text in enumerate(_NAMES, start=1):
        display, _ = core.normalize(text)
        status = Status.CANONICAL if i % 2 else Status.PROVISIONAL
        index.put(Entity(f"E{i}", types[i % 4], status, i,
                         names=(Name(display, NameKind.NAME, 0),)))
    return index


@needs_native
@FAST
@given(st.one_of(st.sampled_from(_NAMES), st.text(any_char, min_size=1, max_size=16)),
       st.sampled_from(["person", "method", "other", "tool"]))
def test_compiled_and_reference_decide_alike(text: str, mention_type: str) -> None:
    """The same decision (outcome, rule, candidates in order, matched names) over one index, on
    the section-2 corpora's tricky names and on any text."""
    from identity_server.domain import Mention

    compiled = _compiled()
    index = _index_of(reference)
    display, k = reference.normalize(text)
    if not display or not k:
        return
    m = Mention(display, mention_type, mention_type, k)
    ours, theirs = compiled.decide(index, m), reference.decide(index, m)
    assert (ours.outcome, ours.rule) == (theirs.outcome, theirs.rule)
    assert [(c.entity.entity_id, c.matched_name, c.alias_only) for c in ours.candidates] == [
        (c.entity.entity_id, c.matched_name, c.alias_only) for c in theirs.candidates]
