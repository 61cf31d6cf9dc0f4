from google.protobuf import struct_pb2 as _struct_pb2
from rollout.v1 import backend_pb2 as _backend_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Stage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STAGE_UNSPECIFIED: _ClassVar[Stage]
    STAGE_QUEUED: _ClassVar[Stage]
    STAGE_INIT: _ClassVar[Stage]
    STAGE_RUN: _ClassVar[Stage]
    STAGE_EVAL: _ClassVar[Stage]
    STAGE_DONE: _ClassVar[Stage]

class StalenessAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STALENESS_ACTION_UNSPECIFIED: _ClassVar[StalenessAction]
    STALENESS_ACTION_FLAG: _ClassVar[StalenessAction]
    STALENESS_ACTION_RESTART: _ClassVar[StalenessAction]

class TrajectoryStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAJECTORY_STATUS_UNSPECIFIED: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_COMPLETED: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_TRUNCATED: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_TIMEOUT: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_CANCELLED: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_INVALID_TASK: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_ENVIRONMENT_ERROR: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_SANDBOX_ERROR: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_BACKEND_ERROR: _ClassVar[TrajectoryStatus]

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_SYSTEM: _ClassVar[Role]
    ROLE_USER: _ClassVar[Role]
    ROLE_ASSISTANT: _ClassVar[Role]
    ROLE_TOOL: _ClassVar[Role]

class ToolOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_OUTCOME_UNSPECIFIED: _ClassVar[ToolOutcome]
    TOOL_OUTCOME_OK: _ClassVar[ToolOutcome]
    TOOL_OUTCOME_ERROR: _ClassVar[ToolOutcome]
    TOOL_OUTCOME_MALFORMED: _ClassVar[ToolOutcome]
    TOOL_OUTCOME_FINISH: _ClassVar[ToolOutcome]
STAGE_UNSPECIFIED: Stage
STAGE_QUEUED: Stage
STAGE_INIT: Stage
STAGE_RUN: Stage
STAGE_EVAL: Stage
STAGE_DONE: Stage
STALENESS_ACTION_UNSPECIFIED: StalenessAction
STALENESS_ACTION_FLAG: StalenessAction
STALENESS_ACTION_RESTART: StalenessAction
TRAJECTORY_STATUS_UNSPECIFIED: TrajectoryStatus
TRAJECTORY_STATUS_COMPLETED: TrajectoryStatus
TRAJECTORY_STATUS_TRUNCATED: TrajectoryStatus
TRAJECTORY_STATUS_TIMEOUT: TrajectoryStatus
TRAJECTORY_STATUS_CANCELLED: TrajectoryStatus
TRAJECTORY_STATUS_INVALID_TASK: TrajectoryStatus
TRAJECTORY_STATUS_ENVIRONMENT_ERROR: TrajectoryStatus
TRAJECTORY_STATUS_SANDBOX_ERROR: TrajectoryStatus
TRAJECTORY_STATUS_BACKEND_ERROR: TrajectoryStatus
ROLE_UNSPECIFIED: Role
ROLE_SYSTEM: Role
ROLE_USER: Role
ROLE_ASSISTANT: Role
ROLE_TOOL: Role
TOOL_OUTCOME_UNSPECIFIED: ToolOutcome
TOOL_OUTCOME_OK: ToolOutcome
TOOL_OUTCOME_ERROR: ToolOutcome
TOOL_OUTCOME_MALFORMED: ToolOutcome
TOOL_OUTCOME_FINISH: ToolOutcome

