"""TEST DOUBLE of the agreed ``rollout_client`` API (AsyncRolloutClient.run_group, Group, Sample, TlsOptions).

Used by conftest.py only when the real package (helper-pyclient's python/rollout_client/__init__.py) is not there, so
the adapters can be tested against a real server before the two branches meet. It is a real client — one grpc.aio
bidi stream over the generated stubs in gen/python, acks every trajectory — but has none of the real package's
resume, multi-server routing or backpressure. Not shipped.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "gen", "python"))

import grpc  # noqa: E402
from google.protobuf import struct_pb2  # noqa: E402
from rollout.v1 import rollout_pb2, rollout_pb2_grpc  # noqa: E402

_INFRA = {"timeout", "cancelled", "environment_error", "sandbox_error", "backend_error"}


@dataclass
class TlsOptions:
    root_certificates: bytes | None = None


@dataclass
class Sample:
    task_id: str
    sample_index: int
    group_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    policy_versions: list[int]
    reward: float
    status: str
    is_infra_failure: bool
    finish_reason: str
    num_turns: int
    error: str
    timing: dict[str, float]
    stale: bool
    raw: Any = None

    @classmethod
    def from_proto(cls, t: Any) -> "Sample":
        return _sample(t)


@dataclass
class Group:
    task_id: str
    group_id: str
    samples: list[Sample] = field(default_factory=list)

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.status in ("completed", "truncated")]

    @property
    def failed(self) -> list[Sample]:
        return [s for s in self.samples if s.status not in ("completed", "truncated")]

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]


def _sample(t: Any) -> Sample:
    status = rollout_pb2.TrajectoryStatus.Name(t.status).removeprefix("TRAJECTORY_STATUS_").lower()
    versions: list[int] = [0] * len(t.response_token_ids)
    for turn in t.turns:
        for i in range(turn.start, turn.end):
            versions[i] = int(turn.policy_version) if t.response_mask[i] else 0
    timing = {f.name: float(getattr(t.timing, f.name)) for f in t.timing.DESCRIPTOR.fields}
    return Sample(
        task_id=t.task_id, sample_index=t.sample_index, group_id=t.group_id, prompt_ids=list(t.prompt_token_ids),
        response_ids=list(t.response_token_ids), loss_mask=list(t.response_mask), logprobs=list(t.response_logprobs),
        policy_versions=versions, reward=t.reward, status=status, is_infra_failure=status in _INFRA,
        finish_reason=t.finish_reason, num_turns=sum(1 for x in t.turns if x.role == rollout_pb2.ROLE_ASSISTANT),
        error=t.error, timing=timing, stale=bool(getattr(t, "stale", False)), raw=t,
    )


class AsyncRolloutClient:
    """TEST DOUBLE: see the module doc."""

    def __init__(self, targets: str | Sequence[str], *, token: str | None = None, tls: TlsOptions | None = None,
                 session_id: str | None = None, max_in_flight: int = 1024) -> None:
        self._target = targets if isinstance(targets, str) else list(targets)[0]
        self._session_id = session_id or f"adapter-test-{uuid.uuid4().hex[:8]}"
        self._ids = itertools.count()
        self._outgoing: asyncio.Queue[Any] = asyncio.Queue()
        self._groups: dict[str, tuple[int, list[Sample], asyncio.Future[Group], str]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._channel: grpc.aio.Channel | None = None

    async def _start(self) -> None:
        self._channel = grpc.aio.insecure_channel(self._target)
        stub = rollout_pb2_grpc.RolloutServiceStub(self._channel)
        await self._outgoing.put(rollout_pb2.RolloutRequest(open=rollout_pb2.OpenSession(session_id=self._session_id)))

        async def requests():
            while True:
                item = await self._outgoing.get()
                if item is None:
                    return
                yield item

        call = stub.Rollout(requests())

        async def read() -> None:
            try:
                async for response in call:
                    kind = response.WhichOneof("kind")
                    if kind == "rejected":
                        entry = self._groups.pop(response.rejected.task_id, None)
                        if entry and not entry[2].done():
                            entry[2].set_exception(ValueError(f"rejected: {response.rejected.field}: {response.rejected.reason}"))
                    elif kind == "trajectory":
                        t = response.trajectory
                        await self._outgoing.put(rollout_pb2.RolloutRequest(ack=rollout_pb2.Ack(
                            trajectories=[rollout_pb2.TrajectoryRef(task_id=t.task_id, sample_index=t.sample_index)])))
                        entry = self._groups.get(t.task_id)
                        if entry is None:
                            continue
                        n, samples, future, group_id = entry
                        samples.append(_sample(t))
                        if len(samples) == n:
                            del self._groups[t.task_id]
                            future.set_result(Group(task_id=t.task_id, group_id=group_id, samples=sorted(samples, key=lambda s: s.sample_index)))
            except Exception as error:  # the stream died: every open group hears of it
                for _, _, future, _ in self._groups.values():
                    if not future.done():
                        future.set_exception(error)

        self._reader = asyncio.ensure_future(read())

    async def run_group(self, environment: str, instance: dict[str, Any], num_samples: int, *, sampling: dict[str, Any] | None = None,
                        limits: dict[str, Any] | None = None, task_id: str | None = None, group_id: str | None = None,
                        metadata: dict[str, str] | None = None) -> Group:
        if self._reader is None:
            await self._start()
        task_id = task_id or f"{self._session_id}-{next(self._ids)}"
        group_id = group_id or task_id
        struct = struct_pb2.Struct()
        struct.update(instance)
        spec = rollout_pb2.TaskSpec(task_id=task_id, group_id=group_id, num_samples=num_samples, environment=environment,
                                    instance=struct, sampling=rollout_pb2.SamplingParams(**(sampling or {})),
                                    limits=rollout_pb2.TaskLimits(**(limits or {})), metadata=metadata or {})
        future: asyncio.Future[Group] = asyncio.get_running_loop().create_future()
        self._groups[task_id] = (num_samples, [], future, group_id)
        await self._outgoing.put(rollout_pb2.RolloutRequest(task=spec))
        return await future

    async def close(self) -> None:
        await self._outgoing.put(None)
        if self._reader is not None:
            self._reader.cancel()
        if self._channel is not None:
            await self._channel.close()


def group_advantages(group: Group, *, normalize: str = "std", drop_failed: bool = True) -> list[float]:
    raise NotImplementedError("test double")
