"""What the store keeps of a caller's input, on a real SQLite file read back with sqlite3.

A context id is an identifier: one with a control or format character is refused, saying which
character and where. A mention's type as given is kept with the evidence cleaned as the mention
is (display form), and read from the vocabulary as before when it has nothing to clean. A
ResolveBatch reply is kept for repeats only when the batch wrote something.
"""

from __future__ import annotations

import json
import re
import sqlite3
import unicodedata
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import grpc
import pytest
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from identity_server.errors import EntityNotFound, InvalidArgument
from identity_server.server import build_service
from identity_server.service import IdentityService, ItemError, ResolveResult
from identity_server.settings import Settings
from tests.conftest import sqlite_url

T = 10.0  # deadline of every gRPC call, in seconds


def _rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(path)) as db:
        return db.execute(sql).fetchall()


def _evidence(path: Path) -> list[tuple[str, str, str, str, int]]:
    rows = _rows(path, "SELECT entity_id, context_id, surface, raw_type, count FROM evidence")
    return [(str(e), str(c), str(s), str(t), int(n)) for e, c, s, t, n in rows]


def _batch_replies(path: Path) -> int:
    (count,), = _rows(path, "SELECT count(*) FROM batch_replies")
    return int(count)


def _controls(text: str) -> list[str]:
    return [c for c in text if unicodedata.category(c) in ("Cc", "Cf")]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "stored.sqlite"


@pytest.fixture
def svc(db_path: Path) -> Iterator[IdentityService]:
    service = build_service(Settings(db_url=sqlite_url(db_path)))
    yield service
    service.close()


@pytest.fixture
def strict(tmp_path: Path) -> Iterator[IdentityService]:
    service = build_service(Settings(db_url=sqlite_url(tmp_path / "strict.sqlite"),
                                     strict_types=True))
    yield service
    service.close()


# -- raw types and surfaces ----------------------------------------------------------------------


def test_raw_types_and_surfaces_are_stored_in_display_form(svc: IdentityService,
                                                           db_path: Path) -> None:
    """Before, "person\\x1b[31m" and "per\\x00son" went into evidence.raw_type byte for byte."""
    svc.resolve("Quorbex Lovelace", "person\x1b[31m", context_id="paper-1")
    svc.resolve("Quorbex Lovelace", "per\x00son", context_id="paper-1")
    svc.resolve("Quorbex Lovelace", "\x07\u200b", context_id="paper-1")
    svc.resolve("Quorbex Lovelace", "  ｐｅｒｓｏｎ\u2028 ", context_id="paper-1")
    results = svc.resolve_batch("paper-2", [("Quorbex\x1b Lovelace\u200b", "\u202eperson\u202c"),
                                            ("Mem\x00Castle", "tool\x7f"),
                                            ("Mem\tCastle", "  Tool\t ")])
    assert all(isinstance(r, ResolveResult) for r in results)

    rows = _evidence(db_path)
    for row in rows:
        assert not any(_controls(field) for field in row[:4]), row
    assert {(c, s, t) for _, c, s, t, _ in rows} == {
        ("paper-1", "Quorbex Lovelace", "person[31m"),
        ("paper-1", "Quorbex Lovelace", "person"),  # "per\x00son"
        ("paper-1", "Quorbex Lovelace", ""),  # nothing left: an empty type
        ("paper-1", "Quorbex Lovelace", "person"),  # NFKC of the fullwidth letters
        ("paper-2", "Quorbex Lovelace", "person"),
        ("paper-2", "MemCastle", "tool"),
        ("paper-2", "Mem Castle", "Tool"),
    }
    # The surface kept with the evidence is the mention's display form, as the reply says.
    assert {r.display_form for r in results if isinstance(r, ResolveResult)} == {
        "Quorbex Lovelace", "MemCastle", "Mem Castle"}


