"""`--log-format json`: both CLIs, run as real processes, write one JSON object a line on stderr
(ingest's worker process too), and `--log-format text` keeps the plain lines.

Servers are stopped with SIGTERM by their own PID; stderr goes to a file, read once they end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

from ingest.testing import serve_stub
from tests.conftest import serve_process

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SERVER = str(BIN / "identity-server")
INGEST = str(BIN / "ingest")

T = 10.0  # deadline of every call, in seconds

# RFC 3339, UTC, to the millisecond: 2026-12-06T18:01:02.345Z
TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")
LEVELS = {"debug", "info", "warning", "error", "critical"}
# Today's text lines: `2026-12-06 18:01:02,345 INFO identity_server.server ...`
TEXT_LINE = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3} (DEBUG|INFO|WARNING|ERROR|"
                       r"CRITICAL) [\w.]+ .*")


def _env() -> dict[str, str]:
    """The test's environment without IDENTITY_* and INGEST_* settings: only the flags count."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("IDENTITY_", "INGEST_"))}


def _records(stderr: str) -> list[dict[str, Any]]:
    """Every line of stderr as a JSON log record, its keys and their types checked."""
    lines = stderr.splitlines()
    assert lines, "nothing logged"
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            pytest.fail(f"not a JSON line on stderr: {line!r}\n--- stderr ---\n{stderr}")
        assert isinstance(record, dict), line
        assert isinstance(record["time"], str) and TIME.fullmatch(record["time"]), line
        assert record["level"] in LEVELS, line
        assert isinstance(record["logger"], str) and record["logger"], line
        assert isinstance(record["event"], str), line
        if "exception" in record:
            assert isinstance(record["exception"], str), line
            assert record["exception"].startswith("Traceback (most recent call last):"), line
        records.append(record)
    return records


