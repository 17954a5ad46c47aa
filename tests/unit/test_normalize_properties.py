"""Properties of SPEC section 2's definitions, and the brute-force oracle for the typo index.

The one-edit oracle below is the spec's sentence written out the slow, obvious way (enumerate
single edits); the index oracle compares NameIndex.typo_neighbours with a scan of every name.
"""

from __future__ import annotations

import random
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from identity_server.domain import Entity, Name, NameKind, Status
from identity_server.index import NameIndex
from identity_server.normalize import WHITE_SPACE, display_form, key, one_edit_apart
from identity_server.typo_table import (
    DeletionVariantTable,
    _chunk_variant_hashes,
    variant_hash,
    variant_hashes,
)

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Any code point at all, lone surrogates included (st.text() leaves them out by default).
any_char = st.one_of(st.characters(codec=None), st.characters(categories=["Cs"]))
any_text = st.text(any_char, max_size=40)
# Text rich in the characters the definitions single out.
tricky_char = st.one_of(
    st.sampled_from(
        list("aAbB\u00df\u00e9e\u0301 \t\n\u00a0\u3000\u200b\u200d\u202e\u00ad\x1c\x1f\x85"
             "-.,#+_!?\u20ac19\u0661\ufb01\u00b2\uff21\u2028")
    ),
    st.characters(categories=["Cc", "Cf", "Zs", "Zl", "Zp", "P", "S", "Nd", "M"]),
)
tricky_text = st.text(tricky_char, max_size=30)


# -- display form and key ------------------------------------------------------------------------


@FAST
@given(st.one_of(any_text, tricky_text))
def test_display_form_is_idempotent(raw: str) -> None:
    """Stored names are "kept in display form": the display form of a display form is itself."""
    once = display_form(raw)
    assert display_form(once) == once


@FAST
@given(st.one_of(any_text, tricky_text))
def test_key_is_stable_under_display_form(raw: str) -> None:
    """A name re-normalised on load keeps its key, so the index never loses it."""
    once = display_form(raw)
    assert key(display_form(once)) == key(once)


@FAST
@given(st.one_of(any_text, tricky_text))
def test_display_form_shape(raw: str) -> None:
    """No Cc/Cf outside White_Space, White_Space only as single inner spaces, NFKC-normal."""
    d = display_form(raw)
    assert d == d.strip(" ")
    assert "  " not in d
    for c in d:
        assert c == " " or c not in WHITE_SPACE
        assert unicodedata.category(c) not in ("Cc", "Cf")
    assert unicodedata.normalize("NFKC", d) == d


@FAST
@given(any_text, any_text)
def test_functions_never_raise(a: str, b: str) -> None:
    """Any string, lone surrogates included, is normalised and compared without an exception."""
    da, db = display_form(a), display_form(b)
    ka, kb = key(da), key(db)
    assert isinstance(one_edit_apart(ka, kb), bool)
    assert isinstance(one_edit_apart(a, b), bool)


def _is_digit(c: str) -> bool:
    return unicodedata.category(c) == "Nd"


@FAST
@given(st.one_of(any_text, tricky_text))
def test_key_has_no_white_space_and_only_allowed_punctuation(raw: str) -> None:
    """Keys drop White_Space and P* except '#' and a mark standing between two digits."""
    k = key(display_form(raw))
    for i, c in enumerate(k):
        assert c not in WHITE_SPACE
        if unicodedata.category(c).startswith("P") and c != "#":
            assert 0 < i < len(k) - 1 and _is_digit(k[i - 1]) and _is_digit(k[i + 1]), (k, i)


@FAST
@given(st.one_of(any_text, tricky_text))
def test_key_keeps_every_letter_symbol_and_digit(raw: str) -> None:
    """Only White_Space and punctuation are deleted: every other character survives, in order."""
    folded = display_form(raw).casefold()
    kept = [c for c in folded
            if c not in WHITE_SPACE and not unicodedata.category(c).startswith("P")]
    k = key(display_form(raw))
    assert [c for c in k if not unicodedata.category(c).startswith("P")] == kept


