"""Pure checks: one raw line -> a checked paper (mentions, relationships) plus per-item rejects.

Nothing here does I/O. A line that cannot be a paper at all (not JSON, no paper_id, mentions not a
list) is rejected whole; anything smaller rejects only that item, and relationships that lean on a
rejected or missing mention are rejected with it, so the rest of the paper is always stored.
"""

from __future__ import annotations

import hashlib
import json
import json.encoder
import logging
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import orjson
from pydantic import BaseModel, ValidationError

from ingest.models import (
    MAX_OFFSET,
    EvidenceIn,
    Limits,
    LongInteger,
    MentionIn,
    PaperEnvelope,
    RelationshipIn,
    Span,
    SpanError,
    first_surrogate,
    integer_as_text,
    limits_in_force,
    to_span,
)
from ingest.read import RawLine
from ingest.vocabulary import Vocabulary

logger = logging.getLogger(__name__)

RAW_KEEP_CHARS = 4096
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
# canonical_json for values read by json.loads (which cannot hold cycles): the same text, built
# once instead of per call, without the cycle check.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              check_circular=False).encode
_SEP = b"\x1f"
# How the encoders above write a string (ensure_ascii=False): the same C function.
_json_str = json.encoder.encode_basestring
_BOM = b"\xef\xbb\xbf"
_DIGITS = frozenset(b"0123456789")


def _numbers_as_stdlib(encoded: bytes) -> bool:
    """False when orjson's text may hold a number ``_CANONICAL`` writes otherwise: a float
    below 1e-4 in magnitude, which orjson writes as 1e-7 (float.__repr__: 1e-07) or 0.00005
    (5e-05); an integer beyond 64 bits, which orjson reads as a float, written with e+. Text
    that only looks so ("lr 1e-5" in a quote) costs the stdlib's reading, nothing else."""
    if b"0.0000" in encoded:
        return False
    for mark in (b"e-", b"e+"):
        i = encoded.find(mark, 1)
        while i != -1:
            if encoded[i - 1] in _DIGITS:
                return False
            i = encoded.find(mark, i + 2)
    return True


def _read_fast(data: bytes) -> tuple[dict[str, Any], bytes, bool] | None:
    """A line read by orjson and its canonical text, when both are what ``json.loads`` and
    ``_CANONICAL`` make of it (the usual case, at a quarter of their cost); None sends the line
    to them. orjson refuses what they might read otherwise (a lone surrogate, NaN, 1e400, deep
    nesting); its text is checked for the number forms it writes differently."""
    try:
        obj = orjson.loads(data.removeprefix(_BOM))
        if type(obj) is not dict:
            return None
        encoded = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        return None
    if not _numbers_as_stdlib(encoded):
        return None
    return obj, encoded, True  # orjson refuses lone surrogates: the text is plain UTF-8


def _read_stdlib(raw: RawLine, prefix: str) -> tuple[dict[str, Any], bytes, bool] | LineReject:
    """The line read by ``json``, its canonical text, and whether that text is plain UTF-8
    (False when it holds lone surrogates); or the line's reject, saying why it is no JSON
    object."""
    assert raw.data is not None
    long_integers = False

    def integer(text: str) -> int | float:
        nonlocal long_integers
        try:
            return int(text)
        except ValueError:  # more digits than Python converts: the item holding it is refused
            long_integers = True
            return LongInteger(text)

    try:
        obj = json.loads(raw.data.decode("utf-8").removeprefix("\ufeff"), parse_int=integer)
    except UnicodeDecodeError as e:
        return LineReject(raw.position, f"line is not valid UTF-8: {e}", _keep(prefix))
    except json.JSONDecodeError as e:
        # Its "line 1 column 42" counts inside the JSON text; the position names the file line.
        # Some messages end in "at" already ("Unterminated string starting at").
        return LineReject(raw.position, f"line is not valid JSON: {e.msg.removesuffix(' at')} "
                                        f"at column {e.colno}", _keep(prefix))
    except ValueError as e:
        return LineReject(raw.position, f"line is not valid JSON: {e}", _keep(prefix))
    if not isinstance(obj, dict):
        return LineReject(
            raw.position, f"line must be a JSON object, got {_json_type(obj)}", _keep(prefix)
        )
    canonical = _with_long_integers(obj) if long_integers else _CANONICAL(obj)
    try:
        return obj, canonical.encode("utf-8"), True
    except UnicodeEncodeError:  # lone surrogates: hashed as before, checked item by item
        return obj, canonical.encode("utf-8", errors="surrogatepass"), False


