"""The client against real servers (see conftest.py): groups, streams, cancel, resume, failover, the sync client."""
from __future__ import annotations

import asyncio
import collections
import os

import pytest

from conftest import Proxy, Server, check_sample, math_instance
from rollout_client import AsyncRolloutClient, RolloutClient, TaskRejectedError, group_advantages

SAMPLING = {"temperature": 1.0, "max_tokens_per_turn": 256}


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, float(os.environ.get("PYCLIENT_TEST_TIMEOUT", "240"))))


def test_run_group_returns_every_sample_of_the_group_with_the_trainer_invariants(server):
    async def main():
        async with AsyncRolloutClient(server.address) as client:
            group = await client.run_group("math", math_instance(1), 4, sampling=SAMPLING, group_id="g-1", metadata={"step": "1"})
            assert group.group_id == "g-1"
            assert [s.sample_index for s in group.samples] == [0, 1, 2, 3]
            for s in group.samples:
                assert s.status in ("completed", "truncated") and not s.is_infra_failure
                assert check_sample(s) == []
                assert s.task_id == group.task_id and s.raw.metadata["step"] == "1"
                assert s.timing["total_ms"] > 0 and s.num_turns >= 1
            assert group.rewards == [s.reward for s in group.samples] and group.failed == []

    run(main())


def test_concurrent_run_group_calls_share_one_stream_and_each_gets_its_own_group(server):
    async def main():
        async with AsyncRolloutClient(server.address) as client:
            groups = await asyncio.gather(*(client.run_group("math", math_instance(i), 3, sampling=SAMPLING, task_id=f"conc-{i}") for i in range(24)))
            assert [g.task_id for g in groups] == [f"conc-{i}" for i in range(24)]
            for g in groups:
                assert sorted(s.sample_index for s in g.samples) == [0, 1, 2]
                assert all(s.task_id == g.task_id and check_sample(s) == [] for s in g.samples)
            (stats,) = client.connection_stats()
            assert stats["reconnects"] == 0 and stats["load"] == 0
            assert client._in_flight == 0  # every slot handed back

    run(main())


def test_samples_then_groups_iterate_submitted_tasks_in_completion_order_once(server):
    async def main():
        async with AsyncRolloutClient(server.address, max_in_flight=6) as client:
            ids = [await client.submit("math", math_instance(i), 2, sampling=SAMPLING) for i in range(3)]
            seen = collections.Counter()
            async for s in client.samples():
                seen[(s.task_id, s.sample_index)] += 1
            assert seen == {(t, i): 1 for t in ids for i in range(2)}
            # max_in_flight=6 < 4 tasks × 2 samples: the fourth submit waits for room, made by the groups() consumer.
            submitter = asyncio.ensure_future(asyncio.gather(*(client.submit("math", math_instance(10 + i), 2, sampling=SAMPLING, task_id=f"grp-{i}") for i in range(4))))
            await asyncio.sleep(0.5)
            got = []
            while len(got) < 4:
                async for g in client.groups():
                    assert sorted(s.sample_index for s in g.samples) == [0, 1]
                    got.append(g.task_id)
            await submitter
            assert sorted(got) == [f"grp-{i}" for i in range(4)]

    run(main())


def test_a_bad_spec_is_rejected_naming_the_field_and_bad_options_fail_before_sending(server):
    async def main():
        async with AsyncRolloutClient(server.address) as client:
            with pytest.raises(TaskRejectedError) as info:
                await client.run_group("math", math_instance(0), 0)
            assert info.value.field == "num_samples"
            with pytest.raises(TaskRejectedError) as info:
                await client.submit("no-such-environment", {}, 1)
            assert info.value.field == "environment"
            with pytest.raises(ValueError, match="sampling"):
                await client.submit("math", math_instance(0), 1, sampling={"temprature": 1.0})
            assert client._in_flight == 0
            group = await client.run_group("math", math_instance(2), 1)  # the stream survives rejections
            assert len(group.samples) == 1

    run(main())


def test_cancel_ends_the_unfinished_samples_as_cancelled_infrastructure_failures(stalled_server):
    async def main():
        async with AsyncRolloutClient(stalled_server.address) as client:
            job = asyncio.ensure_future(client.run_group("math", math_instance(3), 3, task_id="to-cancel"))
            while "to-cancel" not in client._tasks or not client._tasks["to-cancel"].accepted.done():
                await asyncio.sleep(0.05)
            await client.cancel("to-cancel")
            group = await job
            assert [s.status for s in group.samples] == ["cancelled"] * 3
            assert len(group.failed) == 3 and group.ok == [] and group.rewards == []
            assert group_advantages(group) == []

    run(main())


