"""What a server's answers can do to the client: end the stream with RESOURCE_EXHAUSTED "Bandwidth exhausted or memory
limit exceeded" (what grpc reports for the HTTP/2 RST_STREAM ENHANCE_YOUR_CALM the real server now resets a stalled
stream with), send trajectories of tasks never submitted, duplicate or out-of-range sample indexes, more samples than
the group has, a trajectory whose turns make the client's per-token work quadratic.

Against a grpc.aio server DOUBLE in this process (named as such: it speaks the real RolloutService contract from the
generated stubs and runs no rollouts), scripted stream by stream: a real server does none of these on purpose, and the
test needs to say exactly what the stream carries and how it ends."""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Awaitable, Callable, List

import grpc
import grpc.aio

from conftest import until
from rollout.v1 import rollout_pb2, rollout_pb2_grpc
from rollout_client import AsyncRolloutClient
from rollout_client.results import Sample

#: What grpc (core and grpc-js) says for an RST_STREAM ENHANCE_YOUR_CALM.
CALM = "Bandwidth exhausted or memory limit exceeded"


def trajectory(task_id: str, index: int, reward: float = 1.0) -> Any:
    return rollout_pb2.Trajectory(
        task_id=task_id, sample_index=index, group_id=task_id, status=rollout_pb2.TRAJECTORY_STATUS_COMPLETED,
        prompt_token_ids=[1, 2], response_token_ids=[5, 6, 7], response_mask=[1, 1, 0], response_logprobs=[-0.5, -0.25, 0.0],
        turns=[rollout_pb2.Turn(role=rollout_pb2.ROLE_ASSISTANT, start=0, end=2, policy_version=3), rollout_pb2.Turn(role=rollout_pb2.ROLE_TOOL, start=2, end=3)],
        reward=reward, num_turns=1,
    )


def out(**kind: Any) -> Any:
    return rollout_pb2.RolloutResponse(**kind)


