"""The command line's client commands against a real server on a free port: the review queue
(`links`, `settle`), curation (`merge`, `promote`, `alias`), `entity` and `import --server`,
checked both by what they print and by what the server holds afterwards."""

from __future__ import annotations

import getpass
import gzip
import json
from pathlib import Path

import grpc
import pytest
from identity_api.v1 import identity_service_pb2 as pb
from identity_api.v1 import identity_service_pb2_grpc as pb_grpc

import identity_client._protocol
from identity_server import cli, remote
from identity_server.server import RunningServer
from tests.conftest import ADMIN_TOKEN

CaptureFixture = pytest.CaptureFixture[str]


def _run(server: RunningServer, *argv: str) -> int:
    return cli.main([*argv, "--server", f"127.0.0.1:{server.port}", "--timeout", "10"])


def _admin(server: RunningServer, *argv: str) -> int:
    return _run(server, *argv, "--admin-token", ADMIN_TOKEN)


def _resolve(stub: pb_grpc.IdentityServiceStub, mention: str, etype: str) -> pb.ResolveResponse:
    reply: pb.ResolveResponse = stub.Resolve(
        pb.ResolveRequest(mention=mention, entity_type=etype), timeout=10)
    return reply


def _weak_pair(stub: pb_grpc.IdentityServiceStub, a: str, b: str) -> tuple[str, str]:
    """Two entities linked possibly_same_as: keys under 3 characters are weak (SPEC section 2)."""
    first = _resolve(stub, a, "metric")
    second = _resolve(stub, b, "metric")
    assert second.match_kind == pb.NEW and list(second.possibly_same_as) == [first.entity_id]
    return first.entity_id, second.entity_id


def _open_links(stub: pb_grpc.IdentityServiceStub) -> set[frozenset[str]]:
    reply = stub.ListPossiblySameAs(pb.ListPossiblySameAsRequest(page_size=1000), timeout=10)
    return {frozenset((link.entity_id, link.other_id)) for link in reply.links}


def test_links_lists_the_review_queue_with_each_end_named(
        server: RunningServer, stub: pb_grpc.IdentityServiceStub, capsys: CaptureFixture) -> None:
    f1, f_1 = _weak_pair(stub, "F1", "F-1")
    mt, mt_dot = _weak_pair(stub, "MT", "MT.")
    capsys.readouterr()

    assert _run(server, "links") == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{f1} 'F1' [metric, provisional]  ~  {f_1} 'F-1' [metric, provisional]",
                   f"{mt} 'MT' [metric, provisional]  ~  {mt_dot} 'MT.' [metric, provisional]",
                   "2 open links"]

    assert _run(server, "links", "--entity", mt_dot) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 open links"

    assert _run(server, "links", "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(x["entity"]["entity_id"], x["other"]["name"]) for x in listed] == [
        (f1, "F-1"), (mt, "MT.")]


def test_links_marks_canonical_entities_and_placeholders(
        server: RunningServer, stub: pb_grpc.IdentityServiceStub, capsys: CaptureFixture,
        tmp_path: Path) -> None:
    authority = tmp_path / "a.jsonl"
    authority.write_text('{"id": "Q1", "name": "Maria Gendor", "type": "person"}\n'
                         '{"id": "Q2", "name": "Maria Gendar", "type": "person"}\n',
                         encoding="utf-8")
    assert _admin(server, "import", str(authority)) == 0
    placeholder = _resolve(stub, "Maria Gendir", "person")  # a typo of both: ambiguous
    assert placeholder.match_kind == pb.AMBIGUOUS
    capsys.readouterr()

    assert _run(server, "links") == 0
    out = capsys.readouterr().out.splitlines()
    pid = placeholder.entity_id
    assert sorted(out[:-1]) == [  # a link is an unordered pair, shown in id order
        f"{q} 'Maria {name}' [person, canonical]  ~  "
        f"{pid} 'Maria Gendir' [person, provisional placeholder]"
        for q, name in (("Q1", "Gendor"), ("Q2", "Gendar"))]


