"""The W3C Reconciliation Service API, version 0.2 (what OpenRefine 3.3 and later speak), over
the section-2 rules: `identity-server serve --reconcile-port N` serves it at /reconcile.

A query is decided as a lookup-only Resolve is: nothing is written. Its candidates are the
deciding rule's, in the rules' order; `match` is true exactly on the entity the rules converge
on (EXACT, CASE, PUNCTUATION, ALIAS or TYPO) and nowhere else. Scores (0-100) are rapidfuzz's
similarity of the mention to the name each candidate matched through, capped so that the
rules' order holds: the winner scores highest, and a candidate the rules rank lower never
scores above one they rank higher. docs/reconciliation.md has the shapes and an example.
"""

from __future__ import annotations

import html
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from identity_server.access import AccessPolicy, Role
from identity_server.domain import OTHER, Mention
from identity_server.errors import (
    EntityNotFound,
    IdentityError,
    InvalidArgument,
    PermissionDenied,
    StartupError,
    Unauthenticated,
)
from identity_server.matching import Decision, Outcome
from identity_server.scoring import capped, similarity

if TYPE_CHECKING:
    from identity_server.service import IdentityService

logger = logging.getLogger(__name__)

VERSIONS = ["0.2"]
IDENTIFIER_SPACE = "https://paper-identity.invalid/entity/"
SCHEMA_SPACE = "https://paper-identity.invalid/type/"
DEFAULT_LIMIT = 10
MAX_QUERIES = 1000  # a request's queries: OpenRefine sends 10 a request by default
JSON_HEADERS = {"Cache-Control": "no-store"}


@dataclass(frozen=True)
class Query:
    text: str
    types: tuple[str, ...]
    limit: int


def candidates_of(decision: Decision, mention: Mention) -> list[dict[str, Any]]:
    """The reconciliation candidates of a decision, in the rules' order, with the scores a
    Resolve's reply gives them (identity_server.scoring)."""
    converged = decision.outcome is Outcome.CONVERGED
    # What the rules found: the winner's match kind, else the outcome (ambiguous, weak).
    found = decision.match_kind.value.lower() if converged else decision.outcome.value
    similarities = [similarity(mention.display, c.matched_name) for c in decision.candidates]
    scores = capped(decision, similarities)
    out: list[dict[str, Any]] = []
    for i, (candidate, score, alike) in enumerate(
            zip(decision.candidates, scores, similarities, strict=True)):
        entity = candidate.entity
        winner = converged and i == 0
        out.append({
            "id": entity.entity_id,
            "name": entity.name,
            "type": [{"id": entity.entity_type, "name": entity.entity_type}],
            "score": score,
            "match": winner,
            "features": [
                {"id": "name_similarity", "value": alike},
                {"id": found if winner or not converged else "candidate", "value": True}],
        })
    return out


class Reconciler:
    """The endpoint's work: parse queries, decide each through the service, shape replies."""

    def __init__(self, service: IdentityService, access: Callable[[], AccessPolicy]) -> None:
        self.service = service
        self._access = access

    def manifest(self, base: str) -> dict[str, Any]:
        types = sorted(self.service.config.vocabulary.types)
        return {
            "versions": VERSIONS,
            "name": "paper-identity entity reconciliation",
            "identifierSpace": IDENTIFIER_SPACE,
            "schemaSpace": SCHEMA_SPACE,
            "defaultTypes": [{"id": t, "name": t} for t in types],
            "view": {"url": f"{base}entity/{{{{id}}}}"},
            "preview": {"url": f"{base}preview/{{{{id}}}}", "width": 430, "height": 90},
        }

    def check_access(self, request: Request) -> None:
        header = request.headers.get("authorization")
        self._access().check((("authorization", header),) if header else (), Role.READER,
                             "reconciliation")

    def _decide(self, mention: Mention) -> Decision:
        """Under the index's read guarantees (`LiveIndex.answer`): the index as it is then."""
        return self.service.core.decide(self.service.index, mention)

    def reconcile(self, queries: dict[str, Query]) -> dict[str, Any]:
        service = self.service
        out: dict[str, Any] = {}
        for name, q in queries.items():
            mention_type = next((t for t in q.types if t in service.config.vocabulary.types),
                                q.types[0] if q.types else OTHER)
            try:
                mention = service.parse_mention(q.text, mention_type)
            except InvalidArgument:  # nothing to reconcile (empty, too long): no candidates
                out[name] = {"result": []}
                continue
            decision = service.live.answer(self._decide, mention)
            out[name] = {"result": candidates_of(decision, mention)[:q.limit]}
        return out


