"""The W3C Reconciliation API (0.2) over HTTP against a real server: the spec's JSON shapes,
`match` exactly where the section-2 rules converge (checked against a lookup-only Resolve over
gRPC), scores in descending order, CORS and JSONP, and nothing written."""

from __future__ import annotations

import json
import sqlite3
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from identity_server.server import RunningServer, start_server
from identity_server.settings import Settings

T = 10.0
AUTHORITY = [
    {"id": "Q1", "name": "Graph Attention Network", "type": "method", "aliases": ["GAT"]},
    {"id": "Q2", "name": "Mem-Castle", "type": "tool"},
    {"id": "Q3", "name": "Maria", "type": "person"},
    {"id": "Q4", "name": "Mario", "type": "person"},
    {"id": "Q5", "name": "Transformer", "type": "method"},
    {"id": "Q6", "name": "Transformer", "type": "tool"},
    {"id": "Q7", "name": "Ada Lovelace", "type": "person"},
]
QUERIES: dict[str, dict[str, Any]] = {
    "exact": {"query": "Graph Attention Network", "type": "method"},
    "case": {"query": "graph attention NETWORK", "type": "method"},
    "punctuation": {"query": "memcastle", "type": "tool"},
    "alias": {"query": "GAT", "type": "method"},
    "typo": {"query": "Ada Lovelase", "type": "person"},
    "weak": {"query": "Marla", "type": "person"},
    "ambiguous": {"query": "transformer", "type": "other"},
    "unknown": {"query": "Quorbex Engine", "type": "tool"},
    "untyped": {"query": "ada lovelace"},
    "listed types": {"query": "Mem Castle", "type": ["tool", "method"], "limit": 1},
    "empty": {"query": "  "},
}


@pytest.fixture
def reconciling(tmp_path: Path) -> Iterator[tuple[RunningServer, Path]]:
    db = tmp_path / "r.sqlite"
    running = start_server(Settings(db_url=f"sqlite:///{db}", port=0, reconcile_port=0,
                                    admin_token="adm"))
    report = running.service.import_lines([json.dumps(record) for record in AUTHORITY], "jsonl")
    assert not report.errors
    yield running, db
    running.stop(grace=1.0)


def url(running: RunningServer, path: str = "/reconcile") -> str:
    assert running.reconcile_server is not None
    return f"http://127.0.0.1:{running.reconcile_server.port}{path}"


