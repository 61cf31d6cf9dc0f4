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
