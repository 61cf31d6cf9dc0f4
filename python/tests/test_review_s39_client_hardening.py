"""Review s39 of the Python client against a hostile or silent server: one server of several that sends bytes the
client cannot decode (or whose handling fails) no longer fails the whole client; a spec or an OpenSession the server
never answers no longer leaves submit(), or a groups() loop waiting for a spec sent again, waiting for ever
(submit_timeout); a refused RolloutClient leaves no thread behind; a flood of DeliveryPaused notices no longer
costs a scan of every task each; a resume answered with another session id is not adopted silently; wait_connected()
on a failed client raises instead of waiting for ever.

Against the grpc.aio server DOUBLE of test_review_s37_hostile_server (named as such: it speaks the real RolloutService
contract from the generated stubs and runs no rollouts), scripted stream by stream, and its raw variant of
test_review_s38_receive_path (to put undecodable bytes on the wire)."""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, List

import grpc
import pytest

from conftest import until
from rollout.v1 import rollout_pb2
from rollout_client import AsyncRolloutClient, RolloutClient, RolloutClientError
from test_review_s37_hostile_server import ScriptedRolloutDouble, Stream, out, run, serve, trajectory
from test_review_s38_receive_path import serve_raw, undecodable_trajectory


async def opened(s: Stream) -> Any:
    """Reads the OpenSession and answers it with the same session id."""
    request = await s.read_until("open")
    await s.write(out(opened=rollout_pb2.SessionOpened(session_id=request.open.session_id)))
    return request


async def good(s: Stream) -> None:
    """A server that accepts every spec and sends its samples at once."""
    await opened(s)
    while True:
        request = await s.read()
        if request.WhichOneof("kind") == "task":
            spec = request.task
            await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id=spec.task_id, num_samples=spec.num_samples)))
            for i in range(spec.num_samples):
                await s.write(out(trajectory=trajectory(spec.task_id, i)))


def undecodable() -> ScriptedRolloutDouble:
    """A server that accepts every spec and then sends a trajectory of it that no protobuf runtime decodes; as a real
    server, it sends that unacked trajectory again on every resume (the client re-opens a few times: review s40)."""
    owed: List[str] = []

    async def script(s: Stream) -> None:
        await opened(s)
        for task_id in owed:
            await s.write(undecodable_trajectory(task_id, 0))
        while True:
            request = await s.read()
            if request.WhichOneof("kind") == "task":
                spec = request.task
                owed.append(spec.task_id)
                await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id=spec.task_id, num_samples=spec.num_samples)))
                await s.write(undecodable_trajectory(spec.task_id, 0))

    return ScriptedRolloutDouble([script])


async def take(client: AsyncRolloutClient) -> list:
    return [g async for g in client.groups()]


def test_one_server_of_two_sending_undecodable_bytes_is_declared_lost_and_its_task_moved_not_the_whole_client_failed():
    """Server A sends a message the client cannot decode. It failed every call of the client (RolloutClientError "could
    not be decoded"), though server B was fine. Now A alone is declared lost for good (its runner ended: it would get
    the same bytes on every resume): its unfinished task is submitted again to B, B's own task is not touched, and later
    submits go to B. connection_stats() says why A is lost."""

    async def main() -> None:
        bad, good_double = undecodable(), ScriptedRolloutDouble([good])
        (bad_server, bad_address), (good_server, good_address) = await serve_raw(bad), await serve(good_double)
        try:
            async with AsyncRolloutClient([bad_address, good_address], failover_after=3600) as client:
                await client.wait_connected(30)
                # Both assigned before either answers: the least-loaded rule gives one to each server.
                await asyncio.gather(client.submit("math", {"p": 1}, 2, task_id="t01"), client.submit("math", {"p": 2}, 2, task_id="t02"))
                groups = await asyncio.wait_for(take(client), 30)
                assert sorted((g.task_id, len(g.samples)) for g in groups) == [("t01", 2), ("t02", 2)]
                stats = client.connection_stats()
                assert stats[0]["dead"] and "could not be decoded" in stats[0]["failed"], stats
                assert not stats[1]["dead"] and stats[1]["failed"] is None, stats
                assert client.stats["resubmitted"] == 1
                # Re-opened twice (review s40: garbled once costs a resume), then not again: it sends the same bytes.
                assert len(bad.streams) == 3, "the lost server is not re-opened after its third undecodable stream"
                await client.submit("math", {"p": 3}, 1, task_id="t03")
                assert [g.task_id for g in await asyncio.wait_for(take(client), 30)] == ["t03"]
        finally:
            await bad_server.stop(None)
            await good_server.stop(None)

    run(main())


