"""The ingest pipeline end to end against the stub identity server and real DuckDB files."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from identity_client import IdentityClient, IdentityError, RetryPolicy, ServerUnavailable
from ingest.cli import main
from ingest.models import Limits
from ingest.pipeline import JobError, JobOptions, Summary, run_job, sync_redirects
from ingest.sink import GraphSink
from ingest.testing import StubServer, serve_stub, stub_entity_id, synthetic_papers
from tests.integration.ingest.conftest import rows

FAST = RetryPolicy(deadline_seconds=5.0, budget_seconds=20.0, initial_backoff=0.01,
                   max_backoff=0.1)


def ingest(paths: list[Path], db: Path, address: str, *, policy: RetryPolicy = FAST,
           **options: Any) -> tuple[Summary, int]:
    with GraphSink(db) as sink, IdentityClient(address, policy=policy) as client:
        summary = run_job(paths, sink=sink, resolver=client, options=JobOptions(**options))
        sync_redirects(client, sink)
        return summary, client.retries


def small_paper(paper_id: str = "p1", revision: str | None = None,
                rels: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    p: dict[str, Any] = {
        "paper_id": paper_id,
        "mentions": [{"id": "m1", "text": "BERT", "type": "method"},
                     {"id": "m2", "text": "SQuAD", "type": "dataset"},
                     {"id": "m3", "text": "Jacob Devlin", "type": "person"}],
        "relationships": rels if rels is not None else [
            {"subject": "m1", "predicate": "evaluated on", "object": "m2", "confidence": 0.9},
            {"subject": "m1", "predicate": "authored by", "object": "m3"},
            {"subject": "m2", "predicate": "is used by", "object": "m1"},
        ],
    }
    if revision is not None:
        p["revision"] = revision
    return p


def test_batch_ingested_twice_has_identical_tables(
        tmp_path: Path, stub: StubServer, jsonl: Callable[..., Path],
        snapshot: Callable[..., Any]) -> None:
    papers = list(synthetic_papers(60, mentions_per_paper=8, relationships_per_paper=5, seed=3))
    corpus = jsonl(tmp_path / "in.jsonl",
                   [*papers,
                    "{not json", {"paper_id": "bad", "mentions": "x", "relationships": []},
                    small_paper("p-bad", rels=[{"subject": "m1", "predicate": "uses",
                                                "object": "m1"}])])
    # Two mentions of one entity (the stub: same type and casefolded text) joined by an edge:
    # stored by id that is a self-loop, rejected like one between a mention and itself.
    same_entity = sum(
        1 for p in papers
        for r in p["relationships"]
        if len({stub_entity_id(m["type"], m["text"]) for m in p["mentions"]
                if m["id"] in (r["subject"], r["object"])}) == 1)
    assert same_entity > 0
    db = tmp_path / "g.duckdb"
    first, _ = ingest([corpus], db, stub.address, concurrency=4, group_papers=7)
    before = snapshot(db, wall_clock=True)
    second, _ = ingest([corpus], db, stub.address, concurrency=4, group_papers=7)
    assert snapshot(db, wall_clock=True) == before
    assert (first.ingested, first.unchanged, first.rejected_lines, first.rejected_items) == (
        61, 0, 2, 1 + same_entity)
    assert (second.ingested, second.unchanged) == (0, 61)
    # The rerun counts the bad lines apart, as it counts the unchanged papers apart.
    assert (second.rejected_lines, second.lines_rejected_before, second.rejected_items) == (
        0, 2, 0)
    assert "0 lines; 2 lines rejected as in an earlier run" in "\n".join(second.lines())
    assert len(before["papers"]) == 61 and len(before["rejects"]) == 3 + same_entity
    assert len(before["relationships"]) == 60 * 5 - same_entity


def test_concurrency_does_not_change_what_is_stored(
        tmp_path: Path, jsonl: Callable[..., Path], snapshot: Callable[..., Any]) -> None:
    corpus = jsonl(tmp_path / "in.jsonl", synthetic_papers(40, mentions_per_paper=6,
                                                           relationships_per_paper=4, seed=5))
    results = []
    for concurrency in (1, 8):
        with serve_stub() as fresh:
            db = tmp_path / f"c{concurrency}.duckdb"
            ingest([corpus], db, fresh.address, concurrency=concurrency)
            # Ids do not depend on order; who saw a name first (match kind, counts) may.
            results.append((
                rows(db, "SELECT paper_id, mention_id, entity_id FROM mentions ORDER BY ALL"),
                snapshot(db)["relationships"]))
    assert results[0] == results[1]
    assert len(results[0][0]) == 40 * 6


def test_changed_paper_closes_old_relationships_and_adds_new(
        tmp_path: Path, stub: StubServer, jsonl: Callable[..., Path],
        snapshot: Callable[..., Any]) -> None:
    v1 = jsonl(tmp_path / "v1.jsonl", [small_paper(revision="v1"), small_paper("p2")])
    rels_v2: list[dict[str, Any]] = [{"subject": "m1", "predicate": "evaluated on", "object": "m2", "confidence": 0.9},
               {"subject": "m3", "predicate": "works at", "object": "m2"}]
    v2 = jsonl(tmp_path / "v2.jsonl", [small_paper(revision="v2", rels=rels_v2)])
    db = tmp_path / "g.duckdb"
    ingest([v1], db, stub.address)
    summary, _ = ingest([v2], db, stub.address)
    assert (summary.ingested, summary.changed) == (1, 1)
    rels = rows(db, "SELECT revision, predicate, valid_to IS NOT NULL, closed_in_revision "
                    "FROM relationships WHERE paper_id = 'p1' ORDER BY revision, predicate")
    assert rels == [
        ("v1", "authored_by", True, "v2"),
        ("v1", "evaluated_on", True, "v2"),
        ("v1", "uses", True, "v2"),
        ("v2", "affiliated_with", False, None),
        ("v2", "evaluated_on", False, None),
    ]
    assert rows(db, "SELECT revision, is_current FROM papers WHERE paper_id = 'p1' "
                    "ORDER BY revision") == [("v1", False), ("v2", True)]
    assert rows(db, "SELECT revision, count(*) FILTER (WHERE is_current), count(*) "
                    "FROM mentions WHERE paper_id = 'p1' GROUP BY revision ORDER BY revision") == [
        ("v1", 0, 3), ("v2", 3, 3)]
    # p2 is untouched; the edge view shows only open edges.
    assert rows(db, "SELECT count(*) FROM graph_edges WHERE paper_id = 'p2'") == [(3,)]
    assert rows(db, "SELECT count(*) FROM graph_edges WHERE paper_id = 'p1'") == [(2,)]
    # Rerunning either delivery changes nothing: an old revision is never re-applied.
    before = snapshot(db, wall_clock=True)
    ingest([v1], db, stub.address)
    ingest([v2], db, stub.address)
    ingest([v1, v2], db, stub.address)
    assert snapshot(db, wall_clock=True) == before


def test_two_revisions_in_one_job_close_in_the_same_transaction(
        tmp_path: Path, stub: StubServer, jsonl: Callable[..., Path]) -> None:
    corpus = jsonl(tmp_path / "in.jsonl", [small_paper(revision="v1"),
                                           small_paper(revision="v2", rels=[])])
    db = tmp_path / "g.duckdb"
    ingest([corpus], db, stub.address, concurrency=1)
    assert rows(db, "SELECT revision, is_current FROM papers ORDER BY revision") == [
        ("v1", False), ("v2", True)]
    assert rows(db, "SELECT count(*) FROM relationships WHERE valid_to IS NULL") == [(0,)]
    assert rows(db, "SELECT DISTINCT closed_in_revision FROM relationships") == [("v2",)]


def test_each_kind_of_bad_input_is_rejected_and_the_rest_stored(
        tmp_path: Path, stub: StubServer, jsonl: Callable[..., Path]) -> None:
    good_rel: dict[str, Any] = {"subject": "m1", "predicate": "uses", "object": "m2"}
    bad_rels: list[dict[str, Any]] = [
        {"subject": "m1", "predicate": "uses", "object": "m7"},
        {"subject": "m2", "predicate": "uses", "object": "m2"},
        {"subject": "m1", "predicate": "uses", "object": "m3", "confidence": float("nan")},
        {"subject": "m1", "predicate": "uses", "object": "m3", "confidence": 2},
        {"subject": "m1", "predicate": "uses", "object": "m3", "confidence": "0.5"},
        {"subject": "m1", "object": "m3"},
        {"subject": "m3", "predicate": "uses", "object": "m1",
         "evidence": {"quote": "q" * 70_000}},
        {"subject": "m1", "predicate": "uses", "object": "m9"},  # m9 is BERT again
    ]
    paper = small_paper(rels=[good_rel, *bad_rels])
    paper["mentions"] += [{"id": "m4", "text": "x" * 600, "type": "method"},
                          {"id": "m5", "type": "method"},
                          {"id": "m6", "text": ["BERT"], "type": "method"},
                          {"id": "m8", "text": "y" * 520, "type": "method"},
                          {"id": "m9", "text": "bert", "type": "method"},
                          {"id": "m10", "text": "Z", "type": "method", "span": [0, 2**63]}]
    not_a_list = {"paper_id": "p9", "mentions": {"m1": "BERT"}, "relationships": []}
    corpus = jsonl(tmp_path / "in.jsonl", [
        "this is not json",
        paper,
        not_a_list,
        {"mentions": [], "relationships": []},
        '{"paper_id": "huge", "mentions": [], "relationships": [], "pad": "' + "z" * 200_000 + '"}',
        '{"paper_id": "deep", "mentions": [], "relationships": [], "x": '
        + "[" * 5000 + "]" * 5000 + "}",
        not_a_list,  # the same bad line again: its own reject row
    ])
    db = tmp_path / "g.duckdb"
    with GraphSink(db) as sink, IdentityClient(stub.address, policy=FAST) as client:
        summary = run_job([corpus], sink=sink, resolver=client, options=JobOptions(
            limits=Limits(max_line_bytes=100_000, max_mention_chars=550)))
    got = rows(db, "SELECT position, item, reason FROM rejects ORDER BY position, item")
    where = {(pos.rsplit(":", 1)[1], item): reason for pos, item, reason in got}
    expected = {
        ("1", ""): "not valid JSON",
        ("2", "mentions[3]"): "600 characters long, more than the cap of 550",
        ("2", "mentions[4]"): "text: required field is missing",
        ("2", "mentions[5]"): "text: Input should be a valid string (got list)",
        ("2", "mentions[6]"): "identity server refused the mention: INVALID_ARGUMENT",
        ("2", "relationships[1]"): "'m7' is not a mention id of this paper",
        ("2", "relationships[2]"): "self-loop",
        ("2", "relationships[3]"): "finite",
        ("2", "relationships[4]"): "between 0 and 1, got 2",
        ("2", "relationships[5]"): "valid number (got str)",
        ("2", "relationships[6]"): "predicate: required field is missing",
        ("2", "relationships[7]"): "more than the cap of 65536",
        ("2", "relationships[8]"): "'m1' and object 'm9' resolve to the same entity",
        ("2", "mentions[8]"): "span offsets must be at most 9223372036854775807",
        ("3", ""): "paper.mentions: Input should be a valid list (got dict)",
        ("4", ""): "paper.paper_id: required field is missing",
        ("5", ""): "more than the cap of 100000 bytes",
        ("6", ""): "nests JSON too deeply",
        ("7", ""): "paper.mentions: Input should be a valid list (got dict)",
    }
    assert set(where) == set(expected)
    for key, fragment in expected.items():
        assert fragment in where[key], (key, where[key])
    # The rest of the paper is stored.
    assert rows(db, "SELECT mention_id FROM mentions ORDER BY mention_id") == [
        ("m1",), ("m2",), ("m3",), ("m9",)]
    assert rows(db, "SELECT subject_mention_id, object_mention_id FROM relationships") == [
        ("m1", "m2")]
    assert rows(db, "SELECT counts.rejects FROM papers") == [(13,)]
    assert (summary.rejected_items, summary.rejected_lines, summary.ingested) == (13, 6, 1)
    assert len(got) == 13 + 6  # every rejected item and line has its row


def test_unavailable_server_is_retried(
        tmp_path: Path, stub: StubServer, jsonl: Callable[..., Path],
        snapshot: Callable[..., Any], caplog: pytest.LogCaptureFixture) -> None:
    corpus = jsonl(tmp_path / "in.jsonl", synthetic_papers(20, mentions_per_paper=5,
                                                           relationships_per_paper=3, seed=9))
    stub.servicer.fail_next(6)
    with caplog.at_level(logging.DEBUG, logger="identity_client"):
        summary, retries = ingest([corpus], tmp_path / "g.duckdb", stub.address, concurrency=1)
    assert retries == 6
    assert summary.ingested == 20
    retried = [r for r in caplog.records if "retry_in" in r.getMessage()]
    assert [r.levelno for r in retried] == [logging.WARNING] + [logging.DEBUG] * 5  # one line
    with serve_stub() as clean:
        ingest([corpus], tmp_path / "clean.duckdb", clean.address, concurrency=1)
    assert snapshot(tmp_path / "g.duckdb") == snapshot(tmp_path / "clean.duckdb")


def test_calls_the_server_cancels_are_retried_and_those_the_job_cancels_are_not(
        tmp_path: Path, stub: StubServer, jsonl: Callable[..., Path],
        snapshot: Callable[..., Any]) -> None:
    """A server that stops cancels the calls still running when its grace period ends: the
    client sees CANCELLED, and a restart must cost time, not the job. A call the job cancels
    itself (interrupted) is not retried."""
    corpus = jsonl(tmp_path / "in.jsonl", synthetic_papers(10, mentions_per_paper=5,
                                                           relationships_per_paper=3, seed=5))
    stub.servicer.fail_next(3, grpc.StatusCode.CANCELLED)
    summary, retries = ingest([corpus], tmp_path / "g.duckdb", stub.address, concurrency=1)
    assert (retries, summary.ingested) == (3, 10)
    with serve_stub() as clean:
        ingest([corpus], tmp_path / "clean.duckdb", clean.address, concurrency=1)
    assert snapshot(tmp_path / "g.duckdb") == snapshot(tmp_path / "clean.duckdb")

    stub.servicer.delay_seconds = 5.0
    with IdentityClient(stub.address, policy=FAST) as client:
        threading.Timer(0.3, client.abort).start()
        started = time.monotonic()
        with pytest.raises(IdentityError) as stopped:
            client.resolve_batch("p-abort", [("BERT", "method")])
        assert stopped.value.code == "CANCELLED" and client.retries == 0
        assert time.monotonic() - started < 4.0


def test_slow_replies_hit_the_deadline_and_are_retried_without_double_counting(
        tmp_path: Path, stub: StubServer, jsonl: Callable[..., Path],
        snapshot: Callable[..., Any]) -> None:
    corpus = jsonl(tmp_path / "in.jsonl", synthetic_papers(10, mentions_per_paper=5,
                                                           relationships_per_paper=3, seed=2))
    stub.servicer.slow_next(2, 0.6)
    policy = RetryPolicy(deadline_seconds=0.25, budget_seconds=20, initial_backoff=0.3,
                         max_backoff=0.6)
    summary, retries = ingest([corpus], tmp_path / "g.duckdb", stub.address, policy=policy,
                              concurrency=1)
    assert retries >= 1
    assert summary.ingested == 10
    with serve_stub() as clean:
        ingest([corpus], tmp_path / "clean.duckdb", clean.address, concurrency=1)
    assert snapshot(tmp_path / "g.duckdb") == snapshot(tmp_path / "clean.duckdb")


def test_server_restart_mid_job_costs_time_not_data(
        tmp_path: Path, jsonl: Callable[..., Path]) -> None:
    corpus = jsonl(tmp_path / "in.jsonl", synthetic_papers(30, mentions_per_paper=5,
                                                           relationships_per_paper=3, seed=4))
    first = serve_stub()
    port = first.port
    first.servicer.delay_seconds = 0.05
    db = tmp_path / "g.duckdb"
    restarted: list[StubServer] = []

    def restart() -> None:
        first.stop()
        threading.Event().wait(0.5)
        restarted.append(serve_stub(port=port))

    timer = threading.Timer(0.2, restart)
    timer.start()
    try:
        summary, retries = ingest([corpus], db, f"127.0.0.1:{port}", concurrency=2)
    finally:
        timer.join()
        for s in restarted:
            s.stop()
    assert summary.ingested == 30
    assert retries >= 1
    assert rows(db, "SELECT count(*) FROM papers") == [(30,)]
    # The stub forgets everything on restart, but its ids are predictable: same edges.
    with serve_stub() as clean:
        ingest([corpus], tmp_path / "clean.duckdb", clean.address, concurrency=2)
    edges = "SELECT relationship_id, subject_id, predicate, object_id FROM relationships ORDER BY 1"
    assert rows(db, edges) == rows(tmp_path / "clean.duckdb", edges)


def test_server_gone_for_good_fails_the_job_and_keeps_what_was_written(
        tmp_path: Path, jsonl: Callable[..., Path]) -> None:
    corpus = jsonl(tmp_path / "in.jsonl", synthetic_papers(3, mentions_per_paper=3,
                                                           relationships_per_paper=1))
    with serve_stub() as gone:
        address = gone.address
    policy = RetryPolicy(deadline_seconds=0.2, budget_seconds=0.5, initial_backoff=0.05)
    with (GraphSink(tmp_path / "g.duckdb") as sink, IdentityClient(address, policy=policy) as c,
          pytest.raises(JobError, match="UNAVAILABLE")):
        run_job([corpus], sink=sink, resolver=c)


def test_non_retryable_error_rejects_the_paper_only(
        tmp_path: Path, stub: StubServer, jsonl: Callable[..., Path]) -> None:
    corpus = jsonl(tmp_path / "in.jsonl", [small_paper("p1"), small_paper("p2")])
    stub.servicer.fail_next(1, grpc.StatusCode.INVALID_ARGUMENT)
    summary, _ = ingest([corpus], tmp_path / "g.duckdb", stub.address, concurrency=1)
    assert summary.ingested == 1 and summary.rejected_lines == 1
    assert "identity server refused the paper" in rows(
        tmp_path / "g.duckdb", "SELECT reason FROM rejects")[0][0]
    # Run again with the server well: the paper is stored and its reject is gone, as in one
    # clean run.
    again, _ = ingest([corpus], tmp_path / "g.duckdb", stub.address, concurrency=1)
    assert (again.ingested, again.unchanged, again.rejected_lines) == (1, 1, 0)
    assert rows(tmp_path / "g.duckdb", "SELECT count(*) FROM rejects") == [(0,)]


def test_merge_on_the_server_shows_through_the_views_after_sync(
        tmp_path: Path, stub: StubServer, jsonl: Callable[..., Path]) -> None:
    corpus = jsonl(tmp_path / "in.jsonl", [small_paper("p1")])
    db = tmp_path / "g.duckdb"
    ingest([corpus], db, stub.address)
    bert = stub_entity_id("method", "BERT")
    squad = stub_entity_id("dataset", "SQuAD")
    with IdentityClient(stub.address, policy=FAST) as client:
        # A chain: BERT -> X -> Y must read as BERT -> Y after sync.
        x = client.resolve("Bert Large", "method").entity_id
        y = client.resolve("BERT family", "method").entity_id
        client.merge(bert, x)
        client.merge(x, y)
    # Before sync, edges still show the stored ids.
    assert rows(db, "SELECT DISTINCT subject_id FROM graph_edges WHERE predicate = "
                    "'evaluated_on'") == [(bert,)]
    with GraphSink(db) as sink, IdentityClient(stub.address, policy=FAST) as client:
        result = sync_redirects(client, sink)
        assert result.merges == 2
        again = sync_redirects(client, sink)
        assert again.merges == 0 and again.last_sequence == result.last_sequence
    assert rows(db, "SELECT from_id, to_id FROM redirects ORDER BY from_id") == sorted(
        [(bert, y), (x, y)])
    assert rows(db, "SELECT subject_id, object_id FROM graph_edges WHERE predicate = "
                    "'evaluated_on'") == [(y, squad)]
    assert rows(db, "SELECT subject_id FROM relationships WHERE predicate = 'evaluated_on'") == [
        (bert,)]  # stored edges are never rewritten
    assert rows(db, "SELECT resolved_id FROM mentions_resolved WHERE mention_id = 'm1'") == [(y,)]
    assert (y,) in rows(db, "SELECT entity_id FROM entities")


def test_an_edge_whose_ends_a_merge_joined_leaves_the_current_graph(
        tmp_path: Path, stub: StubServer, jsonl: Callable[..., Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    paper = {"paper_id": "p1",
             "mentions": [{"id": "m1", "text": "BERT-base", "type": "method"},
                          {"id": "m2", "text": "BERT", "type": "method"},
                          {"id": "m3", "text": "SQuAD", "type": "dataset"}],
             "relationships": [{"subject": "m1", "predicate": "extends", "object": "m2"},
                               {"subject": "m1", "predicate": "evaluated on", "object": "m3"}]}
    db = tmp_path / "g.duckdb"
    ingest([jsonl(tmp_path / "in.jsonl", [paper])], db, stub.address)
    base, bert = stub_entity_id("method", "BERT-base"), stub_entity_id("method", "BERT")
    squad = stub_entity_id("dataset", "SQuAD")
    edges = "SELECT subject_id, predicate, object_id FROM graph_edges ORDER BY predicate"
    assert rows(db, edges) == [(base, "evaluated_on", squad), (base, "extends", bert)]
    with IdentityClient(stub.address, policy=FAST) as client:
        client.merge(base, bert)  # a curator: BERT-base is BERT
    with GraphSink(db) as sink, IdentityClient(stub.address, policy=FAST) as client:
        assert sync_redirects(client, sink).merges == 1
    # "BERT extends BERT" is no edge (ingest rejects a self-loop); the other edge follows the
    # merge, and the stored row is kept as it was, visible resolved.
    assert rows(db, edges) == [(bert, "evaluated_on", squad)]
    assert rows(db, "SELECT subject_id, object_id FROM relationships WHERE predicate = "
                    "'extends'") == [(base, bert)]
    assert rows(db, "SELECT resolved_subject_id, resolved_object_id, valid_to IS NULL FROM "
                    "relationships_resolved WHERE predicate = 'extends'") == [(bert, bert, True)]
    assert main(["stats", "--db", str(db)]) == 0
    assert ("relationships:   2 open (1 in graph_edges: not those a merge made self-loops), "
            "0 closed") in capsys.readouterr().out


def test_memory_does_not_grow_with_the_batch(
        tmp_path: Path, jsonl: Callable[..., Path]) -> None:
    import subprocess
    import sys
    import tracemalloc

    # The stub keeps every reply, so it runs in its own process: only the client is measured.
    server = subprocess.Popen([sys.executable, "-m", "ingest.testing"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None
        address = server.stdout.readline().strip()

        def peak(n: int) -> int:
            corpus = jsonl(tmp_path / f"in{n}.jsonl", synthetic_papers(
                n, mentions_per_paper=6, relationships_per_paper=4, seed=n))
            tracemalloc.start()
            try:
                summary, _ = ingest([corpus], tmp_path / f"g{n}.duckdb", address,
                                    concurrency=2, chunk_lines=32, group_papers=40)
                assert summary.ingested == n
                return tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()

        small, large = peak(150), peak(900)
    finally:
        server.terminate()
        server.wait(timeout=10)
        if server.stdout is not None:
            server.stdout.close()
    assert large < small * 1.5, (small, large)


def test_a_server_that_refuses_every_call_fails_the_job(
        tmp_path: Path, stub: StubServer, jsonl: Callable[..., Path]) -> None:
    corpus = jsonl(tmp_path / "in.jsonl", [small_paper("p1"), small_paper("p2")])
    stub.servicer.fail_next(1, grpc.StatusCode.UNAUTHENTICATED)
    with (GraphSink(tmp_path / "g.duckdb") as sink,
          IdentityClient(stub.address, policy=FAST) as client,
          pytest.raises(JobError, match="UNAUTHENTICATED")):
        run_job([corpus], sink=sink, resolver=client, options=JobOptions(concurrency=1))


def test_the_entities_view_names_an_entity_by_its_most_frequent_spelling_ties_in_sort_order(
        tmp_path: Path, stub: StubServer, jsonl: Callable[..., Path]) -> None:
    """The same data gives the same `entities` rows: the most frequent spelling and type, a tie
    going to the first in sort order (not whichever the engine met first)."""
    def paper(pid: str, *texts: str) -> dict[str, Any]:
        return {"paper_id": pid, "relationships": [], "mentions": [
            {"id": f"m{i}", "text": t, "type": "method"} for i, t in enumerate(texts)]}

    # Ten entities, each seen once as "Model-N Net" and once as "model-n net", in both orders.
    upper = [f"Model-{n} Net" for n in range(10)]
    lower = [u.lower() for u in upper]
    first = [u if n % 2 else lo for n, (u, lo) in enumerate(zip(upper, lower, strict=True))]
    second = [lo if n % 2 else u for n, (u, lo) in enumerate(zip(upper, lower, strict=True))]
    corpus = jsonl(tmp_path / "in.jsonl", [
        paper("p1", *first, "SQuAD"), paper("p2", *second, "squad"), paper("p3", "squad")])
    db = tmp_path / "g.duckdb"
    ingest([corpus], db, stub.address)
    assert rows(db, "SELECT name, entity_type, mention_count, paper_count, spellings "
                    "FROM entities ORDER BY name") == [
        *((u, "method", 2, 2, [u, u.lower()]) for u in upper),
        ("squad", "method", 3, 3, ["SQuAD", "squad"]),
    ]


def test_calls_in_flight_share_one_outage_budget(tmp_path: Path) -> None:
    """Calls that start failing one after another give up together when the server has been
    unreachable for the budget, not each a budget after its own first failure (papers in flight
    used to keep a job retrying for about twice the budget)."""
    with serve_stub() as gone:
        address = gone.address
    policy = RetryPolicy(deadline_seconds=0.2, budget_seconds=1.0, initial_backoff=0.05,
                         max_backoff=0.1)
    gave_up: list[float] = []
    with IdentityClient(address, policy=policy) as client:
        started = time.monotonic()

        def call(delay: float) -> None:
            time.sleep(delay)
            with pytest.raises(ServerUnavailable, match="retry budget of 1 s"):
                client.resolve("BERT", "method")
            gave_up.append(time.monotonic() - started)

        callers = [threading.Thread(target=call, args=(d,)) for d in (0.0, 0.4, 0.8)]
        for t in callers:
            t.start()
        for t in callers:
            t.join(timeout=30)
    assert len(gave_up) == 3
    # Each its own budget would end the last near 1.8 s; one shared outage ends all near 1 s.
    assert max(gave_up) < 1.6, gave_up


def test_callers_keep_resolving_while_a_group_is_written(
        tmp_path: Path, stub: StubServer, jsonl: Callable[..., Path]) -> None:
    """The papers read ahead of the writer are a chunk more than the calls in flight: while the
    writer writes a group (or parses the next chunk), the callers still have papers to send, so
    the server is not left idle, and the read-ahead stays bounded. Before, only the calls in
    flight (4 per caller, 16 at least) were queued, and the callers stopped after those."""
    chunk = 64
    corpus = jsonl(tmp_path / "in.jsonl", synthetic_papers(
        300, mentions_per_paper=3, relationships_per_paper=1, seed=11))
    calls = 0
    written = 0
    most_ahead = 0
    during_first_write: list[int] = []
    lock = threading.Condition()

    class CountingClient(IdentityClient):
        def resolve_batch(self, *args: Any, **kwargs: Any) -> Any:
            nonlocal calls, most_ahead
            with lock:
                calls += 1
                most_ahead = max(most_ahead, calls - written)
                lock.notify_all()
            return super().resolve_batch(*args, **kwargs)

    class SlowFirstWrite(GraphSink):
        def write(self, items: Any) -> Any:
            nonlocal written
            with lock:
                if not during_first_write:
                    before = calls
                    # Holds the writer until the callers have sent 40 more papers (or 10 s).
                    lock.wait_for(lambda: calls >= before + 40, timeout=10)
                    during_first_write.append(calls - before)
            outcome = super().write(items)
            with lock:
                written += len(items)
            return outcome

    with SlowFirstWrite(tmp_path / "g.duckdb") as sink, \
            CountingClient(stub.address, policy=FAST) as client:
        summary = run_job([corpus], sink=sink, resolver=client, options=JobOptions(
            concurrency=1, chunk_lines=chunk, group_papers=20))
    assert summary.ingested == 300
    assert during_first_write[0] >= 40, during_first_write
    # Bounded: the read-ahead (a chunk, the calls in flight, the one just sent) and a group.
    assert most_ahead <= chunk + 16 + 1 + 20, most_ahead


def test_a_paper_beyond_the_servers_batch_limit_goes_in_parts(tmp_path: Path,
                                                                jsonl: Callable[..., Path]) -> None:
    """A server that takes fewer mentions in one ResolveBatch than a paper has says its limit
    in the refusal's trailing metadata; the client sends the paper in parts of that size, in
    order, under the paper's context, and the paper is stored whole (before: rejected whole).
    A refusal that names no limit is not split."""
    mentions = [{"id": f"m{i}", "text": f"Quorbex {i}", "type": "method"} for i in range(8)]
    paper = {"paper_id": "p1", "mentions": mentions, "relationships": [
        {"subject": "m0", "predicate": "uses", "object": "m7"},
        {"subject": "m3", "predicate": "uses", "object": "m4"}]}
    corpus = jsonl(tmp_path / "in.jsonl", [paper])
    db = tmp_path / "g.duckdb"
    with serve_stub(max_batch=3) as stub:
        summary, _ = ingest([corpus], db, stub.address, concurrency=1)
        assert (summary.ingested, summary.rejected_lines, summary.rejected_items) == (1, 0, 0)
        assert stub.servicer.calls["ResolveBatch"] == 1 + 3  # refused whole, then 3 + 3 + 2
        assert rows(db, "SELECT mention_id, entity_id FROM mentions ORDER BY mention_id") == [
            (f"m{i}", stub_entity_id("method", f"Quorbex {i}")) for i in range(8)]
        assert rows(db, "SELECT count(*) FROM relationships") == [(2,)]
        again, _ = ingest([corpus], db, stub.address, concurrency=1)
        assert (again.ingested, again.unchanged) == (0, 1)

        with IdentityClient(stub.address, policy=FAST) as client:
            texts = [(m["text"], "method") for m in mentions]
            parts = client.resolve_batch("p2", texts)
            assert not parts.replayed
            assert client.resolve_batch("p2", texts).replayed  # every part replayed
            stub.servicer.fail_next(1, grpc.StatusCode.INVALID_ARGUMENT)
            before = stub.servicer.calls["ResolveBatch"]
            with pytest.raises(IdentityError) as refused:
                client.resolve_batch("p3", texts)
            assert refused.value.batch_limit is None
            assert stub.servicer.calls["ResolveBatch"] == before + 1
