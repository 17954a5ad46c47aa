"""identity_client against a real server: every RPC through the blocking and the asyncio client,
with the same results; batches in parts, retries, tokens, TLS and the change feed followed.

One scenario is written once and run through both clients: a sync client's results are plain
values, an async client's are awaited (`_got`).
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest

from identity_client import (
    AsyncIdentityClient,
    ChangeKind,
    Entity,
    IdentityClient,
    IdentityError,
    ItemFailure,
    MatchKind,
    Resolution,
    RetryPolicy,
    ServerUnavailable,
    Status,
)
from identity_server.server import start_server
from identity_server.settings import Settings
from tests.conftest import ADMIN_TOKEN

REPO = Path(__file__).resolve().parents[2]
AUTHORITY = (REPO / "examples" / "authority.jsonl").read_bytes()
POLICY = RetryPolicy(deadline_seconds=10.0, budget_seconds=5.0)


async def _got(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _listed(value: Any) -> list[Any]:
    """A sync iterator's or an async iterator's items."""
    if hasattr(value, "__aiter__"):
        return [x async for x in value]
    return list(value)


def _client(kind: str, address: str, **options: Any) -> Any:
    make = IdentityClient if kind == "sync" else AsyncIdentityClient
    return make(address, policy=options.pop("policy", POLICY), **options)


async def _close(client: Any) -> None:
    await _got(client.close())


async def _scenario(client: Any) -> list[Any]:
    """Every RPC once, in an order where each sees the one before; what each answered."""
    seen: list[Any] = []
    chunks = [AUTHORITY[i:i + 50] for i in range(0, len(AUTHORITY), 50)]
    report = await _got(client.import_authority(chunks))
    records = AUTHORITY.count(b"\n")
    assert (report.imported, report.created, report.errors) == (records, records, ())
    seen.append((report.imported, report.created))

    case = await _got(client.resolve("common crawl", "dataset", lookup_only=True))
    assert isinstance(case, Resolution)
    assert (case.entity_id, case.status, case.match_kind) == ("Q1", Status.CANONICAL,
                                                               MatchKind.CASE)
    assert case.candidates[0] == "Q1" and case.scores[0] == max(case.scores)
    alias = await _got(client.resolve("CC", "dataset", lookup_only=True))
    assert (alias.entity_id, alias.match_kind) == ("Q1", "alias")
    seen += [case, alias]

    # Three mentions to a server that takes two at once: sent in two parts, the refused one
    # named by its place in the whole batch.
    mentions = [("Common Crawl", "dataset"), ("Zorblax Quintum", "dataset"), ("   ", "dataset")]
    batch = await _got(client.resolve_batch("paper-1", mentions))
    exact, new, refused = batch.outcomes
    assert (exact.entity_id, exact.match_kind) == ("Q1", MatchKind.EXACT)
    assert isinstance(refused, ItemFailure) and refused.code == "INVALID_ARGUMENT"
    assert refused.message.startswith("mention 2:")
    assert new.match_kind == MatchKind.NEW and new.created and new.status == Status.PROVISIONAL
    again = await _got(client.resolve_batch("paper-1", mentions))
    assert again.outcomes == batch.outcomes
    # The part whose every item was refused stored no reply: only a batch of replays is one.
    assert not again.replayed
    one = [("Common Crawl", "dataset")]
    assert not (await _got(client.resolve_batch("paper-3", one))).replayed
    assert (await _got(client.resolve_batch("paper-3", one))).replayed
    seen.append(batch.outcomes)

    q1 = await _got(client.get_entity("Q1"))
    assert isinstance(q1, Entity)
    assert (q1.name, q1.aliases, q1.paper_count, q1.status) == ("Common Crawl", ("CC",), 2,
                                                               Status.CANONICAL)
    datasets = await _listed(client.list_entities(entity_type="dataset"))
    assert [e.entity_id for e in datasets] == sorted(
        e.entity_id for e in datasets) and "Q1" in {e.entity_id for e in datasets}
    page = await _got(client.list_entities_page(page_size=2))
    assert len(page.entities) == 2 and page.next_page_token
    seen.append([e.entity_id for e in datasets])

    # Keys under 3 characters are weak (SPEC section 2): "F1" and "F-1" are linked, not merged.
    f1 = await _got(client.resolve("F1", "metric", context_id="paper-2"))
    f_1 = await _got(client.resolve("F-1", "metric", context_id="paper-2"))
    assert f_1.possibly_same_as == (f1.entity_id,)
    links = await _got(client.list_possibly_same_as())
    assert {(x.entity_id, x.other_id) for x in links} == {(f1.entity_id, f_1.entity_id)}
    settled = await _got(client.settle(f1.entity_id, f_1.entity_id, "distinct", actor="tester",
                                       reason="different metrics"))
    assert settled.entity_id == f1.entity_id
    assert await _got(client.list_possibly_same_as()) == []

    merged = await _got(client.merge(new.entity_id, "Q1"))
    assert merged.entity_id == "Q1" and "Zorblax Quintum" in merged.surface_forms
    gone = await _got(client.get_entity(new.entity_id))
    assert (gone.status, gone.redirect_to) == (Status.MERGED, "Q1")
    promoted = await _got(client.promote(f1.entity_id))
    assert promoted.status == Status.CANONICAL
    aliased = await _got(client.add_alias(f1.entity_id, "F one"))
    assert "F one" in aliased.aliases
    seen.append((merged.entity_id, promoted.status, aliased.aliases))

    changes = await _listed(client.list_changes())
    assert [c.sequence for c in changes] == list(range(1, len(changes) + 1))
    kinds = {c.kind for c in changes}
    assert {ChangeKind.IMPORTED, ChangeKind.MERGED, ChangeKind.PROMOTED,
            ChangeKind.ALIAS_ADDED, ChangeKind.LINK_SETTLED} <= kinds
    assert all(c.recorded_at.tzinfo is not None for c in changes)
    assert changes[0].recorded_at.astimezone(UTC) <= changes[-1].recorded_at.astimezone(UTC)
    some = await _listed(client.list_changes(2, limit=3))
    assert [c.sequence for c in some] == [3, 4, 5]
    seen.append([(c.sequence, c.kind, c.entity_id, c.other_id) for c in changes])

    with pytest.raises(IdentityError) as missing:
        await _got(client.get_entity("no-such-id"))
    assert (missing.value.method, missing.value.code) == ("GetEntity", "NOT_FOUND")
    return seen


@pytest.fixture
def address(db_url: str) -> Iterator[str]:
    running = start_server(Settings(db_url=db_url, port=0, admin_token=ADMIN_TOKEN,
                                    max_batch_size=2))
    yield f"127.0.0.1:{running.port}"
    running.stop(grace=1.0)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_every_call_against_a_real_server(kind: str, address: str) -> None:
    async def run() -> list[Any]:
        client = _client(kind, address, admin_token=ADMIN_TOKEN)
        try:
            return await _scenario(client)
        finally:
            await _close(client)

    asyncio.run(run())


def test_both_clients_get_the_same_answers(tmp_path: Path) -> None:
    """The same scenario on two fresh stores: the blocking and the asyncio client's results
    are equal (ids, kinds, outcomes and the whole change feed but its times)."""
    answers = []
    for kind in ("sync", "async"):
        running = start_server(Settings(db_url=f"sqlite:///{tmp_path / kind}.sqlite", port=0,
                                        admin_token=ADMIN_TOKEN, max_batch_size=2))
        try:
            async def run(port: int = running.port, kind: str = kind) -> list[Any]:
                client = _client(kind, f"127.0.0.1:{port}", admin_token=ADMIN_TOKEN)
                try:
                    return await _scenario(client)
                finally:
                    await _close(client)

            answers.append(asyncio.run(run()))
        finally:
            running.stop(grace=1.0)
    assert answers[0] == answers[1]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_admin_calls_without_the_admin_token_are_refused(kind: str, address: str) -> None:
    async def run() -> None:
        client = _client(kind, address)
        try:
            with pytest.raises(IdentityError) as refused:
                await _got(client.promote("Q1"))
            assert refused.value.code == "UNAUTHENTICATED"
        finally:
            await _close(client)

    asyncio.run(run())


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_absent_server_is_retried_until_the_budget_is_spent(kind: str) -> None:
    with socket.socket() as s:  # a port bound and released: nothing answers on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def run() -> None:
        client = _client(kind, f"127.0.0.1:{port}",
                         policy=RetryPolicy(deadline_seconds=0.5, budget_seconds=0.6))
        try:
            with pytest.raises(ServerUnavailable) as gave_up:
                await _got(client.resolve("Ada Lovelace", "person"))
            assert gave_up.value.code == "UNAVAILABLE" and client.retries >= 1
            assert f"127.0.0.1:{port}" in gave_up.value.message
        finally:
            await _close(client)

    asyncio.run(run())


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_followed_feed_brings_changes_as_they_happen(kind: str, address: str) -> None:
    async def run() -> None:
        client = _client(kind, address)
        writer = _client("sync", address)
        try:
            writer.resolve("Ada Lovelace", "person")
            stream = client.list_changes(follow=True)
            if hasattr(stream, "__anext__"):
                first = await stream.__anext__()
                writer.resolve("Grace Hopper", "person")
                second = await stream.__anext__()
                await stream.aclose()
            else:
                first = next(stream)
                writer.resolve("Grace Hopper", "person")
                second = next(stream)
                stream.close()
            assert (first.sequence, second.sequence) == (1, 2)
            assert second.kind == ChangeKind.CREATED
        finally:
            writer.close()
            await _close(client)

    asyncio.run(run())


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_tls_with_root_certificates(kind: str, tmp_path: Path, db_url: str) -> None:
    from tests.integration.test_server_ops import _self_signed

    cert, key = _self_signed(tmp_path)
    running = start_server(Settings(db_url=db_url, port=0, tls_cert=str(cert),
                                    tls_key=str(key)))
    try:
        async def run() -> None:
            client = _client(kind, f"localhost:{running.port}",
                             root_certificates=cert.read_bytes())
            try:
                made = await _got(client.resolve("Ada Lovelace", "person"))
                assert made.created and made.entity_id
            finally:
                await _close(client)

        asyncio.run(run())
    finally:
        running.stop(grace=0)


def test_the_client_needs_nothing_of_the_server_or_ingest() -> None:
    """identity_client is a public package: grpcio and the generated proto code only."""
    script = ("import sys\n"
              "import identity_client, identity_client.aio, identity_client.sync\n"
              "own = sorted(m for m in sys.modules if m.split('.')[0] in "
              "('identity_server', 'ingest'))\n"
              "print(own)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True, cwd=REPO)
    assert done.stdout.strip() == "[]"


def test_the_documented_examples_run(address: str) -> None:
    """docs/client.md's first two examples, as a newcomer pastes them (at this server)."""
    text = (REPO / "docs" / "client.md").read_text(encoding="utf-8")
    blocks = text.split("```python\n")[1:3]
    for block in blocks:
        code = block.split("```")[0].replace("127.0.0.1:50051", address)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60, check=False, cwd=REPO)
        assert done.returncode == 0, done.stderr
        assert "ItemFailure" not in done.stdout and done.stdout