def test_a_runner_failing_on_one_server_of_two_declares_that_server_lost_and_the_other_completes_the_work(monkeypatch):
    """A FAULT INJECTED into the handling of one server's trajectories (standing for any exception in the client while
    it handles a message) ended with every call failing. With a second server, the failing one is declared lost and
    its task runs on the other."""
    failing: List[str] = []
    real = AsyncRolloutClient._on_trajectory

    def on_trajectory(self: Any, conn: Any, t: Any) -> None:
        if conn.target in failing:
            raise KeyError("injected handler fault")
        real(self, conn, t)

    monkeypatch.setattr(AsyncRolloutClient, "_on_trajectory", on_trajectory)

    async def main() -> None:
        a, b = ScriptedRolloutDouble([good]), ScriptedRolloutDouble([good])
        (a_server, a_address), (b_server, b_address) = await serve(a), await serve(b)
        failing.append(a_address)
        try:
            async with AsyncRolloutClient([a_address, b_address], failover_after=3600) as client:
                await client.wait_connected(30)
                await asyncio.gather(client.submit("math", {"p": 1}, 2, task_id="t01"), client.submit("math", {"p": 2}, 2, task_id="t02"))
                groups = await asyncio.wait_for(take(client), 30)
                assert sorted((g.task_id, len(g.samples)) for g in groups) == [("t01", 2), ("t02", 2)]
                assert "injected handler fault" in client.connection_stats()[0]["failed"]
        finally:
            await a_server.stop(None)
            await b_server.stop(None)

    run(main())


def test_when_every_server_sent_undecodable_bytes_every_call_fails_naming_the_cause():
    """Two servers, both faulty: the first is declared lost, its task moved to the second, which fails too; being the
    last, it fails the client as a single server does (no hang, the cause named)."""

    async def main() -> None:
        a, b = undecodable(), undecodable()
        (a_server, a_address), (b_server, b_address) = await serve_raw(a), await serve_raw(b)
        try:
            async with AsyncRolloutClient([a_address, b_address], failover_after=3600) as client:
                await client.wait_connected(30)
                await client.submit("math", {"p": 1}, 2, task_id="t01")
                with pytest.raises(RolloutClientError, match="could not be decoded"):
                    await asyncio.wait_for(take(client), 30)
                with pytest.raises(RolloutClientError, match="could not be decoded"):
                    await client.submit("math", {"p": 2}, 1, task_id="t02")
        finally:
            await a_server.stop(None)
            await b_server.stop(None)

    run(main())


def test_a_server_that_never_answers_opensession_fails_the_submit_after_submit_timeout_naming_it():
    """The server takes the stream and OpenSession and says nothing (no SessionOpened). submit() waited for ever (one
    server: no failover). Now it raises after submit_timeout, naming the server and the SessionOpened it waited for."""

    async def silent(s: Stream) -> None:
        await s.read_until("open")
        await s.drain()

    async def main() -> None:
        double = ScriptedRolloutDouble([silent])
        server, address = await serve(double)
        try:
            async with AsyncRolloutClient(address, failover_after=3600, submit_timeout=0.5) as client:
                with pytest.raises(RolloutClientError, match=rf"{address}: .*no answer.*SessionOpened"):
                    await asyncio.wait_for(client.submit("math", {"p": 1}, 1, task_id="a"), 30)
                with pytest.raises(RolloutClientError, match="SessionOpened"):
                    await asyncio.wait_for(client.run_group("math", {"p": 1}, 1, task_id="b"), 30)
                assert await asyncio.wait_for(take(client), 30) == []
        finally:
            await server.stop(None)

    run(main())


def test_a_spec_the_server_never_answers_fails_its_submit_after_submit_timeout_and_is_cancelled_there():
    """The session opens, the spec is read and never answered (no TaskAccepted, no TaskRejected): submit() waited for
    ever. Now it raises after submit_timeout naming the server and what it waited for, and the task is cancelled on the
    server (it may have started it); a later task the server answers completes as usual."""

    async def mute(s: Stream) -> None:
        await opened(s)
        await s.read_until("task", "mute")
        await s.read_until("cancel", "mute")
        spec = (await s.read_until("task", "fine")).task
        await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id="fine", num_samples=spec.num_samples)))
        await s.write(out(trajectory=trajectory("fine", 0)))
        await s.drain()

    async def main() -> None:
        double = ScriptedRolloutDouble([mute])
        server, address = await serve(double)
        try:
            async with AsyncRolloutClient(address, failover_after=3600, submit_timeout=0.5) as client:
                with pytest.raises(RolloutClientError, match=rf"{address}: no answer to task mute's spec .*neither TaskAccepted nor TaskRejected"):
                    await asyncio.wait_for(client.submit("math", {"p": 1}, 1, task_id="mute"), 30)
                await until(lambda: any(r.WhichOneof("kind") == "cancel" for r in double.streams[0].requests), "the task cancelled on the server")
                await client.submit("math", {"p": 2}, 1, task_id="fine")
                assert [g.task_id for g in await asyncio.wait_for(take(client), 30)] == ["fine"]
        finally:
            await server.stop(None)

    run(main())


