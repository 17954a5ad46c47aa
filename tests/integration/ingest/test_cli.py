"""The `ingest` command line: run / sync / stats, exit codes, and a job killed with SIGKILL."""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ingest.cli import main
from ingest.testing import StubServer, serve_stub, synthetic_papers
from tests.conftest import WITH_SIGINT, signal_a_thread_other_than_main

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"


def test_run_examples_against_the_stub_then_stats_and_sync(
        tmp_path: Path, stub: StubServer, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "graph.duckdb"
    code = main(["run", str(EXAMPLES), "--db", str(db), "--server", stub.address,
                 "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    assert "papers ingested:   205 (5 changed revisions)" in out
    assert "see table rejects" in out
    assert "papers/s" in out
    assert main(["stats", "--db", str(db)]) == 0
    stats = capsys.readouterr().out
    assert "papers:          200 (205 revisions)" in stats
    assert "top 10 entities" in stats
    assert main(["sync", "--db", str(db), "--server", stub.address]) == 0
    assert "new merges:   0" in capsys.readouterr().out
    # Rerun: nothing new.
    assert main(["run", str(EXAMPLES), "--db", str(db), "--server", stub.address,
                 "--no-progress"]) == 0
    assert "papers ingested:   0" in capsys.readouterr().out


def test_progress_goes_to_a_log_as_lines_when_stderr_is_not_a_terminal(
        tmp_path: Path, stub: StubServer, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import ingest.cli

    monkeypatch.setattr(ingest.cli, "LOG_PROGRESS_EVERY_S", 0.0)
    assert main(["run", str(EXAMPLES / "papers.jsonl"), "--db", str(tmp_path / "g.duckdb"),
                 "--server", stub.address]) == 0
    err = capsys.readouterr().err
    assert "ingest: 202 of 202 lines done" in err  # 200 papers and 2 bad lines
    assert "\r" not in err  # no progress bar redrawn in a log


def test_unreachable_server_exits_non_zero(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    with serve_stub() as gone:
        address = gone.address
    monkeypatch.setenv("INGEST_RETRY_BUDGET_SECONDS", "0.3")
    monkeypatch.setenv("INGEST_DEADLINE_SECONDS", "0.2")
    code = main(["run", str(EXAMPLES / "papers.jsonl"), "--db", str(tmp_path / "g.duckdb"),
                 "--server", address, "--no-progress"])
    assert code == 1
    err = capsys.readouterr().err
    assert "UNAVAILABLE" in err
    # a plaintext call to a TLS server fails just so: the message says what to check
    assert f"is the identity server at {address} running and serving without TLS?" in err
    assert "hint: a server run with TLS needs --tls-ca" in err


def test_missing_input_exits_non_zero(tmp_path: Path, stub: StubServer,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(tmp_path / "nope.jsonl"), "--db", str(tmp_path / "g.duckdb"),
                 "--server", stub.address, "--no-progress"])
    assert code == 1
    assert "does not exist" in capsys.readouterr().err


def test_db_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["stats"])
    assert exc.value.code == 2
    assert "usage: ingest stats" in capsys.readouterr().err  # the command's usage, its options


@pytest.mark.parametrize(("argv", "says"), [
    (["run", "p.jsonl", "--db", "g.duckdb", "--concurency", "2"],
     "ingest run: error: unrecognized arguments: --concurency 2"),
    (["run", "-v", "p.jsonl", "--db", "g.duckdb"],
     "unrecognized arguments: -v (-v is an option of ingest itself: give it before the command)"),
])
def test_a_usage_mistake_is_reported_with_the_commands_usage(
        argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert says in err
    assert err.startswith("usage: ingest run ") and "--concurrency CONCURRENCY" in err


def _cli(corpus: Path, db: Path, address: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "INGEST_GROUP_PAPERS": "10"}
    with (db.parent / f"{db.stem}.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "ingest.cli", "run", str(corpus), "--db", str(db),
             "--server", address, "--concurrency", "1", "--no-progress"],
            env=env, stdout=subprocess.DEVNULL, stderr=log)


def _log(db: Path) -> str:
    return (db.parent / f"{db.stem}.log").read_text(errors="replace")


@pytest.mark.slow
def test_job_killed_with_sigkill_and_rerun_equals_one_clean_run(
        tmp_path: Path, jsonl: Callable[..., Path], snapshot: Callable[..., Any],
        kill_at: Callable[[subprocess.Popen[Any], float], bool]) -> None:
    papers: list[Any] = list(synthetic_papers(700, mentions_per_paper=8,
                                              relationships_per_paper=5, seed=11))
    papers.insert(300, "{broken")
    papers[400]["relationships"].append({"subject": "m0", "predicate": "uses", "object": "m0"})
    revised = dict(papers[100], revision="v2", relationships=papers[100]["relationships"][2:])
    papers.append(revised)  # a changed paper late in the same job
    corpus = jsonl(tmp_path / "corpus.jsonl", papers)

    with serve_stub() as clean_stub:
        started = time.monotonic()
        clean = _cli(corpus, tmp_path / "clean.duckdb", clean_stub.address)
        assert clean.wait(timeout=120) == 0, _log(tmp_path / "clean.duckdb")
        duration = time.monotonic() - started
    expected = snapshot(tmp_path / "clean.duckdb")
    assert len(expected["papers"]) == 701

    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    for attempt in range(5):  # a job may end before the kill (a fast run): try earlier
        db = tmp_path / f"killed{attempt}.duckdb"
        with serve_stub() as stub:
            proc = _cli(corpus, db, stub.address)
            if not kill_at(proc, rng.uniform(0.25, 0.85) * duration * 0.5**attempt):
                continue
            # Kill the rerun too, anywhere (it may finish first), then run to the end.
            proc = _cli(corpus, db, stub.address)
            kill_at(proc, rng.uniform(0.0, 0.6) * duration)
            final = _cli(corpus, db, stub.address)
            assert final.wait(timeout=120) == 0, _log(db)
        break
    else:
        pytest.fail(f"seed {seed}: the job always ended before the kill")
    got = snapshot(db)
    for table in expected:
        assert got[table] == expected[table], f"table {table} differs (seed {seed})"


@pytest.mark.parametrize("delivered_to", ["the process", "a thread other than main"])
def test_ctrl_c_while_the_server_is_slow_stops_the_job_at_once_and_a_rerun_completes_it(
        tmp_path: Path, jsonl: Callable[..., Path], snapshot: Callable[..., Any],
        delivered_to: str) -> None:
    """Calls in flight are cancelled, not waited for: before, a job whose calls outlasted their
    deadline went on retrying for the whole retry budget (two minutes) after Ctrl-C."""
    import signal

    papers = list(synthetic_papers(30, mentions_per_paper=5, relationships_per_paper=3, seed=5))
    corpus = jsonl(tmp_path / "corpus.jsonl", papers)
    db = tmp_path / "graph.duckdb"
    env = {**os.environ, "INGEST_DEADLINE_SECONDS": "0.5"}
    command = [sys.executable, "-m", "ingest.cli", "run", str(corpus), "--db", str(db),
               "--no-progress"]
    with serve_stub() as stub:
        stub.servicer.delay_seconds = 2.0  # every call outlasts its deadline and is retried
        with (tmp_path / "job.log").open("wb") as log:
            proc = subprocess.Popen(
                [*WITH_SIGINT, *command, "--server", stub.address], env=env,
                stdout=subprocess.DEVNULL, stderr=log)
        try:
            for _ in range(400):
                if stub.servicer.calls.get("ResolveBatch", 0) >= 2:  # a retry has begun
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the job never called the server")
            if delivered_to == "the process":
                os.kill(proc.pid, signal.SIGINT)
            else:
                signal_a_thread_other_than_main(proc.pid, signal.SIGINT)
            assert proc.wait(timeout=10) == 130
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        assert "interrupted; rerun the same command to continue" in (
            tmp_path / "job.log").read_text()
        stub.servicer.delay_seconds = 0.0
        rerun = subprocess.run([*command, "--server", stub.address], env=env, check=False,
                               capture_output=True, text=True, timeout=120)
        assert rerun.returncode == 0, rerun.stderr
    assert len(snapshot(db)["papers"]) == 30


def test_rerun_from_another_directory_does_not_duplicate_rejects(
        tmp_path: Path, stub: StubServer, monkeypatch: pytest.MonkeyPatch,
        jsonl: Callable[..., Path]) -> None:
    import duckdb

    (tmp_path / "data").mkdir()
    jsonl(tmp_path / "data" / "in.jsonl", ["{oops", {"paper_id": "p", "mentions": [],
                                                     "relationships": [1]}])
    db = tmp_path / "g.duckdb"
    monkeypatch.chdir(tmp_path / "data")
    assert main(["run", "in.jsonl", "--db", str(db), "--server", stub.address,
                 "--no-progress"]) == 0
    monkeypatch.chdir(tmp_path)
    assert main(["run", "data/in.jsonl", "--db", str(db), "--server", stub.address,
                 "--no-progress"]) == 0
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT position, item FROM rejects ORDER BY ALL").fetchall() == [
            ("in.jsonl:1", ""), ("in.jsonl:2", "relationships[0]")]
    finally:
        con.close()


def test_a_compressed_file_is_ingested_as_its_text_and_a_cut_one_up_to_the_cut(
        tmp_path: Path, stub: StubServer, capsys: pytest.CaptureFixture[str]) -> None:
    import duckdb

    text = (EXAMPLES / "papers.jsonl").read_bytes()
    (tmp_path / "plain").mkdir()
    (tmp_path / "packed").mkdir()
    (tmp_path / "plain" / "papers.jsonl").write_bytes(text)
    (tmp_path / "packed" / "papers.jsonl.gz").write_bytes(gzip.compress(text))

    def summary(directory: str) -> list[str]:
        assert main(["run", str(tmp_path / directory), "--db", str(tmp_path / f"{directory}.db"),
                     "--server", stub.address, "--no-progress"]) == 0
        return [line for line in capsys.readouterr().out.splitlines()
                if not line.startswith("rate:")]

    assert summary("packed") == summary("plain")
    packed = gzip.compress(text)
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(packed[: len(packed) // 2])
    db = tmp_path / "cut.db"
    assert main(["run", str(cut), "--db", str(db), "--server", stub.address,
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "papers ingested:   0" not in out
    con = duckdb.connect(str(db), read_only=True)
    try:
        (position, reason), = con.execute(
            "SELECT position, reason FROM rejects WHERE reason LIKE 'gzip%'").fetchall()
        ingested = con.execute("SELECT count(*) FROM papers").fetchone()
    finally:
        con.close()
    assert reason.startswith("gzip data is corrupt or cut short from here on")
    assert ingested is not None and 0 < ingested[0] < 200
    assert position.startswith(f"{cut}:")  # the line the data broke off in


def test_vocabulary_file_from_the_command_line(
        tmp_path: Path, stub: StubServer, jsonl: Callable[..., Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    import duckdb

    paper = {"paper_id": "p", "mentions": [{"id": "a", "text": "Aspirin", "type": "material"},
                                           {"id": "b", "text": "COX-1", "type": "concept"}],
             "relationships": [{"subject": "b", "predicate": "is inhibited by", "object": "a"},
                               {"subject": "a", "predicate": "blocks", "object": "b"}]}
    corpus = jsonl(tmp_path / "in.jsonl", [paper])
    vocab = tmp_path / "vocab.toml"
    vocab.write_text('labels = ["inhibits"]\n[synonyms]\n"blocks" = "inhibits"\n'
                     '[inverses]\n"is inhibited by" = "inhibits"\n')
    db = tmp_path / "g.duckdb"
    assert main(["run", str(corpus), "--db", str(db), "--server", stub.address,
                 "--vocabulary", str(vocab), "--no-progress"]) == 0
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT subject_mention_id, predicate, object_mention_id, inverted "
                           "FROM relationships ORDER BY ALL").fetchall() == [
            ("a", "inhibits", "b", False), ("a", "inhibits", "b", True)]
    finally:
        con.close()
    vocab.write_text('[synonyms]\n"blocks" = "no_such_label"\n')
    assert main(["run", str(corpus), "--db", str(tmp_path / "h.duckdb"), "--server",
                 stub.address, "--vocabulary", str(vocab), "--no-progress"]) == 1
    assert "no_such_label" in capsys.readouterr().err


def test_a_graph_refuses_ids_from_another_identity_store(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An embedded job run from another directory gets a new, empty store by default: its ids
    would mean other entities than the graph's. Both run and sync refuse it, storing nothing; a
    store that replayed the same input (same ids, other changes) is refused too."""
    import duckdb

    papers = EXAMPLES / "papers.jsonl"
    graph = tmp_path / "graph.duckdb"

    def store(name: str) -> str:
        return f"sqlite:///{tmp_path / name}"

    def counts() -> tuple[int, int, int]:
        with duckdb.connect(str(graph), read_only=True) as con:
            return tuple(con.execute(  # type: ignore[return-value]
                "SELECT (SELECT count(*) FROM mentions), (SELECT count(*) FROM possibly_same_as),"
                " (SELECT max(last_sequence) FROM sync_state)").fetchone())

    assert main(["run", str(papers), "--db", str(graph), "--identity-db", store("a.sqlite"),
                 "--no-progress"]) == 0
    before = counts()
    assert before[0] > 0 and before[2] > 0
    capsys.readouterr()

    # A new, empty store: refused before anything is resolved or stored.
    assert main(["run", str(EXAMPLES / "updates"), "--db", str(graph),
                 "--identity-db", store("new.sqlite"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"has no change {before[2]}" in err and "another identity store" in err
    # named by its URL, which the user can act on (not the embedded server's random port)
    assert f"the identity store {store('new.sqlite')} has no change" in err
    assert main(["sync", "--db", str(graph), "--identity-db", store("new.sqlite")]) == 1
    assert "another identity store" in capsys.readouterr().err
    assert counts() == before

    # A store that saw the same input elsewhere: the same ids, other changes.
    assert main(["run", str(papers), "--db", str(tmp_path / "other.duckdb"),
                 "--identity-db", store("replay.sqlite"), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["sync", "--db", str(graph), "--identity-db", store("replay.sqlite")]) == 1
    assert f"recorded change {before[2]} as" in capsys.readouterr().err
    assert counts() == before

    # The graph's own store still works.
    assert main(["run", str(EXAMPLES / "updates"), "--db", str(graph),
                 "--identity-db", store("a.sqlite"), "--no-progress"]) == 0
    assert counts()[0] > before[0]


def test_bad_settings_exit_2_naming_the_setting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", str(EXAMPLES / "papers.jsonl"), "--db", str(tmp_path / "g.duckdb")]
    with pytest.raises(SystemExit) as exited:
        main([*args, "--concurrency", "0"])
    assert exited.value.code == 2
    assert ("invalid setting: concurrency (INGEST_CONCURRENCY): Input should be greater than or "
            "equal to 1 (got 0)") in capsys.readouterr().err
    for name, value, says in (
            ("INGEST_DEADLINE_SECONDS", "inf", "Input should be a finite number"),
            ("INGEST_RETRY_BUDGET_SECONDS", "nan", "Input should be a finite number"),
            ("INGEST_ADMIN_TOKEN", "sëcret token", "must be visible ASCII characters")):
        monkeypatch.setenv(name, value)  # inf: every call failed at once, and was retried
        with pytest.raises(SystemExit) as exited:
            main(args)
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert f"({name}): " in err and says in err
        assert "sëcret" not in err  # a token is never echoed
        monkeypatch.delenv(name)
    monkeypatch.setenv("IDENTITY_STRICT_TYPES", "maybe")  # read by the embedded server
    assert main([*args, "--identity-db", f"sqlite:///{tmp_path / 'i.sqlite'}"]) == 1
    assert "strict_types (IDENTITY_STRICT_TYPES)" in capsys.readouterr().err
    import duckdb

    with duckdb.connect(str(tmp_path / "g.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM mentions").fetchone() == (0,)


def test_a_misspelt_setting_variable_is_named_with_the_setting_it_nearly_is(
        tmp_path: Path, stub: StubServer, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    """pydantic ignores unknown prefixed variables: without a warning a typo would silently
    leave the default in force. The job itself still runs."""
    for name in list(os.environ):  # only this test's variables
        if name.upper().startswith(("INGEST_", "IDENTITY_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("INGEST_RETRY_FOR_S", "5")
    monkeypatch.setenv("ingest_concurency", "3")  # names are read case-insensitively
    monkeypatch.setenv("INGEST_DEADLINE_SECONDS", "5")  # a real one: not reported
    monkeypatch.setenv("INGEST_XYZZY", "1")
    with caplog.at_level("WARNING", logger="ingest.cli"):
        assert main(["run", str(EXAMPLES / "papers.jsonl"), "--db", str(tmp_path / "g.duckdb"),
                     "--server", stub.address, "--no-progress"]) == 0
    said = [r.getMessage() for r in caplog.records if r.name == "ingest.cli"]
    assert said == [
        ("INGEST_RETRY_FOR_S is not a setting and is ignored "
         "(did you mean INGEST_RETRY_BUDGET_SECONDS?)"),
        "INGEST_XYZZY is not a setting and is ignored",
        "ingest_concurency is not a setting and is ignored (did you mean INGEST_CONCURRENCY?)",
    ]
    assert "papers ingested:   200" in capsys.readouterr().out
    caplog.clear()
    monkeypatch.setenv("IDENTITY_PROMOTE_AFTER_PAPER", "2")  # read by the embedded server
    with caplog.at_level("WARNING", logger="ingest.cli"):
        assert main(["run", str(EXAMPLES / "papers.jsonl"), "--db", str(tmp_path / "e.duckdb"),
                     "--identity-db", f"sqlite:///{tmp_path / 'i.sqlite'}", "--no-progress"]) == 0
    assert ("embedded server: IDENTITY_PROMOTE_AFTER_PAPER is not a setting and is ignored "
            "(did you mean IDENTITY_PROMOTE_AFTER_PAPERS?)") in caplog.text


def test_a_url_for_the_server_is_refused_at_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", str(EXAMPLES / "papers.jsonl"), "--db", str(tmp_path / "g.duckdb"),
              "--server", "http://127.0.0.1:50051"])
    assert exited.value.code == 2
    assert "takes host:port (e.g. 127.0.0.1:50051), not a http:// URL" in capsys.readouterr().err


@pytest.mark.parametrize(("identity_db", "says"), [
    # a database this machine's PostgreSQL does not have: the connection is refused at once
    ("postgresql://postgres:s3cret@127.0.0.1:5432/no_such_database_here",
     "(postgresql://postgres:***@127.0.0.1:5432/no_such_database_here)"),
    ("sqlite://identity.sqlite", "names a host, not a file"),
])
def test_an_embedded_store_that_cannot_open_is_named_without_its_password(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], identity_db: str, says: str) -> None:
    code = main(["run", str(EXAMPLES / "papers.jsonl"), "--db", str(tmp_path / "g.duckdb"),
                 "--identity-db", identity_db])
    err = capsys.readouterr().err
    assert code == 1
    assert "cannot start the embedded identity server" in err and says in err, err
    assert "s3cret" not in err


def test_an_identity_store_given_as_the_graph_is_named_as_such(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import sqlite3

    store = tmp_path / "identity.sqlite"
    with sqlite3.connect(store) as con:
        con.execute("CREATE TABLE entities (entity_id TEXT)")
    assert main(["stats", "--db", str(store)]) == 1
    assert "is a SQLite database (an identity store?), not a DuckDB graph" in (
        capsys.readouterr().err)


def test_a_graph_never_synced_still_refuses_another_identity_store(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A first run killed before its closing sync leaves no feed position: the store must still
    know the first entity the graph saw created, under that spelling."""
    import duckdb

    graph = tmp_path / "graph.duckdb"
    own = f"sqlite:///{tmp_path / 'a.sqlite'}"
    assert main(["run", str(EXAMPLES / "papers.jsonl"), "--db", str(graph), "--identity-db", own,
                 "--no-progress"]) == 0
    with duckdb.connect(str(graph)) as con:  # as if killed before the closing sync
        con.execute("DELETE FROM sync_state")
        con.execute("DELETE FROM feed_anchor")
        mentions = con.execute("SELECT count(*) FROM mentions").fetchone()
    capsys.readouterr()
    assert main(["run", str(EXAMPLES / "updates"), "--db", str(graph),
                 "--identity-db", f"sqlite:///{tmp_path / 'new.sqlite'}", "--no-progress"]) == 1
    assert "does not know prov_" in capsys.readouterr().err
    with duckdb.connect(str(graph), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM mentions").fetchone() == mentions
    assert main(["run", str(EXAMPLES / "updates"), "--db", str(graph), "--identity-db", own,
                 "--no-progress"]) == 0


def test_stats_says_how_many_open_links_it_left_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import duckdb

    graph = tmp_path / "graph.duckdb"
    assert main(["run", str(EXAMPLES / "papers.jsonl"), "--db", str(graph), "--identity-db",
                 f"sqlite:///{tmp_path / 'identity.sqlite'}", "--no-progress"]) == 0
    with duckdb.connect(str(graph), read_only=True) as con:
        (links,) = con.execute("SELECT count(*) FROM possibly_same_as").fetchone()  # type: ignore[misc]
    assert links > 2
    capsys.readouterr()
    assert main(["stats", "--db", str(graph), "--top", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    listed = out[out.index("open possibly_same_as links (run `ingest sync` to refresh):") + 1:]
    assert len(listed) == 3 and listed[2] == f"  ... and {links - 2} more (--top N lists N)"


def test_stats_top_must_be_a_whole_number_of_zero_or_more(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It reached DuckDB as a negative LIMIT and failed there with a Binder Error."""
    for top, says in (("-1", "must be 0 or more, got -1"), ("ten", "not a whole number: 'ten'")):
        with pytest.raises(SystemExit) as exited:
            main(["stats", "--db", str(tmp_path / "g.duckdb"), "--top", top])
        assert exited.value.code == 2
        assert f"argument --top: {says}" in capsys.readouterr().err


def test_stats_reads_without_writing_and_refuses_a_database_ingest_did_not_write(
        tmp_path: Path, stub: StubServer, capsys: pytest.CaptureFixture[str]) -> None:
    """stats created ingest's thirteen tables and views in whatever DuckDB file it was given."""
    import duckdb

    other = tmp_path / "analytics.duckdb"
    with duckdb.connect(str(other)) as con:
        con.execute("CREATE TABLE sales (amount INTEGER)")
    assert main(["stats", "--db", str(other)]) == 1
    assert "is not a graph database written by ingest" in capsys.readouterr().err
    with duckdb.connect(str(other), read_only=True) as con:
        assert con.execute("SELECT table_name FROM information_schema.tables").fetchall() == [
            ("sales",)]

    graph = tmp_path / "graph.duckdb"
    assert main(["run", str(EXAMPLES / "papers.jsonl"), "--db", str(graph), "--server",
                 stub.address, "--no-progress"]) == 0
    capsys.readouterr()
    with duckdb.connect(str(graph), read_only=True):  # another reader meanwhile: stats reads too
        assert main(["stats", "--db", str(graph)]) == 0
    assert "papers:          200" in capsys.readouterr().out


def test_run_refuses_a_database_ingest_did_not_write_and_leaves_it_as_it_was(
        tmp_path: Path, stub: StubServer, capsys: pytest.CaptureFixture[str]) -> None:
    """run created ingest's tables in it, replacing the user's own view named `entities`,
    then failed on the user's `papers` table with a Binder Error."""
    import duckdb

    mine = tmp_path / "mine.duckdb"
    with duckdb.connect(str(mine)) as con:
        con.execute("CREATE TABLE papers (title VARCHAR, year INTEGER)")
        con.execute("INSERT INTO papers VALUES ('On Graphs', 2024)")
        con.execute("CREATE VIEW entities AS SELECT title FROM papers")
    assert main(["run", str(EXAMPLES / "papers.jsonl"), "--db", str(mine), "--server",
                 stub.address, "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "is not a graph database written by ingest" in err
    assert "entities, papers" in err
    with duckdb.connect(str(mine), read_only=True) as con:
        assert sorted(con.execute("SELECT table_name, table_type FROM information_schema.tables")
                      .fetchall()) == [("entities", "VIEW"), ("papers", "BASE TABLE")]
        assert con.execute("SELECT * FROM entities").fetchall() == [("On Graphs",)]


def test_a_file_name_that_is_not_utf8_is_stored_escaped_and_reruns_match(
        tmp_path: Path, stub: StubServer, capsys: pytest.CaptureFixture[str]) -> None:
    """A Latin-1 file name (b'caf\\xe9.jsonl') ended the job with a UnicodeEncodeError when its
    position reached DuckDB; it is stored as `ls -b` shows it."""
    folder = tmp_path / "in"
    folder.mkdir()
    name = os.fsdecode(bytes(folder) + b"/caf\xe9.jsonl")
    Path(name).write_bytes(
        b'{broken\n{"paper_id": "p1", "mentions": [{"id": "m1", "text": "BERT", '
        b'"type": "method"}], "relationships": []}\n')
    db = tmp_path / "graph.duckdb"
    for _ in range(2):  # the rerun finds its reject and its paper again
        assert main(["run", str(folder), "--db", str(db), "--server", stub.address,
                     "--no-progress"]) == 0
    assert "1 line rejected as in an earlier run" in capsys.readouterr().out
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        assert con.sql("SELECT position FROM rejects").fetchall() == [
            (f"{folder}/caf\\xe9.jsonl:1",)]
        assert con.sql("SELECT source FROM papers").fetchall() == [
            (f"{folder}/caf\\xe9.jsonl:2",)]


def test_papers_read_from_a_pipe_compressed_or_not(
        tmp_path: Path, stub: StubServer) -> None:
    """`-` is standard input, and a pipe is read once (its first bytes peeked at to tell
    gzip, not read; no count for the progress bar): the same papers as from the file."""
    papers = (EXAMPLES / "papers.jsonl").read_bytes()
    db = tmp_path / "graph.duckdb"
    outputs = []
    for path, data in (("-", gzip.compress(papers)), ("/dev/stdin", papers)):
        done = subprocess.run(
            [sys.executable, "-m", "ingest.cli", "run", path, "--db", str(db),
             "--server", stub.address], input=data, capture_output=True, timeout=120,
            check=False)
        assert done.returncode == 0, done.stderr.decode()
        outputs.append(done.stdout.decode())
    assert "papers ingested:   200" in outputs[0]
    assert "papers unchanged:  200" in outputs[1]  # the same papers, gzip or not


def test_summary_json_is_the_runs_summary_for_a_pipeline(tmp_path: Path, stub: StubServer,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "summary.json"
    args = ["run", str(EXAMPLES / "papers.jsonl"), "--db", str(tmp_path / "g.duckdb"),
            "--server", stub.address, "--no-progress", "--summary-json", str(out)]
    assert main(args) == 0
    first = json.loads(out.read_text())
    assert first["papers_ingested"] == 200 and first["rejected_lines"] == 2
    assert first["lines_read"] == 202 and first["relationships"] > 0
    assert f"papers ingested:   {first['papers_ingested']}" in capsys.readouterr().out
    assert main(args) == 0  # a rerun changes nothing, and says so
    again = json.loads(out.read_text())
    assert again["papers_ingested"] == 0 and again["papers_unchanged"] == 200
    assert not (tmp_path / "summary.json.partial").exists()
