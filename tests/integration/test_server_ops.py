"""Running the identity server: health, reflection, restarts, idempotent batches, CLI, TLS.

Servers listen on 127.0.0.1, port 0; subprocesses are started here and stopped by their own PID.
Every gRPC call carries a deadline.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor_pb2 import FileDescriptorProto
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from identity_server.server import RunningServer, start_server
from identity_server.settings import Settings
from tests.conftest import ADMIN, ADMIN_TOKEN, read_line, signal_a_thread_other_than_main

T = 10.0  # deadline of every call, in seconds
SERVICE = "identity.v1.IdentityService"
RPCS = {
    "Resolve", "ResolveBatch", "GetEntity", "AddAlias", "Promote", "Merge", "ListPossiblySameAs",
    "SettlePossiblySameAs", "ImportAuthority", "ListChanges", "ListEntities",
}
CLI = Path(sys.executable).parent / "identity-server"

Stub = pb_grpc.IdentityServiceStub


@contextmanager
def serving(db_url: str, **settings: Any) -> Iterator[tuple[RunningServer, Stub]]:
    running = start_server(
        Settings(db_url=db_url, host="127.0.0.1", port=0, admin_token=ADMIN_TOKEN, **settings)
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            yield running, Stub(channel)
    finally:
        running.stop(grace=0)


def import_jsonl(stub: Stub, text: str) -> pb.ImportAuthorityResponse:
    report = stub.ImportAuthority(
        iter([pb.ImportAuthorityRequest(format=pb.AUTHORITY_FORMAT_JSONL, data=text.encode())]),
        metadata=ADMIN, timeout=T,
    )
    assert list(report.errors) == []
    return report


AUTHORITY = "\n".join([
    '{"id": "Q-MEM", "name": "Mem-Castle", "type": "method", "aliases": ["Memory Castle"]}',
    '{"id": "P-1", "name": "Jordan Smith", "type": "person"}',
    '{"id": "P-2", "name": "Jordan Smith", "type": "person"}',
    '{"id": "P-MARIA", "name": "Maria", "type": "person"}',
    '{"id": "C-AI", "name": "AI", "type": "concept"}',
])


def _env() -> dict[str, str]:
    """The test's environment without IDENTITY_* settings, so only the flags given count, and
    without the drain after SIGTERM (tests of the drain set it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDENTITY_")}
    env["IDENTITY_DRAIN_SECONDS"] = "0"
    return env


# -- health and reflection ----------------------------------------------------------------------


def test_health_check_reports_serving(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", SERVICE):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=T)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
    with pytest.raises(grpc.RpcError) as info:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=T)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


class _Details(
    collections.namedtuple(
        "_Details", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


class _DefaultDeadline(grpc.StreamStreamClientInterceptor):
    """Gives calls made by library code (the reflection database) a deadline."""

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        timeout = T if details.timeout is None else details.timeout
        return continuation(
            _Details(details.method, timeout, details.metadata, details.credentials,
                     details.wait_for_ready, details.compression),
            requests,
        )


def test_reflection_lists_and_describes_the_service(channel: grpc.Channel) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = list(stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=T))
    names = {s.name for s in replies[0].list_services_response.service}
    assert {SERVICE, "grpc.health.v1.Health"} <= names

    database = ProtoReflectionDescriptorDatabase(
        grpc.intercept_channel(channel, _DefaultDeadline()))
    assert SERVICE in database.get_services()
    service = DescriptorPool(database).FindServiceByName(SERVICE)
    assert {m.name for m in service.methods} == RPCS
    importer = service.methods_by_name["ImportAuthority"]
    assert importer.client_streaming and not importer.server_streaming
    feed = service.methods_by_name["ListChanges"]
    assert feed.server_streaming and not feed.client_streaming
    assert service.methods_by_name["ResolveBatch"].input_type.full_name == (
        "identity.v1.ResolveBatchRequest")


def test_reflection_answers_under_its_stable_v1_name_too(channel: grpc.Channel) -> None:
    """Tools ask for grpc.reflection.v1 first; the library serves v1alpha, the same messages."""
    info = channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
    listed, described = info(iter([
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE),
    ]), timeout=T)
    names = {s.name for s in listed.list_services_response.service}
    assert {SERVICE, "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection"} <= names
    files = [FileDescriptorProto.FromString(raw)
             for raw in described.file_descriptor_response.file_descriptor_proto]
    assert SERVICE.rpartition(".")[2] in {sv.name for f in files for sv in f.service}


# -- restarts -------------------------------------------------------------------------------------


PROBES = [
    ("Ada Lovelace", "person"),
    ("ada lovelace", "person"),
    ("Jordan Smith", "person"),
    ("Jordan Smith", "other"),
    ("Memory Casle", "method"),
    ("Memory Casl", "method"),
    ("mem castle", "method"),
    ("Mario", "person"),
    ("A.I.", "concept"),
    ("Brand New Thing", "tool"),
    ("Maria", "other"),
    ("ADA LOVELACE", "person"),
    ("MemCastle", "method"),
    ("Memory Castl", "method"),
    ("memory castle", "method"),
]
WRITTEN = 8  # the first PROBES are resolved for real (with evidence) before the restart


def _look(stub: Stub) -> list[tuple[Any, ...]]:
    out = []
    for mention, etype in PROBES:
        r = stub.Resolve(pb.ResolveRequest(mention=mention, entity_type=etype, lookup_only=True),
                         timeout=T)
        out.append((r.entity_id, r.status, r.match_kind, tuple(r.candidates), r.matched_name,
                    r.entity_type, r.name))
    return out


def test_a_restart_on_the_same_file_gives_the_same_answers(db_url: str) -> None:
    with serving(db_url) as (_, stub):
        import_jsonl(stub, AUTHORITY)
        for mention, etype in PROBES[:WRITTEN]:
            stub.Resolve(pb.ResolveRequest(mention=mention, entity_type=etype,
                                           context_id="paper-1"), timeout=T)
        before = _look(stub)
        ids = sorted({row[0] for row in before if row[0]})
        entities = [stub.GetEntity(pb.GetEntityRequest(entity_id=i), timeout=T) for i in ids]
        feed = [r.change for r in stub.ListChanges(pb.ListChangesRequest(), timeout=T)]
    kinds = {row[2] for row in before}
    assert {pb.EXACT, pb.CASE, pb.PUNCTUATION, pb.ALIAS, pb.TYPO, pb.AMBIGUOUS, pb.NEW} <= kinds

    with serving(db_url) as (_, stub):
        assert _look(stub) == before
        again = [stub.GetEntity(pb.GetEntityRequest(entity_id=i), timeout=T) for i in ids]
        assert [e.SerializeToString() for e in again] == [e.SerializeToString() for e in entities]
        fresh = stub.Resolve(pb.ResolveRequest(mention="Fresh After Restart", entity_type="tool"),
                             timeout=T)
        assert fresh.created and fresh.entity_id not in ids
        after = [r.change for r in stub.ListChanges(pb.ListChangesRequest(), timeout=T)]
    assert after[: len(feed)] == feed
    assert [c.sequence for c in after] == list(range(1, len(after) + 1))


# -- idempotent batches ----------------------------------------------------------------------------


MENTIONS = [
    ("Quantum Widget", "tool"),
    ("quantum widget", "tool"),
    ("", "tool"),
    ("Jordan Smith", "person"),
    ("Memory Casle", "method"),
    ("Mario", "person"),
    ("Ada Lovelace", "person"),
]


def _batch(stub: Stub, mentions: list[tuple[str, str]], context_id: str = "paper-7",
           lookup_only: bool = False) -> pb.ResolveBatchResponse:
    return stub.ResolveBatch(
        pb.ResolveBatchRequest(context_id=context_id, lookup_only=lookup_only,
                               mentions=[pb.Mention(mention=m, entity_type=t) for m, t in mentions]),
        timeout=T,
    )


def _evidence(stub: Stub, reply: pb.ResolveBatchResponse) -> dict[str, int]:
    ids = {r.resolved.entity_id for r in reply.results if r.WhichOneof("outcome") == "resolved"}
    return {
        i: stub.GetEntity(pb.GetEntityRequest(entity_id=i), timeout=T).entity.evidence_count
        for i in ids
    }


def _feed_length(stub: Stub) -> int:
    return sum(1 for _ in stub.ListChanges(pb.ListChangesRequest(), timeout=T))


def test_a_repeated_batch_gets_the_first_reply_and_writes_nothing(db_url: str) -> None:
    with serving(db_url) as (_, stub):
        import_jsonl(stub, AUTHORITY)
        first = _batch(stub, MENTIONS)
        assert first.results[0].resolved.created
        assert first.results[2].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        evidence = _evidence(stub, first)
        assert sum(evidence.values()) == 6
        writes = _feed_length(stub)

        again = _batch(stub, MENTIONS)
        assert (first.replayed, again.replayed) == (False, True)
        assert list(again.results) == list(first.results)
        assert again.results[0].resolved.created  # the first reply, not today's answer
        assert _evidence(stub, first) == evidence
        assert _feed_length(stub) == writes

    with serving(db_url) as (_, stub):
        again = _batch(stub, MENTIONS)
        assert again.replayed and list(again.results) == list(first.results)
        assert _evidence(stub, first) == evidence
        assert _feed_length(stub) == writes

        # A lookup-only batch is always answered from the current state.
        look = _batch(stub, MENTIONS, lookup_only=True)
        assert look.results[0].resolved.match_kind == pb.EXACT
        assert not look.results[0].resolved.created


def test_concurrent_identical_batches_get_one_reply_and_count_once(db_url: str) -> None:
    with serving(db_url) as (_, stub):
        import_jsonl(stub, AUTHORITY)
        replies: list[bytes] = []
        replayed: list[bool] = []
        errors: list[BaseException] = []

        def run() -> None:
            try:
                reply = _batch(stub, MENTIONS)
                replayed.append(reply.replayed)
                reply.replayed = False
                replies.append(reply.SerializeToString())
            except BaseException as e:  # reported by the test thread
                errors.append(e)

        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=T)
        assert errors == [] and len(replies) == 4
        assert len(set(replies)) == 1
        assert sorted(replayed) == [False, True, True, True]  # one resolved, three replayed
        first = pb.ResolveBatchResponse.FromString(replies[0])
        assert sum(_evidence(stub, first).values()) == 6