def get(address: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(address, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=T) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def post(address: str, queries: dict[str, Any]) -> dict[str, Any]:
    data = urllib.parse.urlencode({"queries": json.dumps(queries)}).encode()
    with urllib.request.urlopen(urllib.request.Request(address, data=data), timeout=T) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("application/json")
        result: dict[str, Any] = json.loads(reply.read())
        return result


def store_rows(db: Path) -> tuple[Any, ...]:
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return tuple((t, tuple(conn.execute(f'SELECT * FROM "{t}" ORDER BY 1, 2')))
                     for t in tables)


def test_the_manifest_has_the_spec_shape(reconciling: tuple[RunningServer, Path]) -> None:
    running, _ = reconciling
    status, headers, body = get(url(running), {"Origin": "http://localhost:3333"})
    assert status == 200 and headers["access-control-allow-origin"] == "*"
    manifest = json.loads(body)
    assert "0.2" in manifest["versions"]
    assert manifest["name"] and manifest["identifierSpace"] and manifest["schemaSpace"]
    assert {"id": "person", "name": "person"} in manifest["defaultTypes"]
    assert "{{id}}" in manifest["view"]["url"]
    view = manifest["view"]["url"].replace("{{id}}", "Q1")
    status, _, entity = get(view)
    assert status == 200 and json.loads(entity)["name"] == "Graph Attention Network"
    status, _, preview = get(manifest["preview"]["url"].replace("{{id}}", "Q1"))
    assert status == 200 and b"Graph Attention Network" in preview


def test_match_is_exactly_where_the_rules_converge_and_nothing_is_written(
        reconciling: tuple[RunningServer, Path]) -> None:
    running, db = reconciling
    before = store_rows(db)
    reply = post(url(running), QUERIES)
    assert set(reply) == set(QUERIES)
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        stub = pb_grpc.IdentityServiceStub(channel)
        for name, q in QUERIES.items():
            result = reply[name]["result"]
            for c in result:  # the spec's candidate shape
                assert isinstance(c["id"], str) and isinstance(c["name"], str)
                assert isinstance(c["type"], list) and {"id", "name"} <= set(c["type"][0])
                assert 0 <= c["score"] <= 100 and isinstance(c["match"], bool)
                assert all({"id", "value"} == set(f) for f in c["features"])
            scores = [c["score"] for c in result]
            assert scores == sorted(scores, reverse=True), name
            assert len(result) <= q.get("limit", 10)
            matched = [c["id"] for c in result if c["match"]]
            if not q["query"].strip():
                assert result == [], name
                continue
            types = q.get("type", "other")
            looked = stub.Resolve(pb.ResolveRequest(
                mention=q["query"], entity_type=types if isinstance(types, str) else types[0],
                lookup_only=True), timeout=T)
            converged = looked.match_kind in (pb.EXACT, pb.CASE, pb.PUNCTUATION, pb.ALIAS,
                                              pb.TYPO)
            # The reply's scores are the endpoint's, candidate for candidate.
            assert list(looked.candidates)[:len(result)] == [c["id"] for c in result], name
            assert list(looked.candidate_scores)[:len(result)] == [c["score"] for c in result]
            assert len(looked.candidate_scores) == len(looked.candidates), name
            assert matched == ([looked.entity_id] if converged else []), name
            if converged:  # the winner scores highest
                assert result[0]["match"] and all(c["score"] < result[0]["score"]
                                                  for c in result[1:]), name
            else:
                assert {c["id"] for c in result} == set(looked.candidates), name
    assert store_rows(db) == before  # reconciliation only looks
    assert [c["id"] for c in reply["typo"]["result"] if c["match"]] == ["Q7"]
    assert not any(c["match"] for c in reply["ambiguous"]["result"])
    assert {c["id"] for c in reply["ambiguous"]["result"]} == {"Q5", "Q6"}
    assert reply["unknown"]["result"] == []
    kinds = {name: next((f["id"] for f in reply[name]["result"][0]["features"]
                         if f["id"] != "name_similarity"), None)
             for name in ("exact", "case", "punctuation", "alias", "typo", "weak")}
    assert kinds == {"exact": "exact", "case": "case", "punctuation": "punctuation",
                     "alias": "alias", "typo": "typo", "weak": "weak"}


def test_get_and_jsonp_answer_as_post(reconciling: tuple[RunningServer, Path]) -> None:
    running, _ = reconciling
    queries = {"q0": {"query": "GAT", "type": "method"}}
    posted = post(url(running), queries)
    encoded = urllib.parse.quote(json.dumps(queries))
    status, _, body = get(url(running) + f"?queries={encoded}")
    assert status == 200 and json.loads(body) == posted
    status, headers, body = get(url(running) + f"?queries={encoded}&callback=jsonp_1")
    assert status == 200 and headers["content-type"].startswith("application/javascript")
    text = body.decode()
    assert text.startswith("jsonp_1(") and json.loads(text[len("jsonp_1("):-1]) == posted


def test_cors_preflight_is_answered(reconciling: tuple[RunningServer, Path]) -> None:
    running, _ = reconciling
    request = urllib.request.Request(url(running), method="OPTIONS", headers={
        "Origin": "http://localhost:3333", "Access-Control-Request-Method": "POST"})
    with urllib.request.urlopen(request, timeout=T) as reply:
        assert reply.status == 200
        assert reply.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize(("queries", "said"), [
    ("{not json", "queries is not JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"q0": {"text": "x"}}', "query 'q0' must be an object with a string `query`"),
    ('{"q0": {"query": "x", "limit": "ten"}}', "`limit` must be a whole number"),
    ('{"q0": {"query": "x", "type": 5}}', "`type` must be a string or a list"),
])
def test_bad_queries_get_a_400_that_says_what_is_wrong(
        reconciling: tuple[RunningServer, Path], queries: str, said: str) -> None:
    running, _ = reconciling
    status, _, body = get(url(running) + "?queries=" + urllib.parse.quote(queries))
    assert status == 400
    assert said in json.loads(body)["message"]


def test_with_roles_reconciliation_needs_a_reader_token(tmp_path: Path) -> None:
    running = start_server(Settings(db_url=f"sqlite:///{tmp_path / 't.sqlite'}", port=0,
                                    reconcile_port=0, tokens="reader:look,writer:write"))
    try:
        status, _, body = get(url(running))
        assert status == 401 and "authorization" in json.loads(body)["message"]
        status, _, body = get(url(running), {"Authorization": "Bearer look"})
        assert status == 200 and json.loads(body)["versions"] == ["0.2"]
    finally:
        running.stop(grace=0)


def test_a_reply_stored_before_scores_replays_without_them(tmp_path: Path) -> None:
    """A batch reply stored by the release before scores (ten fields an item) still replays."""
    from identity_server.server import build_service

    db = tmp_path / "old.sqlite"
    service = build_service(Settings(db_url=f"sqlite:///{db}"))
    try:
        service.resolve("Maria", "person")
        mentions = [("Maria", "person"), ("Marla", "person")]
        first = service.resolve_batch("W1", mentions)
        assert first[1].candidate_scores  # type: ignore[union-attr]
        with sqlite3.connect(db) as conn:
            (reply,) = conn.execute("SELECT reply FROM batch_replies").fetchone()
            old = json.dumps([item[:10] for item in json.loads(reply)])
            conn.execute("UPDATE batch_replies SET reply = ?", (old,))
        again = service.resolve_batch("W1", mentions)
        assert [r.entity_id for r in again] == [r.entity_id for r in first]  # type: ignore[union-attr]
        assert all(r.candidate_scores == () for r in again)  # type: ignore[union-attr]
    finally:
        service.close()
