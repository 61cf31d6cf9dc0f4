"""Set-up of the adapter tests, run by test/python/adapters.test.ts in .venvs/verl against a real server.

They need verl, torch and transformers, which the client package's own test venvs (python/tests, run on four
protobuf eras) do not have: unless ROLLOUT_ADAPTER_TESTS=1 (the vitest wrapper sets it) this directory is not
collected, so ``pytest python/tests`` there stays the client's suite. Deliberately light: no trainer imports here.

python/ and gen/python go first on sys.path so ``rollout_client`` is this checkout's package (the real client, not
an installed copy).
"""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

if os.environ.get("ROLLOUT_ADAPTER_TESTS") != "1":
    collect_ignore_glob = ["test_*.py"]
else:
    sys.path.insert(0, os.path.dirname(__file__))
    sys.path.insert(0, os.path.join(ROOT, "gen", "python"))
    sys.path.insert(0, os.path.join(ROOT, "python"))


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