@pytest.mark.parametrize(
    "change",
    ["context", "order", "type", "spelling", "one more", "one fewer"],
)
def test_a_batch_that_differs_in_any_way_is_resolved_afresh(db_url: str, change: str) -> None:
    mentions, context = list(MENTIONS), "paper-7"
    if change == "context":
        context = "paper-8"
    elif change == "order":
        mentions[5], mentions[6] = mentions[6], mentions[5]
    elif change == "type":
        mentions[6] = ("Ada Lovelace", "other")
    elif change == "spelling":
        mentions[6] = ("Ada  Lovelace", "person")  # the same display form, another request
    elif change == "one more":
        mentions.append(("Extra Item", "tool"))
    else:
        mentions.pop()
    with serving(db_url) as (_, stub):
        import_jsonl(stub, AUTHORITY)
        first = _batch(stub, MENTIONS)
        evidence = _evidence(stub, first)
        fresh = _batch(stub, mentions, context_id=context)
        assert fresh.SerializeToString() != first.SerializeToString()
        head = fresh.results[0].resolved
        assert (head.entity_id, head.match_kind, head.created) == (
            first.results[0].resolved.entity_id, pb.EXACT, False)
        after = _evidence(stub, first)
        assert sum(after.values()) > sum(evidence.values())


def test_batch_replies_expire_after_the_configured_time(db_url: str) -> None:
    with serving(db_url, batch_reply_ttl_seconds=1) as (_, stub):
        first = _batch(stub, MENTIONS)
        again = _batch(stub, MENTIONS)
        assert again.replayed and list(again.results) == list(first.results)
        time.sleep(1.2)
        later = _batch(stub, MENTIONS)
        assert not later.replayed
        assert later.results[0].resolved.match_kind == pb.EXACT
        assert not later.results[0].resolved.created