def test_a_type_with_control_characters_is_read_once_cleaned(svc: IdentityService,
                                                             strict: IdentityService) -> None:
    assert svc.parse_mention("Ada", "per\x00son").entity_type == "person"
    assert svc.parse_mention("Ada", "\u200bMethod\x1b").entity_type == "method"
    assert svc.parse_mention("Ada", "person\x1b[31m").entity_type == "other"  # unknown
    # Strict mode: still unknown once cleaned is refused, without echoing the control byte;
    # nothing left after cleaning reads as an empty type does (the wildcard).
    with pytest.raises(InvalidArgument, match=r"unknown entity type 'person\[31m'"):
        strict.parse_mention("Ada", "person\x1b[31m")
    assert strict.parse_mention("Ada", "per\x00son").entity_type == "person"
    assert strict.parse_mention("Ada", "\x00\u200b\x07").entity_type == "other"
    assert strict.parse_mention("Ada", "").entity_type == "other"


@pytest.mark.parametrize("raw", [
    "person", " Person ", "PERSON", "ｐｅｒｓｏｎ", "per son", "per  son", "person\t",
    "\tperson\n", "Organization\u00a0", "\u00a0tool", "unknown", "", "   ", "Straße", "ﬁle",
    "x" * 128,
])
def test_a_type_with_nothing_to_clean_is_read_as_before(
        svc: IdentityService, strict: IdentityService, raw: str) -> None:
    """The vocabulary reads such a type as given, exactly as before the cleaning was added."""
    for service in (svc, strict):
        vocabulary = service.config.vocabulary
        try:
            expected: str | None = vocabulary.for_mention(raw)
        except InvalidArgument:
            expected = None
        try:
            got: str | None = service.parse_mention("Ada", raw).entity_type
        except InvalidArgument:
            got = None
        assert got == expected


def test_a_type_that_cannot_be_stored_is_the_items_error(svc: IdentityService,
                                                         db_path: Path) -> None:
    results = svc.resolve_batch("paper-1", [("Ada", "t\ud800"), ("Ada", "\ufdfa" * 8),
                                            ("Ada", "tool")])
    assert isinstance(results[0], ItemError) and "lone surrogate" in results[0].message
    assert isinstance(results[1], ItemError) and "the limit is 128" in results[1].message
    assert isinstance(results[2], ResolveResult)
    assert [t for _, _, _, t, _ in _evidence(db_path)] == ["tool"]


# -- context ids and entity ids ------------------------------------------------------------------


@pytest.mark.parametrize(("context_id", "said"), [
    ("paper\x1b[31m", ("context id: control character U+001B at position 5; a context id is "
                       "an identifier (a paper id)")),
    ("paper-\x00", "control character U+0000 at position 6"),
    ("\x07paper", "control character U+0007 at position 0"),
    ("paper\t1", "control character U+0009 at position 5"),
    ("paper\n", "control character U+000A at position 5"),
    ("pa\u200bper", "format character U+200B at position 2"),
    ("\ufeffpaper", "format character U+FEFF at position 0"),
    ("paper\u202e", "format character U+202E at position 5"),
    ("pap\ud800er", "context id contains a lone surrogate (U+D800 at position 3)"),
])
def test_a_context_id_with_a_control_character_is_refused(
        svc: IdentityService, db_path: Path, context_id: str, said: str) -> None:
    with pytest.raises(InvalidArgument) as one:
        svc.resolve("Quorbex", "tool", context_id=context_id)
    assert said in str(one.value)
    with pytest.raises(InvalidArgument) as whole:  # the whole batch fails, as for a long id
        svc.resolve_batch(context_id, [("Quorbex", "tool"), ("Mem Castle", "tool")])
    assert said in str(whole.value)
    with pytest.raises(InvalidArgument):  # lookup-only too: the same request checks
        svc.resolve("Quorbex", "tool", context_id=context_id, lookup_only=True)
    assert _evidence(db_path) == []
    assert _rows(db_path, "SELECT count(*) FROM entities") == [(0,)]


