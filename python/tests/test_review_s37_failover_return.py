"""A lost server that comes back: its unfinished tasks were moved to the other server, and it still runs them in its
session. Real servers (see conftest.py); the lost one is cut off behind a TCP proxy that refuses connections (a network
partition: the server and its session stay), then let through again."""
from __future__ import annotations

import asyncio
import os
from collections import Counter

from conftest import Proxy, Server, check_sample, math_instance, until
from rollout_client import AsyncRolloutClient


class PartitionProxy(Proxy):
    """The conftest Proxy, which can also refuse every connection (new ones are reset at once) until healed."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.blocked = False

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.blocked:
            writer.transport.abort()
            return
        await super()._handle(reader, writer)

    def partition(self) -> None:
        self.blocked = True
        self.cut()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, float(os.environ.get("PYCLIENT_TEST_TIMEOUT", "240"))))


def test_a_lost_server_that_comes_back_with_the_moved_tasks_still_running_delivers_nothing_twice():
    """Tasks on server A (behind the proxy) are moved to B once A is out of reach for failover_after. A comes back: the
    client resumes its session there, and A sends the samples of the moved tasks too (it kept running them), some
    after B's copies were handed out and acked, some before. Every (task, sample index) reaches the consumer once; every
    second copy is dropped (and acked: the servers forget them)."""
    # 40 ms a token: a sample runs for seconds, so the partition below always finds A running the tasks it took.
    a, b = Server(latency_ms=40), Server(latency_ms=40)
    proxy = PartitionProxy(a.address)
    try:
        async def main():
            via_proxy = await proxy.start()
            async with AsyncRolloutClient([via_proxy, b.address], failover_after=1.0) as client:
                await client.wait_connected(60)
                ids = [await client.submit("math", math_instance(i), 2, task_id=f"back-{i}", sampling={"max_tokens_per_turn": 48}) for i in range(6)]
                on_a = [t for t in ids if client._tasks[t].conn.target == via_proxy]
                assert on_a, "some tasks went to A"
                proxy.partition()
                await until(lambda: client.connection_stats()[0]["dead"], "A declared lost", timeout=60)
                assert client.stats["resubmitted"] >= 1
                proxy.blocked = False  # A is reachable again: the client resumes its session there
                samples = [s async for s in client.samples()]
                assert all(check_sample(s) == [] for s in samples)
                got = [(s.task_id, s.sample_index) for s in samples]
                assert sorted(got) == sorted((t, i) for t in ids for i in range(2)), Counter(got).most_common(3)
                await until(lambda: client.connection_stats()[0]["connected"], "A back", timeout=60)
                # A finishes the moved tasks it kept running: each of its copies is dropped, never handed out.
                moved = client.stats["resubmitted"] * 2  # two samples each, both run again on B
                await until(lambda: client.stats["duplicates_dropped"] >= moved, f"A's {moved} copies of the moved tasks' samples dropped", timeout=120)
                assert [s async for s in client.samples()] == []
                assert not client._unacked, "every copy acked"
        run(main())
    finally:
        a.stop()
        b.stop()
