"""Ingest against the real identity server: embedded (CLI) and over the network."""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from identity_client import IdentityClient, Resolution, RetryPolicy
from ingest import pipeline
from ingest.cli import main
from ingest.pipeline import JobOptions, run_job, sync_redirects
from ingest.sink import GraphSink
from tests.integration.ingest.conftest import rows

pytestmark = pytest.mark.skipif(importlib.util.find_spec("identity_server.server") is None,
                                reason="identity_server.server is not there yet")

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TOKEN = "integration-secret"
POLICY = RetryPolicy(deadline_seconds=10, budget_seconds=10, initial_backoff=0.02)


@pytest.fixture
def real_server(tmp_path: Path) -> Iterator[str]:
    from identity_server.server import start_server
    from identity_server.settings import Settings

    running = start_server(Settings(db_url=f"sqlite:///{tmp_path / 'identity.sqlite'}", port=0,
                                    admin_token=TOKEN))
    try:
        yield f"127.0.0.1:{running.port}"
    finally:
        running.stop(grace=0.5)


def test_embedded_server_runs_the_examples_from_a_fresh_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        snapshot: Callable[..., Any]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(EXAMPLES), "--db", "graph.duckdb", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "papers ingested:   205 (5 changed revisions)" in out
    assert (tmp_path / "identity.sqlite").exists()  # the embedded store, in the working dir
    db = tmp_path / "graph.duckdb"
    before = snapshot(db, wall_clock=True)
    # The real server refuses the punctuation-only mention; its edges go with it.
    assert any("identity server refused the mention" in r[6] for r in before["rejects"])
    assert main(["run", str(EXAMPLES), "--db", "graph.duckdb", "--no-progress"]) == 0
    assert "papers ingested:   0" in capsys.readouterr().out
    assert snapshot(db, wall_clock=True) == before
    assert main(["stats", "--db", "graph.duckdb"]) == 0
    assert "open links" in capsys.readouterr().out


def test_stored_mention_ids_agree_with_resolve(tmp_path: Path, real_server: str) -> None:
    db = tmp_path / "graph.duckdb"
    with GraphSink(db) as sink, IdentityClient(real_server, policy=POLICY) as client:
        summary = run_job([EXAMPLES / "papers.jsonl"], sink=sink, resolver=client,
                          options=JobOptions(concurrency=4))
        assert summary.ingested == 200
        sync_redirects(client, sink)
    stored = rows(db, "SELECT paper_id, mention_index, text, entity_type, resolved_id "
                      "FROM mentions_resolved WHERE is_current ORDER BY paper_id, mention_index")
    assert len(stored) > 2000
    by_paper: dict[str, list[tuple[str, str, str]]] = {}
    for paper_id, _, text, etype, resolved in stored:
        by_paper.setdefault(paper_id, []).append((text, etype, resolved))
    with IdentityClient(real_server, policy=POLICY) as client:
        disagree = []
        for paper_id, items in by_paper.items():
            # The same paper's batch again: the server replays the reply the job stored.
            replay = client.resolve_batch(paper_id, [(t, e) for t, e, _ in items])
            for (text, etype, resolved), r in zip(items, replay.outcomes, strict=True):
                assert isinstance(r, Resolution)
                live = client.get_entity(r.entity_id)
                if (live.redirect_to or r.entity_id) != resolved:
                    disagree.append((paper_id, text, etype))
            # And a fresh lookup of each mention names the same entity.
            for text, etype, resolved in items:
                look = client.resolve(text, etype, lookup_only=True)
                if look.match_kind != "ambiguous" and look.entity_id != resolved:
                    disagree.append((paper_id, text, "lookup"))
    assert disagree == []


