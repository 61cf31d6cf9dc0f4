"""Sample.from_proto on hand-made Trajectory messages: what a server sends that a trainer must never learn from.

The server checks these invariants before it sends a trajectory; the client checks them again on receipt, because a
trainer has no way to notice a NaN reward or a shifted mask once the sample is in a batch (one NaN reward makes every
advantage of its group NaN, and the loss with it).
"""
from __future__ import annotations

import math

import pytest

from rollout.v1 import rollout_pb2
from rollout_client import Group, group_advantages, trainer_batch
from rollout_client.results import Sample

ASSISTANT, TOOL = rollout_pb2.ROLE_ASSISTANT, rollout_pb2.ROLE_TOOL


def trajectory(index: int = 0, reward: float = 1.0, status: int = rollout_pb2.TRAJECTORY_STATUS_COMPLETED, **overrides) -> rollout_pb2.Trajectory:
    """A well-formed two-turn trajectory: 2 sampled tokens, 1 tool token, 1 sampled token."""
    fields = dict(
        task_id="t", sample_index=index, group_id="g", status=status, prompt_token_ids=[1, 2], response_token_ids=[5, 6, 7, 8],
        response_mask=[1, 1, 0, 1], response_logprobs=[-0.5, -0.25, 0.0, -1.0], reward=reward,
        turns=[rollout_pb2.Turn(role=ASSISTANT, start=0, end=2, policy_version=3), rollout_pb2.Turn(role=TOOL, start=2, end=3),
               rollout_pb2.Turn(role=ASSISTANT, start=3, end=4, policy_version=4)],
    )
    fields.update(overrides)
    return rollout_pb2.Trajectory(**fields)


def test_a_well_formed_trajectory_is_a_policy_outcome():
    s = Sample.from_proto(trajectory())
    assert s.ok and s.status == "completed" and s.policy_versions == [3, 3, 0, 4] and s.error == ""


@pytest.mark.parametrize("reward", [math.nan, math.inf, -math.inf])
def test_a_non_finite_reward_is_not_a_policy_outcome_and_leaves_the_groups_advantages_finite(reward):
    bad = Sample.from_proto(trajectory(1, reward=reward))
    assert not bad.ok and bad.is_infra_failure and bad.status == "malformed"
    assert "reward" in bad.error and "completed" in bad.error
    group = Group("t", "g", [Sample.from_proto(trajectory(0, reward=1.0)), bad, Sample.from_proto(trajectory(2, reward=0.0))])
    assert group_advantages(group) == pytest.approx([1.0, -1.0], rel=1e-5)
    assert all(math.isfinite(a) for a in group_advantages(group, drop_failed=False))
    assert trainer_batch([group])["sample_indices"] == [0, 2]


@pytest.mark.parametrize(
    "overrides, named",
    [
        ({"response_mask": [1, 1, 0]}, "length"),  # one mask entry short: every later token would shift by one
        ({"response_logprobs": [-0.5, -0.25, 0.0]}, "length"),
        ({"response_mask": [1, 2, 0, 1]}, "mask"),
        ({"response_logprobs": [-0.5, math.nan, 0.0, -1.0]}, "logprob"),
        ({"response_logprobs": [-0.5, -math.inf, 0.0, -1.0]}, "logprob"),
        ({"response_logprobs": [-0.5, 0.25, 0.0, -1.0]}, "positive"),  # a sampled token's log-probability above 0
        ({"response_logprobs": [-0.5, -0.25, -0.75, -1.0]}, "masked"),  # a template token with a logprob
        ({"turns": [rollout_pb2.Turn(role=ASSISTANT, start=0, end=2), rollout_pb2.Turn(role=ASSISTANT, start=3, end=4)]}, "turns"),
        ({"turns": [rollout_pb2.Turn(role=ASSISTANT, start=0, end=3), rollout_pb2.Turn(role=ASSISTANT, start=3, end=4)]}, "turns"),
        ({"turns": [rollout_pb2.Turn(role=ASSISTANT, start=0, end=2), rollout_pb2.Turn(role=TOOL, start=2, end=3)]}, "turns"),
    ],
)
def test_a_trajectory_breaking_the_token_invariants_is_not_a_policy_outcome(overrides, named):
    s = Sample.from_proto(trajectory(**overrides))
    assert not s.ok and s.status == "malformed" and named in s.error, s.error
    assert group_advantages(Group("t", "g", [s])) == []


def test_an_empty_assistant_span_is_legal():
    """An engine call aborted (weight update) before its first token leaves an empty span the next one continues."""
    turns = [rollout_pb2.Turn(role=ASSISTANT, start=0, end=2), rollout_pb2.Turn(role=ASSISTANT, start=2, end=2),
             rollout_pb2.Turn(role=TOOL, start=2, end=3), rollout_pb2.Turn(role=ASSISTANT, start=3, end=4)]
    assert Sample.from_proto(trajectory(turns=turns)).ok


def test_a_failed_sample_keeps_its_status_and_its_reward_is_not_checked():
    s = Sample.from_proto(trajectory(reward=math.nan, status=rollout_pb2.TRAJECTORY_STATUS_BACKEND_ERROR, error="engine 500"))
    assert s.status == "backend_error" and s.error == "engine 500" and s.is_infra_failure


def test_a_status_from_a_newer_server_is_a_failure_by_number():
    s = Sample.from_proto(trajectory(status=42))
    assert s.status == "status_42" and s.is_infra_failure


def test_the_client_drops_a_trajectory_whose_sample_index_is_outside_its_task():
    """A sample_index past num_samples (or negative) from a faulty server must not complete the group in place of a
    real sample (the real one would then be dropped as a duplicate of a finished task). Drives the client's receive
    path directly: no server speaks such garbage."""
    import asyncio

    from rollout_client import AsyncRolloutClient
    from rollout_client.client import _Task

    async def go():
        client = AsyncRolloutClient("127.0.0.1:1", failover_after=3600)  # nothing listens: no stream, no real data
        try:
            task = _Task(rollout_pb2.TaskSpec(task_id="t", group_id="g", num_samples=2), via_run_group=True)
            client._tasks["t"] = task
            conn = client._conns[0]
            conn.assign(task)
            client._on_trajectory(conn, trajectory(5))
            client._on_trajectory(conn, trajectory(-1))
            client._on_trajectory(conn, trajectory(1))
            assert not task.complete.done() and sorted(task.samples) == [1]
            client._on_trajectory(conn, trajectory(0))
            assert task.complete.done() and [s.sample_index for s in task.group().samples] == [0, 1]
        finally:
            await client.close()

    asyncio.run(go())
