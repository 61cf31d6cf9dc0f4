from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ServerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERVER_STATE_UNSPECIFIED: _ClassVar[ServerState]
    SERVER_STATE_STARTING: _ClassVar[ServerState]
    SERVER_STATE_RUNNING: _ClassVar[ServerState]
    SERVER_STATE_DRAINING: _ClassVar[ServerState]
    SERVER_STATE_DRAINED: _ClassVar[ServerState]
    SERVER_STATE_STOPPED: _ClassVar[ServerState]
    SERVER_STATE_FAILED: _ClassVar[ServerState]
SERVER_STATE_UNSPECIFIED: ServerState
SERVER_STATE_STARTING: ServerState
SERVER_STATE_RUNNING: ServerState
SERVER_STATE_DRAINING: ServerState
SERVER_STATE_DRAINED: ServerState
SERVER_STATE_STOPPED: ServerState
SERVER_STATE_FAILED: ServerState

class DrainRequest(_message.Message):
    __slots__ = ("grace_ms",)
    GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    grace_ms: int
    def __init__(self, grace_ms: _Optional[int] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("state", "deadline_unix_ms")
    STATE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    state: ServerState
    deadline_unix_ms: int
    def __init__(self, state: _Optional[_Union[ServerState, str]] = ..., deadline_unix_ms: _Optional[int] = ...) -> None: ...

class GetServerStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetServerStateResponse(_message.Message):
    __slots__ = ("state", "in_flight", "drain_deadline_unix_ms")
    STATE_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    DRAIN_DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    state: ServerState
    in_flight: int
    drain_deadline_unix_ms: int
    def __init__(self, state: _Optional[_Union[ServerState, str]] = ..., in_flight: _Optional[int] = ..., drain_deadline_unix_ms: _Optional[int] = ...) -> None: ...