def test_context_ids_without_control_characters_still_resolve(svc: IdentityService,
                                                              db_path: Path) -> None:
    for context_id in ("paper 1", "doi:10.1000/xyz\u00a0", "論文-１", "arXiv:2401.00001v2", ""):
        assert svc.resolve("Quorbex", "tool", context_id=context_id).entity_id
    assert {c for _, c, _, _, _ in _evidence(db_path)} == {
        "paper 1", "doi:10.1000/xyz\u00a0", "論文-１", "arXiv:2401.00001v2"}


def test_entity_ids_and_record_ids_follow_the_same_rule(svc: IdentityService) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(
            "entity id: control character U+001B at position 1; an entity id is an identifier")):
        svc.get_entity("Q\x1b1")
    with pytest.raises(EntityNotFound):  # printable: merely unknown, as before
        svc.get_entity("Q 1")
    report = svc.import_lines([
        json.dumps({"id": "Q\u00071", "name": "Ada", "type": "person"}),
        json.dumps({"id": "Q2", "name": "Alan", "type": "person"}),
    ])
    assert [(e.line, e.message) for e in report.errors] == [
        (1, "id: control character U+0007 at position 1; an id is an identifier")]
    assert report.imported == 1


# -- stored batch replies ------------------------------------------------------------------------


def test_a_batch_whose_every_item_failed_keeps_no_reply(svc: IdentityService,
                                                        db_path: Path) -> None:
    bad = [("", "tool"), ("?!", "tool"), ("x" * 513, "tool")]
    first = svc.resolve_prepared(svc.prepare_batch("paper-1", bad))
    assert all(isinstance(r, ItemError) for r in first.results)
    assert _batch_replies(db_path) == 0
    again = svc.resolve_prepared(svc.prepare_batch("paper-1", bad))
    assert (again.results, again.replayed) == (first.results, False)  # checked again, same way
    assert _batch_replies(db_path) == 0
    empty = svc.resolve_prepared(svc.prepare_batch("paper-1", []))
    assert (empty.results, _batch_replies(db_path)) == ([], 0)
    assert _evidence(db_path) == []


def test_a_batch_with_one_good_item_keeps_its_reply_and_replays_it(svc: IdentityService,
                                                                   db_path: Path) -> None:
    mentions = [("", "tool"), ("Quorbex", "tool"), ("?!", "tool")]
    first = svc.resolve_prepared(svc.prepare_batch("paper-1", mentions))
    assert [type(r) for r in first.results] == [ItemError, ResolveResult, ItemError]
    assert (first.replayed, _batch_replies(db_path)) == (False, 1)
    again = svc.resolve_prepared(svc.prepare_batch("paper-1", mentions))
    assert (again.results, again.replayed) == (first.results, True)
    assert [n for _, _, _, _, n in _evidence(db_path)] == [1]  # not counted twice


# -- through a real server -----------------------------------------------------------------------


def test_grpc_refuses_a_context_id_with_a_control_character(
        stub: pb_grpc.IdentityServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as one:
        stub.Resolve(pb.ResolveRequest(mention="Quorbex", entity_type="tool",
                                       context_id="paper\x1b[31m"), timeout=T)
    assert one.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "control character U+001B at position 5" in (one.value.details() or "")
    with pytest.raises(grpc.RpcError) as whole:
        stub.ResolveBatch(pb.ResolveBatchRequest(
            context_id="paper\x07", mentions=[pb.Mention(mention="Quorbex", entity_type="tool")]),
            timeout=T)
    assert whole.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "control character U+0007 at position 5" in (whole.value.details() or "")
    ok = stub.Resolve(pb.ResolveRequest(mention="Quorbex", entity_type="per\x00son",
                                        context_id="paper-1"), timeout=T)
    assert (ok.entity_type, ok.created) == ("person", True)