class Stream:
    """One Rollout call as the double's script sees it: what the client sent on it, and ways to answer."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.requests: List[Any] = []

    async def read(self) -> Any:
        request = await self.context.read()
        if request is grpc.aio.EOF:
            raise EOFError
        self.requests.append(request)
        return request

    async def read_until(self, kind: str, task_id: str = "") -> Any:
        while True:
            request = await self.read()
            if request.WhichOneof("kind") == kind and (not task_id or getattr(request, kind).task_id == task_id):
                return request

    async def write(self, response: Any) -> None:
        await self.context.write(response)

    async def drain(self) -> None:
        """Reads (acks) until the client ends the stream."""
        try:
            while True:
                await self.read()
        except EOFError:
            pass

    def specs(self) -> List[str]:
        return [r.task.task_id for r in self.requests if r.WhichOneof("kind") == "task"]

    def acks(self) -> List[tuple]:
        return [(t.task_id, t.sample_index) for r in self.requests if r.WhichOneof("kind") == "ack" for t in r.ack.trajectories]


class ScriptedRolloutDouble(rollout_pb2_grpc.RolloutServiceServicer):
    """TEST DOUBLE of the Rollout server: stream n of the client runs scripts[n] (the last one for any later stream)."""

    def __init__(self, scripts: List[Callable[[Stream], Awaitable[None]]]) -> None:
        self.scripts = scripts
        self.streams: List[Stream] = []

    async def Rollout(self, request_iterator, context):  # noqa: N802 - the generated servicer's name
        stream = Stream(context)
        self.streams.append(stream)
        try:
            await self.scripts[min(len(self.streams) - 1, len(self.scripts) - 1)](stream)
        except EOFError:
            pass


async def serve(double: ScriptedRolloutDouble):
    server = grpc.aio.server()
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(double, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_a_stream_reset_resource_exhausted_bandwidth_exhausted_is_resumed_not_fatal_and_loses_or_repeats_nothing():
    """The server resets a stream whose client stopped reading (a training step that held the event loop) with
    RST_STREAM ENHANCE_YOUR_CALM: RESOURCE_EXHAUSTED "Bandwidth exhausted or memory limit exceeded". Not a message over
    a size limit (no spec fails), not a status a retry would get again (the client does not fail): the stream is
    re-opened resuming the same session, the spec the server had not answered is sent again (the one it had is not),
    and every sample reaches the consumer once, the one re-sent by the resumed session included."""

    async def first(s: Stream) -> None:
        opened = await s.read_until("open")
        await s.write(out(opened=rollout_pb2.SessionOpened(session_id=opened.open.session_id)))
        await s.read_until("task", "b")  # both specs are here ("a" first)
        await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id="a", num_samples=2)))
        await s.write(out(trajectory=trajectory("a", 0)))
        await s.context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, CALM)

    async def resumed(s: Stream) -> None:
        opened = await s.read_until("open")
        # a/0 was not acked (the consumer may not have taken it yet): the resumed session sends it again, first.
        await s.write(out(trajectory=trajectory("a", 0)))
        await s.write(out(opened=rollout_pb2.SessionOpened(session_id=opened.open.session_id, redelivered=1)))
        await s.read_until("task", "b")
        await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id="b", num_samples=2)))
        for t in (trajectory("a", 1), trajectory("b", 0), trajectory("b", 1)):
            await s.write(out(trajectory=t))
        await s.drain()

    async def main() -> None:
        double = ScriptedRolloutDouble([first, resumed])
        server, address = await serve(double)
        try:
            async with AsyncRolloutClient(address, session_id="calm", failover_after=3600) as client:
                await asyncio.gather(client.submit("math", {"p": 1}, 2, task_id="a"), client.submit("math", {"p": 2}, 2, task_id="b"))
                groups = [g async for g in client.groups()]
                assert sorted((g.task_id, [s.sample_index for s in g.samples]) for g in groups) == [("a", [0, 1]), ("b", [0, 1])]
                assert len(double.streams) == 2, "one re-open, no more"
                again = double.streams[1]
                assert again.requests[0].open.session_id == "calm" and again.requests[0].open.resume, "re-opened as a resume of the session"
                assert again.specs() == ["b"], "only the spec the server had not answered is sent again"
                stats = client.connection_stats()[0]
                assert stats["reconnects"] == 1 and stats["redelivered"] == 1 and stats["sessions_lost"] == 0
                assert client.stats["duplicates_dropped"] == 1  # the re-sent a/0 that had arrived before the reset
                await until(lambda: sorted(set(again.acks())) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)], "every consumed sample acked on the resumed stream")
        finally:
            await server.stop(None)

    run(main())


def test_trajectories_a_faulty_server_sends_outside_the_groups_submitted_are_dropped_acked_and_reported(caplog):
    """Trajectories of a task never submitted, an index outside the group (negative, past num_samples: a group bigger
    than asked for), a second copy of an index: the consumer gets the group it asked for, whole, once, with the first
    copy; the rest is acked (the server would re-send it for ever on every resume otherwise) and logged; nothing
    crashes, nothing waits."""

    async def script(s: Stream) -> None:
        opened = await s.read_until("open")
        await s.write(out(opened=rollout_pb2.SessionOpened(session_id=opened.open.session_id)))
        await s.read_until("task", "a")
        await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id="a", num_samples=2)))
        for t in (trajectory("never-submitted", 0), trajectory("a", -1), trajectory("a", 2), trajectory("a", 7), trajectory("a", 0, reward=0.25), trajectory("a", 0, reward=0.75), trajectory("a", 1, reward=0.5)):
            await s.write(out(trajectory=t))
        await s.drain()

    async def main() -> None:
        double = ScriptedRolloutDouble([script])
        server, address = await serve(double)
        try:
            async with AsyncRolloutClient(address, failover_after=3600) as client:
                await client.submit("math", {"p": 1}, 2, task_id="a")
                groups = [g async for g in client.groups()]
                assert [(g.task_id, [(s.sample_index, s.reward) for s in g.samples]) for g in groups] == [("a", [(0, 0.25), (1, 0.5)])]
                dropped = [("never-submitted", 0), ("a", -1), ("a", 2), ("a", 7)]
                await until(lambda: set(dropped) <= set(double.streams[0].acks()), "what no group takes is acked")
                assert client.connection_stats()[0]["reconnects"] == 0
        finally:
            await server.stop(None)

    with caplog.at_level(logging.WARNING, logger="rollout_client"):
        run(main())
    text = caplog.text
    assert "never-submitted" in text and "sample_index -1" in text and "sample_index 7" in text


def test_a_trajectory_whose_turns_all_span_the_whole_response_is_read_in_linear_time():
    """A faulty server's trajectory with T turns, each spanning all N response tokens: reading it (policy versions
    per token) was O(N x T), here 10^10 steps on the client's event loop (hours; every stream of the client frozen
    meanwhile), from a 1.3 MB message. It is malformed (its turns do not tile the response) and must be read in time
    proportional to its size. The bound below is minutes above what a linear read takes on any machine."""
    n = 100_000
    t = rollout_pb2.Trajectory(
        task_id="a", sample_index=0, status=rollout_pb2.TRAJECTORY_STATUS_COMPLETED,
        response_token_ids=[5] * n, response_mask=[1] * n, response_logprobs=[-0.5] * n,
        turns=[rollout_pb2.Turn(role=rollout_pb2.ROLE_ASSISTANT, start=0, end=n, policy_version=v) for v in range(n)],
    )
    result: List[Sample] = []
    reader = threading.Thread(target=lambda: result.append(Sample.from_proto(t)), daemon=True)
    reader.start()
    reader.join(120)
    assert result, "Sample.from_proto still running after 120 s: quadratic in the turns"
    sample = result[0]
    assert sample.status == "malformed" and "turns do not tile" in sample.error
    assert len(sample.policy_versions) == n


def test_a_submitted_task_refused_when_sent_again_after_its_session_was_lost_is_reported_and_its_partial_group_does_not_end_later_loops(caplog):
    """A task submit() had seen accepted, 3 of its 4 samples taken into a groups() loop's partial group, then the session
    is lost (NOT_FOUND on the resume: a server restarted without its journal) and the spec, sent again to the new
    session, is refused for good (the restarted server's config no longer takes it). Nobody was told: submit() had
    returned, and the refusal went nowhere. Its partial group stayed in the client for good, unacked, and counted as
    "samples waiting for their group": a later groups() loop, with the next task's 2 samples on their way, ended at
    once (2 outstanding <= 3 held), an empty batch for a trainer. Now the refusal is logged at WARNING, naming the task,
    the partial group is dropped and acked (nobody will get it), and the next loop gets the next group."""
    release_b, break_first = asyncio.Event(), asyncio.Event()

    async def first(s: Stream) -> None:
        opened = await s.read_until("open")
        await s.write(out(opened=rollout_pb2.SessionOpened(session_id=opened.open.session_id)))
        await s.read_until("task", "a")
        await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id="a", num_samples=4)))
        for i in range(3):
            await s.write(out(trajectory=trajectory("a", i)))
        await break_first.wait()
        await s.context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset")

    async def gone(s: Stream) -> None:
        await s.read_until("open")
        await s.context.abort(grpc.StatusCode.NOT_FOUND, "no such session")

    async def fresh(s: Stream) -> None:
        opened = await s.read_until("open")
        assert not opened.open.resume
        await s.write(out(opened=rollout_pb2.SessionOpened(session_id=opened.open.session_id)))
        await s.read_until("task", "a")
        await s.write(out(rejected=rollout_pb2.TaskRejected(task_id="a", field="environment", reason="environment: unknown environment 'math'", code=grpc.StatusCode.INVALID_ARGUMENT.value[0])))
        await s.read_until("task", "b")
        await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id="b", num_samples=2)))
        await release_b.wait()
        for i in range(2):
            await s.write(out(trajectory=trajectory("b", i)))
        await s.drain()

    async def main() -> None:
        double = ScriptedRolloutDouble([first, gone, fresh])
        server, address = await serve(double)
        try:
            async with AsyncRolloutClient(address, session_id="lost", failover_after=3600) as client:
                await client.submit("math", {"p": 1}, 4, task_id="a")
                consumer = asyncio.ensure_future(take(client))
                await until(lambda: len(client._partial.get("a", {})) == 3, "a's 3 samples wait in groups() for the 4th")
                break_first.set()  # the stream breaks: the client resumes, the session is gone
                await until(lambda: "a" not in client._tasks, "a's refusal on the new session")
                consumer.cancel()
                await client.submit("math", {"p": 2}, 2, task_id="b")
                later = asyncio.ensure_future(take(client))
                release_b.set()
                groups = await later
                assert [(g.task_id, len(g.samples)) for g in groups] == [("b", 2)]
                await until(lambda: {("a", 0), ("a", 1), ("a", 2)} <= set(double.streams[2].acks()), "a's dropped samples acked")
        finally:
            await server.stop(None)

    async def take(client: AsyncRolloutClient) -> list:
        return [g async for g in client.groups()]

    with caplog.at_level(logging.WARNING, logger="rollout_client"):
        run(main())
    assert any("task a" in r.getMessage() and "unknown environment" in r.getMessage() for r in caplog.records), caplog.text


def test_a_call_the_client_drops_itself_is_re_opened_not_the_end_of_the_connection():
    """The client cancels its own call when a write on it failed other than with a status, or one that failed lingers
    (Connection._writer_done, done here directly: nothing real makes such a write fail on demand). grpc.aio then
    raises asyncio.CancelledError from the pending read, not an AioRpcError: it went through the reconnect loop and
    ended the connection's runner, silently; nothing re-opened the stream or failed the calls (the failover timer was
    cancelled with it), and a groups() loop waited for ever. Now it is a broken stream like any other: re-opened,
    resuming the session, and the group completes."""

    async def first(s: Stream) -> None:
        opened = await s.read_until("open")
        await s.write(out(opened=rollout_pb2.SessionOpened(session_id=opened.open.session_id)))
        await s.read_until("task", "a")
        await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id="a", num_samples=2)))
        await s.write(out(trajectory=trajectory("a", 0)))
        await s.drain()

    async def resumed(s: Stream) -> None:
        opened = await s.read_until("open")
        assert opened.open.resume
        await s.write(out(trajectory=trajectory("a", 0)))
        await s.write(out(opened=rollout_pb2.SessionOpened(session_id=opened.open.session_id, redelivered=1)))
        await s.write(out(trajectory=trajectory("a", 1)))
        await s.drain()

    async def main() -> None:
        double = ScriptedRolloutDouble([first, resumed])
        server, address = await serve(double)
        try:
            async with AsyncRolloutClient(address, session_id="dropped", failover_after=3600) as client:
                await client.submit("math", {"p": 1}, 2, task_id="a")
                conn = client._conns[0]
                await until(lambda: len(client._tasks["a"].samples) == 1, "a/0 came")
                conn._call.cancel()
                groups = await asyncio.wait_for(take(client), 30)
                assert [(g.task_id, [s.sample_index for s in g.samples]) for g in groups] == [("a", [0, 1])]
                assert conn.stats["reconnects"] == 1 and len(double.streams) == 2
        finally:
            await server.stop(None)

    async def take(client: AsyncRolloutClient) -> list:
        return [g async for g in client.groups()]

    run(main())
