"""Pure checks: one raw line -> a checked paper (mentions, relationships) plus per-item rejects.

Nothing here does I/O. A line that cannot be a paper at all (not JSON, no paper_id, mentions not a
list) is rejected whole; anything smaller rejects only that item, and relationships that lean on a
rejected or missing mention are rejected with it, so the rest of the paper is always stored.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel, ValidationError

from ingest.models import (
    EvidenceIn,
    Limits,
    MentionIn,
    PaperEnvelope,
    RelationshipIn,
    Span,
    SpanError,
    limits_in_force,
    to_span,
)
from ingest.read import RawLine
from ingest.vocabulary import Vocabulary

logger = logging.getLogger(__name__)

RAW_KEEP_CHARS = 4096
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


@dataclass(frozen=True, slots=True)
class Reject:
    """One rejected item of a paper (or the whole line when ``item`` is empty)."""

    item: str
    reason: str
    raw: str | None


@dataclass(frozen=True, slots=True)
class CheckedMention:
    index: int
    mention_id: str
    text: str
    entity_type: str
    span: Span | None


@dataclass(frozen=True, slots=True)
class CheckedRelationship:
    index: int
    relationship_id: str
    subject_mention_id: str
    object_mention_id: str
    predicate: str
    raw_predicate: str
    inverted: bool
    confidence: float
    evidence_span: Span | None
    evidence_quote: str | None


@dataclass(frozen=True, slots=True)
class CheckedPaper:
    """A paper that passed the envelope checks; its bad items are in ``rejects``."""

    position: str
    paper_id: str
    revision: str
    content_hash: str
    mentions: tuple[CheckedMention, ...]
    relationships: tuple[CheckedRelationship, ...]
    rejects: tuple[Reject, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class LineReject:
    """A line that could not be read as a paper; ``paper_id`` is set when it could be read."""

    position: str
    reason: str
    raw: str
    paper_id: str | None = None
    content_hash: str | None = None


def canonical_json(value: Any) -> str:
    """A stable text form (sorted keys, no spaces) so hashes ignore formatting."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8", errors="surrogatepass"))
        h.update(b"\x1f")
    return h.hexdigest()


def relationship_id(paper_id: str, revision: str, content_hash: str, relationship: str) -> str:
    """Derived from the paper, its revision (and content) and the relationship itself."""
    return _digest("rel", paper_id, revision, content_hash, relationship)[:32]


def _keep(text: str) -> str:
    return text if len(text) <= RAW_KEEP_CHARS else text[:RAW_KEEP_CHARS] + "…"


def _raw_item(item: Any) -> str:
    try:
        return _keep(canonical_json(item))
    except (TypeError, ValueError):
        return _keep(repr(item))


def _describe(error: ValidationError, where: str) -> str:
    """One readable sentence per error: ``mentions[3].text: text is empty``."""
    parts = []
    for err in error.errors(include_url=False):
        loc = ".".join(str(x) for x in err["loc"] if not str(x).startswith("function-"))
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "missing":
            msg = "required field is missing"
        elif "input" in err and err["type"].endswith("_type"):
            msg = f"{msg} (got {type(err['input']).__name__})"
        parts.append(f"{where}.{loc}: {msg}" if loc else f"{where}: {msg}")
    return "; ".join(dict.fromkeys(parts))


def _validate(model: type[BaseModel], item: Any, where: str) -> Any:
    if not isinstance(item, dict):
        raise _ItemError(f"{where}: must be a JSON object, got {_json_type(item)}")
    try:
        return model.model_validate(item)
    except ValidationError as e:
        raise _ItemError(_describe(e, where)) from e


class _ItemError(Exception):
    pass


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    for py, name in names.items():
        if isinstance(value, py):
            return name
    return "number" if isinstance(value, int | float) else type(value).__name__


def _span(value: Any, where: str) -> Span | None:
    try:
        return to_span(value)
    except SpanError as e:
        raise _ItemError(f"{where}: {e}") from e


def parse_line(raw: RawLine, *, vocabulary: Vocabulary, limits: Limits) -> CheckedPaper | LineReject:
    """Reads one line into a checked paper, or rejects the line with a reason."""
    with limits_in_force(limits):
        return _parse_line(raw, vocabulary, limits)


def _parse_line(raw: RawLine, vocabulary: Vocabulary, limits: Limits) -> CheckedPaper | LineReject:
    prefix = raw.prefix.decode("utf-8", errors="replace")
    if raw.data is None:
        return LineReject(
            raw.position,
            f"line is {raw.size} bytes long, more than the cap of {limits.max_line_bytes} bytes",
            _keep(prefix),
        )
    try:
        obj = json.loads(raw.data.decode("utf-8").removeprefix("\ufeff"))
    except UnicodeDecodeError as e:
        return LineReject(raw.position, f"line is not valid UTF-8: {e}", _keep(prefix))
    except ValueError as e:
        return LineReject(raw.position, f"line is not valid JSON: {e}", _keep(prefix))
    if not isinstance(obj, dict):
        return LineReject(
            raw.position, f"line must be a JSON object, got {_json_type(obj)}", _keep(prefix)
        )
    content_hash = _digest("paper", canonical_json(obj))
    paper_id = obj.get("paper_id") if isinstance(obj.get("paper_id"), str) else None
    try:
        envelope = PaperEnvelope.model_validate(obj)
    except ValidationError as e:
        return LineReject(raw.position, _describe(e, "paper"), _keep(prefix), paper_id, content_hash)
    return check_paper(envelope, raw.position, content_hash, vocabulary=vocabulary, limits=limits)