def test_a_spec_sent_again_on_a_new_session_and_never_answered_ends_its_task_instead_of_a_groups_loop_waiting_for_ever(caplog):
    """submit() returned (the task was accepted); the server then lost the session (NOT_FOUND on the resume) and the
    client sent the spec again on a fresh session, which never answers it. groups() waited for ever for the rest of the
    group. Now the task fails after submit_timeout like a task refused when sent again: said at WARNING naming the
    server, its group dropped, and groups() ends."""

    async def first(s: Stream) -> None:
        await opened(s)
        await s.read_until("task", "a")
        await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id="a", num_samples=2)))
        await s.write(out(trajectory=trajectory("a", 0)))
        await s.context.abort(grpc.StatusCode.UNAVAILABLE, "cut")

    async def gone(s: Stream) -> None:
        await s.read_until("open")
        await s.context.abort(grpc.StatusCode.NOT_FOUND, "session unknown")

    async def mute(s: Stream) -> None:
        await opened(s)
        await s.drain()

    async def main() -> None:
        double = ScriptedRolloutDouble([first, gone, mute])
        server, address = await serve(double)
        try:
            async with AsyncRolloutClient(address, failover_after=3600, submit_timeout=0.5) as client:
                await client.submit("math", {"p": 1}, 2, task_id="a")
                assert await asyncio.wait_for(take(client), 30) == []
                assert "a" in double.streams[2].specs()
        finally:
            await server.stop(None)

    with caplog.at_level(logging.WARNING, logger="rollout_client"):
        run(main())
    assert any(f"no answer to task a's spec" in r.getMessage() for r in caplog.records), caplog.text


def test_the_sync_client_takes_submit_timeout_and_an_unreachable_server_ends_the_submit_naming_it():
    """RolloutClient passes submit_timeout on; a server nobody listens at ends a submit with the address and the last
    stream status, not a wait for ever. A submit_timeout that is not positive is refused naming the option, and the
    refused client's event loop thread does not outlive the refusal (it was left running for the process's life)."""
    before = len([t for t in threading.enumerate() if t.name == "rollout-client"])
    with pytest.raises(ValueError, match="submit_timeout"):
        RolloutClient("127.0.0.1:1", submit_timeout=0)
    assert len([t for t in threading.enumerate() if t.name == "rollout-client"]) == before
    with RolloutClient("127.0.0.1:1", submit_timeout=0.5, failover_after=3600) as client:
        with pytest.raises(RolloutClientError, match=r"127\.0\.0\.1:1: no answer .*SessionOpened.*UNAVAILABLE"):
            client.submit("math", {"p": 1}, 1)


def test_a_flood_of_delivery_paused_notices_scans_the_clients_tasks_a_bounded_number_of_times(monkeypatch):
    """Each DeliveryPaused notice ran _on_delivery_paused: a scan of every task, of every unacked sample (twice) and of
    the orphans. A faulty server sending thousands of them (or a real one pausing and resuming at every ack) cost that
    scan each. Now the scan runs at most once per _PAUSE_SCAN_EVERY per server, and once more after a burst: what the
    scan is for still happens (run_group's samples acked early, after the flood and after a later pause)."""
    n = 2000
    scans: List[int] = []
    real = AsyncRolloutClient._on_delivery_paused

    def on_delivery_paused(self: Any, conn: Any) -> None:
        scans.append(1)
        real(self, conn)

    monkeypatch.setattr(AsyncRolloutClient, "_on_delivery_paused", on_delivery_paused)

    def paused(resumed: bool = False) -> Any:
        return out(delivery_paused=rollout_pb2.DeliveryPaused(unacked_bytes=10, limit_bytes=1, held=1, resumed=resumed))

    async def acked(s: Stream, ref: tuple) -> None:
        while ref not in s.acks():
            await s.read()

    async def script(s: Stream) -> None:
        await opened(s)
        await s.read_until("task", "g")
        await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id="g", num_samples=3)))
        await s.write(out(trajectory=trajectory("g", 0)))
        for _ in range(n):
            await s.write(paused())
        await acked(s, ("g", 0))  # run_group waits: what keeps the pause is acked early
        await s.write(paused(resumed=True))
        await s.write(out(trajectory=trajectory("g", 1)))  # not paused: kept unacked for its consumer
        await s.write(paused())
        await acked(s, ("g", 1))  # paused again while run_group waits: acked early, throttled scan or not
        await s.write(out(trajectory=trajectory("g", 2)))
        await s.drain()

    async def main() -> None:
        double = ScriptedRolloutDouble([script])
        server, address = await serve(double)
        try:
            async with AsyncRolloutClient(address, failover_after=3600) as client:
                group = await asyncio.wait_for(client.run_group("math", {"p": 1}, 3, task_id="g"), 30)
                assert [s.sample_index for s in group.samples] == [0, 1, 2]
                assert client.connection_stats()[0]["delivery_paused"] == n + 1
        finally:
            await server.stop(None)

    run(main())
    assert len(scans) <= n // 4, f"{len(scans)} scans for {n + 1} notices"


