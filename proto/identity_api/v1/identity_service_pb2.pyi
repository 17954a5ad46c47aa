from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EntityStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENTITY_STATUS_UNSPECIFIED: _ClassVar[EntityStatus]
    CANONICAL: _ClassVar[EntityStatus]
    PROVISIONAL: _ClassVar[EntityStatus]
    MERGED: _ClassVar[EntityStatus]

class MatchKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MATCH_KIND_UNSPECIFIED: _ClassVar[MatchKind]
    EXACT: _ClassVar[MatchKind]
    CASE: _ClassVar[MatchKind]
    PUNCTUATION: _ClassVar[MatchKind]
    ALIAS: _ClassVar[MatchKind]
    TYPO: _ClassVar[MatchKind]
    AMBIGUOUS: _ClassVar[MatchKind]
    NEW: _ClassVar[MatchKind]

class Decision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECISION_UNSPECIFIED: _ClassVar[Decision]
    SAME: _ClassVar[Decision]
    DISTINCT: _ClassVar[Decision]

class AuthorityFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AUTHORITY_FORMAT_UNSPECIFIED: _ClassVar[AuthorityFormat]
    AUTHORITY_FORMAT_JSONL: _ClassVar[AuthorityFormat]
    AUTHORITY_FORMAT_CSV: _ClassVar[AuthorityFormat]

class ChangeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHANGE_KIND_UNSPECIFIED: _ClassVar[ChangeKind]
    CHANGE_KIND_CREATED: _ClassVar[ChangeKind]
    CHANGE_KIND_SURFACE_FORM_ADDED: _ClassVar[ChangeKind]
    CHANGE_KIND_ALIAS_ADDED: _ClassVar[ChangeKind]
    CHANGE_KIND_TYPE_UPGRADED: _ClassVar[ChangeKind]
    CHANGE_KIND_PROMOTED: _ClassVar[ChangeKind]
    CHANGE_KIND_MERGED: _ClassVar[ChangeKind]
    CHANGE_KIND_LINK_ADDED: _ClassVar[ChangeKind]
    CHANGE_KIND_LINK_SETTLED: _ClassVar[ChangeKind]
    CHANGE_KIND_IMPORTED: _ClassVar[ChangeKind]
ENTITY_STATUS_UNSPECIFIED: EntityStatus
CANONICAL: EntityStatus
PROVISIONAL: EntityStatus
MERGED: EntityStatus
MATCH_KIND_UNSPECIFIED: MatchKind
EXACT: MatchKind
CASE: MatchKind
PUNCTUATION: MatchKind
ALIAS: MatchKind
TYPO: MatchKind
AMBIGUOUS: MatchKind
NEW: MatchKind
DECISION_UNSPECIFIED: Decision
SAME: Decision
DISTINCT: Decision
AUTHORITY_FORMAT_UNSPECIFIED: AuthorityFormat
AUTHORITY_FORMAT_JSONL: AuthorityFormat
AUTHORITY_FORMAT_CSV: AuthorityFormat
CHANGE_KIND_UNSPECIFIED: ChangeKind
CHANGE_KIND_CREATED: ChangeKind
CHANGE_KIND_SURFACE_FORM_ADDED: ChangeKind
CHANGE_KIND_ALIAS_ADDED: ChangeKind
CHANGE_KIND_TYPE_UPGRADED: ChangeKind
CHANGE_KIND_PROMOTED: ChangeKind
CHANGE_KIND_MERGED: ChangeKind
CHANGE_KIND_LINK_ADDED: ChangeKind
CHANGE_KIND_LINK_SETTLED: ChangeKind
CHANGE_KIND_IMPORTED: ChangeKind

class ResolveRequest(_message.Message):
    __slots__ = ("mention", "entity_type", "context_id", "lookup_only")
    MENTION_FIELD_NUMBER: _ClassVar[int]
    ENTITY_TYPE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_ID_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_ONLY_FIELD_NUMBER: _ClassVar[int]
    mention: str
    entity_type: str
    context_id: str
    lookup_only: bool
    def __init__(self, mention: _Optional[str] = ..., entity_type: _Optional[str] = ..., context_id: _Optional[str] = ..., lookup_only: _Optional[bool] = ...) -> None: ...