def test_a_broken_connection_is_resumed_and_every_sample_arrives_exactly_once(slow_server):
    async def main():
        proxy = Proxy(slow_server.address)
        address = await proxy.start()
        try:
            async with AsyncRolloutClient(address) as client:
                jobs = [asyncio.ensure_future(client.run_group("math", math_instance(20 + i), 3, task_id=f"resume-{i}")) for i in range(4)]
                # Cut once some samples have arrived in groups still incomplete. They were acked on arrival (the client
                # holds them), so the resumed session re-sends only what the cut lost (acks, trajectories in flight),
                # and whatever comes twice is dropped: each sample is handed out once.
                while sum(len(t.samples) for t in client._tasks.values() if len(t.samples) < t.num_samples) < 2:
                    await asyncio.sleep(0.02)
                proxy.cut()
                groups = await asyncio.gather(*jobs)
                for g in groups:
                    assert sorted(s.sample_index for s in g.samples) == [0, 1, 2]
                    assert all(s.ok and check_sample(s) == [] for s in g.samples)
                (stats,) = client.connection_stats()
                assert stats["reconnects"] >= 1 and stats["sessions_lost"] == 0
                assert client._in_flight == 0  # every slot handed back
                assert client.stats["resubmitted"] == 0
        finally:
            await proxy.close()

    run(main())


def test_tasks_spread_over_two_servers_and_survive_one_of_them_killed():
    a, b = Server(latency_ms=20), Server(latency_ms=20)
    try:
        async def main():
            async with AsyncRolloutClient([a.address, b.address], failover_after=1.0) as client:
                await client.wait_connected(60)
                jobs = [asyncio.ensure_future(client.run_group("math", math_instance(40 + i), 2, task_id=f"fo-{i}")) for i in range(8)]
                while not all(t.accepted.done() for t in client._tasks.values()) or len(client._tasks) < 8:
                    await asyncio.sleep(0.02)
                loads = {s["target"]: s["load"] for s in client.connection_stats()}
                assert loads[a.address] == loads[b.address] == 8  # least loaded first: 4 tasks × 2 samples each
                b.kill()
                groups = await asyncio.gather(*jobs)
                for g in groups:
                    assert sorted(s.sample_index for s in g.samples) == [0, 1]
                    assert all(s.ok and check_sample(s) == [] for s in g.samples)
                stats = {s["target"]: s for s in client.connection_stats()}
                assert stats[b.address]["dead"] and not stats[a.address]["dead"]
                assert client.stats["resubmitted"] >= 1
                # New work goes to the survivor only.
                g = await client.run_group("math", math_instance(99), 1)
                assert g.samples[0].ok
        run(main())
    finally:
        a.stop()
        b.stop()


def test_a_server_restarted_at_the_same_address_gets_the_unfinished_tasks_again():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    first = Server(latency_ms=20, port=port)
    second = None
    try:
        async def main():
            nonlocal second
            async with AsyncRolloutClient(first.address) as client:
                jobs = [asyncio.ensure_future(client.run_group("math", math_instance(80 + i), 2, task_id=f"restart-{i}")) for i in range(3)]
                while len(client._tasks) < 3 or not all(t.accepted.done() for t in client._tasks.values()):
                    await asyncio.sleep(0.02)
                first.kill()  # the server, its sessions and its running samples are gone
                second = await asyncio.get_running_loop().run_in_executor(None, lambda: Server(latency_ms=20, port=port))
                groups = await asyncio.gather(*jobs)
                for g in groups:
                    assert sorted(s.sample_index for s in g.samples) == [0, 1]
                    assert all(s.ok and check_sample(s) == [] for s in g.samples)
                (stats,) = client.connection_stats()
                assert stats["sessions_lost"] == 1  # resume answered NOT_FOUND: the session was opened afresh
        run(main())
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_the_sync_client_runs_groups_from_threads_and_iterates_samples(server):
    from concurrent.futures import ThreadPoolExecutor

    with RolloutClient(server.address) as client:
        with ThreadPoolExecutor(4) as pool:
            groups = list(pool.map(lambda i: client.run_group("math", math_instance(60 + i), 2, sampling=SAMPLING), range(6)))
        assert all(sorted(s.sample_index for s in g.samples) == [0, 1] for g in groups)
        task_id = client.submit("math", math_instance(70), 3)
        got = sorted((s.task_id, s.sample_index) for s in client.samples())
        assert got == [(task_id, 0), (task_id, 1), (task_id, 2)]
        with pytest.raises(TaskRejectedError):
            client.run_group("math", math_instance(0), 0)