def test_a_resume_answered_with_another_session_id_is_the_session_gone_path_not_a_silent_adoption():
    """The stream breaks; the resume of session "mine" is answered SessionOpened(session_id="someone-else"). The client
    took that id silently: it went on as if resumed, sent nothing again, and waited for ever for samples the other
    session never owed it (and later resumed someone else's session). Now it is what NOT_FOUND is: the session is gone,
    it is opened afresh under its own id and every unfinished task is submitted again."""

    async def first(s: Stream) -> None:
        await opened(s)
        await s.read_until("task", "a")
        await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id="a", num_samples=2)))
        await s.write(out(trajectory=trajectory("a", 0)))
        await s.context.abort(grpc.StatusCode.UNAVAILABLE, "cut")

    async def other(s: Stream) -> None:
        request = await s.read_until("open")
        assert request.open.resume
        await s.write(out(opened=rollout_pb2.SessionOpened(session_id="someone-else")))
        await s.drain()

    async def fresh(s: Stream) -> None:
        await opened(s)
        await s.read_until("task", "a")
        await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id="a", num_samples=2)))
        for i in range(2):
            await s.write(out(trajectory=trajectory("a", i)))
        await s.drain()

    async def main() -> None:
        double = ScriptedRolloutDouble([first, other, fresh])
        server, address = await serve(double)
        try:
            async with AsyncRolloutClient(address, session_id="mine", failover_after=3600) as client:
                await client.submit("math", {"p": 1}, 2, task_id="a")
                groups = await asyncio.wait_for(take(client), 20)
                assert [(g.task_id, [s.sample_index for s in g.samples]) for g in groups] == [("a", [0, 1])]
                third = double.streams[2].requests[0].open
                assert (third.session_id, third.resume) == ("mine", False)
                assert client.connection_stats()[0]["sessions_lost"] == 1
                assert client._conns[0].session_id == "mine"
        finally:
            await server.stop(None)

    run(main())


def test_a_fresh_open_answered_with_another_session_id_fails_the_single_server_client_naming_both():
    """OpenSession(session_id="mine", resume=false) answered with SessionOpened(session_id="other"): the server uses the
    id it is given (src/contract/sessions.ts), so this is a faulty server; adopted, the client would later resume a
    session not its own. It fails the client (one server), naming both ids."""

    async def script(s: Stream) -> None:
        await s.read_until("open")
        await s.write(out(opened=rollout_pb2.SessionOpened(session_id="other")))
        await s.drain()

    async def main() -> None:
        double = ScriptedRolloutDouble([script])
        server, address = await serve(double)
        try:
            async with AsyncRolloutClient(address, session_id="mine", failover_after=3600) as client:
                with pytest.raises(RolloutClientError, match=r"session 'mine'.*'other'"):
                    await asyncio.wait_for(client.submit("math", {"p": 1}, 1, task_id="a"), 20)
        finally:
            await server.stop(None)

    run(main())


def test_wait_connected_on_a_client_that_failed_raises_instead_of_waiting_for_ever():
    """A status no retry changes (here UNAUTHENTICATED) fails the client; wait_connected() without a timeout waited for
    ever for a stream that will never open. Now it raises the client's error."""

    async def script(s: Stream) -> None:
        await s.read_until("open")
        await s.context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad token")

    async def main() -> None:
        double = ScriptedRolloutDouble([script])
        server, address = await serve(double)
        try:
            async with AsyncRolloutClient(address, failover_after=3600) as client:
                with pytest.raises(RolloutClientError, match="UNAUTHENTICATED"):
                    await asyncio.wait_for(client.wait_connected(), 20)
        finally:
            await server.stop(None)

    run(main())
