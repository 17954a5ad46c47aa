"""Access by role against a real server: every RPC with no token, an unknown one and each role;
a refused call writes nothing; health and reflection stay open; tokens are re-read on SIGHUP."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from identity_server.access import AccessPolicy, Role, TokensError, read_tokens_file
from identity_server.server import RunningServer, start_server
from identity_server.settings import Settings
from tests.conftest import serve_process

T = 10.0
TOKENS = {"reader": "r-token-1", "writer": "w-token-2", "admin": "a-token-3"}
CLI = Path(sys.executable).parent / "identity-server"


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


CALLERS: dict[str, tuple[tuple[str, str], ...]] = {
    "none": (),
    "unknown": bearer("not-a-token"),
    "malformed": (("authorization", TOKENS["admin"]),),  # no scheme
    **{role: bearer(token) for role, token in TOKENS.items()},
}
RANK = {"none": 0, "unknown": 0, "malformed": 0, "reader": 1, "writer": 2, "admin": 3}


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    path.write_text("# role token\n" + "".join(f"{r} {t}\n" for r, t in TOKENS.items()))
    return path


@pytest.fixture
def guarded(tmp_path: Path, tokens_file: Path) -> Iterator[tuple[RunningServer, Path]]:
    db = tmp_path / "identity.sqlite"
    running = start_server(Settings(db_url=f"sqlite:///{db}", port=0,
                                    tokens_file=str(tokens_file)))
    yield running, db
    running.stop(grace=1.0)


def _store_state(db: Path) -> tuple[Any, ...]:
    """Everything a call could write: the rows of every table of the store."""
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return tuple((t, tuple(conn.execute(f'SELECT * FROM "{t}" ORDER BY 1, 2'))) for t in tables)


def _calls(stub: pb_grpc.IdentityServiceStub, made: dict[str, str]
           ) -> list[tuple[str, int, Callable[[Any], object]]]:
    """(name, role rank needed, call(metadata)) for every IdentityService RPC."""
    a, b, c = made["a"], made["b"], made["c"]

    def import_call(md: Any) -> object:
        data = json.dumps({"id": "Q77", "name": "Imported Thing", "type": "concept"}).encode()
        return stub.ImportAuthority(
            iter([pb.ImportAuthorityRequest(data=data + b"\n",
                                            format=pb.AUTHORITY_FORMAT_JSONL)]),
            timeout=T, metadata=md)

    return [
        ("Resolve", 2, lambda md: stub.Resolve(pb.ResolveRequest(
            mention="Brand New Thing", entity_type="tool"), timeout=T, metadata=md)),
        ("Resolve lookup-only", 1, lambda md: stub.Resolve(pb.ResolveRequest(
            mention="Brand New Thing", entity_type="tool", lookup_only=True),
            timeout=T, metadata=md)),
        ("ResolveBatch", 2, lambda md: stub.ResolveBatch(pb.ResolveBatchRequest(
            context_id="W1", mentions=[pb.Mention(mention="Another Thing", entity_type="tool")]),
            timeout=T, metadata=md)),
        ("ResolveBatch lookup-only", 1, lambda md: stub.ResolveBatch(pb.ResolveBatchRequest(
            context_id="W1", lookup_only=True,
            mentions=[pb.Mention(mention="Another Thing", entity_type="tool")]),
            timeout=T, metadata=md)),
        ("GetEntity", 1, lambda md: stub.GetEntity(pb.GetEntityRequest(entity_id=a),
                                                   timeout=T, metadata=md)),
        ("ListEntities", 1, lambda md: stub.ListEntities(pb.ListEntitiesRequest(),
                                                         timeout=T, metadata=md)),
        ("ListPossiblySameAs", 1, lambda md: stub.ListPossiblySameAs(
            pb.ListPossiblySameAsRequest(), timeout=T, metadata=md)),
        ("ListChanges", 1, lambda md: list(stub.ListChanges(
            pb.ListChangesRequest(after_sequence=0, limit=5), timeout=T, metadata=md))),
        ("AddAlias", 3, lambda md: stub.AddAlias(pb.AddAliasRequest(
            entity_id=a, alias="Alpha Alias"), timeout=T, metadata=md)),
        ("Promote", 3, lambda md: stub.Promote(pb.PromoteRequest(entity_id=a),
                                               timeout=T, metadata=md)),
        ("SettlePossiblySameAs", 3, lambda md: stub.SettlePossiblySameAs(
            pb.SettlePossiblySameAsRequest(entity_id=a, other_id=b, decision=pb.DISTINCT,
                                           actor="curator", reason="two people"),
            timeout=T, metadata=md)),
        ("Merge", 3, lambda md: stub.Merge(pb.MergeRequest(source_id=c, target_id=a),
                                           timeout=T, metadata=md)),
        ("ImportAuthority", 3, import_call),
    ]


def test_every_rpc_gives_the_code_of_each_role_and_a_refused_call_writes_nothing(
        guarded: tuple[RunningServer, Path]) -> None:
    running, db = guarded
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        stub = pb_grpc.IdentityServiceStub(channel)
        writer = CALLERS["writer"]
        made = {  # Maria and Mario: a weak typo pair, linked possibly_same_as
            key: stub.Resolve(pb.ResolveRequest(mention=text, entity_type="person"),
                              timeout=T, metadata=writer).entity_id
            for key, text in (("a", "Maria"), ("b", "Mario"), ("c", "Mariana Lopez"))
        }
        for caller in ("none", "unknown", "malformed", "reader", "writer"):
            for name, needed, call in _calls(stub, made):
                if RANK[caller] >= needed:
                    continue
                before = _store_state(db)
                with pytest.raises(grpc.RpcError) as refused:
                    call(CALLERS[caller])
                expected = (grpc.StatusCode.UNAUTHENTICATED if RANK[caller] == 0
                            else grpc.StatusCode.PERMISSION_DENIED)
                assert refused.value.code() == expected, (name, caller)
                assert TOKENS["admin"] not in (refused.value.details() or ""), (name, caller)
                assert _store_state(db) == before, (name, caller)
        # Each role may make the calls of its rank and below (admin last: it merges).
        for caller in ("reader", "writer", "admin"):
            for name, needed, call in _calls(stub, made):
                if RANK[caller] >= needed and (caller == "admin" or needed < 3):
                    call(CALLERS[caller])


def test_health_and_reflection_answer_without_a_token(
        guarded: tuple[RunningServer, Path]) -> None:
    running, _ = guarded
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                           timeout=T)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = list(reflect.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=T))
        names = {s.name for s in replies[0].list_services_response.service}
        assert "identity.v1.IdentityService" in names


def test_without_tokens_resolves_stay_open_and_admin_needs_the_admin_token(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="identity_server.server")
    running = start_server(Settings(db_url=f"sqlite:///{tmp_path / 'open.sqlite'}", port=0,
                                    admin_token="only-admin"))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.IdentityServiceStub(channel)
            made = stub.Resolve(pb.ResolveRequest(mention="Open Thing", entity_type="tool"),
                                timeout=T)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Promote(pb.PromoteRequest(entity_id=made.entity_id), timeout=T)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            promoted = stub.Promote(pb.PromoteRequest(entity_id=made.entity_id), timeout=T,
                                    metadata=bearer("only-admin"))
            assert promoted.entity.status == pb.CANONICAL
    finally:
        running.stop(grace=1.0)
    assert any("anyone who can reach" in r.getMessage() for r in caplog.records)


def test_a_token_is_found_in_constant_time_and_the_highest_role_wins() -> None:
    policy = AccessPolicy.of([(Role.READER, "same"), (Role.WRITER, "same"),
                              (Role.READER, "other")], admin_token="boss")
    assert policy.role_of(b"same") is Role.WRITER
    assert policy.role_of(b"boss") is Role.ADMIN
    assert policy.role_of(b"nobody") is None
    assert policy.enforcing


@pytest.mark.parametrize(("text", "complaint"), [
    ("reader\n", "line 1: expected `role token`"),
    ("# fine\nsuperuser s3cr3t-1\n", "line 2: unknown role 'superuser'"),
    ("writer s3cr3t-\u00e9\n", "line 1: a token must be visible ASCII"),
])
def test_a_bad_tokens_file_names_the_line_and_never_the_token(
        tmp_path: Path, text: str, complaint: str) -> None:
    path = tmp_path / "tokens"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TokensError) as bad:
        read_tokens_file(path)
    assert complaint in str(bad.value)
    assert "s3cr3t" not in str(bad.value)
    with pytest.raises(TokensError):  # the server refuses to start on it
        start_server(Settings(db_url=f"sqlite:///{tmp_path / 's.sqlite'}", port=0,
                              tokens_file=str(path)))


def test_identity_tokens_variable_sets_tokens(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDENTITY_TOKENS", "reader:env-reader, writer:env-writer")
    running = start_server(Settings(db_url=f"sqlite:///{tmp_path / 'env.sqlite'}", port=0))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.IdentityServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Resolve(pb.ResolveRequest(mention="X Thing", entity_type="tool"),
                             timeout=T, metadata=bearer("env-reader"))
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert stub.Resolve(pb.ResolveRequest(mention="X Thing", entity_type="tool"),
                                timeout=T, metadata=bearer("env-writer")).created
    finally:
        running.stop(grace=1.0)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDENTITY_")}
    env["IDENTITY_DRAIN_SECONDS"] = "0"
    return env


def test_sighup_rereads_the_tokens_file(tmp_path: Path, tokens_file: Path) -> None:
    args = [str(CLI), "serve", "--port", "0", "--db", f"sqlite:///{tmp_path / 'hup.sqlite'}",
            "--tokens-file", str(tokens_file)]
    with serve_process(args, env=_env()) as (proc, port):
        request = pb.ResolveRequest(mention="Hup Thing", entity_type="tool", lookup_only=True)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.IdentityServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Resolve(request, timeout=T, metadata=bearer("fresh-token"))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            tokens_file.write_text("reader fresh-token\n")
            os.kill(proc.pid, signal.SIGHUP)
            deadline = time.monotonic() + T
            while True:
                try:
                    stub.Resolve(request, timeout=T, metadata=bearer("fresh-token"))
                    break
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.UNAUTHENTICATED
                    assert time.monotonic() < deadline, "SIGHUP did not reload the tokens"
                    time.sleep(0.1)
            with pytest.raises(grpc.RpcError) as gone:  # the old tokens are gone
                stub.Resolve(request, timeout=T, metadata=CALLERS["writer"])
            assert gone.value.code() == grpc.StatusCode.UNAUTHENTICATED
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=T) == 0
        assert proc.stderr is not None
        log = proc.stderr.read()
        assert "tokens reloaded" in log and "fresh-token" not in log


REPO = Path(__file__).resolve().parents[2]


def test_ingest_and_the_client_commands_present_a_token_from_a_file_or_the_environment(
        guarded: tuple[RunningServer, Path], tmp_path: Path) -> None:
    running, _ = guarded
    address = f"127.0.0.1:{running.port}"
    writer_file = tmp_path / "writer.token"
    writer_file.write_text(TOKENS["writer"] + "\n")
    env = {k: v for k, v in _env().items() if not k.startswith("INGEST_")}
    papers = REPO / "examples" / "papers.jsonl"
    ingest = [str(CLI.parent / "ingest"), "run", str(papers), "--db", str(tmp_path / "g.duckdb"),
              "--server", address]
    refused = subprocess.run(ingest, env={**env, "INGEST_RETRY_BUDGET_SECONDS": "1"},
                             capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stderr
    done = subprocess.run(ingest, env={**env, "INGEST_TOKEN_FILE": str(writer_file)},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    resolve = [str(CLI), "resolve", "Graph Attention Network", "--type", "method",
               "--lookup-only", "--server", address]
    denied = subprocess.run(resolve, env=env, capture_output=True, text=True, timeout=60,
                            check=False)
    assert denied.returncode != 0 and "UNAUTHENTICATED" in denied.stderr
    by_file = subprocess.run([*resolve, "--token-file", str(writer_file)], env=env,
                             capture_output=True, text=True, timeout=60, check=False)
    assert by_file.returncode == 0, by_file.stderr
    by_env = subprocess.run(resolve, env={**env, "IDENTITY_TOKEN": TOKENS["reader"]},
                            capture_output=True, text=True, timeout=60, check=False)
    assert by_env.returncode == 0, by_env.stderr