def parse_queries(text: str) -> dict[str, Query]:
    """The `queries` parameter: a JSON object of named queries; InvalidArgument says what is
    wrong and with which query."""
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise InvalidArgument(f"queries is not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise InvalidArgument("queries must be a JSON object of named queries "
                              '({"q0": {"query": "..."}, ...})')
    if len(raw) > MAX_QUERIES:
        raise InvalidArgument(f"{len(raw)} queries in one request; the limit is {MAX_QUERIES}")
    out = {}
    for name, q in raw.items():
        if not isinstance(q, dict) or not isinstance(q.get("query"), str):
            raise InvalidArgument(f"query {name!r} must be an object with a string `query`")
        types = q.get("type")
        if types is None:
            type_list: tuple[str, ...] = ()
        elif isinstance(types, str):
            type_list = (types,)
        elif isinstance(types, list) and all(isinstance(t, str) for t in types):
            type_list = tuple(types)
        else:
            raise InvalidArgument(f"query {name!r}: `type` must be a string or a list of them")
        limit = q.get("limit", DEFAULT_LIMIT)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise InvalidArgument(f"query {name!r}: `limit` must be a whole number")
        strict = q.get("type_strict", "should")
        if strict not in ("any", "all", "should"):
            raise InvalidArgument(f"query {name!r}: `type_strict` must be any, all or should")
        out[str(name)] = Query(q["query"], tuple(t.strip().casefold() for t in type_list),
                               limit or DEFAULT_LIMIT)
    return out


def _reply(request: Request, body: Any, status: int = 200) -> Response:
    """JSON, or JSONP when the request names a `callback` (older OpenRefine)."""
    callback = request.query_params.get("callback")
    if callback and callback.replace("_", "").replace(".", "").isalnum():
        text = f"{callback}({json.dumps(body, ensure_ascii=False)})"
        return Response(text, status, media_type="application/javascript",
                        headers=JSON_HEADERS)
    return JSONResponse(body, status, headers=JSON_HEADERS)


def _error(request: Request, status: int, message: str) -> Response:
    return _reply(request, {"status": "error", "message": message}, status)


def build_app(reconciler: Reconciler) -> Starlette:
    """The ASGI app: /reconcile (manifest and queries), /entity/ID (JSON), /preview/ID."""

    def guarded(handler: Callable[[Request], Response]) -> Callable[[Request], Response]:
        def run(request: Request) -> Response:
            try:
                reconciler.check_access(request)
                return handler(request)
            except PermissionDenied as e:
                return _error(request, 403, str(e))
            except EntityNotFound as e:
                return _error(request, 404, str(e))
            except InvalidArgument as e:
                return _error(request, 400, str(e))
            except Unauthenticated as e:
                return _error(request, 401, str(e))
            except IdentityError as e:  # the store failed
                return _error(request, 503, str(e))
        return run

    async def reconcile(request: Request) -> Response:
        queries = request.query_params.get("queries")
        if request.method == "POST":  # a form, as OpenRefine posts it (urlencoded)
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind not in ("", "application/x-www-form-urlencoded"):
                return _error(request, 415, f"POST the queries as a urlencoded form field "
                                            f"`queries`, not {kind}")
            body = (await request.body()).decode("utf-8", errors="replace")
            posted = urllib.parse.parse_qs(body).get("queries")
            queries = posted[0] if posted else queries
        started = time.perf_counter()

        def answer(req: Request) -> Response:
            if queries is None:
                return _reply(req, reconciler.manifest(str(req.base_url)))
            parsed = parse_queries(queries)
            reply = reconciler.reconcile(parsed)
            logger.debug("reconcile queries=%d duration_ms=%.2f", len(parsed),
                         (time.perf_counter() - started) * 1e3)
            return _reply(req, reply)

        return await run_in_threadpool(guarded(answer), request)

    def entity(request: Request) -> Response:
        view = reconciler.service.get_entity(request.path_params["entity_id"],
                                              max_surface_forms=20)
        return _reply(request, {
            "id": view.entity_id, "name": view.name, "type": view.entity_type,
            "status": view.status.value, "aliases": list(view.aliases),
            "surface_forms": list(view.surface_forms), "redirect_to": view.redirect_to,
            "papers": view.paper_count})

    def preview(request: Request) -> Response:
        view = reconciler.service.get_entity(request.path_params["entity_id"],
                                              max_surface_forms=5)
        aliases = ", ".join(html.escape(a) for a in view.aliases) or "no aliases"
        return HTMLResponse(
            f"<html><body style='font-family:sans-serif;margin:0'><b>{html.escape(view.name)}"
            f"</b> <i>{html.escape(view.entity_type)}, {view.status.value}</i><br>"
            f"<small>{html.escape(view.entity_id)} &middot; {aliases} &middot; "
            f"{view.paper_count} papers</small></body></html>")

    return Starlette(
        routes=[
            Route("/reconcile", reconcile, methods=["GET", "POST"]),
            Route("/entity/{entity_id:path}", guarded(entity), methods=["GET"]),
            Route("/preview/{entity_id:path}", guarded(preview), methods=["GET"]),
        ],
        # The spec asks for CORS: OpenRefine and browser clients call from other origins.
        middleware=[Middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["GET", "POST"],
                               allow_headers=["authorization", "content-type"])],
    )


class ReconcileServer:
    """The endpoint served by uvicorn on a thread of its own; `close` stops it."""

    def __init__(self, app: Starlette, host: str, port: int) -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                                access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="reconcile", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise StartupError(f"cannot serve reconciliation on {host}:{port}: the port "
                                   "is in use, or the address is not one of this machine's")
            time.sleep(0.01)
        sockets: Sequence[Any] = self._server.servers[0].sockets
        self.port: int = sockets[0].getsockname()[1]

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


__all__ = ["ReconcileServer", "Reconciler", "build_app", "candidates_of", "parse_queries"]
