"""Readings of SPEC sentences where the text leaves a choice; each test names the choice made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from identity_server.domain import MatchKind, Status
from identity_server.errors import InvalidArgument
from identity_server.server import build_service
from identity_server.service import IdentityService
from identity_server.settings import Settings


def record(entity_id: str, name: str, entity_type: str, *aliases: str) -> str:
    return json.dumps({"id": entity_id, "name": name, "type": entity_type, "aliases": list(aliases)})


def test_strict_mode_refuses_unknown_types_but_reads_empty_as_other(tmp_path: Path) -> None:
    """"an empty or unknown type is read as other, unless ... strict mode, where an *unknown*
    type is INVALID_ARGUMENT": empty stays the wildcard."""
    svc = build_service(Settings(db_url=f"sqlite:///{tmp_path / 's.sqlite'}", strict_types=True))
    try:
        with pytest.raises(InvalidArgument, match="unknown entity type"):
            svc.resolve("Ada Lovelace", "wizard")
        assert svc.resolve("Ada Lovelace", "  ").entity_type == "other"
        assert svc.resolve("Ada Lovelace", " Person ").entity_type == "person"
    finally:
        svc.close()


def test_merging_an_already_merged_pair_either_way_is_a_no_op(service: IdentityService) -> None:
    a = service.resolve("Alpha Centauri", "place").entity_id
    b = service.resolve("Proxima Centauri", "place").entity_id
    service.merge(b, a)
    before = service.list_changes(0)
    assert service.merge(b, a).entity_id == a
    assert service.merge(a, b).entity_id == a
    assert service.list_changes(0) == before


def test_a_merged_entity_shows_no_evidence_of_its_own(service: IdentityService) -> None:
    """"its evidence and links move too": the target counts it, the source no longer does."""
    a = service.resolve("Graph Attention Network", "method", context_id="p1").entity_id
    b = service.resolve("GATv2 network", "method", context_id="p2").entity_id
    service.merge(b, a)
    merged, live = service.get_entity(b), service.get_entity(a)
    assert merged.status is Status.MERGED and merged.redirect_to == a
    assert (merged.evidence_count, merged.paper_count) == (0, 0)
    assert (live.evidence_count, live.paper_count) == (2, 2)


def test_an_alias_added_over_a_surface_form_replaces_it_and_over_a_name_or_alias_changes_nothing(
    service: IdentityService,
) -> None:
    """AddAlias of a spelling the entity holds as a surface form makes it an alias (listed once,
    matching as ALIAS from then on); of its name or one of its aliases, nothing changes. The
    change feed says which it was."""
    service.import_lines([record("Q1", "Mem Castle", "tool")])
    assert service.resolve("MEM CASTLE", "tool").match_kind is MatchKind.CASE
    assert service.get_entity("Q1").surface_forms == ("MEM CASTLE",)
    view = service.add_alias("Q1", "MEM CASTLE")
    assert (view.name, view.aliases, view.surface_forms) == ("Mem Castle", ("MEM CASTLE",), ())
    reply = service.resolve("MEM CASTLE", "tool", lookup_only=True)
    assert (reply.entity_id, reply.match_kind, reply.matched_name) == (
        "Q1", MatchKind.ALIAS, "MEM CASTLE"
    )
    last = service.list_changes(0)[-1].seq
    for unchanged in ("Mem Castle", "MEM CASTLE"):
        view = service.add_alias("Q1", unchanged)
        assert (view.name, view.aliases, view.surface_forms) == (
            "Mem Castle", ("MEM CASTLE",), ()
        )
    assert service.list_changes(last) == []
    imported, *added = [(c.kind, c.detail) for c in service.list_changes(0)
                        if c.entity_id == "Q1"]
    assert imported[0] == "imported"
    assert added == [("surface_form_added", {"surface_form": "MEM CASTLE"}),
                     ("alias_added", {"alias": "MEM CASTLE"})]


def test_a_name_that_becomes_an_alias_is_recorded_as_one_after_the_existing_aliases(
    service: IdentityService,
) -> None:
    """"aliases ... in the order they were recorded": recorded as an alias when it became one."""
    service.import_lines([record("Q1", "Mem Castle", "tool")])
    service.add_alias("Q1", "Mem-Castle")
    service.import_lines([record("Q1", "Alpha Castle", "tool")])
    entity = service.get_entity("Q1")
    assert entity.name == "Alpha Castle"
    assert entity.aliases == ("Mem-Castle", "Mem Castle")
    reply = service.resolve("memcastle", "tool", lookup_only=True)
    assert (reply.entity_id, reply.match_kind, reply.matched_name) == (
        "Q1", MatchKind.ALIAS, "Mem-Castle"
    )


def test_reimport_drops_authority_aliases_but_keeps_curator_aliases_and_surface_forms(
    service: IdentityService,
) -> None:
    service.import_lines([record("Q7", "Turing Machine", "concept", "a-machine", "Logical Computing Machine")])
    service.add_alias("Q7", "Universal Machine")
    service.resolve("turing machine", "concept")
    service.import_lines([record("Q7", "Turing Machine", "concept", "a-machine")])
    entity = service.get_entity("Q7")
    assert entity.aliases == ("a-machine", "Universal Machine")
    assert entity.surface_forms == ("turing machine",)
    assert service.resolve("Logical Computing Machine", "concept", lookup_only=True).entity_id == ""


def test_a_mention_with_a_lone_surrogate_is_invalid(service: IdentityService) -> None:
    with pytest.raises(InvalidArgument, match="lone surrogate"):
        service.resolve("Ada\ud800", "person")
    (item_error, ok) = service.resolve_batch("p1", [("Ada\ud800", "person"), ("Ada", "person")])
    assert getattr(item_error, "code", None) == "INVALID_ARGUMENT"
    assert getattr(ok, "entity_id", "")
