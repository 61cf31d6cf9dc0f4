"""The client's errors: one base class, so a trainer can catch everything the client raises in one place."""
from __future__ import annotations

import grpc

#: TaskRejected codes that say "not now" rather than "not this spec": RESOURCE_EXHAUSTED (the session's delivery is
#: paused, the server is at its admission limit) and UNAVAILABLE (draining, an engine or sandbox outage).
_RETRYABLE = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], grpc.StatusCode.UNAVAILABLE.value[0]})
_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}


class RolloutClientError(Exception):
    """Base of every error the client raises."""


class TaskRejectedError(RolloutClientError):
    """The server rejected a task spec; `field` names what to fix (e.g. "instance.answer", "num_samples").

    `code` is the refusal as a gRPC status code (an int, e.g. 3 INVALID_ARGUMENT; 0 from servers that do not send
    one); `retryable` is True when the refusal is temporary (RESOURCE_EXHAUSTED, UNAVAILABLE) and the same spec may
    be submitted again later. AsyncRolloutClient already retried such a refusal for `retry_rejected_for` seconds.
    """

    def __init__(self, task_id: str, field: str, reason: str, code: int = 0) -> None:
        self.task_id = task_id
        self.field = field
        self.reason = reason
        self.code = code
        message = f"task {task_id} rejected: {field}: {reason}" if field else f"task {task_id} rejected: {reason}"
        super().__init__(f"{message} ({self.code_name})" if self.code_name else message)

    @property
    def retryable(self) -> bool:
        return self.code in _RETRYABLE

    @property
    def code_name(self) -> str:
        """The status name of `code` ("INVALID_ARGUMENT"), or "" when the server sent none."""
        return _NAMES.get(self.code, "") if self.code else ""


class ClientClosedError(RolloutClientError):
    """The client was closed while this call waited."""