class ResolveResponse(_message.Message):
    __slots__ = ("entity_id", "status", "match_kind", "created", "possibly_same_as", "candidates", "name", "matched_name", "entity_type", "display_form", "candidate_scores")
    ENTITY_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MATCH_KIND_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    POSSIBLY_SAME_AS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MATCHED_NAME_FIELD_NUMBER: _ClassVar[int]
    ENTITY_TYPE_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_FORM_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_SCORES_FIELD_NUMBER: _ClassVar[int]
    entity_id: str
    status: EntityStatus
    match_kind: MatchKind
    created: bool
    possibly_same_as: _containers.RepeatedScalarFieldContainer[str]
    candidates: _containers.RepeatedScalarFieldContainer[str]
    name: str
    matched_name: str
    entity_type: str
    display_form: str
    candidate_scores: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, entity_id: _Optional[str] = ..., status: _Optional[_Union[EntityStatus, str]] = ..., match_kind: _Optional[_Union[MatchKind, str]] = ..., created: _Optional[bool] = ..., possibly_same_as: _Optional[_Iterable[str]] = ..., candidates: _Optional[_Iterable[str]] = ..., name: _Optional[str] = ..., matched_name: _Optional[str] = ..., entity_type: _Optional[str] = ..., display_form: _Optional[str] = ..., candidate_scores: _Optional[_Iterable[float]] = ...) -> None: ...

class Mention(_message.Message):
    __slots__ = ("mention", "entity_type")
    MENTION_FIELD_NUMBER: _ClassVar[int]
    ENTITY_TYPE_FIELD_NUMBER: _ClassVar[int]
    mention: str
    entity_type: str
    def __init__(self, mention: _Optional[str] = ..., entity_type: _Optional[str] = ...) -> None: ...

class ResolveBatchRequest(_message.Message):
    __slots__ = ("context_id", "mentions", "lookup_only")
    CONTEXT_ID_FIELD_NUMBER: _ClassVar[int]
    MENTIONS_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_ONLY_FIELD_NUMBER: _ClassVar[int]
    context_id: str
    mentions: _containers.RepeatedCompositeFieldContainer[Mention]
    lookup_only: bool
    def __init__(self, context_id: _Optional[str] = ..., mentions: _Optional[_Iterable[_Union[Mention, _Mapping]]] = ..., lookup_only: _Optional[bool] = ...) -> None: ...

class ItemError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ResolveBatchResult(_message.Message):
    __slots__ = ("resolved", "error")
    RESOLVED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    resolved: ResolveResponse
    error: ItemError
    def __init__(self, resolved: _Optional[_Union[ResolveResponse, _Mapping]] = ..., error: _Optional[_Union[ItemError, _Mapping]] = ...) -> None: ...

class ResolveBatchResponse(_message.Message):
    __slots__ = ("results", "replayed")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ResolveBatchResult]
    replayed: bool
    def __init__(self, results: _Optional[_Iterable[_Union[ResolveBatchResult, _Mapping]]] = ..., replayed: _Optional[bool] = ...) -> None: ...

class Entity(_message.Message):
    __slots__ = ("entity_id", "name", "entity_type", "status", "aliases", "surface_forms", "redirect_to", "placeholder", "evidence_count", "paper_count", "surface_form_count")
    ENTITY_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENTITY_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ALIASES_FIELD_NUMBER: _ClassVar[int]
    SURFACE_FORMS_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_TO_FIELD_NUMBER: _ClassVar[int]
    PLACEHOLDER_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_COUNT_FIELD_NUMBER: _ClassVar[int]
    PAPER_COUNT_FIELD_NUMBER: _ClassVar[int]
    SURFACE_FORM_COUNT_FIELD_NUMBER: _ClassVar[int]
    entity_id: str
    name: str
    entity_type: str
    status: EntityStatus
    aliases: _containers.RepeatedScalarFieldContainer[str]
    surface_forms: _containers.RepeatedScalarFieldContainer[str]
    redirect_to: str
    placeholder: bool
    evidence_count: int
    paper_count: int
    surface_form_count: int
    def __init__(self, entity_id: _Optional[str] = ..., name: _Optional[str] = ..., entity_type: _Optional[str] = ..., status: _Optional[_Union[EntityStatus, str]] = ..., aliases: _Optional[_Iterable[str]] = ..., surface_forms: _Optional[_Iterable[str]] = ..., redirect_to: _Optional[str] = ..., placeholder: _Optional[bool] = ..., evidence_count: _Optional[int] = ..., paper_count: _Optional[int] = ..., surface_form_count: _Optional[int] = ...) -> None: ...

