"""Helpers of the adapter tests (imported by them; conftest.py puts this directory on sys.path)."""
from __future__ import annotations

import os

from transformers import AutoTokenizer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

#: The tokenizer of the model the fake engine serves (to read prompts back, and as trainers would hold it).
TOKENIZER = AutoTokenizer.from_pretrained(os.path.join(ROOT, ".cache", "models", "tiny-qwen3"))


def fetch_trajectory(stub, task_id: str, sample_index: int):
    """The trajectory as the server stores it (GetTrajectory), to check an adapter's output against."""
    from rollout.v1 import rollout_pb2

    response = stub.GetTrajectory(rollout_pb2.GetTrajectoryRequest(task_id=task_id, sample_index=sample_index, wait=True), timeout=60)
    assert len(response.trajectories) == 1, response
    return response.trajectories[0]


def hand_made_group(rewards=(1.0, 0.0, 1.0), *, stale=(), failed=()):
    """A Group built from hand-made Trajectory messages, as the client delivers them (Sample.from_proto): each
    sample samples 2 tokens, gets 1 tool token, samples 1 more. Indices in `stale` are flagged stale (the task's
    max_staleness with FLAG), those in `failed` end in a sandbox error."""
    from rollout.v1 import rollout_pb2
    from rollout_client import Group, Sample

    samples = []
    for i, reward in enumerate(rewards):
        t = rollout_pb2.Trajectory(
            task_id="hand-made", sample_index=i, group_id="hand-made", reward=reward, stale=i in stale,
            status=rollout_pb2.TRAJECTORY_STATUS_SANDBOX_ERROR if i in failed else rollout_pb2.TRAJECTORY_STATUS_COMPLETED,
            prompt_token_ids=[11, 12, 13], response_token_ids=[21, 22, 23, 24], response_mask=[1, 1, 0, 1],
            response_logprobs=[-0.5, -0.25, 0.0, -1.0],
            turns=[rollout_pb2.Turn(role=rollout_pb2.ROLE_ASSISTANT, start=0, end=2, policy_version=3, finish_reason="stop"),
                   rollout_pb2.Turn(role=rollout_pb2.ROLE_TOOL, start=2, end=3),
                   rollout_pb2.Turn(role=rollout_pb2.ROLE_ASSISTANT, start=3, end=4, policy_version=5, finish_reason="stop")],
        )
        samples.append(Sample.from_proto(t))
    return Group(task_id="hand-made", group_id="hand-made", samples=samples)