def _serve(tmp_path: Path, *top_level: str) -> str:
    """Runs `identity-server *top_level serve` on a free port, makes one call, stops it with
    SIGTERM; returns its stderr."""
    log_path = tmp_path / "server.log"
    args = [SERVER, *top_level, "serve", "--db", f"sqlite:///{tmp_path / 'x.sqlite'}",
            "--host", "127.0.0.1", "--port", "0"]
    with log_path.open("w") as log, serve_process(args, env=_env(), stderr=log) as (proc, port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:  # logged whatever it answers (OK at debug, a refusal at info)
                pb_grpc.IdentityServiceStub(channel).Resolve(
                    pb.ResolveRequest(mention="Ada Lovelace", entity_type="person"), timeout=T)
            except grpc.RpcError:
                pass
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    return log_path.read_text()


def test_server_logs_one_json_object_a_line(tmp_path: Path) -> None:
    records = _records(_serve(tmp_path, "--log-level", "debug", "--log-format", "json"))
    started = [r for r in records if "listening on" in r["event"]]
    assert started and started[0]["level"] == "info", records
    assert started[0]["logger"] == "identity_server.server"
    # A call's fields (given with extra=) are top-level keys, of their own JSON types.
    for record in records:
        if "method" in record:
            assert isinstance(record["method"], str), record
        if "duration_ms" in record:
            assert isinstance(record["duration_ms"], int | float), record


def test_server_text_format_is_unchanged(tmp_path: Path) -> None:
    lines = _serve(tmp_path, "--log-format", "text").splitlines()
    assert lines
    assert all(TEXT_LINE.fullmatch(line) for line in lines), lines
    assert any(re.fullmatch(r"\S+ \S+ INFO identity_server\.server identity server listening on "
                            r"127\.0\.0\.1:\d+ \(store sqlite:///.*\)", line)
               for line in lines), lines


@pytest.mark.parametrize(("command", "rest"), [(SERVER, ["serve"]),
                                               (INGEST, ["stats", "--db", "x"])])
def test_an_unknown_log_format_is_a_usage_error(command: str, rest: list[str]) -> None:
    done = subprocess.run([command, "--log-format", "xml", *rest],
                          capture_output=True, text=True, timeout=60, check=False, env=_env())
    assert done.returncode == 2
    assert done.stderr.startswith(f"usage: {Path(command).name} ")
    assert "argument --log-format: invalid choice: 'xml'" in done.stderr


def test_fields_given_with_extra_are_top_level_keys(tmp_path: Path) -> None:
    """The import's refused records, as log records: their file, line and reason as fields."""
    authority = tmp_path / "authority.jsonl"
    authority.write_text('{"id": "Q1", "name": "Ada", "type": "person"}\nnot json\n')
    done = subprocess.run(
        [SERVER, "--log-format", "json", "import", str(authority),
         "--db", f"sqlite:///{tmp_path / 'i.sqlite'}"],
        capture_output=True, text=True, timeout=60, check=False, env=_env())
    assert done.returncode == 1, done.stderr
    assert "imported 1 records" in done.stdout
    refused = [r for r in _records(done.stderr) if r.get("line") == 2]
    assert len(refused) == 1, done.stderr
    assert refused[0]["level"] == "warning"
    assert refused[0]["file"] == str(authority)
    assert refused[0]["reason"].startswith("not valid JSON")
    assert refused[0]["event"] == f"{authority}:2: {refused[0]['reason']}"


def test_ingest_with_its_worker_logs_only_json(tmp_path: Path) -> None:
    """The embedded server, the job's process and its worker process (which writes `job done`)
    all log JSON lines; no progress bar or plain line among them."""
    done = subprocess.run(
        [INGEST, "--log-format", "json", "-v", "run", "examples/papers.jsonl",
         "--db", str(tmp_path / "g.duckdb"),
         "--identity-db", f"sqlite:///{tmp_path / 'identity.sqlite'}"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False, env=_env())
    assert done.returncode == 0, done.stderr
    assert "papers ingested:   200" in done.stdout
    records = _records(done.stderr)
    events = {(r["logger"], r["event"].split(":")[0]) for r in records}
    assert ("ingest.cli", "embedded identity server on 127.0.0.1") in events, events
    assert ("ingest.pipeline", "job done") in events, events  # from the worker process


def test_ingest_error_and_its_traceback_are_json(tmp_path: Path) -> None:
    done = subprocess.run(
        [INGEST, "--log-format", "json", "-vv", "run", str(tmp_path / "missing.jsonl"),
         "--db", str(tmp_path / "g.duckdb")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False, env=_env())
    assert done.returncode == 1
    records = _records(done.stderr)
    [error] = [r for r in records if r["level"] == "error"]
    assert error["event"] == f"input path {tmp_path / 'missing.jsonl'} does not exist"
    [failed] = [r for r in records if r["event"] == "job failed"]
    assert "InputError" in failed["exception"]


def test_ingest_progress_is_a_json_record(tmp_path: Path) -> None:
    """Progress, a plain line every 30 s in a text log, is a record (with its counts as fields)
    among JSON lines; here every update, as the interval is set to 0 in the process."""
    with serve_stub() as stub:
        script = ("import sys, ingest.cli as cli; cli.LOG_PROGRESS_EVERY_S = 0.0; "
                  "sys.exit(cli.main(sys.argv[1:]))")
        done = subprocess.run(
            [sys.executable, "-c", script, "--log-format", "json", "run",
             str(REPO / "examples" / "papers.jsonl"), "--db", str(tmp_path / "g.duckdb"),
             "--server", stub.address],
            capture_output=True, text=True, timeout=120, check=False, env=_env())
    assert done.returncode == 0, done.stderr
    progress = [r for r in _records(done.stderr) if r["logger"] == "ingest.progress"]
    assert progress, done.stderr  # shown without -v, as the plain lines are
    last = progress[-1]
    assert last["level"] == "info"
    assert (last["lines_done"], last["lines_total"]) == (202, 202)  # 200 papers, 2 bad lines
    assert isinstance(last["lines_per_s"], float)
    assert last["event"].startswith("202 of 202 lines done")