def oracle_key(display: str) -> str:
    """SPEC section 2's key, character by character: casefold, then delete White_Space and P*
    except '#' and a mark with a digit on each side (in the casefolded form)."""
    folded = display.casefold()
    out = []
    for i, c in enumerate(folded):
        if c in WHITE_SPACE:
            continue
        between_digits = 0 < i < len(folded) - 1 and _is_digit(folded[i - 1]) and _is_digit(
            folded[i + 1])
        if unicodedata.category(c).startswith("P") and c != "#" and not between_digits:
            continue
        out.append(c)
    return "".join(out)


ascii_text = st.text(st.characters(max_codepoint=127), max_size=30)
# ASCII names: words, spaces, marks and now and then a digit (the fast path and its way out).
ascii_name = st.text(st.sampled_from(list("abcXYZ   -.,'&()/_:#+19")), max_size=25)


@FAST
@given(st.one_of(any_text, tricky_text, ascii_text, ascii_name))
def test_key_matches_the_definition(raw: str) -> None:
    display = display_form(raw)
    assert key(display) == oracle_key(display)
    assert key(raw) == oracle_key(raw)  # and on text that is not a display form


# ASCII with digits beside marks and spaces: `key`'s one-pattern path for ASCII text that is
# not letters only ("ResNet-50", "Windows 1.0", "COVID-19 (SARS-CoV-2)").
ascii_with_digits = st.text(st.sampled_from(list("aB 1290.-,#_+/'()\t")), max_size=20)


@settings(max_examples=2000, deadline=None)
@given(ascii_with_digits)
def test_key_of_ascii_text_with_digits_matches_the_definition(raw: str) -> None:
    assert key(raw) == oracle_key(raw)
    assert key(display_form(raw)) == oracle_key(display_form(raw))


def test_key_of_ascii_names() -> None:
    assert key("Mem-Castle") == key("mem castle") == key("MemCastle") == "memcastle"
    assert key("O'Brien, J. (ed.)") == "obrienjed"
    assert key("Windows 1.0") == "windows1.0" and key("Windows 10") == "windows10"
    assert key("C#") == "c#" and key("C++") == "c++" and key("A\x1cB") == "a\x1cb"
    assert key("ResNet-50") == "resnet50" and key("COVID-19 (SARS-CoV-2)") == "covid19sarscov2"
    assert key("v1.2-beta") == "v1.2beta" and key("1. 2") == "12" and key("3_4") == "3_4"


# -- one edit: the oracle -------------------------------------------------------------------------


def _guarded(s: str, i: int) -> bool:
    """Editing s[i] does not count: it is a digit, or both of its neighbours are digits."""
    return _is_digit(s[i]) or (0 < i < len(s) - 1 and _is_digit(s[i - 1]) and _is_digit(s[i + 1]))


def oracle_one_edit(a: str, b: str) -> bool:
    """The spec's sentence, enumerated: some single counting edit turns a into b."""
    for x, y in ((a, b), (b, a)):  # deleting from x, i.e. inserting into y
        for i in range(len(x)):
            if x[:i] + x[i + 1 :] == y and not _guarded(x, i):
                return True
    if len(a) == len(b):
        for i in range(len(a)):
            if (a[i] != b[i] and a[:i] + b[i] + a[i + 1 :] == b
                    and not _guarded(a, i) and not _guarded(b, i)):
                return True
            if i + 1 < len(a) and a[i] != a[i + 1]:
                swapped = a[:i] + a[i + 1] + a[i] + a[i + 2 :]
                if swapped == b and not any(_guarded(a, j) for j in (i, i + 1)):
                    return True
    return False


small_key = st.text(st.sampled_from(list("aab12.#\u0661e\u0301")), max_size=7)


