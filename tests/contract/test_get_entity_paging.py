"""GetEntity's page of surface forms (`max_surface_forms`, `surface_forms_offset`) and their
count, the same on the stub and on the real server: a much-mentioned entity has thousands of
spellings, which a caller asking for its status or a few of them should not be sent. The admin
calls' replies take the same cap (`max_surface_forms`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from ingest.testing import serve_stub

NAME = "graph attention network"
TOKEN = "paging-secret"
ADMIN = (("authorization", f"Bearer {TOKEN}"),)
# Case forms, each first seen once: a surface form each, recorded in this order.
FORMS = ["".join(c.upper() if bits >> i & 1 else c for i, c in enumerate(NAME))
         for bits in range(1, 8)]


@contextmanager
def _real_server(tmp_path: Path) -> Iterator[pb_grpc.IdentityServiceStub]:
    from identity_server.server import start_server
    from identity_server.settings import Settings

    running = start_server(Settings(db_url=f"sqlite:///{tmp_path / 'identity.sqlite'}", port=0,
                                    admin_token=TOKEN))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            yield pb_grpc.IdentityServiceStub(channel)
    finally:
        running.stop(grace=0.5)


@pytest.fixture(params=["stub", "real"])
def service(request: pytest.FixtureRequest,
            tmp_path: Path) -> Iterator[pb_grpc.IdentityServiceStub]:
    if request.param == "stub":
        with serve_stub(admin_token=TOKEN) as stub_server, \
                grpc.insecure_channel(stub_server.address) as channel:
            yield pb_grpc.IdentityServiceStub(channel)
        return
    with _real_server(tmp_path) as client:
        yield client


def _entity(service: pb_grpc.IdentityServiceStub, entity_id: str, **page: int) -> pb.Entity:
    reply: pb.GetEntityResponse = service.GetEntity(
        pb.GetEntityRequest(entity_id=entity_id, **page), timeout=10)
    return reply.entity


def _spelled(service: pb_grpc.IdentityServiceStub) -> str:
    eid: str = service.Resolve(pb.ResolveRequest(mention=NAME, entity_type="method"),
                               timeout=10).entity_id
    for form in FORMS:
        reply = service.Resolve(pb.ResolveRequest(mention=form, entity_type="method"), timeout=10)
        assert (reply.entity_id, reply.match_kind) == (eid, pb.CASE)
    return eid


def test_unset_lists_every_surface_form_with_their_count(
        service: pb_grpc.IdentityServiceStub) -> None:
    eid = _spelled(service)
    entity = _entity(service, eid)
    assert list(entity.surface_forms) == FORMS and entity.surface_form_count == len(FORMS)
    assert entity.name == NAME


def test_a_page_of_surface_forms_and_the_count_of_all(
        service: pb_grpc.IdentityServiceStub) -> None:
    eid = _spelled(service)
    first = _entity(service, eid, max_surface_forms=3)
    assert list(first.surface_forms) == FORMS[:3] and first.surface_form_count == len(FORMS)
    middle = _entity(service, eid, max_surface_forms=3, surface_forms_offset=3)
    assert list(middle.surface_forms) == FORMS[3:6]
    last = _entity(service, eid, max_surface_forms=3, surface_forms_offset=6)
    assert list(last.surface_forms) == FORMS[6:]
    rest = _entity(service, eid, surface_forms_offset=5)  # no limit: all from the offset on
    assert list(rest.surface_forms) == FORMS[5:]
    beyond = _entity(service, eid, max_surface_forms=3, surface_forms_offset=50)
    assert list(beyond.surface_forms) == [] and beyond.surface_form_count == len(FORMS)


def test_zero_lists_none_but_says_how_many(service: pb_grpc.IdentityServiceStub) -> None:
    eid = _spelled(service)
    entity = _entity(service, eid, max_surface_forms=0)
    assert list(entity.surface_forms) == [] and entity.surface_form_count == len(FORMS)
    assert (entity.name, entity.entity_type, entity.status) == (NAME, "method", pb.PROVISIONAL)


@pytest.mark.parametrize("page", [{"max_surface_forms": -1}, {"surface_forms_offset": -2}])
def test_a_negative_page_is_invalid_argument(service: pb_grpc.IdentityServiceStub,
                                             page: dict[str, int]) -> None:
    eid = _spelled(service)
    with pytest.raises(grpc.RpcError) as exc:
        _entity(service, eid, **page)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "must be 0 or more" in (exc.value.details() or "")


def _new(service: pb_grpc.IdentityServiceStub, mention: str) -> str:
    reply = service.Resolve(pb.ResolveRequest(mention=mention, entity_type="method"), timeout=10)
    assert reply.created
    return str(reply.entity_id)


def test_a_merge_reply_lists_as_many_surface_forms_as_asked(
        service: pb_grpc.IdentityServiceStub) -> None:
    target = _spelled(service)
    source = _new(service, "a different method")
    reply = service.Merge(pb.MergeRequest(source_id=source, target_id=target, max_surface_forms=2),
                          metadata=ADMIN, timeout=10)
    forms = list(reply.entity.surface_forms)
    # The source's name became a surface form of the target (the stub files it the same way).
    assert forms == FORMS[:2] and reply.entity.surface_form_count == len(FORMS) + 1
    again = service.Merge(pb.MergeRequest(source_id=source, target_id=target), metadata=ADMIN,
                          timeout=10)  # already merged: a no-op, unset lists them all
    assert list(again.entity.surface_forms)[: len(FORMS)] == FORMS
    assert len(again.entity.surface_forms) == len(FORMS) + 1


def test_a_negative_cap_on_a_merge_is_invalid_argument_and_merges_nothing(
        service: pb_grpc.IdentityServiceStub) -> None:
    target = _spelled(service)
    source = _new(service, "a different method")
    with pytest.raises(grpc.RpcError) as exc:
        service.Merge(pb.MergeRequest(source_id=source, target_id=target, max_surface_forms=-1),
                      metadata=ADMIN, timeout=10)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_surface_forms" in (exc.value.details() or "")
    assert _entity(service, source).status == pb.PROVISIONAL


@pytest.fixture
def server(tmp_path: Path) -> Iterator[pb_grpc.IdentityServiceStub]:
    """The real server alone: the stub serves only the admin calls ingest uses (Merge)."""
    with _real_server(tmp_path) as client:
        yield client


def test_every_admin_reply_takes_the_cap(server: pb_grpc.IdentityServiceStub) -> None:
    eid = _spelled(server)
    alias = server.AddAlias(pb.AddAliasRequest(entity_id=eid, alias="GAT", max_surface_forms=1),
                            metadata=ADMIN, timeout=10).entity
    assert list(alias.aliases) == ["GAT"] and list(alias.surface_forms) == FORMS[:1]
    assert alias.surface_form_count == len(FORMS)
    promoted = server.Promote(pb.PromoteRequest(entity_id=eid, max_surface_forms=0),
                              metadata=ADMIN, timeout=10).entity
    assert promoted.status == pb.CANONICAL and list(promoted.surface_forms) == []
    assert promoted.surface_form_count == len(FORMS)
    # A weak match links a new entity to one with spellings: settling the pair answers with
    # the first of them, capped too.
    maria = server.Resolve(pb.ResolveRequest(mention="Maria", entity_type="person"), timeout=10)
    for form in ("MARIA", "maria", "MAria"):
        server.Resolve(pb.ResolveRequest(mention=form, entity_type="person"), timeout=10)
    mario = server.Resolve(pb.ResolveRequest(mention="Mario", entity_type="person"), timeout=10)
    assert mario.created and list(mario.possibly_same_as) == [maria.entity_id]
    settled = server.SettlePossiblySameAs(pb.SettlePossiblySameAsRequest(
        entity_id=maria.entity_id, other_id=mario.entity_id, decision=pb.DISTINCT, actor="t",
        reason="different people", max_surface_forms=1), metadata=ADMIN, timeout=10).entity
    assert (settled.entity_id, list(settled.surface_forms), settled.surface_form_count) == (
        maria.entity_id, ["MARIA"], 3)