def check_paper(
    envelope: PaperEnvelope,
    position: str,
    content_hash: str,
    *,
    vocabulary: Vocabulary,
    limits: Limits,
) -> CheckedPaper:
    """Checks every mention and relationship of a paper; bad ones become rejects."""
    revision = envelope.revision if envelope.revision is not None else content_hash
    rejects: list[Reject] = []
    mentions: list[CheckedMention] = []
    seen_mentions: dict[str, int] = {}
    rejected_mentions: dict[str, str] = {}
    for i, item in enumerate(envelope.mentions):
        where = f"mentions[{i}]"
        if i >= limits.max_mentions:
            rejects.append(
                Reject(where, f"{where}: paper has more than {limits.max_mentions} mentions",
                       _raw_item(item))
            )
            _note_rejected_id(item, where, rejected_mentions)
            continue
        try:
            m: MentionIn = _validate(MentionIn, item, where)
            span = _span(m.span, where + ".span")
        except _ItemError as e:
            rejects.append(Reject(where, str(e), _raw_item(item)))
            _note_rejected_id(item, where, rejected_mentions)
            continue
        if m.id in seen_mentions:
            rejects.append(
                Reject(where, f"{where}: duplicate mention id {m.id!r} (first at "
                       f"mentions[{seen_mentions[m.id]}])", _raw_item(item))
            )
            continue
        seen_mentions[m.id] = i
        mentions.append(CheckedMention(i, m.id, m.text, m.type, span))

    relationships: list[CheckedRelationship] = []
    seen_rels: dict[str, int] = {}
    for i, item in enumerate(envelope.relationships):
        where = f"relationships[{i}]"
        try:
            if i >= limits.max_relationships:
                raise _ItemError(f"{where}: paper has more than {limits.max_relationships} "
                                 "relationships")
            r: RelationshipIn = _validate(RelationshipIn, item, where)
            rel = _check_relationship(r, item, where, seen_mentions, rejected_mentions)
            evidence = r.evidence or EvidenceIn()
            evidence_span = _span(evidence.span, where + ".evidence.span")
        except _ItemError as e:
            rejects.append(Reject(where, str(e), _raw_item(item)))
            continue
        canonical = _relationship_key(r, evidence_span)
        if canonical in seen_rels:
            rejects.append(
                Reject(where, f"{where}: duplicate of relationships[{seen_rels[canonical]}]",
                       _raw_item(item))
            )
            continue
        seen_rels[canonical] = i
        reading = vocabulary.read(r.predicate)
        subject, obj = (rel[1], rel[0]) if reading.inverted else rel
        relationships.append(
            CheckedRelationship(
                index=i,
                relationship_id=relationship_id(envelope.paper_id, revision, content_hash,
                                                canonical),
                subject_mention_id=subject,
                object_mention_id=obj,
                predicate=reading.label,
                raw_predicate=r.predicate,
                inverted=reading.inverted,
                confidence=1.0 if r.confidence is None else r.confidence,
                evidence_span=evidence_span,
                evidence_quote=evidence.quote,
            )
        )
    return CheckedPaper(
        position=position,
        paper_id=envelope.paper_id,
        revision=revision,
        content_hash=content_hash,
        mentions=tuple(mentions),
        relationships=tuple(relationships),
        rejects=tuple(rejects),
    )


def _relationship_key(r: RelationshipIn, span: Span | None) -> str:
    """The relationship itself, as read (unknown keys ignored): its id's input and dedupe key."""
    quote = None if r.evidence is None else r.evidence.quote
    return _ENCODE([r.subject, r.predicate, r.object, r.confidence,
                    None if span is None else [span.start, span.end], quote])


def _note_rejected_id(item: Any, where: str, rejected: dict[str, str]) -> None:
    if isinstance(item, dict) and isinstance(item.get("id"), str):
        rejected.setdefault(item["id"], where)


def _check_relationship(
    r: RelationshipIn,
    item: Any,
    where: str,
    mentions: Mapping[str, int],
    rejected: Mapping[str, str],
) -> tuple[str, str]:
    for role, mid in (("subject", r.subject), ("object", r.object)):
        if mid not in mentions:
            if mid in rejected:
                raise _ItemError(
                    f"{where}.{role}: mention {mid!r} was rejected ({rejected[mid]})"
                )
            raise _ItemError(f"{where}.{role}: {mid!r} is not a mention id of this paper")
    if r.subject == r.object:
        raise _ItemError(f"{where}: self-loop, subject and object are both {r.subject!r}")
    return r.subject, r.object


def drop_refused_mentions(paper: CheckedPaper, refused: Mapping[int, str]) -> CheckedPaper:
    """Removes mentions the identity server refused (by mention index) and edges that use them."""
    if not refused:
        return paper
    rejects = list(paper.rejects)
    kept: list[CheckedMention] = []
    dropped: dict[str, str] = {}
    for m in paper.mentions:
        if m.index in refused:
            where = f"mentions[{m.index}]"
            rejects.append(
                Reject(where, f"{where}: identity server refused the mention: {refused[m.index]}",
                       _keep(canonical_json({"id": m.mention_id, "text": m.text,
                                             "type": m.entity_type})))
            )
            dropped[m.mention_id] = where
        else:
            kept.append(m)
    rels: list[CheckedRelationship] = []
    for r in paper.relationships:
        bad = next((x for x in (r.subject_mention_id, r.object_mention_id) if x in dropped), None)
        if bad is None:
            rels.append(r)
            continue
        where = f"relationships[{r.index}]"
        rejects.append(Reject(where, f"{where}: mention {bad!r} was rejected ({dropped[bad]})",
                              None))
    return replace(paper, mentions=tuple(kept), relationships=tuple(rels), rejects=tuple(rejects))
