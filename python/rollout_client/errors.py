"""The client's errors: one base class, so a trainer can catch everything the client raises in one place."""
from __future__ import annotations


class RolloutClientError(Exception):
    """Base of every error the client raises."""


class TaskRejectedError(RolloutClientError):
    """The server rejected a task spec; `field` names what to fix (e.g. "instance.answer", "num_samples")."""

    def __init__(self, task_id: str, field: str, reason: str) -> None:
        super().__init__(f"task {task_id} rejected: {field}: {reason}" if field else f"task {task_id} rejected: {reason}")
        self.task_id = task_id
        self.field = field
        self.reason = reason


class ClientClosedError(RolloutClientError):
    """The client was closed while this call waited."""