@settings(max_examples=1500, deadline=None)
@given(small_key, small_key)
def test_one_edit_apart_matches_oracle(a: str, b: str) -> None:
    """one_edit_apart agrees with the enumerated definition on a small, collision-rich alphabet."""
    assert one_edit_apart(a, b) is oracle_one_edit(a, b)


@settings(max_examples=1500, deadline=None)
@given(small_key, st.integers(0, 8), st.sampled_from(list("ab1.#x")), st.integers(0, 3))
def test_one_edit_apart_matches_oracle_on_near_pairs(
    a: str, pos: int, char: str, op: int
) -> None:
    """Pairs made by one edit of a: the oracle and the implementation agree on every one."""
    i = min(pos, len(a))
    if op == 0:
        b = a[:i] + char + a[i:]
    elif op == 1 and a:
        i = min(i, len(a) - 1)
        b = a[:i] + a[i + 1 :]
    elif op == 2 and a:
        i = min(i, len(a) - 1)
        b = a[:i] + char + a[i + 1 :]
    elif len(a) >= 2:
        i = min(i, len(a) - 2)
        b = a[:i] + a[i + 1] + a[i] + a[i + 2 :]
    else:
        b = a + char
    assert one_edit_apart(a, b) is oracle_one_edit(a, b)


@FAST
@given(st.one_of(any_text, small_key), st.one_of(any_text, small_key))
def test_one_edit_apart_is_symmetric(a: str, b: str) -> None:
    """'between two keys': the relation has no direction."""
    assert one_edit_apart(a, b) is one_edit_apart(b, a)


@FAST
@given(st.one_of(any_text, small_key))
def test_equal_keys_are_not_one_edit_apart(a: str) -> None:
    """Distance 1 excludes distance 0."""
    assert one_edit_apart(a, a) is False


# -- the typo index against a brute-force scan ----------------------------------------------------

name_text = st.text(st.sampled_from(list("abcab12. -#")), min_size=1, max_size=9)
entity_spec = st.tuples(
    st.lists(st.tuples(name_text, st.sampled_from(list(NameKind))), min_size=1, max_size=4),
    st.sampled_from([Status.CANONICAL, Status.PROVISIONAL, Status.MERGED]),
)


def _entity(n: int, spec: tuple[list[tuple[str, NameKind]], Status]) -> Entity:
    raw_names, status = spec
    names = []
    for pos, (raw, kind) in enumerate(raw_names):
        display = display_form(raw)
        if display and key(display):
            names.append(Name(display, kind, pos))
    return Entity(f"e{n}", "other", status, n,
                  redirect_to="e0" if status is Status.MERGED else None, names=tuple(names))


def brute_force_typo(entities: dict[str, Entity], k: str) -> set[tuple[str, str]]:
    """(anchor key, entity id) over every live entity's name and aliases, never surface forms."""
    out: set[tuple[str, str]] = set()
    for e in entities.values():
        if e.status is Status.MERGED:
            continue
        for n in e.names:
            if n.kind is NameKind.SURFACE:
                continue
            if min(len(n.key), len(k)) >= 4 and one_edit_apart(k, n.key):
                out.add((n.key, e.entity_id))
    return out


def fast_typo(index: NameIndex, k: str) -> set[tuple[str, str]]:
    """What matching does with the index: neighbours, each key verified with one_edit_apart and
    each entity for a name or alias (not a surface form) with that key."""
    return {
        (anchor, eid)
        for anchor, ids in index.typo_neighbours(k)
        if min(len(anchor), len(k)) >= 4 and one_edit_apart(k, anchor)
        for eid in ids
        if any(n.key == anchor and n.kind is not NameKind.SURFACE for n in _names(index, eid))
    }


def _names(index: NameIndex, eid: str) -> tuple[Name, ...]:
    entity = index.get(eid)
    return entity.names if entity is not None else ()


