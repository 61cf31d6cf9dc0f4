"""Acks are split to fit the server's bounds: bytes (the channel's send limit) and entries per Ack (the bound the server
advertises in the Rollout stream's `rollout-max-ack-entries` response header, past which it refuses the whole ack)."""
from __future__ import annotations

import asyncio
import json
import logging

import grpc
import pytest

from conftest import Server, math_instance
from rollout.v1 import rollout_pb2, rollout_pb2_grpc
from rollout_client import AsyncRolloutClient
from rollout_client.connection import DEFAULT_MAX_ACK_ENTRIES, _ack_requests, max_ack_entries_of

SAMPLING = {"temperature": 1.0, "max_tokens_per_turn": 64}


def test_a_burst_of_acks_over_the_entry_bound_goes_as_several_acks_each_within_it():
    for bound in (DEFAULT_MAX_ACK_ENTRIES, 3):
        refs = [(f"t{i}", 0) for i in range(2 * bound + 5)]
        requests = _ack_requests(refs, None, bound)
        assert all(len(r.ack.trajectories) <= bound for r in requests)
        assert [(t.task_id, t.sample_index) for r in requests for t in r.ack.trajectories] == refs


def test_the_advertised_bound_is_the_headers_positive_integer_else_65536():
    assert DEFAULT_MAX_ACK_ENTRIES == 65_536
    assert max_ack_entries_of((("rollout-max-ack-entries", "3"),)) == 3
    assert max_ack_entries_of((("other", "1"), ("rollout-max-ack-entries", "10"), ("rollout-max-ack-entries", "4"))) == 4
    for garbage in ["", "0", "-5", "abc", "3.5", "1e3", " 7", "9" * 40]:
        assert max_ack_entries_of((("rollout-max-ack-entries", garbage),)) == DEFAULT_MAX_ACK_ENTRIES, garbage
    assert max_ack_entries_of(()) == DEFAULT_MAX_ACK_ENTRIES  # an older server sends no header
    assert max_ack_entries_of(None) == DEFAULT_MAX_ACK_ENTRIES


@pytest.fixture(scope="module")
def small_ack_server(tmp_path_factory):
    config = tmp_path_factory.mktemp("small-acks") / "config.json"
    config.write_text(json.dumps({"sessions": {"maxAckEntries": 3}}))
    s = Server(latency_ms=1, extra_args=["--config", str(config)])
    yield s
    s.stop()


def test_acks_against_a_server_with_a_small_bound_are_all_applied_none_refused(small_ack_server, caplog):
    """Eight samples acked at once (manual acks) against a server that takes three per Ack: split by its header, every
    one is applied (the session, closed with nothing unacked, is gone: a resume of it is NOT_FOUND), none refused."""
    session_id = "py-small-acks"

    async def main():
        async with AsyncRolloutClient(small_ack_server.address, session_id=session_id, ack="manual") as client:
            await client.submit("math", math_instance(3), 8, sampling=SAMPLING)
            got = [s async for s in client.samples()]
            assert len(got) == 8
            client.ack(got)
        channel = grpc.aio.insecure_channel(small_ack_server.address)
        try:
            call = rollout_pb2_grpc.RolloutServiceStub(channel).Rollout()
            await call.write(rollout_pb2.RolloutRequest(open=rollout_pb2.OpenSession(session_id=session_id, resume=True)))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call.read()
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
        finally:
            await channel.close()

    with caplog.at_level(logging.WARNING, logger="rollout_client"):
        asyncio.run(asyncio.wait_for(main(), 120))
    assert not [r for r in caplog.records if "refused" in r.getMessage()], [r.getMessage() for r in caplog.records]