@dataclass(frozen=True, slots=True)
class Reject:
    """One rejected item of a paper (or the whole line when ``item`` is empty)."""

    item: str
    reason: str
    raw: str | None


class CheckedMention(NamedTuple):
    """One mention that passed its checks (a named tuple: one is built per mention)."""

    index: int  # type: ignore[assignment]  # shadows tuple.index, which nothing here uses
    mention_id: str
    text: str
    entity_type: str
    span: Span | None


class CheckedRelationship(NamedTuple):
    """One relationship that passed its checks (a named tuple: one is built per relationship)."""

    index: int  # type: ignore[assignment]  # shadows tuple.index, which nothing here uses
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
    return _with_long_integers(value)


# Stands in for a LongInteger's digits while the encoder writes the rest (it would write an
# infinity): a string no input holds, since it is drawn anew by each process.
_LONG_INTEGER = f"long-integer-{secrets.token_hex(16)}-"


def _with_long_integers(value: Any) -> str:
    """_CANONICAL(value), with each LongInteger in it written as its digits (the JSON it was)."""
    digits: list[str] = []

    def stand_in(v: Any) -> Any:
        if isinstance(v, LongInteger):
            digits.append(v.text)
            return f"{_LONG_INTEGER}{len(digits) - 1}"
        if isinstance(v, dict):
            return {k: stand_in(x) for k, x in v.items()}
        if isinstance(v, list):
            return [stand_in(x) for x in v]
        return v

    text = _CANONICAL(stand_in(value))
    for i, d in enumerate(digits):
        text = text.replace(f'"{_LONG_INTEGER}{i}"', d, 1)
    return text


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
    """The raw text kept with a reject: capped, and storable (lone surrogates escaped)."""
    if first_surrogate(text) is not None:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
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
            given = err["input"]
            got = (f"a {given.digits}-digit integer" if isinstance(given, LongInteger)
                   else type(given).__name__)
            msg = f"{msg} (got {got})"
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
        try:
            return _parse_line(raw, vocabulary, limits)
        except RecursionError:  # JSON nested deeper than Python's parser and encoder can follow
            return LineReject(raw.position, "line nests JSON too deeply to be read",
                              _keep(raw.prefix.decode("utf-8", errors="replace")))


def _parse_line(raw: RawLine, vocabulary: Vocabulary, limits: Limits) -> CheckedPaper | LineReject:
    prefix = raw.prefix.decode("utf-8", errors="replace")
    if raw.unreadable:
        return LineReject(raw.position, raw.unreadable, "")
    if raw.data is None:
        return LineReject(
            raw.position,
            f"line is {raw.size} bytes long, more than the cap of {limits.max_line_bytes} bytes",
            _keep(prefix),
        )
    read = _read_fast(raw.data) or _read_stdlib(raw, prefix)
    if isinstance(read, LineReject):
        return read
    obj, encoded, plain = read
    content_hash = hashlib.sha256(b"paper" + _SEP + encoded + _SEP).hexdigest()
    if plain:
        fast = _fast_paper(obj, raw.position, content_hash, vocabulary, limits)
        if fast is not None:
            return fast
    paper_id = integer_as_text(obj.get("paper_id"))
    paper_id = paper_id if isinstance(paper_id, str) else None
    if paper_id is not None and first_surrogate(paper_id) is not None:
        paper_id = None  # the reject is stored without it; its reason says what is wrong
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


