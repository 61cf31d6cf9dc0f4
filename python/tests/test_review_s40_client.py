"""Review s40 of the Python client: the work done per trajectory while a server holds delivery for acks was a scan of
every task (twice in _on_trajectory, once more per sample a reader waits for, and groups()' sum over its partial
groups): max_in_flight² over a paused batch, now O(1) per trajectory (counts kept, the reader's scan throttled as the
notice scan is). A server that sends bytes the client cannot decode once is resumed (as any broken stream), not lost
for good at the first garbled message; the same bytes on every resume still lose it (bounded).

Against the grpc.aio server DOUBLE of test_review_s37_hostile_server (named as such: it speaks the real
RolloutService contract from the generated stubs and runs no rollouts), scripted stream by stream, and its raw variant
of test_review_s38_receive_path (to put undecodable bytes on the wire)."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Dict, List

from rollout.v1 import rollout_pb2
from rollout_client import AsyncRolloutClient
from rollout_client import connection as connection_module
from test_review_s37_hostile_server import ScriptedRolloutDouble, Stream, out, run, serve, trajectory
from test_review_s38_receive_path import serve_raw, undecodable_trajectory


async def opened(s: Stream) -> Any:
    request = await s.read_until("open")
    await s.write(out(opened=rollout_pb2.SessionOpened(session_id=request.open.session_id)))
    return request


class CountingDict(dict):
    """A dict that counts the entries its values() hands out: the work of a scan of the client's tasks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.visits = 0
        self.counting = True

    def values(self) -> Any:  # type: ignore[override]
        for v in super().values():
            if self.counting:
                self.visits += 1
            yield v


def test_trajectories_arriving_while_delivery_is_paused_cost_no_scan_of_the_tasks_each(monkeypatch):
    """N tasks of 2 samples are submitted; the server pauses delivery and sends every first sample, then every second
    one (a groups() reader holds N partial groups meanwhile). Each trajectory ran _run_group_waits (every task of the
    server) and _submit_waits (every task of the client); groups() summed its partial groups for each sample; and the
    reader, keeping up with the trickle, ran the pause scan (every task) before each wait. Counted: task records
    visited inside _on_trajectory, partial groups visited, and pause scans (_ack_waiting_groups calls, throttled to one
    per _PAUSE_SCAN_EVERY per kind). Printed (pytest -s): the whole phase's visits, the micro-benchmark of the report."""
    n = 1000
    inside_on_trajectory = [False]
    scans: List[int] = []
    real_on_trajectory = AsyncRolloutClient._on_trajectory
    real_ack_waiting_groups = AsyncRolloutClient._ack_waiting_groups

    def on_trajectory(self: Any, conn: Any, t: Any) -> None:
        inside_on_trajectory[0] = True
        try:
            real_on_trajectory(self, conn, t)
        finally:
            inside_on_trajectory[0] = False

    def ack_waiting_groups(self: Any, conn: Any, **kwargs: Any) -> int:
        scans.append(1)
        return real_ack_waiting_groups(self, conn, **kwargs)

    monkeypatch.setattr(AsyncRolloutClient, "_on_trajectory", on_trajectory)
    monkeypatch.setattr(AsyncRolloutClient, "_ack_waiting_groups", ack_waiting_groups)

    async def script(s: Stream) -> None:
        await opened(s)
        ids: List[str] = []
        while len(ids) < n:
            request = await s.read_until("task")
            ids.append(request.task.task_id)
            await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id=request.task.task_id, num_samples=2)))
        await s.write(out(delivery_paused=rollout_pb2.DeliveryPaused(unacked_bytes=10, limit_bytes=1, held=2 * n, resumed=False)))
        for index in (0, 1):
            for task_id in ids:
                await s.write(out(trajectory=trajectory(task_id, index)))
        await s.drain()

    async def main() -> Dict[str, Any]:
        server, address = await serve(ScriptedRolloutDouble([script]))
        try:
            async with AsyncRolloutClient(address, failover_after=3600, max_in_flight=4 * n) as client:
                conn = client._conns[0]
                tasks, conn_tasks, partial = CountingDict(), CountingDict(), CountingDict()
                client._tasks, conn.tasks, client._partial = tasks, conn_tasks, partial
                await asyncio.gather(*(client.submit("math", {"p": i}, 2, task_id=f"t{i:04d}") for i in range(n)))
                # Only what the trajectories cost from here on (a submit's own work is not what this is about).
                tasks.visits = conn_tasks.visits = 0
                inside_visits = [0]
                real_values = CountingDict.values

                def values(self: Any) -> Any:
                    for v in real_values(self):
                        if inside_on_trajectory[0]:
                            inside_visits[0] += 1
                        yield v

                monkeypatch.setattr(CountingDict, "values", values)
                scans.clear()
                began = time.monotonic()
                groups = await asyncio.wait_for(_take(client), 120)
                elapsed = time.monotonic() - began
                assert sorted(g.task_id for g in groups) == [f"t{i:04d}" for i in range(n)]
                assert all([s.sample_index for s in g.samples] == [0, 1] for g in groups)
                return {
                    "elapsed": elapsed, "inside": inside_visits[0], "partial": partial.visits, "scans": len(scans),
                    "visits": tasks.visits + conn_tasks.visits + partial.visits,
                }
        finally:
            await server.stop(None)

    got = run(main())
    print(
        f"\n{n} tasks x 2 samples while paused: {got['visits']} task/partial-group records visited in all "
        f"({got['inside']} inside _on_trajectory, {got['partial']} of groups()' partial groups), {got['scans']} pause "
        f"scans, in {got['elapsed']:.2f} s"
    )
    assert got["inside"] == 0, f"{got['inside']} task records visited while handling {2 * n} trajectories"
    assert got["partial"] == 0, f"{got['partial']} partial groups visited by groups() for {2 * n} samples"
    # Throttled: the reader's scan and the notice scan each at most once per _PAUSE_SCAN_EVERY, plus one after a burst.
    bound = 2 * (got["elapsed"] / connection_module._PAUSE_SCAN_EVERY + 2)
    assert got["scans"] <= bound, f"{got['scans']} pause scans in {got['elapsed']:.2f} s (at most {bound:.0f})"