def test_links_pages_through_the_queue_up_to_the_limit(
        server: RunningServer, stub: pb_grpc.IdentityServiceStub, capsys: CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(identity_client._protocol, "PAGE_SIZE", 2)  # several pages, few links
    pairs = [_weak_pair(stub, f"{c}1", f"{c}-1") for c in "ABCDE"]
    capsys.readouterr()

    assert _run(server, "links", "--limit", "3") == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4 and out[-1] == "3 open links (more: raise --limit)"

    assert _run(server, "links", "--limit", "0") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "5 open links"
    assert [line.split()[0] for line in out[:-1]] == [a for a, _ in pairs]


def test_settle_distinct_and_same_change_the_store(
        server: RunningServer, stub: pb_grpc.IdentityServiceStub, capsys: CaptureFixture) -> None:
    f1, f_1 = _weak_pair(stub, "F1", "F-1")
    mt, mt_dot = _weak_pair(stub, "MT", "MT.")

    assert _admin(server, "settle", f1, f_1, "distinct", "--reason", "F1 score vs Formula 1",
                  "--actor", "alice") == 0
    assert _admin(server, "settle", mt_dot, mt, "same", "--reason", "one task") == 0
    out = capsys.readouterr().out
    assert f"entity_id:     {mt}" in out  # the older of two provisional entities is the target
    assert _open_links(stub) == set()

    merged = stub.GetEntity(pb.GetEntityRequest(entity_id=mt_dot), timeout=10).entity
    assert merged.status == pb.MERGED and merged.redirect_to == mt
    changes = list(stub.ListChanges(pb.ListChangesRequest(), timeout=10))
    settled = [json.loads(c.change.detail) for c in changes
               if c.change.kind == pb.CHANGE_KIND_LINK_SETTLED]
    assert [(s["decision"], s["actor"], s["reason"]) for s in settled] == [
        ("distinct", "alice", "F1 score vs Formula 1"),
        ("same", getpass.getuser(), "one task"),  # the actor defaults to the login name
    ]

    # Settling again: the pair is no longer linked, and the server says so.
    assert _admin(server, "settle", f1, f_1, "same", "--reason", "changed my mind") == 1
    assert "FAILED_PRECONDITION" in capsys.readouterr().err


def test_merge_promote_and_alias_act_on_the_server(
        server: RunningServer, stub: pb_grpc.IdentityServiceStub, capsys: CaptureFixture) -> None:
    ada = _resolve(stub, "Ada Lovelace", "person").entity_id
    countess = _resolve(stub, "Countess of Lovelace", "person").entity_id

    assert _admin(server, "merge", countess, ada) == 0
    assert _admin(server, "promote", ada) == 0
    assert _admin(server, "alias", ada, "Augusta Ada King") == 0
    out = capsys.readouterr().out
    assert "status:        CANONICAL" in out and "aliases:       Augusta Ada King" in out

    live = stub.GetEntity(pb.GetEntityRequest(entity_id=ada), timeout=10).entity
    assert live.status == pb.CANONICAL
    assert list(live.aliases) == ["Augusta Ada King"]
    assert list(live.surface_forms) == ["Countess of Lovelace"]  # a provisional name
    assert _resolve(stub, "Augusta Ada Kinf", "person").entity_id == ada  # a typo anchor now

    assert _run(server, "entity", countess) == 0
    out = capsys.readouterr().out
    assert "status:        MERGED" in out and f"redirect_to:   {ada}" in out

    assert _admin(server, "merge", ada, ada) == 1
    assert "FAILED_PRECONDITION: cannot merge" in capsys.readouterr().err

    # Named by its merged-away id, an entity is acted on where the id redirects, saying so.
    assert _admin(server, "alias", countess, "A. A. King") == 0
    captured = capsys.readouterr()
    assert f"note: {countess} was merged into {ada}; this acted on {ada}" in captured.err
    assert f"entity_id:     {ada}" in captured.out
    assert _admin(server, "alias", ada, "Ada King") == 0
    assert "note:" not in capsys.readouterr().err


def test_admin_commands_without_the_token_say_how_to_give_it(
        server: RunningServer, stub: pb_grpc.IdentityServiceStub, capsys: CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    ada = _resolve(stub, "Ada Lovelace", "person").entity_id
    monkeypatch.delenv("IDENTITY_ADMIN_TOKEN", raising=False)

    assert _run(server, "promote", ada) == 2
    err = capsys.readouterr().err
    assert "--admin-token" in err and "IDENTITY_ADMIN_TOKEN" in err
    assert _run(server, "promote", ada, "--admin-token", "wrong") == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err
    assert stub.GetEntity(pb.GetEntityRequest(entity_id=ada), timeout=10).entity.status == (
        pb.PROVISIONAL)

    assert _run(server, "promote", ada, "--admin-token", "sëcret") == 2  # cannot be a header
    err = capsys.readouterr().err
    assert "must be visible ASCII" in err and "sëcret" not in err

    monkeypatch.setenv("IDENTITY_ADMIN_TOKEN", ADMIN_TOKEN)
    assert _run(server, "promote", ada) == 0
    assert stub.GetEntity(pb.GetEntityRequest(entity_id=ada), timeout=10).entity.status == (
        pb.CANONICAL)


def test_entity_fetches_and_shows_a_page_of_surface_forms(
        server: RunningServer, stub: pb_grpc.IdentityServiceStub, capsys: CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    name = "graph attention network"
    eid = _resolve(stub, name, "method").entity_id
    forms = []
    for bits in range(1, 26):  # 25 case forms, each first seen once: a surface form each
        form = "".join(c.upper() if bits >> i & 1 else c for i, c in enumerate(name))
        forms.append(form)
        assert _resolve(stub, form, "method").match_kind == pb.CASE
    stub.Resolve(pb.ResolveRequest(mention=name, entity_type="method", context_id="paper-1"),
                 timeout=10)
    capsys.readouterr()

    assert _run(server, "entity", eid, "--forms", "3") == 0
    out = capsys.readouterr().out
    assert (f"surface_forms: [1-3 of 25] {' | '.join(forms[:3])}  ... and {len(forms) - 3} "
            f"more") in out
    assert "evidence:      1 resolves in 1 papers" in out

    assert _run(server, "entity", eid, "--forms", "3", "--forms-offset", "21") == 0
    assert (f"surface_forms: [22-24 of 25] {' | '.join(forms[21:24])}  ... and 1 more"
            in capsys.readouterr().out)
    assert _run(server, "entity", eid, "--forms-offset", "30") == 0
    assert "surface_forms: none from 31 on (25 in all)" in capsys.readouterr().out

    assert _run(server, "entity", eid, "--json") == 0  # only the page shown travels
    shown = json.loads(capsys.readouterr().out)
    assert shown["surface_forms"] == forms[:20] and shown["surface_form_count"] == "25"
    assert shown["status"] == "PROVISIONAL"
    assert _run(server, "entity", eid, "--json", "--forms", "0") == 0
    assert json.loads(capsys.readouterr().out)["surface_forms"] == forms

    assert _run(server, "entity", eid, "--forms", "0") == 0
    assert f"surface_forms: {' | '.join(forms)}\n" in capsys.readouterr().out

    assert _run(server, "resolve", forms[4], "--type", "method", "--json") == 0
    resolved = json.loads(capsys.readouterr().out)
    assert (resolved["entity_id"], resolved["match_kind"]) == (eid, "EXACT")

    assert _run(server, "entity", "no-such-id") == 1
    assert "NOT_FOUND" in capsys.readouterr().err

    # The admin commands' replies carry the same first 20, not all 25.
    monkeypatch.setenv("IDENTITY_ADMIN_TOKEN", ADMIN_TOKEN)
    assert _run(server, "alias", eid, "GAT") == 0
    out = capsys.readouterr().out
    assert (f"surface_forms: [1-20 of 25] {' | '.join(forms[:20])}  ... and 5 more "
            f"(`entity {eid} --forms 0`: all)") in out
    assert "aliases:       GAT" in out
    assert _run(server, "promote", eid, "--json") == 0  # only those 20 travel
    promoted = json.loads(capsys.readouterr().out)
    assert promoted["surface_forms"] == forms[:20] and promoted["surface_form_count"] == "25"


def test_admin_commands_against_a_server_without_admin_say_so(
        db_url: str, capsys: CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not "give the token": this server has none, so no token would do."""
    from identity_server.server import start_server
    from identity_server.settings import Settings

    monkeypatch.delenv("IDENTITY_ADMIN_TOKEN", raising=False)
    running = start_server(Settings(db_url=db_url, port=0))
    try:
        assert _run(running, "promote", "Q1") == 1
        err = capsys.readouterr().err
        assert "UNAUTHENTICATED: admin RPCs are disabled: start the server with --admin-token" in err
        assert "give the token" not in err
    finally:
        running.stop(grace=0)


def test_settle_without_a_login_name_asks_for_the_actor(
        server: RunningServer, stub: pb_grpc.IdentityServiceStub, capsys: CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    f1, f_1 = _weak_pair(stub, "F1", "F-1")

    def no_login_name() -> str:
        raise OSError("No username set in the environment")

    monkeypatch.setattr(getpass, "getuser", no_login_name)
    assert _admin(server, "settle", f1, f_1, "distinct", "--reason", "r") == 2
    assert "give --actor" in capsys.readouterr().err
    assert _open_links(stub) == {frozenset((f1, f_1))}


def _entity(stub: pb_grpc.IdentityServiceStub, entity_id: str) -> pb.Entity | None:
    try:
        entity: pb.Entity = stub.GetEntity(pb.GetEntityRequest(entity_id=entity_id),
                                           timeout=10).entity
    except grpc.RpcError as e:
        assert e.code() is grpc.StatusCode.NOT_FOUND
        return None
    return entity


def test_import_through_a_running_server(
        server: RunningServer, stub: pb_grpc.IdentityServiceStub, capsys: CaptureFixture,
        tmp_path: Path) -> None:
    provisional = _resolve(stub, "ada lovelace", "person").entity_id
    authority = tmp_path / "authors.jsonl"
    authority.write_text('{"id": "Q7259", "name": "Ada Lovelace", "type": "person", '
                         '"aliases": ["Augusta Ada King"]}\n'
                         '{"id": "Q2", "name": "", "type": "person"}\n', encoding="utf-8")

    assert _admin(server, "import", str(authority)) == 1  # one record refused
    captured = capsys.readouterr()
    assert f"{authority}:2: empty name" in captured.err
    assert ("imported 1 records (1 new, 0 replaced); merged 1 provisional entities, linked 0; "
            "refused 1 records") in captured.out
    ada = _entity(stub, "Q7259")
    assert ada is not None and list(ada.aliases) == ["Augusta Ada King"]
    merged = _entity(stub, provisional)
    assert merged is not None and merged.redirect_to == "Q7259"

    assert _run(server, "import", str(authority)) == 2  # admin: no token, no import
    assert "IDENTITY_ADMIN_TOKEN" in capsys.readouterr().err


def test_import_through_a_server_sends_no_line_cut_short(
        server: RunningServer, stub: pb_grpc.IdentityServiceStub, capsys: CaptureFixture,
        tmp_path: Path) -> None:
    """A gzip file whose data breaks off inside a record: the whole lines before it are
    imported, and the part of the record read so far is not (it would be a valid record with
    an alias cut short)."""
    whole = b"id,name,type,aliases\nQ1,Ada Lovelace,person,Countess of Lovelace\n"
    part = b"Q2,Charles Babbage,person,Father of the Comp"  # "...uter" is lost with the rest
    rest = gzip.compress(b"uter\nQ3,Alan Turing,person,\n")[:10]  # its header, no data
    packed = tmp_path / "authority.csv.gz"
    packed.write_bytes(gzip.compress(whole + part) + rest)

    assert _admin(server, "import", str(packed)) == 2
    captured = capsys.readouterr()
    assert "the gzip data is corrupt or cut short after line 2" in captured.err
    assert "imported 1 records (1 new, 0 replaced)" in captured.out
    assert _entity(stub, "Q1") is not None
    assert _entity(stub, "Q2") is None and _entity(stub, "Q3") is None


def test_a_utf16_file_is_refused_through_a_server_as_into_a_store(
        server: RunningServer, stub: pb_grpc.IdentityServiceStub, capsys: CaptureFixture,
        tmp_path: Path) -> None:
    """Exit 2 and the same message both ways (through a server it exited 1, and its message
    spoke of records 'from before it')."""
    wide = tmp_path / "authority.jsonl"
    wide.write_bytes("\ufeff{\"id\": \"Q1\", \"name\": \"Ada\", \"type\": \"person\"}\n"
                     .encode("utf-16-le"))
    says = f"error: {wide}: the authority file is UTF-16 (it starts with a UTF-16 byte-order mark)"
    assert _admin(server, "import", str(wide)) == 2
    assert says in capsys.readouterr().err
    assert cli.main(["import", str(wide), "--db", f"sqlite:///{tmp_path / 'own.sqlite'}"]) == 2
    err = capsys.readouterr().err
    assert says in err and "from before it" not in err
    assert _entity(stub, "Q1") is None


def test_import_through_a_server_keeps_lines_whole_across_reads(
        server: RunningServer, stub: pb_grpc.IdentityServiceStub, capsys: CaptureFixture,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads of a few bytes, and a cap on what is held back below a line's length: every line
    reaches the server whole, once, in order (the server's own cap is the real one)."""
    monkeypatch.setattr(remote, "READ_CHUNK", 7)
    monkeypatch.setattr(remote, "MAX_LINE_BYTES", 20)
    records = [(f"Q{i}", f"Person Number {i} of the Test", f"P. N. {i}") for i in range(1, 6)]
    authority = tmp_path / "people.csv"
    authority.write_text("id,name,type,aliases\n" + "".join(
        f"{i},{name},person,{alias}\n" for i, name, alias in records), encoding="utf-8")

    assert _admin(server, "import", str(authority)) == 0
    assert "imported 5 records (5 new, 0 replaced)" in capsys.readouterr().out
    for i, name, alias in records:
        got = _entity(stub, i)
        assert got is not None and (got.name, list(got.aliases)) == (name, [alias])


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf", "soon"])
def test_a_deadline_that_cannot_work_is_refused_naming_the_flag(
        timeout: str, capsys: CaptureFixture) -> None:
    for argv in (["entity", "Q1"], ["import", "-", "--server", "127.0.0.1:1"]):
        with pytest.raises(SystemExit) as exited:
            cli.main([*argv, "--timeout", timeout])
        assert exited.value.code == 2
        assert "argument --timeout:" in capsys.readouterr().err


@pytest.mark.parametrize(("server", "says"), [
    ("http://127.0.0.1:50051", "takes host:port (e.g. 127.0.0.1:50051), not a http:// URL"),
    ("127.0.0.1", "takes host:port (e.g. 127.0.0.1:50051), got '127.0.0.1'"),  # gRPC: port 443
])
def test_a_server_address_that_is_not_host_port_is_refused_at_once(
        server: str, says: str, capsys: CaptureFixture) -> None:
    for argv in (["entity", "Q1"], ["import", "-"]):
        with pytest.raises(SystemExit) as exited:
            cli.main([*argv, "--server", server])
        assert exited.value.code == 2
        assert f"argument --server: {says}" in capsys.readouterr().err


def test_an_unknown_option_is_reported_with_the_commands_usage(capsys: CaptureFixture) -> None:
    """argparse printed the top-level usage, which does not show the command's options."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--prot", "0"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: identity-server serve ") and "--port PORT" in err
    assert "identity-server serve: error: unrecognized arguments: --prot 0" in err
    with pytest.raises(SystemExit):
        cli.main(["entity", "Q1", "--log-level", "debug"])
    assert ("--log-level is an option of identity-server itself: give it before the command"
            in capsys.readouterr().err)


def test_entity_shows_an_entity_whose_reply_outgrows_grpcs_default_4_mb(
        server: RunningServer, capsys: CaptureFixture) -> None:
    """gRPC clients take 4 MB by default; the server sends up to 64 MB, and so many spellings
    of one long name make a reply of ~5 MB."""
    import random

    name = "a" * 300 + " graph attention network " + "b" * 180
    rng = random.Random(7)
    forms = list(dict.fromkeys(
        "".join(c.upper() if rng.random() < 0.5 else c for c in name) for _ in range(10_200)))
    options = [("grpc.max_receive_message_length", 64 << 20)]
    with grpc.insecure_channel(f"127.0.0.1:{server.port}", options=options) as channel:
        big = pb_grpc.IdentityServiceStub(channel)
        eid = _resolve(big, name, "method").entity_id
        for start in range(0, len(forms), 5000):
            reply = big.ResolveBatch(pb.ResolveBatchRequest(mentions=[
                pb.Mention(mention=f, entity_type="method") for f in forms[start:start + 5000]]),
                timeout=120)
            assert {r.resolved.entity_id for r in reply.results} == {eid}

    assert _run(server, "entity", eid, "--json", "--forms", "0") == 0
    shown = json.loads(capsys.readouterr().out)
    assert len(shown["surface_forms"]) == len(forms) and len(json.dumps(shown)) > 4 << 20