# -- the fast path ---------------------------------------------------------------------------------
#
# Most papers are clean. For them, one pass of plain type and size checks over the parsed JSON
# gives the same CheckedPaper as the per-item pydantic validation above at a fraction of the cost.
# The pass accepts only what the per-item path accepts without a single reject and builds exactly
# what it builds; anything else (a bad item, a duplicate, a cap, an unusual shape) returns None and
# the paper is checked item by item, so reasons and positions come from one place only. The unit
# tests hold the two paths to the same output.

_STR, _INT, _FLOAT, _DICT, _LIST = str, int, float, dict, list


def _fast_span(value: Any) -> Span | None | bool:
    """A valid span (or None when absent), or False when the per-item path must judge it."""
    if value is None:
        return None
    if type(value) is _LIST:
        if len(value) != 2:
            return False
        start, end = value
    elif type(value) is _DICT:
        start = value.get("start")
        end = value.get("end")
    else:
        return False
    if (type(start) is not _INT or type(end) is not _INT or start < 0 or end < start
            or end > MAX_OFFSET):
        return False
    return Span(start, end)


def _fast_paper(
    obj: dict[str, Any], position: str, content_hash: str, vocabulary: Vocabulary, limits: Limits
) -> CheckedPaper | None:
    """The whole paper when every item passes every check; None sends it to ``check_paper``."""
    paper_id = obj.get("paper_id")
    revision = obj.get("revision")
    if type(paper_id) is _INT:  # ids and revisions may be integers, read as their text
        paper_id = str(paper_id)
    if type(revision) is _INT:
        revision = str(revision)
    mention_items = obj.get("mentions")
    relationship_items = obj.get("relationships")
    max_id = limits.max_id_chars
    if (type(paper_id) is not _STR or type(mention_items) is not _LIST
            or type(relationship_items) is not _LIST or not paper_id.strip()
            or len(paper_id) > max_id or not paper_id.isprintable()
            or len(mention_items) > limits.max_mentions
            or len(relationship_items) > limits.max_relationships):
        return None
    if revision is None:
        revision = content_hash
    elif type(revision) is not _STR or not revision.strip() or len(revision) > max_id:
        return None

    max_text = limits.max_mention_chars
    mentions: list[CheckedMention] = []
    seen: set[str] = set()
    for i, m in enumerate(mention_items):
        if type(m) is not _DICT:
            return None
        mid = m.get("id")
        if type(mid) is _INT:
            mid = str(mid)
        text = m.get("text")
        etype = m.get("type")
        if etype is None and "type" in m:  # null reads as blank (BlankIfNull); missing: refused
            etype = ""
        if (type(mid) is not _STR or type(text) is not _STR or type(etype) is not _STR
                or len(mid) > max_id or len(text) > max_text or len(etype) > 128
                or mid in seen or not mid.strip() or not text.strip()):
            return None
        span = _fast_span(m.get("span"))
        if span is False:
            return None
        seen.add(mid)
        mentions.append(CheckedMention(i, mid, text, etype, span))  # type: ignore[arg-type]

    max_predicate = limits.max_predicate_chars
    max_quote = limits.max_quote_bytes
    read = vocabulary.read
    ids = hashlib.sha256(_SEP.join(
        x.encode("utf-8") for x in ("rel", paper_id, revision, content_hash, "")))
    relationships: list[CheckedRelationship] = []
    keys: set[str] = set()
    for i, r in enumerate(relationship_items):
        if type(r) is not _DICT:
            return None
        subject = r.get("subject")
        predicate = r.get("predicate")
        if predicate is None and "predicate" in r:  # null reads as blank (BlankIfNull)
            predicate = ""
        obj_id = r.get("object")
        if type(subject) is _INT:
            subject = str(subject)
        if type(obj_id) is _INT:
            obj_id = str(obj_id)
        confidence = r.get("confidence")
        evidence = r.get("evidence")
        if (type(subject) is not _STR or type(predicate) is not _STR or type(obj_id) is not _STR
                or subject not in seen or obj_id not in seen or subject == obj_id
                or len(subject) > max_id or len(obj_id) > max_id
                or len(predicate) > max_predicate):
            return None
        # (mention ids in ``seen`` are already non-blank)
        if confidence is not None:
            if type(confidence) is not _FLOAT and type(confidence) is not _INT:
                return None
            if not 0 <= confidence <= 1:  # also false for NaN
                return None
            confidence = float(confidence)
        keyed = _keyed_confidence(confidence)
        if evidence is None:
            span = quote = None
        elif type(evidence) is _DICT:
            span = _fast_span(evidence.get("span"))
            if span is False:
                return None
            quote = evidence.get("quote")
            if quote is not None and (
                    type(quote) is not _STR
                    or (len(quote) * 4 > max_quote and len(quote.encode("utf-8")) > max_quote)):
                return None
        else:
            return None
        # _relationship_key's text, written out: ``_ENCODE`` per item costs more than the rest
        key = (f"[{_json_str(subject)},{_json_str(predicate)},{_json_str(obj_id)},"
               f"{'null' if keyed is None else float.__repr__(keyed)},"
               f"{'null' if span is None else f'[{span[0]},{span[1]}]'},"  # type: ignore[index]
               f"{'null' if quote is None else _json_str(quote)}]")
        if key in keys:
            return None
        keys.add(key)
        h = ids.copy()
        h.update(key.encode("utf-8") + _SEP)
        reading = read(predicate)
        if reading.inverted:
            subject, obj_id = obj_id, subject
        relationships.append(CheckedRelationship(
            i, h.hexdigest()[:32], subject, obj_id, reading.label, predicate, reading.inverted,
            1.0 if confidence is None else confidence, span, quote))  # type: ignore[arg-type]
    return CheckedPaper(position, paper_id, revision, content_hash, tuple(mentions),
                        tuple(relationships))