async def _take(client: AsyncRolloutClient) -> list:
    return [g async for g in client.groups()]


def test_a_server_that_garbles_one_message_once_is_resumed_and_the_group_completes():
    """The server sends one message the client cannot decode, and on the resume sends the trajectory as it should
    have. The client lost the server for good at the first such message (the only server: every call failed with
    "could not be decoded"), though nothing had been handled and a resume brings the trajectory again. Now the stream
    is re-opened with resume, as any broken stream, and the group completes."""

    async def first(s: Stream) -> None:
        await opened(s)
        await s.read_until("task", "abc")
        await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id="abc", num_samples=2)))
        await s.write(out(trajectory=trajectory("abc", 0)))
        await s.write(undecodable_trajectory("abc", 1))
        await s.drain()

    async def resumed(s: Stream) -> None:
        request = await opened(s)
        assert request.open.resume
        await s.write(out(trajectory=trajectory("abc", 1)))  # the re-sent trajectory, as it should have been
        await s.drain()

    async def main() -> None:
        double = ScriptedRolloutDouble([first, resumed])
        server, address = await serve_raw(double)
        try:
            async with AsyncRolloutClient(address, session_id="garbled-once", failover_after=3600) as client:
                await client.submit("math", {"p": 1}, 2, task_id="abc")
                groups = await asyncio.wait_for(_take(client), 30)
                assert [(g.task_id, [s.sample_index for s in g.samples]) for g in groups] == [("abc", [0, 1])]
                stats = client.connection_stats()[0]
                assert stats["reconnects"] == 1 and stats["failed"] is None and not stats["dead"], stats
                assert len(double.streams) == 2
        finally:
            await server.stop(None)

    run(main())