class GetEntityRequest(_message.Message):
    __slots__ = ("entity_id", "max_surface_forms", "surface_forms_offset")
    ENTITY_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_SURFACE_FORMS_FIELD_NUMBER: _ClassVar[int]
    SURFACE_FORMS_OFFSET_FIELD_NUMBER: _ClassVar[int]
    entity_id: str
    max_surface_forms: int
    surface_forms_offset: int
    def __init__(self, entity_id: _Optional[str] = ..., max_surface_forms: _Optional[int] = ..., surface_forms_offset: _Optional[int] = ...) -> None: ...

class GetEntityResponse(_message.Message):
    __slots__ = ("entity",)
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    entity: Entity
    def __init__(self, entity: _Optional[_Union[Entity, _Mapping]] = ...) -> None: ...

class ListEntitiesRequest(_message.Message):
    __slots__ = ("status", "entity_type", "page_size", "page_token", "max_surface_forms")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ENTITY_TYPE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MAX_SURFACE_FORMS_FIELD_NUMBER: _ClassVar[int]
    status: EntityStatus
    entity_type: str
    page_size: int
    page_token: str
    max_surface_forms: int
    def __init__(self, status: _Optional[_Union[EntityStatus, str]] = ..., entity_type: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., max_surface_forms: _Optional[int] = ...) -> None: ...

