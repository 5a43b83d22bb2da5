from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Reason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REASON_UNSPECIFIED: _ClassVar[Reason]
    REASON_RPM_EXCEEDED: _ClassVar[Reason]
    REASON_TPM_EXCEEDED: _ClassVar[Reason]
    REASON_CONCURRENCY_EXCEEDED: _ClassVar[Reason]
    REASON_CONTEXT_TOO_LARGE: _ClassVar[Reason]
    REASON_REQUEST_TOO_LARGE: _ClassVar[Reason]
    REASON_BUDGET_EXCEEDED: _ClassVar[Reason]
    REASON_BLOCKED: _ClassVar[Reason]
    REASON_IMAGES_EXCEEDED: _ClassVar[Reason]

class Level(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEVEL_UNSPECIFIED: _ClassVar[Level]
    LEVEL_GLOBAL: _ClassVar[Level]
    LEVEL_TENANT: _ClassVar[Level]
    LEVEL_USER: _ClassVar[Level]
    LEVEL_SESSION: _ClassVar[Level]

class Dimension(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DIMENSION_UNSPECIFIED: _ClassVar[Dimension]
    DIMENSION_REQUESTS: _ClassVar[Dimension]
    DIMENSION_TOKENS: _ClassVar[Dimension]
    DIMENSION_CONCURRENCY: _ClassVar[Dimension]
    DIMENSION_INPUT_TOKENS: _ClassVar[Dimension]
    DIMENSION_OUTPUT_TOKENS: _ClassVar[Dimension]
    DIMENSION_SPEND: _ClassVar[Dimension]
    DIMENSION_IMAGES: _ClassVar[Dimension]

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_UNSPECIFIED: _ClassVar[Priority]
    PRIORITY_CRITICAL: _ClassVar[Priority]
    PRIORITY_NORMAL: _ClassVar[Priority]
    PRIORITY_BATCH: _ClassVar[Priority]

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    OUTCOME_APPLIED: _ClassVar[Outcome]
    OUTCOME_ALREADY_SETTLED: _ClassVar[Outcome]
    OUTCOME_EXPIRED: _ClassVar[Outcome]

class LimitStatuses(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LIMIT_STATUSES_UNSPECIFIED: _ClassVar[LimitStatuses]
    LIMIT_STATUSES_ALL: _ClassVar[LimitStatuses]
    LIMIT_STATUSES_BINDING: _ClassVar[LimitStatuses]
    LIMIT_STATUSES_NONE: _ClassVar[LimitStatuses]
REASON_UNSPECIFIED: Reason
REASON_RPM_EXCEEDED: Reason
REASON_TPM_EXCEEDED: Reason
REASON_CONCURRENCY_EXCEEDED: Reason
REASON_CONTEXT_TOO_LARGE: Reason
REASON_REQUEST_TOO_LARGE: Reason
REASON_BUDGET_EXCEEDED: Reason
REASON_BLOCKED: Reason
REASON_IMAGES_EXCEEDED: Reason
LEVEL_UNSPECIFIED: Level
LEVEL_GLOBAL: Level
LEVEL_TENANT: Level
LEVEL_USER: Level
LEVEL_SESSION: Level
DIMENSION_UNSPECIFIED: Dimension
DIMENSION_REQUESTS: Dimension
DIMENSION_TOKENS: Dimension
DIMENSION_CONCURRENCY: Dimension
DIMENSION_INPUT_TOKENS: Dimension
DIMENSION_OUTPUT_TOKENS: Dimension
DIMENSION_SPEND: Dimension
DIMENSION_IMAGES: Dimension
PRIORITY_UNSPECIFIED: Priority
PRIORITY_CRITICAL: Priority
PRIORITY_NORMAL: Priority
PRIORITY_BATCH: Priority
OUTCOME_UNSPECIFIED: Outcome
OUTCOME_APPLIED: Outcome
OUTCOME_ALREADY_SETTLED: Outcome
OUTCOME_EXPIRED: Outcome
LIMIT_STATUSES_UNSPECIFIED: LimitStatuses
LIMIT_STATUSES_ALL: LimitStatuses
LIMIT_STATUSES_BINDING: LimitStatuses
LIMIT_STATUSES_NONE: LimitStatuses

class Message(_message.Message):
    __slots__ = ("role", "content", "name")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    name: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class CheckAndReserveRequest(_message.Message):
    __slots__ = ("tenant_id", "user_id", "tier", "model", "prompt_tokens", "max_output_tokens", "idempotency_key", "lease_ttl_ms", "messages", "prompt", "allow_reduced_output", "min_output_tokens", "priority", "candidate_models", "session_id", "images", "limit_statuses", "max_wait_ms")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    ALLOW_REDUCED_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    MIN_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_MODELS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    LIMIT_STATUSES_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    user_id: str
    tier: str
    model: str
    prompt_tokens: int
    max_output_tokens: int
    idempotency_key: str
    lease_ttl_ms: int
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    prompt: str
    allow_reduced_output: bool
    min_output_tokens: int
    priority: Priority
    candidate_models: _containers.RepeatedScalarFieldContainer[str]
    session_id: str
    images: int
    limit_statuses: LimitStatuses
    max_wait_ms: int
    def __init__(self, tenant_id: _Optional[str] = ..., user_id: _Optional[str] = ..., tier: _Optional[str] = ..., model: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., max_output_tokens: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., lease_ttl_ms: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., prompt: _Optional[str] = ..., allow_reduced_output: _Optional[bool] = ..., min_output_tokens: _Optional[int] = ..., priority: _Optional[_Union[Priority, str]] = ..., candidate_models: _Optional[_Iterable[str]] = ..., session_id: _Optional[str] = ..., images: _Optional[int] = ..., limit_statuses: _Optional[_Union[LimitStatuses, str]] = ..., max_wait_ms: _Optional[int] = ...) -> None: ...

class SkippedCandidate(_message.Message):
    __slots__ = ("model", "reason", "level", "dimension", "retry_after_ms", "model_group", "detail")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    MODEL_GROUP_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    model: str
    reason: Reason
    level: Level
    dimension: Dimension
    retry_after_ms: int
    model_group: str
    detail: str
    def __init__(self, model: _Optional[str] = ..., reason: _Optional[_Union[Reason, str]] = ..., level: _Optional[_Union[Level, str]] = ..., dimension: _Optional[_Union[Dimension, str]] = ..., retry_after_ms: _Optional[int] = ..., model_group: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class LimitStatus(_message.Message):
    __slots__ = ("level", "dimension", "period_seconds", "limit", "remaining", "reset_after_ms", "model_group", "window", "timezone")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    PERIOD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    RESET_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    MODEL_GROUP_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    TIMEZONE_FIELD_NUMBER: _ClassVar[int]
    level: Level
    dimension: Dimension
    period_seconds: int
    limit: int
    remaining: int
    reset_after_ms: int
    model_group: str
    window: str
    timezone: str
    def __init__(self, level: _Optional[_Union[Level, str]] = ..., dimension: _Optional[_Union[Dimension, str]] = ..., period_seconds: _Optional[int] = ..., limit: _Optional[int] = ..., remaining: _Optional[int] = ..., reset_after_ms: _Optional[int] = ..., model_group: _Optional[str] = ..., window: _Optional[str] = ..., timezone: _Optional[str] = ...) -> None: ...

class CheckAndReserveResponse(_message.Message):
    __slots__ = ("allowed", "reservation_id", "reason", "limiting_level", "retry_after_ms", "reserved_tokens", "limits", "detail", "limiting_dimension", "limiting_period_seconds", "lease_expires_in_ms", "replayed", "max_output_tokens", "estimated_prompt_tokens", "estimator_multiplier", "granted_max_output_tokens", "shadow_denied", "shadow_reason", "shadow_limiting_level", "shadow_detail", "degraded", "limiting_model_group", "reserved_output_tokens", "chosen_model", "skipped_candidates", "waited_ms")
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LIMITING_LEVEL_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    RESERVED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    LIMITING_DIMENSION_FIELD_NUMBER: _ClassVar[int]
    LIMITING_PERIOD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_IN_MS_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATOR_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    GRANTED_MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SHADOW_DENIED_FIELD_NUMBER: _ClassVar[int]
    SHADOW_REASON_FIELD_NUMBER: _ClassVar[int]
    SHADOW_LIMITING_LEVEL_FIELD_NUMBER: _ClassVar[int]
    SHADOW_DETAIL_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    LIMITING_MODEL_GROUP_FIELD_NUMBER: _ClassVar[int]
    RESERVED_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_MODEL_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    WAITED_MS_FIELD_NUMBER: _ClassVar[int]
    allowed: bool
    reservation_id: str
    reason: Reason
    limiting_level: Level
    retry_after_ms: int
    reserved_tokens: int
    limits: _containers.RepeatedCompositeFieldContainer[LimitStatus]
    detail: str
    limiting_dimension: Dimension
    limiting_period_seconds: int
    lease_expires_in_ms: int
    replayed: bool
    max_output_tokens: int
    estimated_prompt_tokens: int
    estimator_multiplier: float
    granted_max_output_tokens: int
    shadow_denied: bool
    shadow_reason: Reason
    shadow_limiting_level: Level
    shadow_detail: str
    degraded: bool
    limiting_model_group: str
    reserved_output_tokens: int
    chosen_model: str
    skipped_candidates: _containers.RepeatedCompositeFieldContainer[SkippedCandidate]
    waited_ms: int
    def __init__(self, allowed: _Optional[bool] = ..., reservation_id: _Optional[str] = ..., reason: _Optional[_Union[Reason, str]] = ..., limiting_level: _Optional[_Union[Level, str]] = ..., retry_after_ms: _Optional[int] = ..., reserved_tokens: _Optional[int] = ..., limits: _Optional[_Iterable[_Union[LimitStatus, _Mapping]]] = ..., detail: _Optional[str] = ..., limiting_dimension: _Optional[_Union[Dimension, str]] = ..., limiting_period_seconds: _Optional[int] = ..., lease_expires_in_ms: _Optional[int] = ..., replayed: _Optional[bool] = ..., max_output_tokens: _Optional[int] = ..., estimated_prompt_tokens: _Optional[int] = ..., estimator_multiplier: _Optional[float] = ..., granted_max_output_tokens: _Optional[int] = ..., shadow_denied: _Optional[bool] = ..., shadow_reason: _Optional[_Union[Reason, str]] = ..., shadow_limiting_level: _Optional[_Union[Level, str]] = ..., shadow_detail: _Optional[str] = ..., degraded: _Optional[bool] = ..., limiting_model_group: _Optional[str] = ..., reserved_output_tokens: _Optional[int] = ..., chosen_model: _Optional[str] = ..., skipped_candidates: _Optional[_Iterable[_Union[SkippedCandidate, _Mapping]]] = ..., waited_ms: _Optional[int] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("reservation_id", "prompt_tokens", "completion_tokens", "cached_prompt_tokens", "completion_text", "cache_write_prompt_tokens", "cache_write_1h_prompt_tokens", "reasoning_tokens", "images")
    RESERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TEXT_FIELD_NUMBER: _ClassVar[int]
    CACHE_WRITE_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_WRITE_1H_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASONING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    reservation_id: str
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    completion_text: str
    cache_write_prompt_tokens: int
    cache_write_1h_prompt_tokens: int
    reasoning_tokens: int
    images: int
    def __init__(self, reservation_id: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ..., completion_text: _Optional[str] = ..., cache_write_prompt_tokens: _Optional[int] = ..., cache_write_1h_prompt_tokens: _Optional[int] = ..., reasoning_tokens: _Optional[int] = ..., images: _Optional[int] = ...) -> None: ...

class CommitResponse(_message.Message):
    __slots__ = ("outcome", "token_delta", "estimation_ratio", "estimation_error_tokens", "cost_micros", "completion_tokens")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    TOKEN_DELTA_FIELD_NUMBER: _ClassVar[int]
    ESTIMATION_RATIO_FIELD_NUMBER: _ClassVar[int]
    ESTIMATION_ERROR_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_MICROS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    outcome: Outcome
    token_delta: int
    estimation_ratio: float
    estimation_error_tokens: int
    cost_micros: int
    completion_tokens: int
    def __init__(self, outcome: _Optional[_Union[Outcome, str]] = ..., token_delta: _Optional[int] = ..., estimation_ratio: _Optional[float] = ..., estimation_error_tokens: _Optional[int] = ..., cost_micros: _Optional[int] = ..., completion_tokens: _Optional[int] = ...) -> None: ...

class RefundRequest(_message.Message):
    __slots__ = ("reservation_id",)
    RESERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    reservation_id: str
    def __init__(self, reservation_id: _Optional[str] = ...) -> None: ...

class RefundResponse(_message.Message):
    __slots__ = ("outcome", "refunded_tokens", "cost_micros")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REFUNDED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_MICROS_FIELD_NUMBER: _ClassVar[int]
    outcome: Outcome
    refunded_tokens: int
    cost_micros: int
    def __init__(self, outcome: _Optional[_Union[Outcome, str]] = ..., refunded_tokens: _Optional[int] = ..., cost_micros: _Optional[int] = ...) -> None: ...

class RenewLeaseRequest(_message.Message):
    __slots__ = ("reservation_id", "lease_ttl_ms")
    RESERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    reservation_id: str
    lease_ttl_ms: int
    def __init__(self, reservation_id: _Optional[str] = ..., lease_ttl_ms: _Optional[int] = ...) -> None: ...

class RenewLeaseResponse(_message.Message):
    __slots__ = ("outcome", "expires_in_ms")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_MS_FIELD_NUMBER: _ClassVar[int]
    outcome: Outcome
    expires_in_ms: int
    def __init__(self, outcome: _Optional[_Union[Outcome, str]] = ..., expires_in_ms: _Optional[int] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ("tenant_id", "user_id", "tier", "model", "session_id")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    user_id: str
    tier: str
    model: str
    session_id: str
    def __init__(self, tenant_id: _Optional[str] = ..., user_id: _Optional[str] = ..., tier: _Optional[str] = ..., model: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class LevelLeases(_message.Message):
    __slots__ = ("level", "active", "limit", "model_group")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    MODEL_GROUP_FIELD_NUMBER: _ClassVar[int]
    level: Level
    active: int
    limit: int
    model_group: str
    def __init__(self, level: _Optional[_Union[Level, str]] = ..., active: _Optional[int] = ..., limit: _Optional[int] = ..., model_group: _Optional[str] = ...) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("limits", "leases", "degraded")
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    limits: _containers.RepeatedCompositeFieldContainer[LimitStatus]
    leases: _containers.RepeatedCompositeFieldContainer[LevelLeases]
    degraded: bool
    def __init__(self, limits: _Optional[_Iterable[_Union[LimitStatus, _Mapping]]] = ..., leases: _Optional[_Iterable[_Union[LevelLeases, _Mapping]]] = ..., degraded: _Optional[bool] = ...) -> None: ...

class GetEstimatorRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class EstimatorState(_message.Message):
    __slots__ = ("key", "multiplier", "samples", "p95_ratio", "refreshed_ms_ago", "correction", "content_fit", "learned_outputs")
    KEY_FIELD_NUMBER: _ClassVar[int]
    MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    P95_RATIO_FIELD_NUMBER: _ClassVar[int]
    REFRESHED_MS_AGO_FIELD_NUMBER: _ClassVar[int]
    CORRECTION_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIT_FIELD_NUMBER: _ClassVar[int]
    LEARNED_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    key: str
    multiplier: float
    samples: int
    p95_ratio: float
    refreshed_ms_ago: int
    correction: str
    content_fit: ContentFit
    learned_outputs: _containers.RepeatedCompositeFieldContainer[LearnedOutput]
    def __init__(self, key: _Optional[str] = ..., multiplier: _Optional[float] = ..., samples: _Optional[int] = ..., p95_ratio: _Optional[float] = ..., refreshed_ms_ago: _Optional[int] = ..., correction: _Optional[str] = ..., content_fit: _Optional[_Union[ContentFit, _Mapping]] = ..., learned_outputs: _Optional[_Iterable[_Union[LearnedOutput, _Mapping]]] = ...) -> None: ...

class LearnedOutput(_message.Message):
    __slots__ = ("tier", "samples", "tokens")
    TIER_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tier: str
    samples: int
    tokens: int
    def __init__(self, tier: _Optional[str] = ..., samples: _Optional[int] = ..., tokens: _Optional[int] = ...) -> None: ...

class ContentFit(_message.Message):
    __slots__ = ("costs", "constant", "bound", "samples")
    COSTS_FIELD_NUMBER: _ClassVar[int]
    CONSTANT_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    costs: _containers.RepeatedCompositeFieldContainer[GroupCost]
    constant: float
    bound: float
    samples: int
    def __init__(self, costs: _Optional[_Iterable[_Union[GroupCost, _Mapping]]] = ..., constant: _Optional[float] = ..., bound: _Optional[float] = ..., samples: _Optional[int] = ...) -> None: ...

class GroupCost(_message.Message):
    __slots__ = ("group", "cost")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    group: str
    cost: float
    def __init__(self, group: _Optional[str] = ..., cost: _Optional[float] = ...) -> None: ...

class GetEstimatorResponse(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[EstimatorState]
    def __init__(self, keys: _Optional[_Iterable[_Union[EstimatorState, _Mapping]]] = ...) -> None: ...