class RolloutRequest(_message.Message):
    __slots__ = ("open", "task", "cancel", "ack")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    open: OpenSession
    task: TaskSpec
    cancel: CancelTask
    ack: Ack
    def __init__(self, open: _Optional[_Union[OpenSession, _Mapping]] = ..., task: _Optional[_Union[TaskSpec, _Mapping]] = ..., cancel: _Optional[_Union[CancelTask, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ...) -> None: ...

class RolloutResponse(_message.Message):
    __slots__ = ("opened", "accepted", "rejected", "stage", "trajectory", "delivery_paused")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_PAUSED_FIELD_NUMBER: _ClassVar[int]
    opened: SessionOpened
    accepted: TaskAccepted
    rejected: TaskRejected
    stage: StageEvent
    trajectory: Trajectory
    delivery_paused: DeliveryPaused
    def __init__(self, opened: _Optional[_Union[SessionOpened, _Mapping]] = ..., accepted: _Optional[_Union[TaskAccepted, _Mapping]] = ..., rejected: _Optional[_Union[TaskRejected, _Mapping]] = ..., stage: _Optional[_Union[StageEvent, _Mapping]] = ..., trajectory: _Optional[_Union[Trajectory, _Mapping]] = ..., delivery_paused: _Optional[_Union[DeliveryPaused, _Mapping]] = ...) -> None: ...

class DeliveryPaused(_message.Message):
    __slots__ = ("unacked_bytes", "limit_bytes", "held", "reason", "resumed")
    UNACKED_BYTES_FIELD_NUMBER: _ClassVar[int]
    LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    unacked_bytes: int
    limit_bytes: int
    held: int
    reason: str
    resumed: bool
    def __init__(self, unacked_bytes: _Optional[int] = ..., limit_bytes: _Optional[int] = ..., held: _Optional[int] = ..., reason: _Optional[str] = ..., resumed: bool = ...) -> None: ...

class OpenSession(_message.Message):
    __slots__ = ("session_id", "resume", "stage_events")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    STAGE_EVENTS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    resume: bool
    stage_events: bool
    def __init__(self, session_id: _Optional[str] = ..., resume: bool = ..., stage_events: bool = ...) -> None: ...

class CancelTask(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("task_ids", "trajectories")
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    trajectories: _containers.RepeatedCompositeFieldContainer[TrajectoryRef]
    def __init__(self, task_ids: _Optional[_Iterable[str]] = ..., trajectories: _Optional[_Iterable[_Union[TrajectoryRef, _Mapping]]] = ...) -> None: ...

class TrajectoryRef(_message.Message):
    __slots__ = ("task_id", "sample_index")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    sample_index: int
    def __init__(self, task_id: _Optional[str] = ..., sample_index: _Optional[int] = ...) -> None: ...

class SessionOpened(_message.Message):
    __slots__ = ("session_id", "redelivered", "server_version", "max_num_samples", "pending", "max_unacked_bytes", "took_over")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REDELIVERED_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    MAX_UNACKED_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOOK_OVER_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    redelivered: int
    server_version: str
    max_num_samples: int
    pending: int
    max_unacked_bytes: int
    took_over: bool
    def __init__(self, session_id: _Optional[str] = ..., redelivered: _Optional[int] = ..., server_version: _Optional[str] = ..., max_num_samples: _Optional[int] = ..., pending: _Optional[int] = ..., max_unacked_bytes: _Optional[int] = ..., took_over: bool = ...) -> None: ...

class TaskAccepted(_message.Message):
    __slots__ = ("task_id", "num_samples", "duplicate", "already_owed", "resent_sample_indexes")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    ALREADY_OWED_FIELD_NUMBER: _ClassVar[int]
    RESENT_SAMPLE_INDEXES_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    num_samples: int
    duplicate: bool
    already_owed: bool
    resent_sample_indexes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, task_id: _Optional[str] = ..., num_samples: _Optional[int] = ..., duplicate: bool = ..., already_owed: bool = ..., resent_sample_indexes: _Optional[_Iterable[int]] = ...) -> None: ...

class TaskRejected(_message.Message):
    __slots__ = ("task_id", "field", "reason", "code")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    field: str
    reason: str
    code: int
    def __init__(self, task_id: _Optional[str] = ..., field: _Optional[str] = ..., reason: _Optional[str] = ..., code: _Optional[int] = ...) -> None: ...

class StageEvent(_message.Message):
    __slots__ = ("task_id", "sample_index", "stage", "group_id", "environment", "unix_ms")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    sample_index: int
    stage: Stage
    group_id: str
    environment: str
    unix_ms: int
    def __init__(self, task_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., stage: _Optional[_Union[Stage, str]] = ..., group_id: _Optional[str] = ..., environment: _Optional[str] = ..., unix_ms: _Optional[int] = ...) -> None: ...

class TaskSpec(_message.Message):
    __slots__ = ("task_id", "group_id", "num_samples", "environment", "instance", "sampling", "limits", "metadata", "include_messages")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    group_id: str
    num_samples: int
    environment: str
    instance: _struct_pb2.Struct
    sampling: SamplingParams
    limits: TaskLimits
    metadata: _containers.ScalarMap[str, str]
    include_messages: bool
    def __init__(self, task_id: _Optional[str] = ..., group_id: _Optional[str] = ..., num_samples: _Optional[int] = ..., environment: _Optional[str] = ..., instance: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., limits: _Optional[_Union[TaskLimits, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., include_messages: bool = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "seed", "max_tokens_per_turn", "max_total_tokens", "stop")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_PER_TURN_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    seed: int
    max_tokens_per_turn: int
    max_total_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., max_tokens_per_turn: _Optional[int] = ..., max_total_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ...) -> None: ...

class TaskLimits(_message.Message):
    __slots__ = ("max_turns", "init_timeout_ms", "run_timeout_ms", "eval_timeout_ms", "total_timeout_ms", "max_staleness", "staleness_action")
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    INIT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    RUN_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    EVAL_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    STALENESS_ACTION_FIELD_NUMBER: _ClassVar[int]
    max_turns: int
    init_timeout_ms: int
    run_timeout_ms: int
    eval_timeout_ms: int
    total_timeout_ms: int
    max_staleness: int
    staleness_action: StalenessAction
    def __init__(self, max_turns: _Optional[int] = ..., init_timeout_ms: _Optional[int] = ..., run_timeout_ms: _Optional[int] = ..., eval_timeout_ms: _Optional[int] = ..., total_timeout_ms: _Optional[int] = ..., max_staleness: _Optional[int] = ..., staleness_action: _Optional[_Union[StalenessAction, str]] = ...) -> None: ...

class Turn(_message.Message):
    __slots__ = ("role", "start", "end", "backend", "policy_version", "finish_reason", "tool_name", "tool_outcome", "continues_turn", "policy_version_start")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    TOOL_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    CONTINUES_TURN_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_START_FIELD_NUMBER: _ClassVar[int]
    role: Role
    start: int
    end: int
    backend: str
    policy_version: int
    finish_reason: str
    tool_name: str
    tool_outcome: ToolOutcome
    continues_turn: bool
    policy_version_start: int
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., backend: _Optional[str] = ..., policy_version: _Optional[int] = ..., finish_reason: _Optional[str] = ..., tool_name: _Optional[str] = ..., tool_outcome: _Optional[_Union[ToolOutcome, str]] = ..., continues_turn: bool = ..., policy_version_start: _Optional[int] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("role", "content", "name")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    name: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("queue_ms", "init_ms", "run_ms", "llm_ms", "tool_ms", "eval_ms", "total_ms")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    INIT_MS_FIELD_NUMBER: _ClassVar[int]
    RUN_MS_FIELD_NUMBER: _ClassVar[int]
    LLM_MS_FIELD_NUMBER: _ClassVar[int]
    TOOL_MS_FIELD_NUMBER: _ClassVar[int]
    EVAL_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    init_ms: float
    run_ms: float
    llm_ms: float
    tool_ms: float
    eval_ms: float
    total_ms: float
    def __init__(self, queue_ms: _Optional[float] = ..., init_ms: _Optional[float] = ..., run_ms: _Optional[float] = ..., llm_ms: _Optional[float] = ..., tool_ms: _Optional[float] = ..., eval_ms: _Optional[float] = ..., total_ms: _Optional[float] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("task_id", "sample_index", "group_id", "environment", "status", "finish_reason", "error", "prompt_token_ids", "response_token_ids", "response_mask", "response_logprobs", "turns", "reward", "reward_details", "eval_report", "messages", "timing", "policy_version_min", "policy_version_max", "metadata", "num_turns", "logprobs_mode", "stale", "staleness_restarts")
    class RewardDetailsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_MASK_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    REWARD_DETAILS_FIELD_NUMBER: _ClassVar[int]
    EVAL_REPORT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_MIN_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_MAX_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    NUM_TURNS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_MODE_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    STALENESS_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    sample_index: int
    group_id: str
    environment: str
    status: TrajectoryStatus
    finish_reason: str
    error: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    response_token_ids: _containers.RepeatedScalarFieldContainer[int]
    response_mask: _containers.RepeatedScalarFieldContainer[int]
    response_logprobs: _containers.RepeatedScalarFieldContainer[float]
    turns: _containers.RepeatedCompositeFieldContainer[Turn]
    reward: float
    reward_details: _containers.ScalarMap[str, float]
    eval_report: _struct_pb2.Struct
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    timing: Timing
    policy_version_min: int
    policy_version_max: int
    metadata: _containers.ScalarMap[str, str]
    num_turns: int
    logprobs_mode: _backend_pb2.LogprobsMode
    stale: bool
    staleness_restarts: int
    def __init__(self, task_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., group_id: _Optional[str] = ..., environment: _Optional[str] = ..., status: _Optional[_Union[TrajectoryStatus, str]] = ..., finish_reason: _Optional[str] = ..., error: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., response_token_ids: _Optional[_Iterable[int]] = ..., response_mask: _Optional[_Iterable[int]] = ..., response_logprobs: _Optional[_Iterable[float]] = ..., turns: _Optional[_Iterable[_Union[Turn, _Mapping]]] = ..., reward: _Optional[float] = ..., reward_details: _Optional[_Mapping[str, float]] = ..., eval_report: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., policy_version_min: _Optional[int] = ..., policy_version_max: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., num_turns: _Optional[int] = ..., logprobs_mode: _Optional[_Union[_backend_pb2.LogprobsMode, str]] = ..., stale: bool = ..., staleness_restarts: _Optional[int] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: TaskSpec
    def __init__(self, task: _Optional[_Union[TaskSpec, _Mapping]] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("task_id", "num_samples", "duplicate")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    num_samples: int
    duplicate: bool
    def __init__(self, task_id: _Optional[str] = ..., num_samples: _Optional[int] = ..., duplicate: bool = ...) -> None: ...

class GetTrajectoryRequest(_message.Message):
    __slots__ = ("task_id", "sample_index", "wait")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    sample_index: int
    wait: bool
    def __init__(self, task_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., wait: bool = ...) -> None: ...

class GetTrajectoryResponse(_message.Message):
    __slots__ = ("trajectories", "pending")
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    trajectories: _containers.RepeatedCompositeFieldContainer[Trajectory]
    pending: int
    def __init__(self, trajectories: _Optional[_Iterable[_Union[Trajectory, _Mapping]]] = ..., pending: _Optional[int] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("cancelled",)
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: int
    def __init__(self, cancelled: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("environments", "group_ids", "full_trajectories", "stage_events", "stats_interval_ms")
    ENVIRONMENTS_FIELD_NUMBER: _ClassVar[int]
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    FULL_TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    STAGE_EVENTS_FIELD_NUMBER: _ClassVar[int]
    STATS_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    environments: _containers.RepeatedScalarFieldContainer[str]
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    full_trajectories: bool
    stage_events: bool
    stats_interval_ms: int
    def __init__(self, environments: _Optional[_Iterable[str]] = ..., group_ids: _Optional[_Iterable[str]] = ..., full_trajectories: bool = ..., stage_events: bool = ..., stats_interval_ms: _Optional[int] = ...) -> None: ...

class WatchResponse(_message.Message):
    __slots__ = ("stage", "finished", "trajectory", "stats")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    stage: StageEvent
    finished: TrajectorySummary
    trajectory: Trajectory
    stats: PoolStats
    def __init__(self, stage: _Optional[_Union[StageEvent, _Mapping]] = ..., finished: _Optional[_Union[TrajectorySummary, _Mapping]] = ..., trajectory: _Optional[_Union[Trajectory, _Mapping]] = ..., stats: _Optional[_Union[PoolStats, _Mapping]] = ...) -> None: ...

class TrajectorySummary(_message.Message):
    __slots__ = ("task_id", "sample_index", "group_id", "environment", "status", "finish_reason", "reward", "num_turns", "prompt_tokens", "response_tokens", "timing")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    NUM_TURNS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    sample_index: int
    group_id: str
    environment: str
    status: TrajectoryStatus
    finish_reason: str
    reward: float
    num_turns: int
    prompt_tokens: int
    response_tokens: int
    timing: Timing
    def __init__(self, task_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., group_id: _Optional[str] = ..., environment: _Optional[str] = ..., status: _Optional[_Union[TrajectoryStatus, str]] = ..., finish_reason: _Optional[str] = ..., reward: _Optional[float] = ..., num_turns: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., response_tokens: _Optional[int] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ...) -> None: ...

class StagePoolStats(_message.Message):
    __slots__ = ("stage", "concurrency", "active", "queued")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    stage: Stage
    concurrency: int
    active: int
    queued: int
    def __init__(self, stage: _Optional[_Union[Stage, str]] = ..., concurrency: _Optional[int] = ..., active: _Optional[int] = ..., queued: _Optional[int] = ...) -> None: ...

class PoolStats(_message.Message):
    __slots__ = ("unix_ms", "stages", "in_flight", "completed_total", "backends", "backend_details", "admitted", "max_admitted")
    UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_DETAILS_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    MAX_ADMITTED_FIELD_NUMBER: _ClassVar[int]
    unix_ms: int
    stages: _containers.RepeatedCompositeFieldContainer[StagePoolStats]
    in_flight: int
    completed_total: int
    backends: int
    backend_details: _containers.RepeatedCompositeFieldContainer[_backend_pb2.Backend]
    admitted: int
    max_admitted: int
    def __init__(self, unix_ms: _Optional[int] = ..., stages: _Optional[_Iterable[_Union[StagePoolStats, _Mapping]]] = ..., in_flight: _Optional[int] = ..., completed_total: _Optional[int] = ..., backends: _Optional[int] = ..., backend_details: _Optional[_Iterable[_Union[_backend_pb2.Backend, _Mapping]]] = ..., admitted: _Optional[int] = ..., max_admitted: _Optional[int] = ...) -> None: ...

class ListEnvironmentsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListEnvironmentsResponse(_message.Message):
    __slots__ = ("environments",)
    ENVIRONMENTS_FIELD_NUMBER: _ClassVar[int]
    environments: _containers.RepeatedCompositeFieldContainer[EnvironmentInfo]
    def __init__(self, environments: _Optional[_Iterable[_Union[EnvironmentInfo, _Mapping]]] = ...) -> None: ...

class EnvironmentInfo(_message.Message):
    __slots__ = ("name", "description", "instance_schema", "tools")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    instance_schema: _struct_pb2.Struct
    tools: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., instance_schema: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., tools: _Optional[_Iterable[str]] = ...) -> None: ...