def test_merge_on_the_server_shows_through_the_redirect_views_after_sync(
        tmp_path: Path, real_server: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "graph.duckdb"
    assert main(["run", str(EXAMPLES / "papers.jsonl"), "--db", str(db), "--server",
                 real_server, "--no-progress"]) == 0
    (source, n_source), (target, n_target) = rows(
        db, "SELECT entity_id, count(*) FROM mentions WHERE resolved_type = 'method' "
            "AND status = 'provisional' GROUP BY entity_id ORDER BY count(*) DESC, entity_id "
            "LIMIT 2")
    edges_before = rows(db, f"SELECT count(*) FROM graph_edges WHERE subject_id = '{target}' "
                            f"OR object_id = '{target}'")[0][0]
    with IdentityClient(real_server, policy=POLICY, admin_token=TOKEN) as client:
        client.merge(source, target)
    assert main(["sync", "--db", str(db), "--server", real_server]) == 0
    assert "new merges:   1" in capsys.readouterr().out
    assert rows(db, "SELECT from_id, to_id FROM redirects") == [(source, target)]
    assert rows(db, f"SELECT count(*) FROM mentions_resolved WHERE resolved_id = '{target}'") \
        == [(n_source + n_target,)]
    assert rows(db, f"SELECT count(*) FROM graph_edges WHERE subject_id = '{source}' "
                    f"OR object_id = '{source}'") == [(0,)]
    edges_after = rows(db, f"SELECT count(*) FROM graph_edges WHERE subject_id = '{target}' "
                           f"OR object_id = '{target}'")[0][0]
    assert edges_after > edges_before
    # Stored rows are untouched; only the views follow the redirect.
    assert rows(db, f"SELECT count(*) FROM mentions WHERE entity_id = '{source}'") == [
        (n_source,)]
    assert rows(db, f"SELECT count(*) FROM entities WHERE entity_id = '{source}'") == [(0,)]


def test_possibly_same_as_links_reach_stats_after_sync(
        tmp_path: Path, real_server: str, jsonl: Callable[..., Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    papers = [{"paper_id": f"p{i}", "mentions": [{"id": "a", "text": name, "type": "person"},
                                                 {"id": "b", "text": "Physics", "type": "task"}],
               "relationships": [{"subject": "a", "predicate": "related to", "object": "b"}]}
              for i, name in enumerate(["Mario", "Maria"])]
    corpus = jsonl(tmp_path / "in.jsonl", papers)
    db = tmp_path / "graph.duckdb"
    assert main(["run", str(corpus), "--db", str(db), "--server", real_server,
                 "--no-progress", "--concurrency", "1"]) == 0
    assert rows(db, "SELECT count(*) FROM possibly_same_as") == [(1,)]
    capsys.readouterr()
    assert main(["stats", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "possibly_same_as: 1 open links" in out
    assert "Mario" in out and "Maria" in out


def _embedded(corpus: Path, cwd: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "INGEST_GROUP_PAPERS": "10"}
    with (cwd / "ingest.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "ingest.cli", "run", str(corpus), "--db", "graph.duckdb",
             "--concurrency", "1", "--no-progress"],
            cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=log)


@pytest.mark.slow
def test_embedded_job_killed_with_sigkill_and_rerun_equals_one_clean_run(
        tmp_path: Path, jsonl: Callable[..., Path], snapshot: Callable[..., Any],
        kill_at: Callable[[subprocess.Popen[Any], float], bool]) -> None:
    from ingest.testing import synthetic_papers

    papers: list[Any] = list(synthetic_papers(400, mentions_per_paper=8,
                                              relationships_per_paper=5, seed=21))
    papers.insert(150, "not json at all")
    corpus = jsonl(tmp_path / "corpus.jsonl", papers)
    clean_dir = tmp_path / "clean"
    clean_dir.mkdir()
    started = time.monotonic()
    assert _embedded(corpus, clean_dir).wait(timeout=120) == 0, (
        clean_dir / "ingest.log").read_text()
    duration = time.monotonic() - started
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    for attempt in range(5):  # a job may end before the kill (a fast run): try earlier
        killed_dir = tmp_path / f"killed{attempt}"
        killed_dir.mkdir()
        proc = _embedded(corpus, killed_dir)
        if kill_at(proc, rng.uniform(0.35, 0.85) * duration * 0.5**attempt):
            break
    else:
        pytest.fail(f"seed {seed}: the job always ended before the kill")
    assert _embedded(corpus, killed_dir).wait(timeout=120) == 0, (
        killed_dir / "ingest.log").read_text()
    expected = snapshot(clean_dir / "graph.duckdb")
    got = snapshot(killed_dir / "graph.duckdb")
    assert len(expected["papers"]) == 400
    for table in expected:
        assert got[table] == expected[table], f"table {table} differs (seed {seed})"


def _revision(revision: str, rel: tuple[str, str]) -> dict[str, Any]:
    return {"paper_id": "arXiv:0001", "revision": revision,
            "mentions": [{"id": "a", "text": "Quorbex Net", "type": "method"},
                         {"id": "b", "text": "Vextral-10K", "type": "dataset"},
                         {"id": "c", "text": "Ilse Marwood", "type": "person"}],
            "relationships": [{"subject": rel[0], "predicate": "uses", "object": rel[1]}]}


@pytest.mark.parametrize("one_job", [False, True], ids=["two-jobs", "one-job"])
def test_a_new_revision_with_the_same_mentions_creates_nothing(
        tmp_path: Path, real_server: str, one_job: bool) -> None:
    """The server answers the new revision's batch (same paper, same mentions) with the first
    revision's reply, `created` included; ingest neither counts nor stores those as new, and
    stores the revision's mentions as the server decides them now (found, by their name)."""
    import json

    v1, v2 = tmp_path / "v1.jsonl", tmp_path / "v2.jsonl"
    v1.write_text(json.dumps(_revision("v1", ("a", "b"))) + "\n", encoding="utf-8")
    v2.write_text(json.dumps(_revision("v2", ("c", "a"))) + "\n", encoding="utf-8")
    db = tmp_path / "graph.duckdb"
    with GraphSink(db) as sink, IdentityClient(real_server, policy=POLICY) as client:
        jobs = [[v1, v2]] if one_job else [[v1], [v2]]
        summaries = [run_job(paths, sink=sink, resolver=client, options=JobOptions(concurrency=1))
                     for paths in jobs]
    assert sum(s.new_entities for s in summaries) == 3
    assert summaries[-1].changed == 1
    created = rows(db, "SELECT revision, count(*) FILTER (WHERE created) FROM mentions "
                       "GROUP BY revision ORDER BY revision")
    assert created == [("v1", 3), ("v2", 0)]
    kinds = rows(db, "SELECT revision, list(DISTINCT match_kind) FROM mentions "
                     "GROUP BY revision ORDER BY revision")
    assert kinds == [("v1", ["new"]), ("v2", ["exact"])]


def test_a_new_revision_replayed_after_a_merge_stores_live_ids_and_rejects_the_self_loop(
        tmp_path: Path, real_server: str) -> None:
    """After a merge, the first revision's replayed reply names the merged-away entity; the
    new revision's two mentions of the one entity now make a self-loop, rejected like any."""
    import json

    def revision(name: str, rel: tuple[str, str]) -> str:
        paper = _revision(name, rel)
        paper["mentions"][1] = {"id": "b", "text": "Quorbex Network", "type": "method"}
        return json.dumps(paper) + "\n"

    v1, v2 = tmp_path / "v1.jsonl", tmp_path / "v2.jsonl"
    v1.write_text(revision("v1", ("c", "b")), encoding="utf-8")
    v2.write_text(revision("v2", ("a", "b")), encoding="utf-8")
    db = tmp_path / "graph.duckdb"
    with GraphSink(db) as sink, IdentityClient(real_server, policy=POLICY,
                                               admin_token=TOKEN) as client:
        run_job([v1], sink=sink, resolver=client, options=JobOptions(concurrency=1))
        ids = dict(sink.query("SELECT mention_id, entity_id FROM mentions"))
        client.merge(ids["a"], ids["b"])
        summary = run_job([v2], sink=sink, resolver=client, options=JobOptions(concurrency=1))
    assert (summary.changed, summary.rejected_items) == (1, 1)
    assert rows(db, "SELECT mention_id, entity_id FROM mentions WHERE revision = 'v2' "
                    "ORDER BY mention_id") == [("a", ids["b"]), ("b", ids["b"]), ("c", ids["c"])]
    assert rows(db, "SELECT count(*) FROM relationships WHERE revision = 'v2'") == [(0,)]
    (reason,) = rows(db, "SELECT reason FROM rejects")[0]
    assert "self-loop" in reason and ids["b"] in reason


def _new_mention_revision(name: str) -> dict[str, Any]:
    paper = _revision(name, ("a", "b"))
    if name != "v1":
        paper["mentions"][1] = {"id": "b", "text": "Gamma Bench", "type": "dataset"}
    return paper


def test_a_revision_the_server_answered_before_the_job_died_is_stored_as_one_run_would(
        tmp_path: Path, real_server: str) -> None:
    """A job killed after the server answered a new revision's batch and before the paper was
    written: the rerun's batch is replayed, and it is this revision's own reply (what one
    uninterrupted run stored), not an earlier revision's, so it is stored as it is: the new
    mention created, and counted new (it was stored as found, by a lookup)."""
    import json

    v1, v2 = tmp_path / "v1.jsonl", tmp_path / "v2.jsonl"
    v1.write_text(json.dumps(_new_mention_revision("v1")) + "\n", encoding="utf-8")
    v2.write_text(json.dumps(_new_mention_revision("v2")) + "\n", encoding="utf-8")
    db = tmp_path / "graph.duckdb"
    with GraphSink(db) as sink, IdentityClient(real_server, policy=POLICY) as client:
        run_job([v1], sink=sink, resolver=client, options=JobOptions(concurrency=1))
        paper = _new_mention_revision("v2")
        answered = client.resolve_batch(  # what the killed job sent, and got, for v2
            paper["paper_id"], [(m["text"], m["type"]) for m in paper["mentions"]])
        assert [r.created for r in answered.outcomes] == [False, True, False]
        summary = run_job([v2], sink=sink, resolver=client, options=JobOptions(concurrency=1))
    assert (summary.changed, summary.new_entities) == (1, 1)
    assert rows(db, "SELECT mention_id, match_kind, created FROM mentions WHERE revision = 'v2' "
                    "ORDER BY mention_id") == [("a", "exact", False), ("b", "new", True),
                                               ("c", "exact", False)]


def test_the_embedded_jobs_worker_tells_the_revisions_replays_apart_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The same through the command line, whose embedded job resolves from a worker process:
    an earlier revision's replay is stored as found now, this revision's own as it is."""
    import json

    from identity_server.server import start_server
    from identity_server.settings import Settings

    monkeypatch.chdir(tmp_path)
    store = f"sqlite:///{tmp_path / 'identity.sqlite'}"
    for name, paper in (("v1", _new_mention_revision("v1")), ("v2", _new_mention_revision("v2")),
                        ("v3", {**_revision("v3", ("a", "c")),
                                "mentions": _new_mention_revision("v1")["mentions"]})):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(paper) + "\n", encoding="utf-8")
    argv = ["--db", "graph.duckdb", "--identity-db", store, "--no-progress"]
    assert main(["run", "v1.jsonl", *argv]) == 0
    running = start_server(Settings(db_url=store, port=0))  # the killed job's call for v2
    try:
        with IdentityClient(f"127.0.0.1:{running.port}", policy=POLICY) as client:
            paper = _new_mention_revision("v2")
            client.resolve_batch(paper["paper_id"],
                                 [(m["text"], m["type"]) for m in paper["mentions"]])
    finally:
        running.stop(grace=0.5)
    capsys.readouterr()
    assert main(["run", "v2.jsonl", *argv]) == 0
    assert "entities:          1 new" in capsys.readouterr().out
    assert main(["run", "v3.jsonl", *argv]) == 0  # v1's mentions again: v1's reply replayed
    assert "entities:          0 new" in capsys.readouterr().out
    assert rows(tmp_path / "graph.duckdb",
                "SELECT revision, mention_id, match_kind, created FROM mentions "
                "WHERE revision <> 'v1' ORDER BY 1, 2") == [
        ("v2", "a", "exact", False), ("v2", "b", "new", True), ("v2", "c", "exact", False),
        ("v3", "a", "exact", False), ("v3", "b", "exact", False), ("v3", "c", "exact", False)]


def test_a_mention_the_server_refuses_is_named_by_its_place_in_the_paper(
        tmp_path: Path, real_server: str) -> None:
    """The server names a refused item by its place in the batch; after a mention rejected by
    ingest itself those differ, so the reject must not carry the batch's number."""
    import json

    from ingest.models import Limits

    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"paper_id": "p1", "relationships": [], "mentions": [
        {"id": "a", "text": "", "type": "method"},
        {"id": "b", "text": "y" * 520, "type": "method"},
        {"id": "c", "text": "Quorbex", "type": "method"}]}) + "\n", encoding="utf-8")
    db = tmp_path / "graph.duckdb"
    with GraphSink(db) as sink, IdentityClient(real_server, policy=POLICY) as client:
        run_job([src], sink=sink, resolver=client,
                options=JobOptions(limits=Limits(max_mention_chars=600)))
    got = dict(rows(db, "SELECT item, reason FROM rejects"))
    assert set(got) == {"mentions[0]", "mentions[1]"}
    assert "520 code points long; the limit is 512" in got["mentions[1]"]
    assert "mention 0" not in got["mentions[1]"]


def test_a_paper_beyond_the_servers_batch_limit_is_resolved_in_parts(tmp_path: Path) -> None:
    """The real server names its limit in the refusal of a batch too large; ingest sends the
    paper in parts, in order, under the paper's context: a spelling first seen in one part is
    found by a later one, a mention the server refuses is named by its place in the paper (not
    in its part), and a rerun writes nothing."""
    import json

    from identity_server.server import start_server
    from identity_server.settings import Settings
    from ingest.models import Limits

    texts = ["Quorbex Net", "Ada Lovelace", "Vintorfield", "SQuAD", "Plemmar",
             "y" * 520, "quorbex net", "Drabnik", "Ada  Lovelace", "Sollux"]
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({
        "paper_id": "p1",
        "mentions": [{"id": f"m{i}", "text": t, "type": "method"} for i, t in enumerate(texts)],
        "relationships": [{"subject": "m0", "predicate": "uses", "object": "m9"},
                          {"subject": "m2", "predicate": "uses", "object": "m7"}]}) + "\n",
        encoding="utf-8")
    db = tmp_path / "graph.duckdb"
    running = start_server(Settings(db_url=f"sqlite:///{tmp_path / 'identity.sqlite'}", port=0,
                                    max_batch_size=4))
    try:
        address = f"127.0.0.1:{running.port}"
        for run in range(2):
            with GraphSink(db) as sink, IdentityClient(address, policy=POLICY) as client:
                summary = run_job([src], sink=sink, resolver=client,
                                  options=JobOptions(limits=Limits(max_mention_chars=600)))
            if run == 0:
                assert (summary.ingested, summary.rejected_lines) == (1, 0)
                assert summary.new_entities == 7
            else:
                assert (summary.ingested, summary.unchanged, summary.new_entities) == (0, 1, 0)
    finally:
        running.stop(grace=0.5)
    got = dict(rows(db, "SELECT item, reason FROM rejects"))
    assert list(got) == ["mentions[5]"]
    assert "520 code points long; the limit is 512" in got["mentions[5]"]
    assert "mention 1:" not in got["mentions[5]"] and "mention 5:" not in got["mentions[5]"]
    found = dict(rows(db, "SELECT mention_id, entity_id FROM mentions"))
    assert found["m6"] == found["m0"] and found["m8"] == found["m1"]  # across parts
    kinds = dict(rows(db, "SELECT mention_id, match_kind FROM mentions"))
    assert (kinds["m6"], kinds["m8"]) == ("case", "exact")
    assert rows(db, "SELECT count(*) FROM relationships") == [(2,)]


