"""Python client of Rollout Service.

    from rollout_client import AsyncRolloutClient, group_advantages
    async with AsyncRolloutClient("127.0.0.1:50051") as client:
        group = await client.run_group("math", {"problem": "2+2?", "answer": "4"}, num_samples=8)
        print(group.rewards, group_advantages(group))

The generated stubs ship in the same distribution as the package `rollout` (rollout.v1.rollout_pb2, ...).
"""
from .advantages import group_advantages, trainer_batch
from .client import AsyncRolloutClient
from .errors import ClientClosedError, RolloutClientError, SessionTakenOverError, TaskRejectedError, TaskTooLargeError
from .results import POLICY_OUTCOMES, Group, Sample, status_name
from .sync import RolloutClient
from .tls import TlsOptions

__all__ = [
    "AsyncRolloutClient",
    "RolloutClient",
    "Group",
    "Sample",
    "TlsOptions",
    "group_advantages",
    "trainer_batch",
    "RolloutClientError",
    "TaskRejectedError",
    "TaskTooLargeError",
    "SessionTakenOverError",
    "ClientClosedError",
    "POLICY_OUTCOMES",
    "status_name",
]
__version__ = "0.1.0"