# -- the identity-server command line -----------------------------------------------------------


def test_reads_are_answered_while_another_process_holds_the_write_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server writes on its event loop only when nothing is in the way: while another
    connection (another process, say an import) holds SQLite's write lock, a Resolve that
    writes waits for it on a thread, and Resolves the index answers go on being answered.
    The waiting writes take the same road as the others (the service's write queue), and the
    batch, tried on the loop first, is not parsed a second time on its thread."""
    db = tmp_path / "shared.sqlite"
    with serving(f"sqlite:///{db}") as (running, stub):
        service = running.service

        parsed: list[str] = []
        parse = service.parse_mention

        def counting_parse(mention: str, entity_type: str) -> Any:
            parsed.append(mention)
            return parse(mention, entity_type)

        monkeypatch.setattr(service, "parse_mention", counting_parse)
        known = stub.Resolve(pb.ResolveRequest(mention="Quorbex", entity_type="tool"), timeout=T)
        other = sqlite3.connect(db, isolation_level=None)
        other.execute("CREATE TABLE other_process (x)")  # a commit: reads must catch up
        other.execute("BEGIN IMMEDIATE")
        try:
            batch = stub.ResolveBatch.future(pb.ResolveBatchRequest(
                context_id="paper-1", mentions=[pb.Mention(mention="QUORBEX",
                                                           entity_type="tool")]), timeout=T)
            time.sleep(0.3)  # the batch waits for the lock on a server thread
            writing = stub.Resolve.future(
                pb.ResolveRequest(mention="Vextral Autoencoder", entity_type="method"),
                timeout=T)
            time.sleep(0.3)  # so does the new name's Resolve
            for _ in range(5):
                started = time.monotonic()
                again = stub.Resolve(pb.ResolveRequest(mention="Quorbex", entity_type="tool"),
                                     timeout=T)
                assert again.entity_id == known.entity_id
                assert time.monotonic() - started < 1.0
            assert not writing.done() and not batch.done()  # both wait for the lock
        finally:
            other.execute("ROLLBACK")
            other.close()
        made = writing.result(timeout=T)
        assert made.created and made.match_kind == pb.NEW
        assert batch.result(timeout=T).results[0].resolved.entity_id == known.entity_id
        assert parsed.count("QUORBEX") == 1


def test_stop_ends_open_streams_and_returns(db_url: str) -> None:
    """stop() with an import stream whose client went quiet mid-stream and a following
    ListChanges open: both calls end with an error status, stop() returns (a thread reading
    the import's stream does not outlive the server), and the store is usable afterwards."""
    release = threading.Event()

    def chunks() -> Iterator[pb.ImportAuthorityRequest]:
        yield pb.ImportAuthorityRequest(
            format=pb.AUTHORITY_FORMAT_JSONL,
            data=b'{"id": "Q1", "name": "Ada Lovelace", "type": "person"}\n')
        release.wait(T)  # the client says nothing more until the server is gone

    running = start_server(
        Settings(db_url=db_url, host="127.0.0.1", port=0, admin_token=ADMIN_TOKEN))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = Stub(channel)
            made = stub.Resolve(pb.ResolveRequest(mention="Quorbex", entity_type="tool"),
                                timeout=T)
            follower = stub.ListChanges(pb.ListChangesRequest(follow=True), timeout=T)
            assert next(follower).change.entity_id == made.entity_id
            importing = stub.ImportAuthority.future(chunks(), metadata=ADMIN, timeout=T)
            watching = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=""), timeout=T)
            assert next(watching).status == health_pb2.HealthCheckResponse.SERVING
            time.sleep(0.3)  # the server is reading the import's stream
            started = time.monotonic()
            running.stop(grace=0.5)
            assert time.monotonic() - started < 5
            with pytest.raises(grpc.RpcError) as ended:
                importing.result(timeout=T)
            assert ended.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
            with pytest.raises(grpc.RpcError):
                next(follower)
            with pytest.raises(grpc.RpcError):  # the health watch ends too
                for _ in watching:  # (NOT_SERVING may come first)
                    pass
    finally:
        release.set()
        running.stop(grace=0)
    with serving(db_url) as (_, stub):  # the same store serves again
        again = stub.Resolve(pb.ResolveRequest(mention="Quorbex", entity_type="tool"), timeout=T)
        assert again.entity_id == made.entity_id and not again.created
        with pytest.raises(grpc.RpcError) as gone:  # the unfinished import wrote nothing
            stub.GetEntity(pb.GetEntityRequest(entity_id="Q1"), timeout=T)
        assert gone.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(("command", "delivered_to"), [
    ("identity-server", "the process"),
    ("identity-server", "a thread other than main"),
    ("stub", "a thread other than main"),
])
def test_cli_serve_prints_its_port_and_stops_cleanly_on_sigterm(
        tmp_path: Path, command: str, delivered_to: str) -> None:
    """Also when the signal lands on a thread other than main, as a process-wide signal may:
    the handler runs on the main thread, which then waited without end (seen under load)."""
    args = ([str(CLI), "serve", "--host", "127.0.0.1", "--port", "0",
             "--db", f"sqlite:///{tmp_path / 'cli.sqlite'}"] if command == "identity-server"
            else [sys.executable, "-m", "ingest.testing"])
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True, env=_env())
    try:
        line = read_line(proc.stdout, 20.0)
        match = re.search(r"127\.0\.0\.1:(\d+)\s*$", line)
        assert match, line
        port = int(match.group(1))
        assert port > 0
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            reply = Stub(ch).Resolve(pb.ResolveRequest(mention="Ada Lovelace",
                                                       entity_type="person"), timeout=T)
        assert reply.created and reply.match_kind == pb.NEW

        started = time.monotonic()
        if delivered_to == "the process":
            os.kill(proc.pid, signal.SIGTERM)
        else:
            signal_a_thread_other_than_main(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - started < 8
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()
        log.close()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_cli_serve_on_ipv6_prints_an_address_a_client_can_use(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It printed `listening on ::1:PORT`, which no client parses; now `[::1]:PORT`."""
    from identity_server.cli import main as cli_main

    args = [str(CLI), "serve", "--host", "::1", "--port", "0",
            "--db", f"sqlite:///{tmp_path / 'six.sqlite'}"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=_env())
    try:
        line = read_line(proc.stdout, 20.0)
        match = re.fullmatch(r"listening on (\[::1\]:\d+)\s*", line)
        assert match, line
        assert cli_main(["resolve", "Ada Lovelace", "--server", match.group(1)]) == 0
        assert "match_kind:   NEW" in capsys.readouterr().out
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
        assert proc.stdout is not None
        proc.stdout.close()


def test_cli_import_reports_refused_lines(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'imported.sqlite'}"
    jsonl = tmp_path / "authority.jsonl"
    jsonl.write_text(
        '{"id": "Q-ADA", "name": "Ada Lovelace", "type": "person", "aliases": ["Ada King"]}\n'
        '{"id": "Q-BAD", "name": "Bad", "type": "spaceship"}\n'
        '{"id": "Q-TODAI", "name": "東京大学", "type": "organization"}\n'
        "{oops\n",
        encoding="utf-8",
    )
    csv = tmp_path / "authority.csv"
    csv.write_text(
        'id,name,type,aliases\nC-1,"Smith, Jane",person,J. Smith|Jane Smith\n'
        "C-2,Nameless,,\nC-3,Mem-Castle,method,\n",
        encoding="utf-8",
    )
    for path, refused in ((jsonl, [2, 4]), (csv, [3])):
        done = subprocess.run([str(CLI), "import", str(path), "--db", db_url],
                              check=False, capture_output=True, text=True, env=_env(), timeout=30)
        assert done.returncode == 1, done.stderr  # some refused; the rest imported
        assert "imported 2 records" in done.stdout, done.stdout
        for line in refused:
            assert f"{path}:{line}:" in done.stderr, (path, done.stderr)
        ok = {1, 3} if path == jsonl else {2, 4}
        for line in ok:
            assert f"{path}:{line}:" not in done.stderr

    clean = tmp_path / "clean.jsonl"
    clean.write_text('{"id": "Q-BAB", "name": "Charles Babbage", "type": "person"}\n',
                     encoding="utf-8")
    missing = tmp_path / "missing.jsonl"
    for path, code in ((clean, 0), (missing, 2)):
        done = subprocess.run([str(CLI), "import", str(path), "--db", db_url],
                              check=False, capture_output=True, text=True, env=_env(), timeout=30)
        assert done.returncode == code, done.stderr
        assert "Traceback" not in done.stderr
    assert f"error: cannot read {missing}: No such file or directory" in done.stderr

    with serving(db_url) as (_, stub):
        for entity_id, name in (("Q-ADA", "Ada Lovelace"), ("Q-TODAI", "東京大学"),
                                ("C-1", "Smith, Jane"), ("C-3", "Mem-Castle")):
            entity = stub.GetEntity(pb.GetEntityRequest(entity_id=entity_id), timeout=T).entity
            assert (entity.name, entity.status) == (name, pb.CANONICAL)
        assert list(stub.GetEntity(pb.GetEntityRequest(entity_id="C-1"),
                                   timeout=T).entity.aliases) == ["J. Smith", "Jane Smith"]


def test_cli_import_reads_compressed_files_and_refuses_what_it_cannot_read(
        tmp_path: Path) -> None:
    """gzip, bzip2 or xz (known by the first bytes) import as the plain file does; a line that
    is not UTF-8 refuses its record (exit 1, the rest imported); compressed data cut short ends
    the import with exit 2 and an error naming the line and what was kept, never a traceback."""
    import bz2
    import gzip
    import lzma

    def numbered(count: int) -> bytes:
        return b"".join(b'{"id": "Q-%d", "name": "Record %d", "type": "other"}\n' % (i, i)
                        for i in range(1, count + 1))

    records = numbered(5)
    packed = {"a.jsonl.gz": gzip.compress(records), "b.jsonl.bz2": bz2.compress(records),
              "c.jsonl.xz": lzma.compress(records), "d.jsonl": records}

    def run(name: str, data: bytes) -> subprocess.CompletedProcess[str]:
        (tmp_path / name).write_bytes(data)
        return subprocess.run(
            [str(CLI), "import", str(tmp_path / name), "--db",
             f"sqlite:///{tmp_path / (name + '.sqlite')}"],
            check=False, capture_output=True, text=True, env=_env(), timeout=60)

    for name, data in packed.items():
        done = run(name, data)
        assert done.returncode == 0, (name, done.stderr)
        assert "imported 5 records (5 new, 0 replaced)" in done.stdout, (name, done.stdout)
    latin1 = records.replace(b"Record 3", b"R\xe9cord 3")
    for name, data in (("bad.jsonl", latin1), ("bad.jsonl.gz", gzip.compress(latin1))):
        bad = run(name, data)
        assert bad.returncode == 1, bad.stderr
        assert "Traceback" not in bad.stderr
        assert (f"{tmp_path / name}:3: not valid UTF-8 (invalid continuation byte at byte 25 "
                "of the line)") in bad.stderr
        assert "imported 4 records (4 new, 0 replaced)" in bad.stdout
        assert "refused 1 records" in bad.stdout
    cut = run("cut.jsonl.gz", gzip.compress(numbered(2000))[:-200])
    assert cut.returncode == 2, cut.stderr
    assert "Traceback" not in cut.stderr
    assert f"error: {tmp_path / 'cut.jsonl.gz'}: the gzip data is corrupt or cut short" in cut.stderr
    # Every whole line before the break is imported, as through a server (which is sent
    # only whole lines), and the report printed first, refusals included.
    (got,) = re.findall(r"imported (\d+) records", cut.stdout)
    (after,) = re.findall(r"cut short after line (\d+)", cut.stderr)
    assert int(got) == int(after) > 1000
    assert "; the lines before it were imported (with their merges)" in cut.stderr
    wide = run("wide.jsonl", "\ufeff".encode("utf-16-le") + records.decode().encode("utf-16-le"))
    assert wide.returncode == 2, wide.stderr
    assert f"error: {tmp_path / 'wide.jsonl'}: the authority file is UTF-16" in wide.stderr


def test_cli_resolve_prints_the_id(db_url: str) -> None:
    with serving(db_url) as (running, stub):
        import_jsonl(stub, '{"id": "Q-ADA", "name": "Ada Lovelace", "type": "person"}\n')
        address = f"127.0.0.1:{running.port}"
        done = subprocess.run(
            [str(CLI), "resolve", "ada lovelace", "--type", "person", "--server", address],
            check=False, capture_output=True, text=True, env=_env(), timeout=30,
        )
        assert done.returncode == 0, done.stderr
        fields = {
            k.strip(): v.strip() for k, v in
            (line.split(":", 1) for line in done.stdout.splitlines() if ":" in line)
        }
        assert fields["entity_id"] == "Q-ADA" and fields["match_kind"] == "CASE"
        assert fields["status"] == "CANONICAL"

    # The server is gone now: the command says so and fails.
    done = subprocess.run(
        [str(CLI), "resolve", "Ada Lovelace", "--server", address, "--timeout", "3"],
        check=False, capture_output=True, text=True, env=_env(), timeout=30,
    )
    assert done.returncode != 0 and "UNAVAILABLE" in done.stderr
    assert f"hint: no identity server answered at {address}" in done.stderr
    assert "retry budget" not in done.stderr  # a command tries once, and says it plainly


def test_cli_says_which_address_did_not_answer_in_time() -> None:
    """A listener that accepts and never speaks gRPC: the call runs out its deadline, and the
    command names the address and the timeout to check."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        done = subprocess.run(
            [str(CLI), "resolve", "Ada Lovelace", "--server", address, "--timeout", "1"],
            check=False, capture_output=True, text=True, env=_env(), timeout=30,
        )
    assert done.returncode == 1
    assert "DEADLINE_EXCEEDED" in done.stderr
    assert f"hint: {address} did not answer within --timeout 1 s" in done.stderr


# -- TLS ------------------------------------------------------------------------------------------


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1: made with `cryptography` if it is installed,
    else with the openssl command; skip the test when neither is available."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    try:
        import datetime
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        openssl = shutil.which("openssl")
        if openssl is None:
            pytest.skip("neither the cryptography package nor openssl is available")
        subprocess.run(
            [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
             "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
            check=True, capture_output=True, timeout=30,
        )
        return cert, key
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(private.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
        .sign(private, hashes.SHA256())
    )
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return cert, key


def test_tls(tmp_path: Path, db_url: str) -> None:
    cert, key = _self_signed(tmp_path)
    running = start_server(Settings(db_url=db_url, host="127.0.0.1", port=0,
                                    tls_cert=str(cert), tls_key=str(key)))
    try:
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{running.port}", credentials) as ch:
            reply = Stub(ch).Resolve(pb.ResolveRequest(mention="Ada Lovelace",
                                                       entity_type="person"), timeout=T)
            assert reply.created and reply.entity_id
            health = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=SERVICE), timeout=T)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as plain:
            with pytest.raises(grpc.RpcError) as info:
                Stub(plain).Resolve(pb.ResolveRequest(mention="Ada Lovelace"), timeout=3)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        running.stop(grace=0)


