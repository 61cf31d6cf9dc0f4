"""The client's errors: one base class, so a trainer can catch everything the client raises in one place."""
from __future__ import annotations

from typing import Any

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
        # The server's reason names its field already ("instance: too large ..."): said once.
        named = not field or reason.startswith(f"{field}: ")
        message = f"task {task_id} rejected: {reason}" if named else f"task {task_id} rejected: {field}: {reason}"
        super().__init__(f"{message} ({self.code_name})" if self.code_name else message)

    @property
    def retryable(self) -> bool:
        return self.code in _RETRYABLE

    @property
    def code_name(self) -> str:
        """The status name of `code` ("INVALID_ARGUMENT"), or "" when the server sent none."""
        return _NAMES.get(self.code, "") if self.code else ""


class TaskTooLargeError(TaskRejectedError):
    """A task spec over a message size limit on its way to the server. It fails alone and is never retried: the same
    bytes would be refused again, and the refusal ends the whole stream.

    Over this client's channel's `grpc.max_send_message_length` (channel_options): refused before it is sent, nothing
    else notices. Over a limit the client cannot check beforehand (a maxRequestMessageBytes in the channel's service
    config; the server's transport, which takes up to 4 x the server's maxMessageBytes, a spec between the two being
    refused by the server itself, by field, as a plain TaskRejectedError): failed once that refusal ended the stream,
    which is re-opened for the other tasks. `size` is the encoded request in bytes, `limit` the bound it is over,
    `field` the spec's largest top-level field (what to shrink) and `field_size` its bytes. `code` is 3
    INVALID_ARGUMENT, as in the server's own refusal of an oversized spec.
    """

    def __init__(self, task_id: str, size: int, limit: int, where: str, field: str = "", field_size: int = 0) -> None:
        self.size = size
        self.limit = limit
        reason = f"the task spec is {size} bytes, over the {limit}-byte limit of {where}"
        if field:
            reason += f" ({field} is {field_size} bytes)"
        self.field_size = field_size
        super().__init__(task_id, field, reason, grpc.StatusCode.INVALID_ARGUMENT.value[0])

    @classmethod
    def of(cls, spec: Any, size: int, limit: int, where: str) -> "TaskTooLargeError":
        """The error for `spec` (a TaskSpec whose request is `size` bytes), naming its largest top-level field."""
        field, field_size = "", 0
        total = spec.ByteSize()
        for descriptor, _ in spec.ListFields():
            rest = type(spec)()
            rest.CopyFrom(spec)
            rest.ClearField(descriptor.name)
            if total - rest.ByteSize() > field_size:
                field, field_size = descriptor.name, total - rest.ByteSize()
        return cls(spec.task_id, size, limit, where, field, field_size)


class SessionTakenOverError(RolloutClientError):
    """Another stream took this client's session over: a client that resumed the same session id (two trainers, or
    two processes of one, with one session_id). The server ended this client's stream with ABORTED and sends the
    session's trajectories to the other stream now; resuming it again would take it back, and the two would evict
    each other for ever. So every call of this client fails with this error: the session is the other's now.
    """

    def __init__(self, target: str, session_id: str, details: str) -> None:
        self.target = target
        self.session_id = session_id
        self.details = details
        super().__init__(
            f"{target}: ABORTED: {details}: session {session_id!r} was taken over by another stream (another client "
            "resumed it: give each trainer its own session_id); this client stops rather than take it back"
        )


class ClientClosedError(RolloutClientError):
    """The client was closed while this call waited."""