@pytest.mark.parametrize("list_all_from", [None, 1], ids=["one call an id", "by listing"])
def test_sync_brings_the_servers_names_into_the_entities_view(
        tmp_path: Path, real_server: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, list_all_from: int | None) -> None:
    """`ingest sync` stores the server's name, status and aliases of every entity the graph
    refers to; a later sync fetches again only the entities the change feed says changed.
    Many ids are read by listing the store's entities instead, with the same result."""
    if list_all_from is not None:
        monkeypatch.setattr(pipeline, "LIST_ALL_FROM", list_all_from)
    db = tmp_path / "graph.duckdb"
    assert main(["run", str(EXAMPLES / "papers.jsonl"), "--db", str(db), "--server",
                 real_server, "--no-progress"]) == 0
    assert rows(db, "SELECT count(*) FROM entities WHERE server_name IS NOT NULL") == [(0,)]
    assert main(["sync", "--db", str(db), "--server", real_server]) == 0
    entities = rows(db, "SELECT count(*) FROM entities")[0][0]
    assert f"names synced: {entities}" in capsys.readouterr().out
    assert rows(db, "SELECT count(*) FROM entities WHERE server_name IS NULL") == [(0,)]
    (target, spelling), = rows(
        db, "SELECT entity_id, name FROM entities WHERE status = 'provisional' "
            "ORDER BY mention_count DESC, entity_id LIMIT 1")
    with IdentityClient(real_server, policy=POLICY, admin_token=TOKEN) as client:
        before = client.get_entity(target)
        assert rows(db, f"SELECT server_name, status, aliases FROM entities "
                        f"WHERE entity_id = '{target}'") == [(before.name, "provisional", [])]
        client.add_alias(target, "Zq Alias Form")
        client.promote(target)
    assert main(["sync", "--db", str(db), "--server", real_server]) == 0
    assert "names synced: 1\n" in capsys.readouterr().out
    assert rows(db, f"SELECT server_name, status, aliases, name FROM entities "
                    f"WHERE entity_id = '{target}'") == [
        (before.name, "canonical", ["Zq Alias Form"], spelling)]


def test_redirects_record_when_the_server_merged_as_a_timestamp(
        tmp_path: Path, real_server: str) -> None:
    db = tmp_path / "graph.duckdb"
    assert main(["run", str(EXAMPLES / "papers.jsonl"), "--db", str(db), "--server",
                 real_server, "--no-progress"]) == 0
    (a,), (b,) = rows(db, "SELECT DISTINCT entity_id FROM mentions WHERE resolved_type = "
                          "'method' ORDER BY 1 LIMIT 2")
    with IdentityClient(real_server, policy=POLICY, admin_token=TOKEN) as client:
        client.merge(a, b)
        merged_at = next(c.recorded_at for c in client.list_changes() if c.kind == "merged")
    assert main(["sync", "--db", str(db), "--server", real_server]) == 0
    assert rows(db, "SELECT typeof(recorded_at), recorded_at FROM redirects") == [
        ("TIMESTAMP WITH TIME ZONE", merged_at)]
    assert rows(db, "SELECT typeof(recorded_at) FROM feed_anchor") == [
        ("TIMESTAMP WITH TIME ZONE",)]
