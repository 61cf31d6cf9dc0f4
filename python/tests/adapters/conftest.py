"""Shared set-up of the adapter tests (run by test/python/adapters.test.ts against a real server).

ROLLOUT_TARGETS names the server (a real rollout server on 127.0.0.1:0 routed to the fake vLLM engine, a test
double speaking vLLM's HTTP API). python/ goes on sys.path so ``rollout_client`` is the package in this checkout;
while that package has no client yet (it is built on another branch), the TEST DOUBLE in client_double.py stands in
for the agreed API.
"""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "gen", "python"))

import rollout_client  # noqa: E402

if not hasattr(rollout_client, "AsyncRolloutClient"):
    sys.path.insert(0, os.path.dirname(__file__))
    import client_double

    for name in ("AsyncRolloutClient", "Group", "Sample", "TlsOptions", "group_advantages"):
        setattr(rollout_client, name, getattr(client_double, name))
    rollout_client.USING_TEST_DOUBLE = True


def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.join(ROOT, ".cache", "models", "tiny-qwen3"))


#: The tokenizer of the model the fake engine serves (to read prompts back, and as trainers would hold it).
TOKENIZER = _tokenizer()


@pytest.fixture(scope="session")
def target() -> str:
    value = os.environ.get("ROLLOUT_TARGETS")
    if not value:
        pytest.fail("ROLLOUT_TARGETS is not set: run these tests through test/python/adapters.test.ts")
    return value


@pytest.fixture(scope="session")
def stub(target):
    import grpc
    from rollout.v1 import rollout_pb2_grpc

    channel = grpc.insecure_channel(target.split(",")[0])
    yield rollout_pb2_grpc.RolloutServiceStub(channel)
    channel.close()


def fetch_trajectory(stub, task_id: str, sample_index: int):
    """The trajectory as the server stores it (GetTrajectory), to check an adapter's output against."""
    from rollout.v1 import rollout_pb2

    response = stub.GetTrajectory(rollout_pb2.GetTrajectoryRequest(task_id=task_id, sample_index=sample_index, wait=True), timeout=60)
    assert len(response.trajectories) == 1, response
    return response.trajectories[0]