@settings(max_examples=300, deadline=None)
@given(
    st.booleans(),
    st.lists(entity_spec, min_size=1, max_size=25),
    st.lists(st.tuples(st.sampled_from(["put", "discard"]), st.integers(0, 24), entity_spec),
             max_size=15),
    st.integers(-1, 15),
    st.integers(0, 5),
    st.lists(name_text, min_size=1, max_size=10),
)
def test_typo_index_finds_exactly_what_a_scan_finds(
    bulk_load: bool,
    specs: list[tuple[list[tuple[str, NameKind]], Status]],
    edits: list[tuple[str, int, tuple[list[tuple[str, NameKind]], Status]]],
    pack_at: int,
    install_after: int,
    queries: list[str],
) -> None:
    """Typo lookup through the deletion neighbourhood equals a scan with one_edit_apart,
    after a start-up load (packed variants) or single puts (overlay), then any sequence of
    puts, replacements and discards, with the overlay packed at some point: the pack made
    before edit `pack_at` and installed `install_after` edits later (anchors filed meanwhile
    stay in the overlay), so the small tables here also grow past their anchor-number bits."""
    index = NameIndex()
    truth: dict[str, Entity] = {}
    for n, spec in enumerate(specs):
        e = _entity(n, spec)
        truth[e.entity_id] = e
        if not bulk_load:
            index.put(e)
    if bulk_load:
        index.load(truth.values())
    pack = None
    for step, (op, n, spec) in enumerate(edits):
        if step == pack_at:
            pack = index.begin_typo_pack()
        if pack is not None and step == pack_at + install_after:
            index.build_typo_pack(pack)  # built late: anchors filed meanwhile wait beside it
            assert index.install_typo_pack(pack)
            pack.release()
            pack = None
        if op == "put":
            e = _entity(n, spec)
            index.put(e)
            truth[e.entity_id] = e
        else:
            index.discard(f"e{n}")
            truth.pop(f"e{n}", None)
    probes = [key(display_form(q)) for q in queries]
    probes += [n.key for e in truth.values() for n in e.names]
    if pack is not None:  # asked mid-pack too: set-aside overlay, fresh overlay and base
        for k in probes:
            assert fast_typo(index, k) == brute_force_typo(truth, k), k
        index.build_typo_pack(pack)
        assert index.install_typo_pack(pack)
    for k in probes:
        assert fast_typo(index, k) == brute_force_typo(truth, k), k


def test_typo_index_oracle_on_a_known_case() -> None:
    """A hand-made case the random one must also get right: a swap, a deletion, a surface form,
    a digit edit and a short key."""
    index = NameIndex()
    entities = {
        "e1": Entity("e1", "other", Status.CANONICAL, 1,
                     names=(Name("Transformer", NameKind.NAME, 0),)),
        "e2": Entity("e2", "other", Status.PROVISIONAL, 2,
                     names=(Name("Tranformer", NameKind.NAME, 0),
                            Name("Transfromer", NameKind.SURFACE, 1))),
        "e3": Entity("e3", "other", Status.CANONICAL, 3,
                     names=(Name("Transformer1", NameKind.ALIAS, 1),)),
        "e4": Entity("e4", "other", Status.CANONICAL, 4, names=(Name("Tra", NameKind.NAME, 0),)),
    }
    index.put_many(entities.values())
    loaded = NameIndex()
    loaded.load(entities.values())
    for built in (index, loaded):
        assert fast_typo(built, "transfromer") == {("transformer", "e1")}
        assert fast_typo(built, "transformer") == {("tranformer", "e2")}
        assert fast_typo(built, "trab") == set()
    assert brute_force_typo(entities, "transfromer") == {("transformer", "e1")}