def test_tls_clients_of_the_command_line(tmp_path: Path, db_url: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`identity-server resolve --tls-ca` and `ingest run --tls-ca` talk to a TLS server; without
    the option the same commands fail with the server unreachable, not with wrong data."""
    from identity_server import cli as server_cli
    from ingest import cli as ingest_cli

    cert, key = _self_signed(tmp_path)
    running = start_server(Settings(db_url=db_url, host="127.0.0.1", port=0,
                                    tls_cert=str(cert), tls_key=str(key)))
    address = f"localhost:{running.port}"
    papers = tmp_path / "papers.jsonl"
    papers.write_text('{"paper_id": "p1", "mentions": [{"id": "a", "text": "Ada Lovelace", '
                      '"type": "person"}, {"id": "b", "text": "Analytical Engine", '
                      '"type": "tool"}], "relationships": [{"subject": "a", '
                      '"predicate": "uses", "object": "b"}]}\n', encoding="utf-8")
    try:
        assert server_cli.main(["resolve", "Ada Lovelace", "--type", "person",
                                "--server", address, "--tls-ca", str(cert)]) == 0
        assert "match_kind:   NEW" in capsys.readouterr().out
        assert ingest_cli.main(["run", str(papers), "--db", str(tmp_path / "g.duckdb"),
                                "--server", address, "--tls-ca", str(cert),
                                "--no-progress"]) == 0
        assert "papers ingested:   1" in capsys.readouterr().out
        assert server_cli.main(["resolve", "Ada Lovelace", "--server", address,
                                "--timeout", "2"]) == 1
        assert "UNAVAILABLE" in capsys.readouterr().err
        assert server_cli.main(["resolve", "Ada", "--server", address,
                                "--tls-ca", str(tmp_path / "missing.pem")]) == 2
        assert "cannot read the TLS root certificates" in capsys.readouterr().err
    finally:
        running.stop(grace=0)


def test_cli_names_a_misspelt_setting_variable_and_the_setting_it_nearly_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from identity_server.cli import main as cli_main

    for name in list(os.environ):  # only this test's variables
        if name.upper().startswith("IDENTITY_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("IDENTITY_DBURL", "sqlite:///elsewhere.sqlite")
    monkeypatch.setenv("IDENTITY_PROMOTE_AFTER_PAPERS", "3")  # a real one: not reported
    with caplog.at_level("WARNING", logger="identity_server"):
        assert cli_main(["serve", "--port", "70000",
                         "--db", f"sqlite:///{tmp_path / 'never.sqlite'}"]) == 2
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "IDENTITY_DBURL is not a setting and is ignored (did you mean IDENTITY_DB_URL?)"]


def test_cli_serve_says_what_is_wrong_with_its_settings_and_exits_non_zero(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Bad settings exit 2 and a server that cannot start exits 1, each with one line naming
    the setting or the cause: no traceback, and no index built before a TLS typo is found."""
    from identity_server.cli import main as cli_main

    db = ["--db", f"sqlite:///{tmp_path / 'never.sqlite'}"]
    assert cli_main(["serve", "--port", "70000", *db]) == 2
    assert "port (IDENTITY_PORT): Input should be less than or equal to 65535 (got 70000)" in (
        capsys.readouterr().err)
    monkeypatch.setenv("IDENTITY_STRICT_TYPES", "maybe")
    assert cli_main(["serve", "--port", "0", *db]) == 2
    assert "strict_types (IDENTITY_STRICT_TYPES)" in capsys.readouterr().err
    monkeypatch.delenv("IDENTITY_STRICT_TYPES")
    monkeypatch.setenv("IDENTITY_GRACE_SECONDS", "nan")
    assert cli_main(["serve", "--port", "0", *db]) == 2
    assert "grace_seconds (IDENTITY_GRACE_SECONDS): Input should be a finite number" in (
        capsys.readouterr().err)
    monkeypatch.delenv("IDENTITY_GRACE_SECONDS")
    monkeypatch.setenv("IDENTITY_TYPES", '["method", " "]')  # "" would be a type of its own
    assert cli_main(["serve", "--port", "0", *db]) == 2
    assert "types (IDENTITY_TYPES): Value error, a type name is empty" in capsys.readouterr().err
    monkeypatch.delenv("IDENTITY_TYPES")
    monkeypatch.setenv("IDENTITY_ADMIN_TOKEN", "sëcret token")  # no client could send it
    assert cli_main(["serve", "--port", "0", *db]) == 2
    err = capsys.readouterr().err
    assert "admin_token (IDENTITY_ADMIN_TOKEN): Value error, must be visible ASCII" in err
    assert "sëcret" not in err and "(got ***)" in err
    monkeypatch.delenv("IDENTITY_ADMIN_TOKEN")
    assert cli_main(["serve", "--port", "0", "--tls-cert", str(tmp_path / "no.pem"), *db]) == 1
    assert "TLS needs both --tls-cert and --tls-key" in capsys.readouterr().err
    assert cli_main(["serve", "--port", "0", "--tls-cert", str(tmp_path / "no.pem"),
                     "--tls-key", str(tmp_path / "no.key"), *db]) == 1
    assert "cannot read the TLS certificate or key" in capsys.readouterr().err
    assert not (tmp_path / "never.sqlite").exists()  # the store was never opened
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli_main(["serve", "--host", "127.0.0.1", "--port", str(port), *db]) == 1
    assert (f"cannot listen on 127.0.0.1:{port}: Address already in use"
            in capsys.readouterr().err)
    # Checked before the store is opened and its index built (minutes at millions of
    # entities), with the system's reason.
    assert cli_main(["serve", "--host", "192.0.2.1", "--port", "50051", *db]) == 1  # TEST-NET-1
    assert ("cannot listen on 192.0.2.1:50051: Cannot assign requested address"
            in capsys.readouterr().err)
    assert not (tmp_path / "never.sqlite").exists()


@pytest.mark.parametrize(("url", "says"), [
    ("identity.sqlite", "has no scheme"),
    ("sqlite://identity.sqlite", "names a host, not a file: a SQLite URL has three slashes"),
    ("sqlite://", "names no file (SQLite in memory would be a database per connection"),
    ("sqlite:///:memory:", "names no file"),
    ("postgres://ada:secret@127.0.0.1/test", "write postgresql://, not postgres://"),
    ("postgresql+psycopg2://ada:secret@127.0.0.1/test", "unsupported store URL"),
    ("mysql://ada@127.0.0.1/test", "unsupported store URL mysql://"),
])
def test_a_store_url_that_cannot_work_is_refused_saying_what_to_write(
        url: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Before, some failed deep in SQLAlchemy with a traceback (a driver not installed) and
    SQLite in memory started a server whose connections each saw a database of their own."""
    from identity_server.cli import main as cli_main

    assert cli_main(["serve", "--port", "0", "--db", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err, err
    assert "secret" not in err
    assert "sqlite:///" in err or "postgresql://" in err  # what to write instead


def test_a_store_in_a_directory_that_does_not_exist_is_refused_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SQLite says only "unable to open database file"."""
    from identity_server.cli import main as cli_main

    missing = tmp_path / "no-such-dir"
    assert cli_main(["serve", "--port", "0", "--db", f"sqlite:///{missing}/identity.sqlite"]) == 2
    assert f"the directory '{missing}' does not exist" in capsys.readouterr().err
    (tmp_path / "a.jsonl").write_text('{"id": "Q1", "name": "Ada", "type": "person"}\n')
    assert cli_main(["import", str(tmp_path / "a.jsonl"),
                     "--db", f"sqlite:///{missing}/identity.sqlite"]) == 2
    assert f"the directory '{missing}' does not exist" in capsys.readouterr().err
    assert not missing.exists()


def test_cli_import_reads_a_pipe_compressed_or_not(tmp_path: Path) -> None:
    """The first bytes are peeked at, not read: before, a pipe lost them to the look for a
    compressor's magic and the import read nothing, saying 'imported 0 records'."""
    import gzip

    records = b"".join(b'{"id": "Q-%d", "name": "Record %d", "type": "other"}\n' % (i, i)
                       for i in range(1, 6))
    for n, (path, data) in enumerate((("-", records), ("/dev/stdin", gzip.compress(records)))):
        done = subprocess.run(
            [str(CLI), "import", path, "--db", f"sqlite:///{tmp_path / f'{n}.sqlite'}"],
            input=data, check=False, capture_output=True, env=_env(), timeout=60)
        assert done.returncode == 0, done.stderr.decode()
        assert b"imported 5 records (5 new, 0 replaced)" in done.stdout, done.stdout
