"""The model-based test of Resolve (tests/unit/test_resolve_model.py), through real servers.

In-process, a writing Resolve waits on the service's write queue; a server answers it on its
event loop (the lock-free look there, the write queued with the loop's group-commit window,
`loop_work.GroupWindow`) and translates every field to and from the proto. Here
each operation of the model test is a gRPC call to a server on a loopback port (two servers on
one database in every third seed), and every reply, link and entity is compared with the model
as in-process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from identity_server.domain import MatchKind, Status
from identity_server.errors import FailedPrecondition, InvalidArgument
from identity_server.importing import ImportReport
from identity_server.server import RunningServer, start_server
from identity_server.service import EntityView, ItemError, ResolveResult
from identity_server.settings import Settings
from identity_server.store import ChangeRecord, LinkRow
from tests.unit.test_resolve_model import run_against_the_model

TOKEN = "model-test-token"
ADMIN = (("authorization", f"Bearer {TOKEN}"),)
DEADLINE_S = 30.0
_STATUS = {pb.CANONICAL: Status.CANONICAL, pb.PROVISIONAL: Status.PROVISIONAL,
           pb.MERGED: Status.MERGED}
_KIND = {pb.MatchKind.Value(k.value): k for k in MatchKind}
_DECISION = {"same": pb.SAME, "distinct": pb.DISTINCT}
_CODE = {code.value[0]: code.name for code in grpc.StatusCode}
_CHANGE = {number: name.removeprefix("CHANGE_KIND_").lower()
           for name, number in pb.ChangeKind.items()}


class OverGrpc:
    """The service calls the model test makes, as gRPC calls to a server of its own."""

    def __init__(self, settings: Settings) -> None:
        self._server: RunningServer = start_server(
            settings.model_copy(update={"port": 0, "admin_token": TOKEN}))
        self._channel = grpc.insecure_channel(f"127.0.0.1:{self._server.port}")
        self._stub = pb_grpc.IdentityServiceStub(self._channel)

    def _call(self, method: str, request: Any, *, admin: bool = False) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=DEADLINE_S,
                                               metadata=ADMIN if admin else None)
        except grpc.RpcError as e:
            if e.code() is grpc.StatusCode.FAILED_PRECONDITION:
                raise FailedPrecondition(e.details()) from e
            if e.code() is grpc.StatusCode.INVALID_ARGUMENT:
                raise InvalidArgument(e.details()) from e
            raise

    def resolve(self, mention: str, entity_type: str, *, context_id: str = "",
                lookup_only: bool = False) -> ResolveResult:
        return _result(self._call("Resolve", pb.ResolveRequest(
            mention=mention, entity_type=entity_type, context_id=context_id,
            lookup_only=lookup_only)))

    def resolve_batch(self, context_id: str, mentions: Sequence[tuple[str, str]], *,
                      lookup_only: bool = False) -> list[ResolveResult | ItemError]:
        reply = self._call("ResolveBatch", pb.ResolveBatchRequest(
            context_id=context_id, lookup_only=lookup_only,
            mentions=[pb.Mention(mention=m, entity_type=t) for m, t in mentions]))
        return [ItemError(_CODE[r.error.code], r.error.message)
                if r.HasField("error") else _result(r.resolved) for r in reply.results]

    def get_entity(self, entity_id: str) -> EntityView:
        return _view(self._call("GetEntity", pb.GetEntityRequest(entity_id=entity_id)).entity)

    def list_links(self, *, entity_id: str = "", page_size: int = 100,
                   page_token: str = "") -> tuple[list[LinkRow], str]:
        reply = self._call("ListPossiblySameAs", pb.ListPossiblySameAsRequest(
            entity_id=entity_id, page_size=page_size, page_token=page_token))
        return ([LinkRow(link.entity_id, link.other_id, "open", link.sequence)
                 for link in reply.links], reply.next_page_token)

    def add_alias(self, entity_id: str, alias: str) -> EntityView:
        return _view(self._call("AddAlias", pb.AddAliasRequest(entity_id=entity_id, alias=alias),
                                admin=True).entity)

    def promote(self, entity_id: str) -> EntityView:
        return _view(self._call("Promote", pb.PromoteRequest(entity_id=entity_id),
                                admin=True).entity)

    def merge(self, source_id: str, target_id: str) -> EntityView:
        return _view(self._call("Merge", pb.MergeRequest(source_id=source_id,
                                                         target_id=target_id),
                                admin=True).entity)

    def settle(self, entity_id: str, other_id: str, decision: str, *, actor: str,
               reason: str) -> EntityView:
        return _view(self._call("SettlePossiblySameAs", pb.SettlePossiblySameAsRequest(
            entity_id=entity_id, other_id=other_id, decision=_DECISION[decision], actor=actor,
            reason=reason), admin=True).entity)

    def import_lines(self, lines: Iterable[str], fmt: str | None = None) -> ImportReport:
        assert fmt == "jsonl", fmt
        data = "".join(f"{line}\n" for line in lines).encode()

        def requests() -> Iterator[pb.ImportAuthorityRequest]:
            yield pb.ImportAuthorityRequest(format=pb.AUTHORITY_FORMAT_JSONL, data=data)

        reply = self._call("ImportAuthority", requests(), admin=True)
        return ImportReport(imported=reply.imported, created=reply.created,
                            updated=reply.updated, merged=reply.merged, linked=reply.linked,
                            errors=tuple(reply.errors))

    def list_changes(self, after: int, limit: int | None = None) -> list[ChangeRecord]:
        """The change feed's records (kind, entity and other id: what the test reads)."""
        stream = self._stub.ListChanges(pb.ListChangesRequest(after_sequence=after,
                                                              limit=limit or 0),
                                        timeout=DEADLINE_S)
        return [ChangeRecord(r.change.sequence, _CHANGE[r.change.kind], r.change.entity_id,
                             r.change.other_id, {}, 0.0) for r in stream]

    def close(self) -> None:
        self._channel.close()
        self._server.stop(grace=1.0)


def _result(r: Any) -> ResolveResult:
    return ResolveResult(r.entity_id, _STATUS.get(r.status), _KIND[r.match_kind], r.created,
                         tuple(r.possibly_same_as), tuple(r.candidates), r.name,
                         r.matched_name, r.entity_type, r.display_form,
                         tuple(r.candidate_scores))


def _view(e: Any) -> EntityView:
    return EntityView(e.entity_id, e.name, e.entity_type, _STATUS[e.status], tuple(e.aliases),
                      tuple(e.surface_forms), e.redirect_to, e.placeholder, e.evidence_count,
                      e.paper_count, e.surface_form_count)


@pytest.mark.parametrize("seed", range(6))
def test_resolve_after_resolve_over_grpc(tmp_path: Path, seed: int) -> None:
    run_against_the_model(f"sqlite:///{tmp_path / 'identity.sqlite'}", seed, start=OverGrpc)


def test_the_adapter_keeps_every_field() -> None:
    """The comparison is only as good as the translation back from the proto: every field of a
    result and a view is carried (a field added to either must be added here too)."""
    assert list(ResolveResult._fields) == [
        "entity_id", "status", "match_kind", "created", "possibly_same_as", "candidates", "name",
        "matched_name", "entity_type", "display_form", "candidate_scores"]
    assert [f.name for f in dataclasses.fields(EntityView)] == [
        "entity_id", "name", "entity_type", "status", "aliases", "surface_forms", "redirect_to",
        "placeholder", "evidence_count", "paper_count", "surface_form_count"]
