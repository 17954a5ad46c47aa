"""Every IdentityService RPC over a real server on a loopback port (SPEC sections 2-5).

Each test gets a fresh server on a fresh SQLite file (the `server`/`stub` fixtures), so the
state a test sees is only what it made. Every call carries a deadline.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from identity_server.server import RunningServer, start_server
from identity_server.settings import Settings
from tests.conftest import ADMIN, ADMIN_TOKEN

T = 10.0  # deadline of every call, in seconds

Stub = pb_grpc.IdentityServiceStub


# -- helpers -------------------------------------------------------------------------------------


def resolve(stub: Stub, mention: str, entity_type: str = "", *, context_id: str = "",
            lookup_only: bool = False) -> pb.ResolveResponse:
    return stub.Resolve(
        pb.ResolveRequest(mention=mention, entity_type=entity_type, context_id=context_id,
                          lookup_only=lookup_only),
        timeout=T,
    )


def get(stub: Stub, entity_id: str) -> pb.Entity:
    return stub.GetEntity(pb.GetEntityRequest(entity_id=entity_id), timeout=T).entity


def chunked(data: bytes, size: int,
            fmt: int = pb.AUTHORITY_FORMAT_UNSPECIFIED) -> Iterator[pb.ImportAuthorityRequest]:
    for i in range(0, max(len(data), 1), size):
        yield pb.ImportAuthorityRequest(format=fmt if i == 0 else 0, data=data[i : i + size])


def jsonl(records: Iterable[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def import_data(stub: Stub, data: bytes, *, size: int = 4096,
                fmt: int = pb.AUTHORITY_FORMAT_UNSPECIFIED) -> pb.ImportAuthorityResponse:
    return stub.ImportAuthority(chunked(data, size, fmt), metadata=ADMIN, timeout=T)


def import_records(stub: Stub, *records: dict[str, Any]) -> pb.ImportAuthorityResponse:
    report = import_data(stub, jsonl(records), fmt=pb.AUTHORITY_FORMAT_JSONL)
    assert list(report.errors) == []
    return report


def rec(entity_id: str, name: str, entity_type: str, *aliases: str) -> dict[str, Any]:
    return {"id": entity_id, "name": name, "type": entity_type, "aliases": list(aliases)}


def fails(call: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def changes(stub: Stub, after: int = 0, limit: int = 0) -> list[pb.Change]:
    stream = stub.ListChanges(pb.ListChangesRequest(after_sequence=after, limit=limit), timeout=T)
    return [r.change for r in stream]


def links(stub: Stub, entity_id: str = "") -> set[frozenset[str]]:
    reply = stub.ListPossiblySameAs(
        pb.ListPossiblySameAsRequest(entity_id=entity_id, page_size=1000), timeout=T
    )
    assert reply.next_page_token == ""
    return {frozenset((link.entity_id, link.other_id)) for link in reply.links}


def settle(stub: Stub, a: str, b: str, decision: int, *, actor: str = "curator@example.org",
           reason: str = "checked the sources") -> pb.Entity:
    return stub.SettlePossiblySameAs(
        pb.SettlePossiblySameAsRequest(entity_id=a, other_id=b, decision=decision, actor=actor,
                                       reason=reason),
        metadata=ADMIN, timeout=T,
    ).entity


def merge(stub: Stub, source: str, target: str) -> pb.Entity:
    return stub.Merge(pb.MergeRequest(source_id=source, target_id=target), metadata=ADMIN,
                      timeout=T).entity


def promote(stub: Stub, entity_id: str) -> pb.Entity:
    return stub.Promote(pb.PromoteRequest(entity_id=entity_id), metadata=ADMIN, timeout=T).entity


def add_alias(stub: Stub, entity_id: str, alias: str) -> pb.Entity:
    return stub.AddAlias(pb.AddAliasRequest(entity_id=entity_id, alias=alias), metadata=ADMIN,
                         timeout=T).entity


# -- Resolve ----------------------------------------------------------------------------------


def test_resolve_creates_a_provisional_entity_then_finds_it_exactly(stub: Stub) -> None:
    first = resolve(stub, "  Ada\u200b   Lovelace ", "Person", context_id="paper-1")
    assert first.match_kind == pb.NEW and first.created
    assert first.status == pb.PROVISIONAL and first.entity_id
    assert first.display_form == "Ada Lovelace" and first.name == "Ada Lovelace"
    assert first.entity_type == "person"
    assert list(first.candidates) == [] and first.matched_name == ""

    again = resolve(stub, "Ada Lovelace", "person", context_id="paper-2")
    assert again.entity_id == first.entity_id
    assert again.match_kind == pb.EXACT and not again.created
    assert list(again.candidates) == [first.entity_id]
    assert again.matched_name == "Ada Lovelace"

    entity = get(stub, first.entity_id)
    assert entity.status == pb.PROVISIONAL and entity.name == "Ada Lovelace"
    assert list(entity.surface_forms) == []  # the name itself is not recorded again
    assert (entity.evidence_count, entity.paper_count) == (2, 2)


def test_resolve_reports_every_match_kind_on_the_wire(stub: Stub) -> None:
    import_records(stub, rec("Q-MEM", "Mem-Castle", "method", "Memory Castle"))

    case = resolve(stub, "mem-castle", "method")
    assert (case.entity_id, case.match_kind, case.matched_name) == ("Q-MEM", pb.CASE, "Mem-Castle")
    assert case.status == pb.CANONICAL and not case.created
    assert list(case.candidates) == ["Q-MEM"]

    punct = resolve(stub, "Mem Castle", "method")
    assert (punct.entity_id, punct.match_kind) == ("Q-MEM", pb.PUNCTUATION)
    assert punct.matched_name == "Mem-Castle"  # the name comes before surface forms

    exact_alias = resolve(stub, "Memory Castle", "method")
    assert (exact_alias.match_kind, exact_alias.matched_name) == (pb.ALIAS, "Memory Castle")
    case_alias = resolve(stub, "MEMORY CASTLE", "method")
    assert (case_alias.entity_id, case_alias.match_kind) == ("Q-MEM", pb.ALIAS)

    typo = resolve(stub, "Memory Casle", "method")
    assert (typo.entity_id, typo.match_kind, typo.matched_name) == (
        "Q-MEM", pb.TYPO, "Memory Castle")

    surfaces = list(get(stub, "Q-MEM").surface_forms)
    assert surfaces == ["mem-castle", "Mem Castle", "MEMORY CASTLE", "Memory Casle"]

    # The alias and the surface form "MEMORY CASTLE" match at rule 2: not alias-only any more.
    mixed = resolve(stub, "memory castle", "method")
    assert (mixed.match_kind, mixed.matched_name) == (pb.CASE, "Memory Castle")

    # A surface form is never a typo anchor: one edit from "Memory Casle", two from the alias.
    drift = resolve(stub, "Memory Casl", "method")
    assert drift.match_kind == pb.NEW and drift.entity_id != "Q-MEM"
    assert list(drift.candidates) == [] and list(drift.possibly_same_as) == []


def test_resolve_ranks_candidates_by_type_then_status(stub: Stub) -> None:
    import_records(stub, rec("T-ORION", "Orion", "tool"))
    place = resolve(stub, "Orion", "place")  # the tool is incompatible with a place
    assert place.match_kind == pb.NEW and place.created and place.entity_type == "place"

    wildcard = resolve(stub, "Orion", "")  # `other` matches both; canonical first
    assert (wildcard.entity_id, wildcard.match_kind) == ("T-ORION", pb.EXACT)
    assert list(wildcard.candidates) == ["T-ORION", place.entity_id]

    again = resolve(stub, "Orion", "place")
    assert (again.entity_id, again.match_kind) == (place.entity_id, pb.EXACT)
    assert list(again.candidates) == [place.entity_id]


def test_resolve_types_unknown_as_other_and_upgrades_only_provisional_other(stub: Stub) -> None:
    untyped = resolve(stub, "Zeta Widget", "Spaceship")
    assert untyped.entity_type == "other"
    typed = resolve(stub, "Zeta Widget", " TOOL ")
    assert (typed.entity_id, typed.match_kind) == (untyped.entity_id, pb.EXACT)
    assert typed.entity_type == "tool" and get(stub, typed.entity_id).entity_type == "tool"

    import_records(stub, rec("Q-OMEGA", "Omega Core", "other"))
    hit = resolve(stub, "Omega Core", "method")
    assert hit.entity_id == "Q-OMEGA" and hit.entity_type == "other"
    assert get(stub, "Q-OMEGA").entity_type == "other"  # authority types are never upgraded


def test_ambiguous_mentions_share_one_placeholder_linked_to_every_best_candidate(
    stub: Stub,
) -> None:
    import_records(stub, rec("P-1", "Jordan Smith", "person"), rec("P-2", "Jordan Smith", "person"))
    first = resolve(stub, "Jordan Smith", "person")
    assert first.match_kind == pb.AMBIGUOUS and first.created
    assert first.entity_id not in ("P-1", "P-2") and first.status == pb.PROVISIONAL
    assert list(first.candidates) == ["P-1", "P-2"]
    assert sorted(first.possibly_same_as) == ["P-1", "P-2"]
    assert first.matched_name == "Jordan Smith" and first.entity_type == "person"
    placeholder = get(stub, first.entity_id)
    assert placeholder.placeholder and placeholder.name == "Jordan Smith"

    second = resolve(stub, "Jordan Smith", "person")
    assert (second.entity_id, second.match_kind, second.created) == (
        first.entity_id, pb.AMBIGUOUS, False)

    # A candidate that appears later is linked to the same placeholder.
    import_records(stub, rec("P-3", "Jordan Smith", "person"))
    third = resolve(stub, "Jordan Smith", "person")
    assert third.entity_id == first.entity_id and third.match_kind == pb.AMBIGUOUS
    # Every candidate of the deciding rule, best rank first: the placeholder (provisional) last.
    assert list(third.candidates) == ["P-1", "P-2", "P-3", first.entity_id]
    assert links(stub, first.entity_id) == {
        frozenset((first.entity_id, p)) for p in ("P-1", "P-2", "P-3")
    }

    look = resolve(stub, "Jordan Smith", "person", lookup_only=True)
    assert (look.entity_id, look.match_kind) == (first.entity_id, pb.AMBIGUOUS)


def test_two_strong_typo_candidates_are_ambiguous(stub: Stub) -> None:
    import_records(stub, rec("P-SMITH", "Jonathan Smith", "person"),
                   rec("P-SMYTH", "Jonathan Smyth", "person"))
    amb = resolve(stub, "Jonathan Smth", "person")
    assert amb.match_kind == pb.AMBIGUOUS and amb.created
    assert list(amb.candidates) == ["P-SMITH", "P-SMYTH"]
    assert sorted(amb.possibly_same_as) == ["P-SMITH", "P-SMYTH"]
    assert get(stub, amb.entity_id).placeholder


def test_weak_candidates_make_a_new_entity_linked_to_them(stub: Stub) -> None:
    import_records(stub, rec("C-AI", "AI", "concept"), rec("P-MARIA", "Maria", "person"),
                   rec("T-WIN", "Windows 10", "tool"), rec("C-CAT", "Cat", "concept"),
                   rec("C-COVID", "COVID-19", "concept"))
    short_key = resolve(stub, "A.I.", "concept")
    assert short_key.match_kind == pb.NEW and short_key.created
    assert list(short_key.candidates) == ["C-AI"] and list(short_key.possibly_same_as) == ["C-AI"]
    assert short_key.matched_name == "AI"

    short_typo = resolve(stub, "Mario", "person")
    assert short_typo.match_kind == pb.NEW and short_typo.entity_id != "P-MARIA"
    assert list(short_typo.possibly_same_as) == ["P-MARIA"]
    assert links(stub, short_typo.entity_id) == {frozenset((short_typo.entity_id, "P-MARIA"))}

    for mention, etype in (("Windows 11", "tool"), ("Windows 1.0", "tool"),
                           ("COVID-18", "concept"), ("Cot", "concept")):
        other = resolve(stub, mention, etype)  # digit edits; a key under 4 characters
        assert other.match_kind == pb.NEW, mention
        assert list(other.candidates) == [] and list(other.possibly_same_as) == [], mention


def test_a_strong_typo_outranks_a_weak_one(stub: Stub) -> None:
    import_records(stub, rec("P-MARIA", "Maria", "person"), rec("P-MARIASZ", "Mariasz", "person"))
    hit = resolve(stub, "Marias", "person")  # 1 edit from both; only "marias"/"mariasz" is strong
    assert (hit.entity_id, hit.match_kind, hit.matched_name) == ("P-MARIASZ", pb.TYPO, "Mariasz")
    assert list(hit.candidates) == ["P-MARIASZ"] and list(hit.possibly_same_as) == []


def test_lookup_only_writes_nothing(stub: Stub) -> None:
    made = resolve(stub, "Zeta Widget", "", context_id="paper-1")
    before = changes(stub)

    look = resolve(stub, "zeta widget", "tool", context_id="paper-2", lookup_only=True)
    assert (look.entity_id, look.match_kind, look.created) == (made.entity_id, pb.CASE, False)
    assert list(look.possibly_same_as) == []

    new = resolve(stub, "Brand New Thing", "tool", context_id="paper-2", lookup_only=True)
    assert new.match_kind == pb.NEW and new.entity_id == "" and not new.created
    assert new.status == pb.ENTITY_STATUS_UNSPECIFIED
    assert new.display_form == "Brand New Thing"

    import_records(stub, rec("P-1", "Jordan Smith", "person"), rec("P-2", "Jordan Smith", "person"),
                   rec("P-MARIA", "Maria", "person"))
    before = changes(stub)
    weak = resolve(stub, "Mario", "person", lookup_only=True)
    assert (weak.entity_id, weak.match_kind, weak.matched_name) == ("", pb.NEW, "Maria")
    assert list(weak.candidates) == ["P-MARIA"] and list(weak.possibly_same_as) == []
    amb = resolve(stub, "Jordan Smith", "person", lookup_only=True)
    assert amb.match_kind == pb.AMBIGUOUS and amb.entity_id == ""
    assert list(amb.candidates) == ["P-1", "P-2"] and list(amb.possibly_same_as) == []

    assert changes(stub) == before
    entity = get(stub, made.entity_id)
    assert list(entity.surface_forms) == [] and entity.entity_type == "other"
    assert entity.evidence_count == 1
    # The creating call that lookup-only previewed really creates.
    assert resolve(stub, "Brand New Thing", "tool").created


@pytest.mark.parametrize(
    "mention",
    ["", "   ", "\u200b\u200e", "...", "-- !", "x" * 513, "é" * 300 + " " + "e\u0301" * 300],
)
def test_resolve_refuses_an_empty_or_oversized_mention(stub: Stub, mention: str) -> None:
    err = fails(lambda: resolve(stub, mention, "other"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details()


def test_resolve_accepts_a_mention_of_exactly_512_code_points(stub: Stub) -> None:
    mention = "ab" * 256
    assert resolve(stub, mention).display_form == mention


# -- ResolveBatch ------------------------------------------------------------------------------


BATCH = [
    ("Quantum Widget", "tool"),
    ("", "tool"),
    ("quantum widget", "tool"),
    ("x" * 513, ""),
    ("Quantum-Widget", "tool"),
    ("Quantum Widgit", "tool"),
    ("?!", "other"),
    ("Ada Lovelace", "person"),
]


def batch(stub: Stub, mentions: list[tuple[str, str]], *, context_id: str = "paper-1",
          lookup_only: bool = False) -> pb.ResolveBatchResponse:
    return stub.ResolveBatch(
        pb.ResolveBatchRequest(
            context_id=context_id, lookup_only=lookup_only,
            mentions=[pb.Mention(mention=m, entity_type=t) for m, t in mentions],
        ),
        timeout=T,
    )


def test_batch_keeps_order_reports_item_errors_and_sees_its_own_writes(stub: Stub) -> None:
    reply = batch(stub, BATCH)
    r = reply.results
    assert len(r) == len(BATCH)
    assert [x.WhichOneof("outcome") for x in r] == [
        "resolved", "error", "resolved", "error", "resolved", "resolved", "error", "resolved"]
    for i in (1, 3, 6):
        assert r[i].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] == 3
        assert r[i].error.message
    first = r[0].resolved
    assert first.match_kind == pb.NEW and first.created
    assert [(x.resolved.entity_id, x.resolved.match_kind) for x in (r[2], r[4], r[5])] == [
        (first.entity_id, pb.CASE), (first.entity_id, pb.PUNCTUATION), (first.entity_id, pb.TYPO)]
    assert r[7].resolved.match_kind == pb.NEW and r[7].resolved.display_form == "Ada Lovelace"
    entity = get(stub, first.entity_id)
    assert (entity.evidence_count, entity.paper_count) == (4, 1)


def test_batch_equals_resolving_one_at_a_time(stub: Stub, tmp_path: Path) -> None:
    replies = batch(stub, BATCH).results
    other = start_server(Settings(db_url=f"sqlite:///{tmp_path / 'one.sqlite'}", port=0))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{other.port}") as ch:
            single = Stub(ch)
            for reply, (mention, etype) in zip(replies, BATCH, strict=True):
                try:
                    one = resolve(single, mention, etype, context_id="paper-1")
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert reply.WhichOneof("outcome") == "error"
                else:
                    assert reply.resolved == one
    finally:
        other.stop(grace=0)


def test_batch_over_5000_mentions_is_refused_whole(stub: Stub) -> None:
    mentions = [(f"thing {i}", "other") for i in range(5001)]
    err = fails(lambda: batch(stub, mentions))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(err.trailing_metadata() or ())["identity-max-batch-size"] == "5000"
    assert changes(stub) == []  # nothing of it was written
    assert len(batch(stub, mentions[:5000], lookup_only=True).results) == 5000


def test_strict_server_refuses_unknown_types(db_url: str) -> None:
    running = start_server(Settings(db_url=db_url, port=0, strict_types=True))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as ch:
            stub = Stub(ch)
            err = fails(lambda: resolve(stub, "Zeta Widget", "spaceship"))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert resolve(stub, "Zeta Widget", " Tool ").entity_type == "tool"
            reply = batch(stub, [("Zeta Widget", "spaceship"), ("Zeta Widget", "tool")])
            assert reply.results[0].error.code == 3
            assert reply.results[1].resolved.match_kind == pb.EXACT
    finally:
        running.stop(grace=0)


def test_an_empty_batch_gets_an_empty_reply(stub: Stub) -> None:
    assert list(batch(stub, []).results) == []


def test_lookup_only_batch_writes_nothing(stub: Stub) -> None:
    made = resolve(stub, "Quantum Widget", "tool")
    before = changes(stub)
    reply = batch(stub, [("Brand New Thing", "tool"), ("Brand New Thing", "tool"),
                         ("quantum widget", "tool"), ("", "tool")], lookup_only=True)
    r = reply.results
    # Nothing is written, so the second item cannot find the first.
    assert [(x.resolved.entity_id, x.resolved.match_kind) for x in r[:3]] == [
        ("", pb.NEW), ("", pb.NEW), (made.entity_id, pb.CASE)]
    assert r[3].error.code == 3
    assert changes(stub) == before
    assert get(stub, made.entity_id).evidence_count == 0


# -- GetEntity ----------------------------------------------------------------------------------


def test_get_entity_unknown_id_is_not_found(stub: Stub) -> None:
    assert fails(lambda: get(stub, "no-such-id")).code() == grpc.StatusCode.NOT_FOUND


def test_an_empty_entity_id_is_an_invalid_argument(stub: Stub) -> None:
    for call in (lambda: get(stub, ""), lambda: promote(stub, ""),
                 lambda: merge(stub, "", "no-such-id")):
        err = fails(call)
        assert (err.code(), err.details()) == (grpc.StatusCode.INVALID_ARGUMENT,
                                               "entity id is empty")


def test_the_admin_tokens_scheme_is_case_insensitive(stub: Stub) -> None:
    """RFC 9110: 'bearer' and 'BEARER' are the same scheme; the token itself is exact."""
    made = resolve(stub, "Open Door", "tool").entity_id
    for scheme in ("bearer", "BEARER"):
        metadata = (("authorization", f"{scheme} {ADMIN_TOKEN}"),)
        assert stub.Promote(pb.PromoteRequest(entity_id=made), metadata=metadata,
                            timeout=T).entity.status == pb.CANONICAL
    wrong_case = (("authorization", f"Bearer {ADMIN_TOKEN.upper()}"),)
    err = fails(lambda: stub.Promote(pb.PromoteRequest(entity_id=made), metadata=wrong_case,
                                     timeout=T))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED


def test_get_entity_on_a_merged_id_redirects_to_the_end_of_the_chain(stub: Stub) -> None:
    a = resolve(stub, "Graph Alpha", "tool", context_id="paper-1").entity_id
    b = resolve(stub, "Graph Beta", "tool", context_id="paper-2").entity_id
    c = resolve(stub, "Graph Gamma", "tool").entity_id
    merge(stub, a, b)
    merge(stub, b, c)
    for merged in (a, b):
        entity = get(stub, merged)
        assert entity.status == pb.MERGED and entity.redirect_to == c
        assert entity.name == ""
    live = get(stub, c)
    assert live.status == pb.PROVISIONAL and live.redirect_to == ""
    assert list(live.surface_forms) == ["Graph Beta", "Graph Alpha"]
    assert (live.evidence_count, live.paper_count) == (2, 2)
    assert resolve(stub, "Graph Alpha", "tool").entity_id == c


# -- AddAlias, Promote, Merge ------------------------------------------------------------------


def test_add_alias_makes_a_typo_anchor(stub: Stub) -> None:
    made = resolve(stub, "Gizmo Kernel", "method")
    entity = add_alias(stub, made.entity_id, "  Kernel\u00a0of Gizmos ")
    assert list(entity.aliases) == ["Kernel of Gizmos"]
    hit = resolve(stub, "kernel of gizmos", "method")
    assert (hit.entity_id, hit.match_kind) == (made.entity_id, pb.ALIAS)
    typo = resolve(stub, "Kernel of Gizmoz", "method")
    assert (typo.entity_id, typo.match_kind, typo.matched_name) == (
        made.entity_id, pb.TYPO, "Kernel of Gizmos")

    assert fails(lambda: add_alias(stub, made.entity_id, " .. ")).code() == (
        grpc.StatusCode.INVALID_ARGUMENT)
    assert fails(lambda: add_alias(stub, "no-such-id", "X Y Z")).code() == (
        grpc.StatusCode.NOT_FOUND)


def test_promote_keeps_the_id_and_is_a_no_op_on_canonical(stub: Stub) -> None:
    made = resolve(stub, "Gizmo Kernel", "method", context_id="paper-1")
    promoted = promote(stub, made.entity_id)
    assert (promoted.entity_id, promoted.status) == (made.entity_id, pb.CANONICAL)
    assert promoted.evidence_count == 1
    n = len(changes(stub))
    assert promote(stub, made.entity_id).status == pb.CANONICAL
    assert len(changes(stub)) == n
    hit = resolve(stub, "Gizmo Kernel", "method")
    assert (hit.entity_id, hit.status) == (made.entity_id, pb.CANONICAL)
    assert fails(lambda: promote(stub, "no-such-id")).code() == grpc.StatusCode.NOT_FOUND


def test_merge_moves_names_and_evidence_and_admin_calls_follow_redirects(stub: Stub) -> None:
    import_records(stub, rec("T-GE", "Graph Engine", "tool"),
                   rec("T-GM", "Graph Motor", "tool", "GMotor"))
    prov = resolve(stub, "Grph Engn", "tool", context_id="paper-1").entity_id

    target = merge(stub, prov, "T-GE")
    assert target.entity_id == "T-GE" and target.status == pb.CANONICAL
    assert "Grph Engn" in target.surface_forms and "Grph Engn" not in target.aliases
    assert target.evidence_count == 1
    merged = get(stub, prov)
    assert (merged.status, merged.redirect_to) == (pb.MERGED, "T-GE")
    # A provisional name became a surface form, not a typo anchor.
    assert resolve(stub, "Grph Engn", "tool").entity_id == "T-GE"
    assert resolve(stub, "Grph Engnn", "tool").match_kind == pb.NEW

    target = merge(stub, "T-GM", "T-GE")  # a canonical name becomes an alias
    assert {"Graph Motor", "GMotor"} <= set(target.aliases)
    assert resolve(stub, "Graph Motr", "tool").entity_id == "T-GE"
    n = len(changes(stub))
    assert merge(stub, "T-GM", "T-GE").entity_id == "T-GE"  # merging again is a no-op
    assert len(changes(stub)) == n

    after = add_alias(stub, prov, "GE Tool")  # acts on the entity it redirects to
    assert after.entity_id == "T-GE" and "GE Tool" in after.aliases


def test_merge_preconditions(stub: Stub) -> None:
    import_records(stub, rec("T-GE", "Graph Engine", "tool"))
    prov_tool = resolve(stub, "Widget Maker", "tool").entity_id
    prov_person = resolve(stub, "Jane Roe", "person").entity_id
    for source, target in (("T-GE", prov_tool), (prov_person, "T-GE"), (prov_tool, prov_tool),
                           ("T-GE", "T-GE")):
        err = fails(lambda: merge(stub, source, target))  # noqa: B023
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, (source, target)
        assert err.details()
    assert fails(lambda: merge(stub, "no-such-id", "T-GE")).code() == grpc.StatusCode.NOT_FOUND
    assert get(stub, "T-GE").status == pb.CANONICAL
    assert get(stub, prov_tool).status == pb.PROVISIONAL


def test_provisional_entities_are_promoted_after_the_configured_paper_count(db_url: str) -> None:
    running = start_server(Settings(db_url=db_url, port=0, promote_after_papers=2,
                                    admin_token=ADMIN_TOKEN))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as ch:
            stub = Stub(ch)
            first = resolve(stub, "Gizmo Kernel", "method", context_id="paper-1")
            again = resolve(stub, "Gizmo Kernel", "method", context_id="paper-1")
            assert again.status == pb.PROVISIONAL  # one paper, twice
            third = resolve(stub, "gizmo kernel", "method", context_id="paper-2")
            assert third.entity_id == first.entity_id and third.status == pb.CANONICAL
            assert get(stub, first.entity_id).status == pb.CANONICAL
            kinds = [c.kind for c in changes(stub)]
            assert kinds.count(pb.CHANGE_KIND_PROMOTED) == 1

            import_records(stub, rec("P-1", "Jordan Smith", "person"),
                           rec("P-2", "Jordan Smith", "person"))
            for paper in ("paper-1", "paper-2", "paper-3"):
                amb = resolve(stub, "Jordan Smith", "person", context_id=paper)
                assert amb.match_kind == pb.AMBIGUOUS
            placeholder = get(stub, amb.entity_id)
            assert placeholder.paper_count == 3
            assert placeholder.status == pb.PROVISIONAL  # placeholders are never auto-promoted
    finally:
        running.stop(grace=0)


# -- ListPossiblySameAs, SettlePossiblySameAs -------------------------------------------------


def test_links_are_read_through_redirects(stub: Stub) -> None:
    import_records(stub, rec("P-MARIA", "Maria", "person"))
    mario = resolve(stub, "Mario", "person").entity_id
    rossi = resolve(stub, "Mario Rossi", "person").entity_id
    merge(stub, mario, rossi)
    assert links(stub) == {frozenset((rossi, "P-MARIA"))}
    assert links(stub, mario) == {frozenset((rossi, "P-MARIA"))}
    assert settle(stub, mario, "P-MARIA", pb.DISTINCT).entity_id == rossi
    assert links(stub) == set()
    assert fails(lambda: merge(stub, rossi, "P-MARIA")).code() == (
        grpc.StatusCode.FAILED_PRECONDITION)


def test_list_possibly_same_as_pages(stub: Stub) -> None:
    import_records(stub, rec("C-AI", "AI", "concept"))
    made = [resolve(stub, m, "concept").entity_id for m in ("A.I.", "A-I", "A I", "A_I", "A/I")]
    assert len(set(made)) == 5
    expected = {frozenset((m, "C-AI")) for m in made}

    seen: list[frozenset[str]] = []
    sizes = []
    token = ""
    for _ in range(10):
        page = stub.ListPossiblySameAs(
            pb.ListPossiblySameAsRequest(page_size=2, page_token=token), timeout=T)
        sizes.append(len(page.links))
        seen += [frozenset((x.entity_id, x.other_id)) for x in page.links]
        assert all(x.sequence > 0 for x in page.links)
        token = page.next_page_token
        if not token:
            break
    assert sizes == [2, 2, 1]
    assert len(seen) == 5 and set(seen) == expected
    assert links(stub) == expected and links(stub, "C-AI") == expected
    assert links(stub, made[0]) == {frozenset((made[0], "C-AI"))}

    bad = fails(lambda: stub.ListPossiblySameAs(
        pb.ListPossiblySameAsRequest(page_token="not a token"), timeout=T))
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_settle_same_merges_into_the_better_ranked_entity(stub: Stub) -> None:
    older = resolve(stub, "Maria", "person", context_id="paper-1").entity_id
    newer = resolve(stub, "Mario", "person", context_id="paper-2").entity_id
    assert links(stub) == {frozenset((older, newer))}
    result = settle(stub, newer, older, pb.SAME)
    assert result.entity_id == older and result.evidence_count == 2
    assert (get(stub, newer).status, get(stub, newer).redirect_to) == (pb.MERGED, older)
    assert links(stub) == set()

    import_records(stub, rec("P-1", "Jordan Smith", "person"), rec("P-2", "Jordan Smith", "person"))
    placeholder = resolve(stub, "Jordan Smith", "person").entity_id
    result = settle(stub, placeholder, "P-2", pb.SAME)  # canonical before placeholder
    assert result.entity_id == "P-2"
    assert get(stub, placeholder).redirect_to == "P-2"
    # The pair's placeholder is returned through its redirect.
    again = resolve(stub, "Jordan Smith", "person")
    assert (again.entity_id, again.match_kind, again.created) == ("P-2", pb.AMBIGUOUS, False)


def test_settle_distinct_is_sticky(stub: Stub) -> None:
    import_records(stub, rec("P-MARIA", "Maria", "person"))
    mario = resolve(stub, "Mario", "person").entity_id
    assert links(stub, mario) == {frozenset((mario, "P-MARIA"))}
    assert settle(stub, mario, "P-MARIA", pb.DISTINCT).entity_id == mario
    assert links(stub) == set()

    err = fails(lambda: merge(stub, mario, "P-MARIA"))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    err = fails(lambda: settle(stub, mario, "P-MARIA", pb.SAME))  # no open link any more
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION

    # The authority now names P-MARIA "Mario": the import would merge the provisional "Mario"
    # into it (rule 3 converges), but a person called the pair distinct.
    report = import_records(stub, rec("P-MARIA", "Mario", "person"))
    assert (report.updated, report.merged) == (1, 0)
    assert get(stub, mario).status == pb.PROVISIONAL
    assert links(stub) == set()


def test_settle_refusals(stub: Stub) -> None:
    import_records(stub, rec("P-MARIA", "Maria", "person"))
    mario = resolve(stub, "Mario", "person").entity_id
    stranger = resolve(stub, "Someone Else", "person").entity_id
    err = fails(lambda: settle(stub, mario, stranger, pb.SAME))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    for kwargs in ({"actor": ""}, {"reason": "  "}):
        err = fails(lambda: settle(stub, mario, "P-MARIA", pb.SAME, **kwargs))  # noqa: B023
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, kwargs
    err = fails(lambda: settle(stub, mario, "P-MARIA", pb.DECISION_UNSPECIFIED))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert links(stub) == {frozenset((mario, "P-MARIA"))}  # nothing was settled
    assert get(stub, mario).status == pb.PROVISIONAL


# -- ImportAuthority --------------------------------------------------------------------------


def _jsonl_file(prov_id: str) -> bytes:
    lines = [
        json.dumps(rec("Q-TODAI", "東京大学", "organization", "Tōdai", "東大"), ensure_ascii=False),
        json.dumps(rec("Q-UZH", "Universität Zürich", "Organization"), ensure_ascii=False),
        '{"id": "Q-BROKEN", "name": ',
        "",
        json.dumps(rec("Q-SHIP", "Enterprise", "spaceship")),
        json.dumps(rec("Q-NOTYPE", "Nothing", "")),
        json.dumps(rec(prov_id, "Stolen Id", "other")),
        json.dumps(rec("Q-CAFE", "Café 🚀 Ωmega", "other"), ensure_ascii=False) + "\r",
    ]
    return "\n".join(lines).encode("utf-8")  # no newline at the end


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1 << 16])
def test_import_jsonl_in_chunks_that_split_lines_and_characters(stub: Stub, size: int) -> None:
    prov_id = resolve(stub, "Stolen Id", "other").entity_id
    report = import_data(stub, _jsonl_file(prov_id), size=size)
    assert (report.imported, report.created, report.updated) == (3, 3, 0)
    assert [e.line for e in report.errors] == [3, 5, 6, 7]
    assert all(e.message for e in report.errors)
    todai = get(stub, "Q-TODAI")
    assert (todai.name, list(todai.aliases), todai.status) == (
        "東京大学", ["Tōdai", "東大"], pb.CANONICAL)
    assert get(stub, "Q-UZH").entity_type == "organization"
    assert get(stub, "Q-CAFE").name == "Café 🚀 Ωmega"
    assert resolve(stub, "東大", "organization").match_kind == pb.ALIAS
    assert get(stub, prov_id).status == pb.PROVISIONAL
    for missing in ("Q-BROKEN", "Q-SHIP", "Q-NOTYPE"):
        assert fails(lambda: get(stub, missing)).code() == grpc.StatusCode.NOT_FOUND  # noqa: B023


@pytest.mark.parametrize("size", [2, 5, 1 << 16])
def test_import_csv_with_bom_quotes_and_refused_rows(stub: Stub, size: int) -> None:
    text = (
        "id,name,type,aliases\r\n"
        'C-1,"Smith, Jane",person,J. Smith|Jane Smith\r\n'
        "C-2,Mem-Castle,method,\r\n"
        "C-3,Bad Type,spaceship,\r\n"
        "C-4,Zoë Ångström,person,Zoe Angstrom\r\n"
        "C-5,Too,many,fields,here\r\n"
    )
    data = "\ufeff".encode() + text.encode("utf-8")
    report = import_data(stub, data, size=size, fmt=pb.AUTHORITY_FORMAT_CSV)
    assert (report.imported, report.created) == (3, 3)
    # Line numbers count the header; the order of the errors is not part of the contract.
    assert sorted(e.line for e in report.errors) == [4, 6]
    smith = get(stub, "C-1")
    assert (smith.name, list(smith.aliases)) == ("Smith, Jane", ["J. Smith", "Jane Smith"])
    assert get(stub, "C-4").name == "Zoë Ångström"
    assert resolve(stub, "zoe angstrom", "person").entity_id == "C-4"


@pytest.mark.parametrize("size", [1, 3, 1 << 16])
def test_import_refuses_the_records_on_lines_that_are_not_utf8_and_keeps_the_rest(
        stub: Stub, size: int) -> None:
    """Chunks may split lines and characters; a line that is not UTF-8 refuses its own record
    (a CSV record over several lines with it), and the rest of the file is imported."""
    jsonl = (b'{"id": "Q-1", "name": "caf\xe9", "type": "other"}\n'
             + json.dumps(rec("Q-2", "東京大学", "organization"), ensure_ascii=False).encode()
             + b"\n" + "東京".encode()[:-1])  # a last line cut inside a character
    report = import_data(stub, jsonl, size=size)
    assert (report.imported, [e.line for e in report.errors]) == (1, [1, 3])
    assert all(e.message.startswith("not valid UTF-8 (") for e in report.errors)
    assert get(stub, "Q-2").name == "東京大学"

    csv_data = (b'id,name,type\nC-1,"two\nlin\xe9s",other\nC-2,Zo\xc3\xab,person\n')
    report = import_data(stub, csv_data, size=size, fmt=pb.AUTHORITY_FORMAT_CSV)
    assert (report.imported, [e.line for e in report.errors]) == (1, [3])
    assert get(stub, "C-2").name == "Zoë"
    assert fails(lambda: get(stub, "C-1")).code() == grpc.StatusCode.NOT_FOUND


def test_import_refuses_a_line_over_the_cap_without_holding_it(stub: Stub) -> None:
    """A stream without newlines must not fill the server's memory: a line over 16 MiB refuses
    its record, and the records around it are imported."""
    from identity_server.authority import MAX_LINE_BYTES

    long_name = "x" * (MAX_LINE_BYTES + 1)
    data = jsonl([rec("Q-1", "Ada", "person"), rec("Q-2", long_name, "other"),
                  rec("Q-3", "Cy", "person")])
    report = import_data(stub, data, size=1 << 20)
    assert (report.imported, [e.line for e in report.errors]) == (2, [2])
    assert "more than the cap of 16777216 bytes" in report.errors[0].message
    assert get(stub, "Q-3").name == "Cy"


def test_import_refuses_a_utf16_file_whole(stub: Stub) -> None:
    data = ("\ufeff" + json.dumps(rec("Q-1", "Ada", "person")) + "\n").encode("utf-16-le")
    err = fails(lambda: import_data(stub, data, size=5))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "UTF-16" in (err.details() or "")
    assert fails(lambda: get(stub, "Q-1")).code() == grpc.StatusCode.NOT_FOUND


def test_import_merges_or_links_provisional_entities_and_replaces_records(stub: Stub) -> None:
    deep = resolve(stub, "Deep-Net", "method", context_id="paper-1").entity_id
    lake = resolve(stub, "Data-Lake", "dataset").entity_id
    report = import_records(stub, rec("Q-DN", "DeepNet", "method"),
                            rec("Q-DL1", "DataLake", "dataset"), rec("Q-DL2", "Data Lake", "dataset"))
    assert (report.created, report.merged, report.linked) == (3, 1, 1)
    assert (get(stub, deep).status, get(stub, deep).redirect_to) == (pb.MERGED, "Q-DN")
    assert get(stub, "Q-DN").evidence_count == 1
    assert get(stub, lake).status == pb.PROVISIONAL
    assert links(stub, lake) == {frozenset((lake, "Q-DL1")), frozenset((lake, "Q-DL2"))}

    add_alias(stub, "Q-DN", "Curated DN")
    import_records(stub, rec("Q-OLD", "Old Deep Net", "method"))
    merge(stub, "Q-OLD", "Q-DN")
    report = import_records(stub, rec("Q-DN", "Deep Network", "method", "DNet"))
    assert (report.imported, report.created, report.updated) == (1, 0, 1)
    entity = get(stub, "Q-DN")
    assert entity.name == "Deep Network"
    assert {"DeepNet", "Curated DN", "Old Deep Net", "DNet"} <= set(entity.aliases)

    # An id that was merged away is refused, with its line number.
    report = import_data(stub, jsonl([rec("Q-NEW", "New One", "method"),
                                      rec("Q-OLD", "Old Deep Net", "method")]))
    assert report.imported == 1 and [e.line for e in report.errors] == [2]
    assert get(stub, "Q-OLD").status == pb.MERGED


def test_import_never_merges_a_placeholder(stub: Stub) -> None:
    x = resolve(stub, "Jordan Smith", "person", context_id="paper-1").entity_id
    y = resolve(stub, "J. Smith", "person").entity_id
    add_alias(stub, y, "Jordan Smith")
    amb = resolve(stub, "Jordan Smith", "person")
    assert amb.match_kind == pb.AMBIGUOUS and list(amb.candidates) == [x, y]
    report = import_records(stub, rec("P-JS", "Jordan Smith", "person"))
    assert report.merged == 2
    assert get(stub, x).redirect_to == "P-JS" and get(stub, y).redirect_to == "P-JS"
    placeholder = get(stub, amb.entity_id)
    assert placeholder.status == pb.PROVISIONAL and placeholder.placeholder
    assert links(stub, amb.entity_id) == {frozenset((amb.entity_id, "P-JS"))}


# -- ListChanges ------------------------------------------------------------------------------


def test_list_changes_covers_every_kind_gaplessly(stub: Stub) -> None:
    alpha = resolve(stub, "Alpha Thing", "").entity_id                      # created
    resolve(stub, "alpha thing", "tool")                                    # surface, type
    add_alias(stub, alpha, "Alpha Gadget")                                  # alias added
    promote(stub, alpha)                                                    # promoted
    import_records(stub, rec("P-MARIA", "Maria", "person"))                 # imported
    mario = resolve(stub, "Mario", "person").entity_id                      # link added
    settle(stub, mario, "P-MARIA", pb.DISTINCT)                             # link settled
    beta = resolve(stub, "Beta Thing", "tool").entity_id
    merge(stub, beta, alpha)                                                # merged

    feed = changes(stub)
    assert [c.sequence for c in feed] == list(range(1, len(feed) + 1))
    kinds = {c.kind for c in feed}
    assert kinds == set(pb.ChangeKind.values()) - {pb.CHANGE_KIND_UNSPECIFIED}
    by_kind = {c.kind: c for c in feed}
    assert by_kind[pb.CHANGE_KIND_TYPE_UPGRADED].entity_id == alpha
    assert by_kind[pb.CHANGE_KIND_PROMOTED].entity_id == alpha
    assert by_kind[pb.CHANGE_KIND_IMPORTED].entity_id == "P-MARIA"
    merged = by_kind[pb.CHANGE_KIND_MERGED]
    assert (merged.entity_id, merged.other_id) == (beta, alpha)
    link = by_kind[pb.CHANGE_KIND_LINK_ADDED]
    assert {link.entity_id, link.other_id} == {mario, "P-MARIA"}
    settled = json.loads(by_kind[pb.CHANGE_KIND_LINK_SETTLED].detail)
    assert {"curator@example.org", "checked the sources"} <= set(settled.values())
    surface = by_kind[pb.CHANGE_KIND_SURFACE_FORM_ADDED]
    assert "alpha thing" in json.loads(surface.detail).values()
    for c in feed:
        assert isinstance(json.loads(c.detail), dict)
        assert c.recorded_at.endswith("Z") and datetime.fromisoformat(c.recorded_at)

    assert [c.sequence for c in changes(stub, after=4)] == list(range(5, len(feed) + 1))
    assert changes(stub, limit=3) == feed[:3]
    assert changes(stub, after=2, limit=2) == feed[2:4]
    assert changes(stub, after=len(feed)) == []
    err = fails(lambda: changes(stub, after=-1))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_list_changes_follow_delivers_a_later_change(stub: Stub) -> None:
    resolve(stub, "Before Thing", "tool")
    start = len(changes(stub))
    stream = stub.ListChanges(pb.ListChangesRequest(after_sequence=0, follow=True), timeout=T)
    made: list[str] = []
    errors: list[BaseException] = []

    def later() -> None:
        try:
            made.append(resolve(stub, "Late Arrival", "tool").entity_id)
        except BaseException as e:  # reported by the test thread
            errors.append(e)

    try:
        backlog = [next(stream).change for _ in range(start)]
        assert [c.sequence for c in backlog] == list(range(1, start + 1))
        timer = threading.Timer(0.5, later)
        timer.start()
        change = next(stream).change  # blocks until the change above is made
        timer.join()
        assert errors == []
        assert change.sequence == start + 1 and change.kind == pb.CHANGE_KIND_CREATED
        assert change.entity_id == made[0]
    finally:
        stream.cancel()
    err = fails(lambda: next(stream))
    assert err.code() == grpc.StatusCode.CANCELLED


# -- authentication -----------------------------------------------------------------------------


def _admin_calls(stub: Stub, metadata: tuple[tuple[str, str], ...] | None) -> dict[str, Callable[[], Any]]:
    return {
        "AddAlias": lambda: stub.AddAlias(
            pb.AddAliasRequest(entity_id="X", alias="Y Z"), metadata=metadata, timeout=T),
        "Promote": lambda: stub.Promote(
            pb.PromoteRequest(entity_id="X"), metadata=metadata, timeout=T),
        "Merge": lambda: stub.Merge(
            pb.MergeRequest(source_id="X", target_id="Y"), metadata=metadata, timeout=T),
        "SettlePossiblySameAs": lambda: stub.SettlePossiblySameAs(
            pb.SettlePossiblySameAsRequest(entity_id="X", other_id="Y", decision=pb.SAME,
                                           actor="a", reason="r"), metadata=metadata, timeout=T),
        "ImportAuthority": lambda: stub.ImportAuthority(
            iter([pb.ImportAuthorityRequest(data=jsonl([rec("Q-1", "Quiet", "other")]))]),
            metadata=metadata, timeout=T),
    }


@pytest.mark.parametrize("metadata", [None, (("authorization", "Bearer wrong"),),
                                      (("authorization", ADMIN_TOKEN),)])
def test_admin_rpcs_need_the_token(stub: Stub, metadata: Any) -> None:
    said = ("needs metadata 'authorization: Bearer" if metadata is None
            else "is not one this server knows" if metadata[0][1].startswith("Bearer ")
            else "is not 'Bearer '")
    for name, call in _admin_calls(stub, metadata).items():
        err = fails(call)
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED, name
        assert said in (err.details() or ""), (name, err.details())
    assert changes(stub) == []  # in particular, nothing was imported
    assert resolve(stub, "Open Door", "").created  # non-admin RPCs need no token


def test_a_server_without_admin_token_refuses_admin_rpcs(db_url: str) -> None:
    running: RunningServer = start_server(Settings(db_url=db_url, port=0))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as ch:
            stub = Stub(ch)
            made = resolve(stub, "Open Door", "tool").entity_id
            for name, call in _admin_calls(stub, ADMIN).items():
                assert fails(call).code() == grpc.StatusCode.UNAUTHENTICATED, name
            err = fails(lambda: promote(stub, made))
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            assert get(stub, made).status == pb.PROVISIONAL
    finally:
        running.stop(grace=0)


# -- access log ------------------------------------------------------------------------------------


def test_each_call_is_logged_admin_and_failed_ones_at_info(
    stub: Stub, caplog: pytest.LogCaptureFixture
) -> None:
    def rpc_lines() -> list[tuple[int, str]]:
        return [(r.levelno, r.getMessage()) for r in caplog.records
                if r.name == "identity_server.servicer" and r.getMessage().startswith("rpc ")]

    with caplog.at_level(logging.DEBUG, logger="identity_server.servicer"):
        made = resolve(stub, "Quorbex Transformer", "method")
        with pytest.raises(grpc.RpcError):
            resolve(stub, "   ")
        stub.Promote(pb.PromoteRequest(entity_id=made.entity_id), metadata=ADMIN, timeout=T)
    lines = rpc_lines()
    assert [(level, msg.split()[1], msg.split()[-1]) for level, msg in lines] == [
        (logging.DEBUG, "method=Resolve", "code=OK"),
        (logging.INFO, "method=Resolve", "code=INVALID_ARGUMENT"),
        (logging.INFO, "method=Promote", "code=OK"),
    ]


def test_following_streams_are_capped_and_other_calls_are_served(db_url: str) -> None:
    """Following ListChanges streams are capped at a quarter of IDENTITY_MAX_WORKERS: with 4,
    one may follow, a second gets RESOURCE_EXHAUSTED, and other calls are served meanwhile."""
    running = start_server(Settings(db_url=db_url, port=0, max_workers=4))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as ch:
            stub = Stub(ch)
            first = stub.ListChanges(pb.ListChangesRequest(follow=True), timeout=T)
            made = stub.Resolve(pb.ResolveRequest(mention="Quorbex", entity_type="tool"),
                                timeout=T)
            assert next(first).change.entity_id == made.entity_id  # following, and served
            with pytest.raises(grpc.RpcError) as refused:
                next(iter(stub.ListChanges(pb.ListChangesRequest(follow=True), timeout=T)))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "following ListChanges" in (refused.value.details() or "")
            for i in range(8):  # more calls than threads: none waits on the follower
                stub.Resolve(pb.ResolveRequest(mention=f"Thing {i}", entity_type="tool"),
                             timeout=T)
            first.cancel()
            again = stub.ListChanges(pb.ListChangesRequest(follow=True), timeout=T)
            deadline = threading.Event()
            for _ in range(50):  # the cancelled stream's slot comes back
                try:
                    assert next(again).change.sequence == 1
                    break
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    deadline.wait(0.1)
                    again = stub.ListChanges(pb.ListChangesRequest(follow=True), timeout=T)
            else:
                pytest.fail("a following stream never got its slot back")
            again.cancel()
    finally:
        running.stop(grace=0)


def test_imports_in_progress_are_capped_and_other_calls_are_served(db_url: str) -> None:
    """An import holds a pool thread while its client keeps the stream open (a slow or stalled
    sender): imports are capped at a quarter of IDENTITY_MAX_WORKERS, as followers are."""
    running = start_server(Settings(db_url=db_url, port=0, max_workers=4,
                                    admin_token=ADMIN_TOKEN))
    release = threading.Event()

    def stalled() -> Iterator[pb.ImportAuthorityRequest]:
        yield pb.ImportAuthorityRequest(format=pb.AUTHORITY_FORMAT_JSONL)
        yield pb.ImportAuthorityRequest(data=b'{"id": "Q1", "name": "Ada", "type": "person"}\n')
        release.wait(T)

    def records(line: bytes) -> Iterator[pb.ImportAuthorityRequest]:
        yield pb.ImportAuthorityRequest(format=pb.AUTHORITY_FORMAT_JSONL)
        yield pb.ImportAuthorityRequest(data=line)

    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as ch:
            stub = Stub(ch)
            def start() -> Any:
                return stub.ImportAuthority.future(stalled(), metadata=ADMIN, timeout=T)

            first = start()
            for _ in range(100):  # until the stalled import holds its slot
                if first.done():  # refused: a probe below held the one slot when it came
                    first = start()
                    time.sleep(0.05)
                    continue
                try:
                    stub.ImportAuthority(records(b""), metadata=ADMIN, timeout=T)
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    assert "1 imports in progress" in (e.details() or "")
                    break
                time.sleep(0.05)
            else:
                pytest.fail("a second import was never refused")
            for i in range(8):  # more calls than threads: none waits on the import
                stub.Resolve(pb.ResolveRequest(mention=f"Thing {i}", entity_type="tool"),
                             timeout=T)
            release.set()
            assert first.result(timeout=T).imported == 1
            done = stub.ImportAuthority(  # the slot is free again
                records(b'{"id": "Q2", "name": "Bea", "type": "person"}\n'), metadata=ADMIN,
                timeout=T)
            assert done.imported == 1
    finally:
        release.set()
        running.stop(grace=0)


def test_oversized_ids_contexts_types_and_decisions_are_refused_briefly(stub: Stub) -> None:
    """Input sizes are capped: ids and context ids at 512 characters, types at 128, a
    decision's actor and reason at 512 and 4,096. The refusal names the size and fits in a
    reply (a 100 KB id echoed whole would not)."""
    huge = "Q" * 100_000
    for call in (lambda: get(stub, huge),
                 lambda: stub.Promote(pb.PromoteRequest(entity_id=huge), metadata=ADMIN,
                                      timeout=T),
                 lambda: stub.Merge(pb.MergeRequest(source_id=huge, target_id="x"),
                                    metadata=ADMIN, timeout=T)):
        err = fails(call)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "100000 characters long" in (err.details() or "")
        assert len(err.details() or "") < 200
    err = fails(lambda: resolve(stub, "Quorbex", "tool", context_id="p" * 513))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "context id" in err.details()
    err = fails(lambda: batch(stub, [("Quorbex", "tool")], context_id="p" * 513))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    r = batch(stub, [("Quorbex", "t" * 129), ("Quorbex", "tool")]).results
    assert "type is 129 characters long" in r[0].error.message
    assert r[1].HasField("resolved")
    assert resolve(stub, "Quorbex", "t" * 128).entity_id  # at the limit: read as `other`
    err = fails(lambda: stub.SettlePossiblySameAs(pb.SettlePossiblySameAsRequest(
        entity_id="a", other_id="b", decision=pb.SAME, actor="x" * 513, reason="why"),
        metadata=ADMIN, timeout=T))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_import_refuses_a_line_nested_too_deeply_and_keeps_the_rest(stub: Stub) -> None:
    data = ('{"id": "Q1", "name": "Ada Lovelace", "type": "person"}\n'
            + "[" * 100_000 + "]" * 100_000 + "\n"
            + '{"id": "Q2", "name": "Alan Turing", "type": "person"}\n').encode()
    report = import_data(stub, data, fmt=pb.AUTHORITY_FORMAT_JSONL)
    assert report.imported == 2
    assert [(e.line, e.message) for e in report.errors] == [
        (2, "JSON nested too deeply to be read")]


def test_a_request_that_does_not_decode_is_invalid_argument(
        server: RunningServer, caplog: pytest.LogCaptureFixture) -> None:
    """Raw bytes that are not a valid message (a string field that is not UTF-8, a truncated
    message) get INVALID_ARGUMENT naming the message, not INTERNAL, for unary and streaming
    calls alike; the server goes on serving, and logs the call with the status it got."""
    caplog.set_level(logging.INFO, logger="identity_server.servicer")
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        resolve_raw = ch.unary_unary("/identity.v1.IdentityService/Resolve")
        import_raw = ch.stream_unary("/identity.v1.IdentityService/ImportAuthority")
        for raw in (b"\x0a\x02\xff\xfe", b"\x0a\x05ab"):  # mention: not UTF-8; truncated
            with pytest.raises(grpc.RpcError) as bad:
                resolve_raw(raw, timeout=T)
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "not a valid ResolveRequest" in (bad.value.details() or "")
        with pytest.raises(grpc.RpcError) as bad:
            import_raw(iter([b"\x0a\x05ab"]), metadata=ADMIN, timeout=T)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid ImportAuthorityRequest" in (bad.value.details() or "")
        # The call's line is logged as its handler ends, which may be just after the client
        # has its status.
        for _ in range(100):
            if "method=ImportAuthority count=1" in caplog.text:
                break
            threading.Event().wait(0.05)
        assert "method=ImportAuthority count=1" in caplog.text
        assert "code=INVALID_ARGUMENT" in caplog.text.split("method=ImportAuthority")[1]
        with pytest.raises(grpc.RpcError) as bad:  # the health service, unauthenticated too
            ch.unary_unary("/grpc.health.v1.Health/Check")(b"\x0a\x02\xff\xfe", timeout=T)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert resolve(Stub(ch), "Quorbex", "tool").created


def test_an_import_that_breaks_off_keeps_its_committed_records_merged(stub: Stub) -> None:
    """The client cancels after the first 1,000-record transaction has committed: those
    records stay imported, and the provisional entity one of them names is merged into it as
    after a whole import (the records after the transaction are not imported)."""
    made = resolve(stub, "Nuclear Magnetic Resonance", "method")
    records = [{"id": "Q0", "name": "nuclear magnetic resonance", "type": "method"}] + [
        {"id": f"Q{i}", "name": f"Record Number {i}", "type": "other"} for i in range(1, 1500)]
    release = threading.Event()

    def chunks() -> Iterator[pb.ImportAuthorityRequest]:
        yield from chunked(jsonl(records), 8192, pb.AUTHORITY_FORMAT_JSONL)
        release.wait(T)  # the stream stays open until the client cancels

    call = stub.ImportAuthority.future(chunks(), metadata=ADMIN, timeout=T)
    try:
        for _ in range(200):  # until the first transaction has committed
            try:
                get(stub, "Q999")
                break
            except grpc.RpcError:
                threading.Event().wait(0.05)
        call.cancel()
    finally:
        release.set()
    for _ in range(200):  # the server notices the cancel on its next read, then merges
        if get(stub, made.entity_id).redirect_to == "Q0":
            break
        threading.Event().wait(0.05)
    assert get(stub, made.entity_id).redirect_to == "Q0"
    assert get(stub, "Q0").name == "nuclear magnetic resonance"
    assert fails(lambda: get(stub, "Q1499")).code() == grpc.StatusCode.NOT_FOUND


def test_an_import_the_client_cancels_is_logged_as_cancelled_not_as_a_fault(
        stub: Stub, caplog: pytest.LogCaptureFixture) -> None:
    sent = threading.Event()
    release = threading.Event()

    def chunks() -> Iterator[pb.ImportAuthorityRequest]:
        yield pb.ImportAuthorityRequest(
            format=pb.AUTHORITY_FORMAT_JSONL,
            data=b'{"id": "Q1", "name": "Ada Lovelace", "type": "person"}\n')
        sent.set()
        release.wait(T)  # the stream stays open until the client cancels

    with caplog.at_level(logging.DEBUG, logger="identity_server.servicer"):
        call = stub.ImportAuthority.future(chunks(), metadata=ADMIN, timeout=T)
        assert sent.wait(T)
        call.cancel()
        release.set()
        for _ in range(100):  # the handler notices the cancel on its next read of the stream
            if any("method=ImportAuthority" in r.getMessage() for r in caplog.records):
                break
            threading.Event().wait(0.05)
    ours = [r for r in caplog.records if r.name == "identity_server.servicer"]
    assert [r.getMessage().split()[-1] for r in ours
            if "method=ImportAuthority" in r.getMessage()] == ["code=CANCELLED"]
    assert not [r for r in ours if r.levelno >= logging.ERROR]
    # A cancelled import is not a whole file: what it sent is not imported.
    assert fails(lambda: get(stub, "Q1")).code() == grpc.StatusCode.NOT_FOUND


def test_a_reflection_request_that_does_not_decode_is_invalid_argument(
        server: RunningServer) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        info = ch.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
        with pytest.raises(grpc.RpcError) as bad:
            list(info(iter([b"\x0a\x05ab"]), timeout=T))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid ServerReflectionRequest" in (bad.value.details() or "")
