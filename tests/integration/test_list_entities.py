"""ListEntities over gRPC: every entity once, a page at a time in id order, by status and
type; merged entities with the live entity they redirect to; bad arguments named."""

from __future__ import annotations

import grpc
import pytest
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from identity_server.server import RunningServer
from tests.conftest import ADMIN

T = 10.0


def _page_all(stub: pb_grpc.IdentityServiceStub, **request: object) -> list[pb.Entity]:
    found: list[pb.Entity] = []
    token = ""
    while True:
        reply = stub.ListEntities(pb.ListEntitiesRequest(page_token=token, **request), timeout=T)
        found.extend(reply.entities)
        token = reply.next_page_token
        if not token:
            return found


def test_pages_cover_every_entity_once_in_id_order(server: RunningServer,
                                                   stub: pb_grpc.IdentityServiceStub) -> None:
    names = [f"Method Number {i:02d} Alpha" for i in range(23)] + ["Ada Lovelace"]
    made = {stub.Resolve(pb.ResolveRequest(mention=n, entity_type="method" if "Method" in n
                                           else "person"), timeout=T).entity_id for n in names}
    listed = _page_all(stub, page_size=5)
    ids = [e.entity_id for e in listed]
    assert ids == sorted(made) and len(ids) == len(set(ids))
    people = _page_all(stub, entity_type="person")
    assert [e.name for e in people] == ["Ada Lovelace"]
    one = stub.ListEntities(pb.ListEntitiesRequest(page_size=1), timeout=T)
    assert len(one.entities) == 1 and one.next_page_token


def test_merged_entities_are_listed_apart_with_their_redirect(
        server: RunningServer, stub: pb_grpc.IdentityServiceStub) -> None:
    a = stub.Resolve(pb.ResolveRequest(mention="Quorbex Engine", entity_type="tool"), timeout=T)
    b = stub.Resolve(pb.ResolveRequest(mention="Zentrix Tool", entity_type="tool"), timeout=T)
    stub.Merge(pb.MergeRequest(source_id=b.entity_id, target_id=a.entity_id), timeout=T,
               metadata=ADMIN)
    live = _page_all(stub)
    assert [e.entity_id for e in live] == [a.entity_id]
    merged = _page_all(stub, status=pb.MERGED)
    assert [(e.entity_id, e.redirect_to) for e in merged] == [(b.entity_id, a.entity_id)]
    canonical = _page_all(stub, status=pb.CANONICAL)
    assert canonical == []


@pytest.mark.parametrize(("request_fields", "said"), [
    ({"page_size": -1}, "page_size must not be negative"),
    ({"page_token": "not a token"}, "page_token is not one this server returned"),
])
def test_bad_arguments_are_named(stub: pb_grpc.IdentityServiceStub,
                                 request_fields: dict[str, object], said: str) -> None:
    with pytest.raises(grpc.RpcError) as bad:
        stub.ListEntities(pb.ListEntitiesRequest(**request_fields), timeout=T)  # type: ignore[arg-type]
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert said in (bad.value.details() or "")
