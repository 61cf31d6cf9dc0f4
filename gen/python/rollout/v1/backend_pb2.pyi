from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PauseMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PAUSE_MODE_UNSPECIFIED: _ClassVar[PauseMode]
    PAUSE_MODE_WAIT: _ClassVar[PauseMode]
    PAUSE_MODE_ABORT: _ClassVar[PauseMode]
    PAUSE_MODE_KEEP: _ClassVar[PauseMode]

class BackendKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BACKEND_KIND_UNSPECIFIED: _ClassVar[BackendKind]
    BACKEND_KIND_VLLM: _ClassVar[BackendKind]
    BACKEND_KIND_SGLANG: _ClassVar[BackendKind]
    BACKEND_KIND_EMBEDDED: _ClassVar[BackendKind]

class LogprobsMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOGPROBS_MODE_UNSPECIFIED: _ClassVar[LogprobsMode]
    LOGPROBS_MODE_RAW: _ClassVar[LogprobsMode]
    LOGPROBS_MODE_PROCESSED: _ClassVar[LogprobsMode]
    LOGPROBS_MODE_MIXED: _ClassVar[LogprobsMode]

class CapacitySource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CAPACITY_SOURCE_UNSPECIFIED: _ClassVar[CapacitySource]
    CAPACITY_SOURCE_CONFIGURED: _ClassVar[CapacitySource]
    CAPACITY_SOURCE_ENGINE: _ClassVar[CapacitySource]
    CAPACITY_SOURCE_DEFAULT: _ClassVar[CapacitySource]
PAUSE_MODE_UNSPECIFIED: PauseMode
PAUSE_MODE_WAIT: PauseMode
PAUSE_MODE_ABORT: PauseMode
PAUSE_MODE_KEEP: PauseMode
BACKEND_KIND_UNSPECIFIED: BackendKind
BACKEND_KIND_VLLM: BackendKind
BACKEND_KIND_SGLANG: BackendKind
BACKEND_KIND_EMBEDDED: BackendKind
LOGPROBS_MODE_UNSPECIFIED: LogprobsMode
LOGPROBS_MODE_RAW: LogprobsMode
LOGPROBS_MODE_PROCESSED: LogprobsMode
LOGPROBS_MODE_MIXED: LogprobsMode
CAPACITY_SOURCE_UNSPECIFIED: CapacitySource
CAPACITY_SOURCE_CONFIGURED: CapacitySource
CAPACITY_SOURCE_ENGINE: CapacitySource
CAPACITY_SOURCE_DEFAULT: CapacitySource

class Backend(_message.Message):
    __slots__ = ("id", "url", "kind", "max_concurrency", "healthy", "draining", "inflight_trajectories", "inflight_requests", "assigned_total", "policy_version", "model", "max_model_len", "logprobs_mode", "capacity_source", "paused", "unusable_reason", "stalled", "stalls", "weights_unknown")
    ID_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_MODE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    UNUSABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    STALLED_FIELD_NUMBER: _ClassVar[int]
    STALLS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    id: str
    url: str
    kind: BackendKind
    max_concurrency: int
    healthy: bool
    draining: bool
    inflight_trajectories: int
    inflight_requests: int
    assigned_total: int
    policy_version: int
    model: str
    max_model_len: int
    logprobs_mode: LogprobsMode
    capacity_source: CapacitySource
    paused: bool
    unusable_reason: str
    stalled: bool
    stalls: int
    weights_unknown: bool
    def __init__(self, id: _Optional[str] = ..., url: _Optional[str] = ..., kind: _Optional[_Union[BackendKind, str]] = ..., max_concurrency: _Optional[int] = ..., healthy: bool = ..., draining: bool = ..., inflight_trajectories: _Optional[int] = ..., inflight_requests: _Optional[int] = ..., assigned_total: _Optional[int] = ..., policy_version: _Optional[int] = ..., model: _Optional[str] = ..., max_model_len: _Optional[int] = ..., logprobs_mode: _Optional[_Union[LogprobsMode, str]] = ..., capacity_source: _Optional[_Union[CapacitySource, str]] = ..., paused: bool = ..., unusable_reason: _Optional[str] = ..., stalled: bool = ..., stalls: _Optional[int] = ..., weights_unknown: bool = ...) -> None: ...

class AddBackendRequest(_message.Message):
    __slots__ = ("url", "kind", "max_concurrency", "id", "model", "logprobs_mode", "check_answer_id")
    URL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_MODE_FIELD_NUMBER: _ClassVar[int]
    CHECK_ANSWER_ID_FIELD_NUMBER: _ClassVar[int]
    url: str
    kind: BackendKind
    max_concurrency: int
    id: str
    model: str
    logprobs_mode: LogprobsMode
    check_answer_id: bool
    def __init__(self, url: _Optional[str] = ..., kind: _Optional[_Union[BackendKind, str]] = ..., max_concurrency: _Optional[int] = ..., id: _Optional[str] = ..., model: _Optional[str] = ..., logprobs_mode: _Optional[_Union[LogprobsMode, str]] = ..., check_answer_id: bool = ...) -> None: ...

class AddBackendResponse(_message.Message):
    __slots__ = ("backend",)
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    backend: Backend
    def __init__(self, backend: _Optional[_Union[Backend, _Mapping]] = ...) -> None: ...

class RemoveBackendRequest(_message.Message):
    __slots__ = ("id", "drain")
    ID_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    id: str
    drain: bool
    def __init__(self, id: _Optional[str] = ..., drain: bool = ...) -> None: ...

class RemoveBackendResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListBackendsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListBackendsResponse(_message.Message):
    __slots__ = ("backends",)
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    backends: _containers.RepeatedCompositeFieldContainer[Backend]
    def __init__(self, backends: _Optional[_Iterable[_Union[Backend, _Mapping]]] = ...) -> None: ...

class PauseGenerationRequest(_message.Message):
    __slots__ = ("backend_id", "mode")
    BACKEND_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    backend_id: str
    mode: PauseMode
    def __init__(self, backend_id: _Optional[str] = ..., mode: _Optional[_Union[PauseMode, str]] = ...) -> None: ...

class PauseGenerationResponse(_message.Message):
    __slots__ = ("backends",)
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    backends: _containers.RepeatedCompositeFieldContainer[Backend]
    def __init__(self, backends: _Optional[_Iterable[_Union[Backend, _Mapping]]] = ...) -> None: ...

class ResumeGenerationRequest(_message.Message):
    __slots__ = ("backend_id", "policy_version")
    BACKEND_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    backend_id: str
    policy_version: int
    def __init__(self, backend_id: _Optional[str] = ..., policy_version: _Optional[int] = ...) -> None: ...

class ResumeGenerationResponse(_message.Message):
    __slots__ = ("backends",)
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    backends: _containers.RepeatedCompositeFieldContainer[Backend]
    def __init__(self, backends: _Optional[_Iterable[_Union[Backend, _Mapping]]] = ...) -> None: ...
