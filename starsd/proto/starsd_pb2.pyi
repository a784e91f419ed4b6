from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProposeRequest(_message.Message):
    __slots__ = ("target_id", "session_id", "seq", "tokens", "gamma", "temperature", "top_p", "top_k", "seed", "release", "verify_seconds", "rtt_seconds", "sample", "running_requests", "waiting_requests", "occupancy", "following")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    VERIFY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RTT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    WAITING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    OCCUPANCY_FIELD_NUMBER: _ClassVar[int]
    FOLLOWING_FIELD_NUMBER: _ClassVar[int]
    target_id: str
    session_id: int
    seq: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    gamma: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    release: bool
    verify_seconds: float
    rtt_seconds: float
    sample: bool
    running_requests: int
    waiting_requests: int
    occupancy: float
    following: int
    def __init__(self, target_id: _Optional[str] = ..., session_id: _Optional[int] = ..., seq: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ..., gamma: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., release: _Optional[bool] = ..., verify_seconds: _Optional[float] = ..., rtt_seconds: _Optional[float] = ..., sample: _Optional[bool] = ..., running_requests: _Optional[int] = ..., waiting_requests: _Optional[int] = ..., occupancy: _Optional[float] = ..., following: _Optional[int] = ...) -> None: ...

class ProposeResponse(_message.Message):
    __slots__ = ("target_id", "session_id", "seq", "token_ids", "q_ids", "q_probs", "top_k", "service_seconds", "error_code", "error_message", "draft_sessions", "queue_seconds")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    Q_IDS_FIELD_NUMBER: _ClassVar[int]
    Q_PROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SERVICE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DRAFT_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    target_id: str
    session_id: int
    seq: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    q_ids: _containers.RepeatedScalarFieldContainer[int]
    q_probs: _containers.RepeatedScalarFieldContainer[float]
    top_k: int
    service_seconds: float
    error_code: int
    error_message: str
    draft_sessions: int
    queue_seconds: float
    def __init__(self, target_id: _Optional[str] = ..., session_id: _Optional[int] = ..., seq: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., q_ids: _Optional[_Iterable[int]] = ..., q_probs: _Optional[_Iterable[float]] = ..., top_k: _Optional[int] = ..., service_seconds: _Optional[float] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ..., draft_sessions: _Optional[int] = ..., queue_seconds: _Optional[float] = ...) -> None: ...

class ProposeBurst(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[ProposeRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[ProposeRequest, _Mapping]]] = ...) -> None: ...

class ProposeBurstReply(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[ProposeResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[ProposeResponse, _Mapping]]] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("model_name", "vocab_size", "vocab_fingerprint", "max_context", "max_gamma", "max_sessions", "utilization", "sessions", "targets", "bursts")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    MAX_GAMMA_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    BURSTS_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    vocab_size: int
    vocab_fingerprint: str
    max_context: int
    max_gamma: int
    max_sessions: int
    utilization: float
    sessions: int
    targets: int
    bursts: bool
    def __init__(self, model_name: _Optional[str] = ..., vocab_size: _Optional[int] = ..., vocab_fingerprint: _Optional[str] = ..., max_context: _Optional[int] = ..., max_gamma: _Optional[int] = ..., max_sessions: _Optional[int] = ..., utilization: _Optional[float] = ..., sessions: _Optional[int] = ..., targets: _Optional[int] = ..., bursts: _Optional[bool] = ...) -> None: ...