class ListEntitiesResponse(_message.Message):
    __slots__ = ("entities", "next_page_token")
    ENTITIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    entities: _containers.RepeatedCompositeFieldContainer[Entity]
    next_page_token: str
    def __init__(self, entities: _Optional[_Iterable[_Union[Entity, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class AddAliasRequest(_message.Message):
    __slots__ = ("entity_id", "alias", "max_surface_forms")
    ENTITY_ID_FIELD_NUMBER: _ClassVar[int]
    ALIAS_FIELD_NUMBER: _ClassVar[int]
    MAX_SURFACE_FORMS_FIELD_NUMBER: _ClassVar[int]
    entity_id: str
    alias: str
    max_surface_forms: int
    def __init__(self, entity_id: _Optional[str] = ..., alias: _Optional[str] = ..., max_surface_forms: _Optional[int] = ...) -> None: ...

class AddAliasResponse(_message.Message):
    __slots__ = ("entity",)
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    entity: Entity
    def __init__(self, entity: _Optional[_Union[Entity, _Mapping]] = ...) -> None: ...

class PromoteRequest(_message.Message):
    __slots__ = ("entity_id", "max_surface_forms")
    ENTITY_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_SURFACE_FORMS_FIELD_NUMBER: _ClassVar[int]
    entity_id: str
    max_surface_forms: int
    def __init__(self, entity_id: _Optional[str] = ..., max_surface_forms: _Optional[int] = ...) -> None: ...

class PromoteResponse(_message.Message):
    __slots__ = ("entity",)
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    entity: Entity
    def __init__(self, entity: _Optional[_Union[Entity, _Mapping]] = ...) -> None: ...

class MergeRequest(_message.Message):
    __slots__ = ("source_id", "target_id", "max_surface_forms")
    SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_SURFACE_FORMS_FIELD_NUMBER: _ClassVar[int]
    source_id: str
    target_id: str
    max_surface_forms: int
    def __init__(self, source_id: _Optional[str] = ..., target_id: _Optional[str] = ..., max_surface_forms: _Optional[int] = ...) -> None: ...

class MergeResponse(_message.Message):
    __slots__ = ("entity",)
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    entity: Entity
    def __init__(self, entity: _Optional[_Union[Entity, _Mapping]] = ...) -> None: ...

class PossiblySameAsLink(_message.Message):
    __slots__ = ("entity_id", "other_id", "sequence")
    ENTITY_ID_FIELD_NUMBER: _ClassVar[int]
    OTHER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    entity_id: str
    other_id: str
    sequence: int
    def __init__(self, entity_id: _Optional[str] = ..., other_id: _Optional[str] = ..., sequence: _Optional[int] = ...) -> None: ...

class ListPossiblySameAsRequest(_message.Message):
    __slots__ = ("entity_id", "page_size", "page_token")
    ENTITY_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    entity_id: str
    page_size: int
    page_token: str
    def __init__(self, entity_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListPossiblySameAsResponse(_message.Message):
    __slots__ = ("links", "next_page_token")
    LINKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    links: _containers.RepeatedCompositeFieldContainer[PossiblySameAsLink]
    next_page_token: str
    def __init__(self, links: _Optional[_Iterable[_Union[PossiblySameAsLink, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SettlePossiblySameAsRequest(_message.Message):
    __slots__ = ("entity_id", "other_id", "decision", "actor", "reason", "max_surface_forms")
    ENTITY_ID_FIELD_NUMBER: _ClassVar[int]
    OTHER_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MAX_SURFACE_FORMS_FIELD_NUMBER: _ClassVar[int]
    entity_id: str
    other_id: str
    decision: Decision
    actor: str
    reason: str
    max_surface_forms: int
    def __init__(self, entity_id: _Optional[str] = ..., other_id: _Optional[str] = ..., decision: _Optional[_Union[Decision, str]] = ..., actor: _Optional[str] = ..., reason: _Optional[str] = ..., max_surface_forms: _Optional[int] = ...) -> None: ...

class SettlePossiblySameAsResponse(_message.Message):
    __slots__ = ("entity",)
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    entity: Entity
    def __init__(self, entity: _Optional[_Union[Entity, _Mapping]] = ...) -> None: ...

class ImportAuthorityRequest(_message.Message):
    __slots__ = ("format", "data")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    format: AuthorityFormat
    data: bytes
    def __init__(self, format: _Optional[_Union[AuthorityFormat, str]] = ..., data: _Optional[bytes] = ...) -> None: ...

class ImportError(_message.Message):
    __slots__ = ("line", "message")
    LINE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    line: int
    message: str
    def __init__(self, line: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ImportAuthorityResponse(_message.Message):
    __slots__ = ("imported", "created", "updated", "merged", "linked", "errors")
    IMPORTED_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    MERGED_FIELD_NUMBER: _ClassVar[int]
    LINKED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    imported: int
    created: int
    updated: int
    merged: int
    linked: int
    errors: _containers.RepeatedCompositeFieldContainer[ImportError]
    def __init__(self, imported: _Optional[int] = ..., created: _Optional[int] = ..., updated: _Optional[int] = ..., merged: _Optional[int] = ..., linked: _Optional[int] = ..., errors: _Optional[_Iterable[_Union[ImportError, _Mapping]]] = ...) -> None: ...

class Change(_message.Message):
    __slots__ = ("sequence", "kind", "entity_id", "other_id", "detail", "recorded_at")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ENTITY_ID_FIELD_NUMBER: _ClassVar[int]
    OTHER_ID_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    RECORDED_AT_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    kind: ChangeKind
    entity_id: str
    other_id: str
    detail: str
    recorded_at: str
    def __init__(self, sequence: _Optional[int] = ..., kind: _Optional[_Union[ChangeKind, str]] = ..., entity_id: _Optional[str] = ..., other_id: _Optional[str] = ..., detail: _Optional[str] = ..., recorded_at: _Optional[str] = ...) -> None: ...

class ListChangesRequest(_message.Message):
    __slots__ = ("after_sequence", "follow", "limit")
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    after_sequence: int
    follow: bool
    limit: int
    def __init__(self, after_sequence: _Optional[int] = ..., follow: _Optional[bool] = ..., limit: _Optional[int] = ...) -> None: ...

class ListChangesResponse(_message.Message):
    __slots__ = ("change",)
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    change: Change
    def __init__(self, change: _Optional[_Union[Change, _Mapping]] = ...) -> None: ...