def test_a_removed_anchor_stays_gone_after_a_load_and_comes_back_when_re_added() -> None:
    """Packed entries are never deleted: an anchor that lost its last entity must not be
    offered, and one filed again must be found once, through the overlay."""
    index = NameIndex()
    first = Entity("e1", "other", Status.CANONICAL, 1, names=(Name("Transformer", NameKind.NAME, 0),))
    index.load([first])
    assert fast_typo(index, "transfromer") == {("transformer", "e1")}
    index.discard("e1")
    assert list(index.typo_neighbours("transfromer")) == []
    again = Entity("e2", "other", Status.CANONICAL, 2, names=(Name("Transformer", NameKind.NAME, 0),))
    index.put(again)
    assert list(index.typo_neighbours("transfromer")) == [("transformer", ("e2",))]
    with pytest.raises(ValueError, match="empty index"):
        index.load([first])


def test_a_pack_moves_the_overlay_into_the_packed_base_and_a_stale_one_is_refused() -> None:
    """Packing empties the overlay without losing an anchor, takes more number bits when the
    anchors outgrow them, and a pack made before a rebuild is not installed over it."""
    table = DeletionVariantTable()
    table.rebuild(["transformer", "attention"])
    grown = [f"anchor{chr(0x61 + i % 26)}{chr(0x61 + i // 26)}" for i in range(40)]
    for k in grown:
        table.add(k)
    assert (table.packed_anchors, table.overlay_anchors) == (2, 40)
    before = table.packed_bytes()
    pack = table.begin_pack()
    assert table.holds(grown[0]) and "transformer" in table.anchors_near("transfomer")
    table.add("lateanchor")  # filed while the pack is built: waits in the new overlay
    DeletionVariantTable.build(pack)
    assert table.install(pack)
    pack.release()
    assert (table.packed_anchors, table.overlay_anchors) == (42, 1)
    assert table.packed_bytes() > before
    for k in ["transformer", "attention", "lateanchor", *grown]:
        assert table.holds(k), k
        assert k in table.anchors_near(k[1:]), k  # found through a deletion variant
    assert not table.holds("anchor")
    stale = table.begin_pack()
    with pytest.raises(RuntimeError, match="under way"):
        table.begin_pack()
    DeletionVariantTable.build(stale)
    table.rebuild(["other"])
    assert not table.install(stale)
    assert (table.packed_anchors, table.overlay_anchors) == (1, 0)
    assert not table.holds("lateanchor")


def test_a_load_files_each_shared_anchor_key_once_and_never_misses_one() -> None:
    """Start-up collects anchor keys as it loads: a key held as a surface form first and as a
    name later is still filed; keys shared by names, aliases and entities are filed once."""
    entities = [
        Entity("e1", "other", Status.CANONICAL, 1,
               names=(Name("Transformer", NameKind.NAME, 0), Name("TRANSFORMER", NameKind.ALIAS, 1),
                      Name("Graph-Net", NameKind.SURFACE, 2))),
        Entity("e2", "other", Status.PROVISIONAL, 2,
               names=(Name("Graph Net", NameKind.NAME, 0),)),  # key first seen as e1's surface
        Entity("e3", "other", Status.CANONICAL, 3,
               names=(Name("transformer", NameKind.NAME, 0),)),  # key first seen as e1's name
        Entity("e4", "other", Status.CANONICAL, 4,
               names=(Name("Attention", NameKind.SURFACE, 0),)),  # never an anchor
    ]
    index = NameIndex()
    index.load(entities)
    assert index.typo_anchors() == (2, 0)  # transformer, graphnet
    truth = {e.entity_id: e for e in entities}
    for probe in ("transfromer", "grapnet", "atention", "transformer", "graphnet"):
        assert fast_typo(index, probe) == brute_force_typo(truth, probe), probe
    assert fast_typo(index, "grapnet") == {("graphnet", "e2")}
    assert fast_typo(index, "transformr") == {("transformer", "e1"), ("transformer", "e3")}