def _keyed_confidence(confidence: float | None) -> float | None:
    """A confidence as the relationship's key holds it: as stored, so that two relationships
    stored alike are one. An absent confidence is stored as 1.0, so 1.0 is keyed as absent
    (null, which keeps the ids of relationships without one), and -0.0 as 0.0."""
    return None if confidence is None or confidence == 1.0 else confidence + 0.0


def _relationship_key(r: RelationshipIn, span: Span | None) -> str:
    """The relationship itself, as read (unknown keys ignored): its id's input and dedupe key."""
    quote = None if r.evidence is None else r.evidence.quote
    return _ENCODE([r.subject, r.predicate, r.object, _keyed_confidence(r.confidence),
                    None if span is None else [span.start, span.end], quote])


def _note_rejected_id(item: Any, where: str, rejected: dict[str, str]) -> None:
    mention_id = integer_as_text(item.get("id")) if isinstance(item, dict) else None
    if isinstance(mention_id, str):
        rejected.setdefault(mention_id, where)


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
                              _relationship_raw(r)))
    return replace(paper, mentions=tuple(kept), relationships=tuple(rels), rejects=tuple(rejects))


def drop_resolved_self_loops(paper: CheckedPaper, entity_ids: Sequence[str]) -> CheckedPaper:
    """Removes relationships whose two mentions resolved to one entity (`entity_ids` in the
    order of `paper.mentions`): stored by id, they would be self-loops, which are rejected."""
    of_mention = {m.mention_id: eid for m, eid in zip(paper.mentions, entity_ids, strict=True)}
    rels: list[CheckedRelationship] = []
    rejects = list(paper.rejects)
    for r in paper.relationships:
        subject = of_mention.get(r.subject_mention_id)
        if subject is None or subject != of_mention.get(r.object_mention_id):
            rels.append(r)
            continue
        where = f"relationships[{r.index}]"
        rejects.append(Reject(
            where, f"{where}: subject {r.subject_mention_id!r} and object "
                   f"{r.object_mention_id!r} resolve to the same entity {subject}: a self-loop",
            _relationship_raw(r)))
    if len(rels) == len(paper.relationships):
        return paper
    return replace(paper, relationships=tuple(rels), rejects=tuple(rejects))


def _relationship_raw(r: CheckedRelationship) -> str:
    return _keep(canonical_json({"subject": r.subject_mention_id, "predicate": r.raw_predicate,
                                 "object": r.object_mention_id}))