def test_every_variant_of_every_anchor_is_found_built_filed_and_packed() -> None:
    """Each packed word is one (variant, anchor) pair: losing any one of them (a shard cut one
    word off, a bucket directory off by one) loses a typo for the keys that share that variant
    only. So every deletion variant of every anchor is probed - after a build, with more anchors
    waiting in the overlay, and after a pack that must widen the anchor numbers."""
    rng = random.Random(7)
    letters = "abcdefghijklmnopqrstuvwxyzéß0123456789#+"
    unique = {"".join(rng.choices(letters, k=rng.randrange(4, 14))) for _ in range(5000)}
    # 2,000 built get 12-bit numbers (room for 4,096); 4,097 in all need one bit more, just.
    anchors = sorted(unique)[:4097]
    rng.shuffle(anchors)
    built, filed = anchors[:2000], anchors[2000:]

    def all_found(keys: list[str]) -> None:
        for k in keys:
            for i in range(len(k) + 1):
                probe = k[:i] + k[i + 1 :] if i < len(k) else k
                assert k in table.anchors_near(probe), (k, probe)

    table = DeletionVariantTable()
    table.rebuild(built)
    all_found(built)
    for k in filed:
        table.add(k)
    all_found(anchors)
    pack = table.begin_pack()
    DeletionVariantTable.build(pack)
    assert table.install(pack)
    pack.release()
    assert (table.packed_anchors, table.overlay_anchors) == (len(anchors), 0)
    all_found(anchors)


@FAST
@given(st.lists(st.one_of(any_text, tricky_text, st.text(any_char, min_size=60, max_size=700)),
                max_size=8))
def test_the_three_ways_of_hashing_variants_agree(keys: list[str]) -> None:
    """A build hashes variants in numpy, a lookup and a filing from one pass over the key, and
    each must give the hash of the variant string itself: a variant hashed differently at build
    and at lookup is a typo never found (any code point: surrogates, astral, combining)."""
    chunk = [int(h) for h in _chunk_variant_hashes(keys)]
    at = 0
    for k in keys:
        spelled = [variant_hash(k[:i] + k[i + 1 :]) for i in range(len(k))] + [variant_hash(k)]
        assert chunk[at : at + len(k) + 1] == spelled, k
        assert sorted(variant_hashes(k)) == sorted(spelled), k
        at += len(k) + 1
    assert at == len(chunk)
    for k in [*keys, *reversed(keys)]:  # again, in another order: recent keys' are kept
        spelled = [variant_hash(k)] + [variant_hash(k[:i] + k[i + 1 :])
                                       for i in reversed(range(len(k)))]
        assert variant_hashes(k) == spelled, k
        assert variant_hashes(k) == spelled, k  # asked twice running: the kept list, unchanged


def test_a_key_hashed_before_many_others_is_hashed_right_again() -> None:
    """Recent keys' hashes are kept, and the keeping is emptied when full: a key asked again
    after more keys than are kept, or after a few, gets its own hashes either way."""
    keys = [f"graphattentionnetwork{i}" for i in range(200)]
    expected = {k: [variant_hash(k)] + [variant_hash(k[:i] + k[i + 1 :])
                                        for i in reversed(range(len(k)))] for k in keys}
    for k in keys:
        assert variant_hashes(k) == expected[k], k
    for k in [keys[0], keys[-1], keys[-2], keys[100], keys[0]]:
        assert variant_hashes(k) == expected[k], k


def test_an_abandoned_pack_puts_its_anchors_back_in_the_overlay() -> None:
    table = DeletionVariantTable()
    table.rebuild(["transformer"])
    table.add("attention")
    pack = table.begin_pack()
    table.abandon(pack)  # as after a failed build
    assert (table.packed_anchors, table.overlay_anchors) == (1, 1)
    assert table.holds("attention") and "attention" in table.anchors_near("atention")
    assert not table.install(pack)
    again = table.begin_pack()  # the next pack goes ahead
    DeletionVariantTable.build(again)
    assert table.install(again)
    assert (table.packed_anchors, table.overlay_anchors) == (2, 0)
    assert table.holds("attention") and "attention" in table.anchors_near("atention")
