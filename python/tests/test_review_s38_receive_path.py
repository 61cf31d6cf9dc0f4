"""The client's receive path against what a hostile or buggy server sends: a message the client cannot decode, a message
whose handling fails, a message kind it does not know, a flood of trajectories of tasks it does not know or outside
their group, a resumed session's trajectories that no submit ever claims, a task accepted with another num_samples than
its spec; and a TLS path that cannot be read. Never a silent hang, never unbounded growth, never a log flood.

Against the grpc.aio server DOUBLE of test_review_s37_hostile_server (named as such: it speaks the real RolloutService
contract from the generated stubs and runs no rollouts), scripted stream by stream, and, to send bytes the generated
serializer would never produce, a raw variant of it (RawRolloutDouble) registered for the same method."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import grpc.aio
import pytest

import rollout_client.client as client_module
from conftest import until
from rollout.v1 import rollout_pb2
from rollout_client import AsyncRolloutClient, RolloutClientError, TaskRejectedError, TlsOptions
from test_review_s37_hostile_server import ScriptedRolloutDouble, Stream, out, run, serve, trajectory


def undecodable_trajectory(task_id: str, index: int) -> bytes:
    """A RolloutResponse carrying a trajectory whose task_id is not UTF-8: every protobuf runtime refuses to parse it
    (a server of another protocol version, or a faulty one). `task_id` must be 3 characters; its first two bytes are
    replaced by 0xff 0xfe."""
    assert len(task_id) == 3
    raw = out(trajectory=trajectory(task_id, index)).SerializeToString()
    assert raw.count(task_id.encode()) == 2  # task_id and group_id
    return raw.replace(task_id.encode(), b"\xff\xfe" + task_id[2:].encode(), 1)


async def serve_raw(double: ScriptedRolloutDouble):
    """The double behind a handler whose response serializer lets bytes through as they are (what a hostile server's
    encoder can put on the wire), messages being serialized as usual."""
    server = grpc.aio.server()

    async def rollout(request_iterator: Any, context: Any) -> None:
        await double.Rollout(request_iterator, context)

    handler = grpc.method_handlers_generic_handler(
        "rollout.v1.RolloutService",
        {
            "Rollout": grpc.stream_stream_rpc_method_handler(
                rollout,
                request_deserializer=rollout_pb2.RolloutRequest.FromString,
                response_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString(),
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_a_message_the_client_cannot_decode_fails_every_waiter_with_a_clear_error_instead_of_a_silent_hang():
    """grpc.aio logs a message its deserializer refuses ("Exception deserializing message!") and returns None from
    read(). The client's runner then died on None.WhichOneof, silently: no re-open, no failover (its timer went with
    it), and groups() waited for ever. Which task the message was about cannot be known, and the server re-sends an
    unacked trajectory on every resume (the same bytes again): every waiter now raises a RolloutClientError saying a
    message could not be decoded."""

    async def script(s: Stream) -> None:
        opened = await s.read_until("open")
        await s.write(out(opened=rollout_pb2.SessionOpened(session_id=opened.open.session_id)))
        await s.read_until("task", "abc")
        await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id="abc", num_samples=2)))
        await s.write(out(trajectory=trajectory("abc", 0)))
        await s.write(undecodable_trajectory("abc", 1))
        await s.drain()

    async def resumed(s: Stream) -> None:
        # As a real server: the unacked trajectory again on every resume (re-opened a few times since review s40).
        opened = await s.read_until("open")
        await s.write(out(opened=rollout_pb2.SessionOpened(session_id=opened.open.session_id)))
        await s.write(undecodable_trajectory("abc", 1))
        await s.drain()

    async def main() -> None:
        double = ScriptedRolloutDouble([script, resumed])
        server, address = await serve_raw(double)
        try:
            async with AsyncRolloutClient(address, session_id="undecodable", failover_after=3600) as client:
                await client.submit("math", {"p": 1}, 2, task_id="abc")
                with pytest.raises(RolloutClientError, match="could not be decoded"):
                    await asyncio.wait_for(take(client), 30)
                with pytest.raises(RolloutClientError, match="could not be decoded"):
                    await client.submit("math", {"p": 2}, 1, task_id="later")
        finally:
            await server.stop(None)

    async def take(client: AsyncRolloutClient) -> list:
        return [g async for g in client.groups()]

    run(main())


def test_a_failure_while_handling_one_message_fails_every_waiter_naming_it_instead_of_ending_the_runner_silently(monkeypatch, caplog):
    """A bug in the client's own bookkeeping, met while handling one message (here a FAULT INJECTED into _on_accepted,
    standing for any such bug: no well-formed message makes the real one raise), ended the connection's runner with
    the exception unretrieved: no re-open, no failover, and submit() waited for ever. Not skipped: the handler failed
    halfway, the client's counts (room, unacked refs, partial groups) are in an unknown state, and a sample handed out
    twice or a slot lost for good would be silent. Every waiter raises a RolloutClientError naming the exception, and
    the traceback is logged."""

    def broken(self: Any, task: Any, num_samples: int) -> None:
        raise KeyError("injected bookkeeping fault")

    monkeypatch.setattr(AsyncRolloutClient, "_on_accepted", broken)

    async def script(s: Stream) -> None:
        opened = await s.read_until("open")
        await s.write(out(opened=rollout_pb2.SessionOpened(session_id=opened.open.session_id)))
        await s.read_until("task", "a")
        await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id="a", num_samples=1)))
        await s.drain()

    async def main() -> None:
        double = ScriptedRolloutDouble([script])
        server, address = await serve(double)
        try:
            async with AsyncRolloutClient(address, failover_after=3600) as client:
                with pytest.raises(RolloutClientError, match="injected bookkeeping fault"):
                    await asyncio.wait_for(client.submit("math", {"p": 1}, 1, task_id="a"), 30)
        finally:
            await server.stop(None)

    with caplog.at_level(logging.ERROR, logger="rollout_client"):
        run(main())
    assert any(r.exc_info and "injected bookkeeping fault" in repr(r.exc_info[1]) for r in caplog.records), caplog.text


def test_a_message_of_a_kind_this_client_does_not_know_is_skipped_and_the_stream_goes_on():
    """A newer server's message kind (a oneof member this client's stubs lack: decoded with the member as an unknown
    field, WhichOneof None) is skipped, before SessionOpened and after: nobody waits for it."""
    # Field 99, length-delimited, 2 bytes: what a newer `kind` member would look like on the wire.
    unknown = out().SerializeToString() + bytes([(99 << 3 | 2) & 0x7F | 0x80, (99 << 3 | 2) >> 7, 2, 8, 1])

    async def script(s: Stream) -> None:
        opened = await s.read_until("open")
        await s.write(unknown)
        await s.write(out(opened=rollout_pb2.SessionOpened(session_id=opened.open.session_id)))
        await s.read_until("task", "a")
        await s.write(unknown)
        await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id="a", num_samples=1)))
        await s.write(out(trajectory=trajectory("a", 0)))
        await s.drain()

    async def main() -> None:
        double = ScriptedRolloutDouble([script])
        server, address = await serve_raw(double)
        try:
            async with AsyncRolloutClient(address, failover_after=3600) as client:
                await client.submit("math", {"p": 1}, 1, task_id="a")
                groups = await asyncio.wait_for(take(client), 30)
                assert [(g.task_id, len(g.samples)) for g in groups] == [("a", 1)]
                assert client.connection_stats()[0]["reconnects"] == 0
        finally:
            await server.stop(None)

    async def take(client: AsyncRolloutClient) -> list:
        return [g async for g in client.groups()]

    run(main())


def test_a_flood_of_trajectories_of_unknown_tasks_is_acked_and_said_a_few_times_not_once_each(caplog):
    """A faulty server sending thousands of trajectories of tasks this client never submitted: each is acked and
    dropped, as before, and the warning naming it is throttled (one WARNING, then at most one per 30 s with a count of
    those held back, at DEBUG), not one WARNING line each."""
    n = 2000

    async def script(s: Stream) -> None:
        opened = await s.read_until("open")
        await s.write(out(opened=rollout_pb2.SessionOpened(session_id=opened.open.session_id)))
        for i in range(n):
            await s.write(out(trajectory=trajectory(f"stray-{i}", 0)))
        await s.read_until("task", "a")
        await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id="a", num_samples=1)))
        await s.write(out(trajectory=trajectory("a", 0)))
        await s.drain()

    async def main() -> None:
        double = ScriptedRolloutDouble([script])
        server, address = await serve(double)
        try:
            async with AsyncRolloutClient(address, failover_after=3600) as client:
                await client.wait_connected(30)
                await until(lambda: len(set(double.streams[0].acks())) >= n, "every stray trajectory acked")
                await client.submit("math", {"p": 1}, 1, task_id="a")
                groups = await asyncio.wait_for(take(client), 30)
                assert [g.task_id for g in groups] == ["a"]
        finally:
            await server.stop(None)

    async def take(client: AsyncRolloutClient) -> list:
        return [g async for g in client.groups()]

    with caplog.at_level(logging.WARNING, logger="rollout_client"):
        run(main())
    said = [r for r in caplog.records if "unknown task" in r.getMessage()]
    assert 1 <= len(said) <= 10, f"{len(said)} warnings for {n} stray trajectories"
    assert "stray-0" in said[0].getMessage()


def test_a_resumed_sessions_unclaimed_trajectories_are_held_within_a_bound_the_oldest_dropped_and_acked(monkeypatch, caplog):
    """resume=True: trajectories of tasks this process never submits (re-sent after a lost ack of a task finished long
    ago, past the finished-task memory; a predecessor's task the trainer does not submit again) were held in _orphans
    for the whole run, without bound. Now within _ORPHANS_MAX_SAMPLES samples (here 4, set small) and
    _ORPHANS_MAX_BYTES: past it the oldest tasks' are dropped and acked (the server forgets them), counted and said
    (throttled); the ones still held are claimed by a submit of their task as before."""
    monkeypatch.setattr(client_module, "_ORPHANS_MAX_SAMPLES", 4, raising=False)
    n = 50

    async def script(s: Stream) -> None:
        opened = await s.read_until("open")
        assert opened.open.resume
        for i in range(n):
            await s.write(out(trajectory=trajectory(f"old-{i}", 0)))
        await s.write(out(opened=rollout_pb2.SessionOpened(session_id=opened.open.session_id, redelivered=n)))
        await s.read_until("task", f"old-{n - 1}")
        # Owed already: its sample came before SessionOpened and is not sent again.
        await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id=f"old-{n - 1}", num_samples=1)))
        await s.drain()

    async def main() -> None:
        double = ScriptedRolloutDouble([script])
        server, address = await serve(double)
        try:
            async with AsyncRolloutClient(address, session_id="long-run", resume=True, failover_after=3600) as client:
                await client.wait_connected(30)
                assert sum(len(held) for held in client._orphans.values()) == 4
                assert sorted(client._orphans) == [f"old-{i}" for i in range(n - 4, n)]
                assert client.stats["orphans_dropped"] == n - 4
                dropped = {(f"old-{i}", 0) for i in range(n - 4)}
                await until(lambda: dropped <= set(double.streams[0].acks()), "the dropped trajectories acked")
                assert not {(f"old-{i}", 0) for i in range(n - 4, n)} & set(double.streams[0].acks()), "those held stay unacked"
                await client.submit("math", {"p": 1}, 1, task_id=f"old-{n - 1}")
                groups = await asyncio.wait_for(take(client), 30)
                assert [g.task_id for g in groups] == [f"old-{n - 1}"]
                assert client._orphan_samples == 3 and client._orphan_bytes == sum(t.ByteSize() for held in client._orphans.values() for t in held.values())
        finally:
            await server.stop(None)

    async def take(client: AsyncRolloutClient) -> list:
        return [g async for g in client.groups()]

    with caplog.at_level(logging.WARNING, logger="rollout_client"):
        run(main())
    said = [r.getMessage() for r in caplog.records if "were dropped and acked" in r.getMessage()]
    assert 1 <= len(said) <= 10 and "old-0" in said[0], caplog.text


def test_the_orphan_byte_bound_holds_too(monkeypatch):
    """The byte bound alone (samples well under theirs): a predecessor's large trajectories are held up to
    _ORPHANS_MAX_BYTES (here about two of them), the oldest dropped and acked."""
    size = out(trajectory=trajectory("big-0", 0)).trajectory.ByteSize()
    monkeypatch.setattr(client_module, "_ORPHANS_MAX_BYTES", 2 * size + size // 2, raising=False)

    async def script(s: Stream) -> None:
        opened = await s.read_until("open")
        for i in range(10):
            await s.write(out(trajectory=trajectory(f"big-{i}", 0)))
        await s.write(out(opened=rollout_pb2.SessionOpened(session_id=opened.open.session_id, redelivered=10)))
        await s.drain()

    async def main() -> None:
        double = ScriptedRolloutDouble([script])
        server, address = await serve(double)
        try:
            async with AsyncRolloutClient(address, session_id="big", resume=True, failover_after=3600) as client:
                await client.wait_connected(30)
                assert sorted(client._orphans) == ["big-8", "big-9"]
                assert client.stats["orphans_dropped"] == 8
        finally:
            await server.stop(None)

    run(main())


def test_a_task_accepted_with_fewer_samples_than_its_spec_fails_naming_it_and_is_cancelled_not_waited_on_for_ever():
    """A faulty server answers a spec of 3 samples with TaskAccepted(num_samples=2) and runs 2: submit() returned and
    groups() waited for ever for the third. Now the submit raises TaskRejectedError naming num_samples and both
    counts, the task is cancelled on the server, and its 2 trajectories (they come anyway) are acked and dropped; a
    later task completes as usual."""

    async def script(s: Stream) -> None:
        opened = await s.read_until("open")
        await s.write(out(opened=rollout_pb2.SessionOpened(session_id=opened.open.session_id)))
        await s.read_until("task", "short")
        await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id="short", num_samples=2)))
        await s.read_until("cancel", "short")
        for i in range(2):
            await s.write(out(trajectory=trajectory("short", i)))
        await s.read_until("task", "fine")
        await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id="fine", num_samples=1)))
        await s.write(out(trajectory=trajectory("fine", 0)))
        await s.drain()

    async def main() -> None:
        double = ScriptedRolloutDouble([script])
        server, address = await serve(double)
        try:
            async with AsyncRolloutClient(address, failover_after=3600) as client:
                with pytest.raises(TaskRejectedError, match=r"num_samples 2, not the 3") as raised:
                    await asyncio.wait_for(client.submit("math", {"p": 1}, 3, task_id="short"), 30)
                assert raised.value.field == "num_samples" and not raised.value.retryable
                await client.submit("math", {"p": 2}, 1, task_id="fine")
                groups = await asyncio.wait_for(take(client), 30)
                assert [g.task_id for g in groups] == ["fine"]
                await until(lambda: {("short", 0), ("short", 1)} <= set(double.streams[0].acks()), "the cancelled task's trajectories acked")
        finally:
            await server.stop(None)

    async def take(client: AsyncRolloutClient) -> list:
        return [g async for g in client.groups()]

    run(main())


def test_a_flood_of_trajectories_outside_their_group_is_said_a_few_times_not_once_each(caplog):
    """As for unknown tasks: thousands of trajectories of a submitted task with sample indexes outside its group are
    acked and dropped, and said at most _WARN_REPEAT_BURST times per 30 s, not once each."""
    n = 2000

    async def script(s: Stream) -> None:
        opened = await s.read_until("open")
        await s.write(out(opened=rollout_pb2.SessionOpened(session_id=opened.open.session_id)))
        await s.read_until("task", "a")
        await s.write(out(accepted=rollout_pb2.TaskAccepted(task_id="a", num_samples=1)))
        for i in range(n):
            await s.write(out(trajectory=trajectory("a", 1 + i)))
        await s.write(out(trajectory=trajectory("a", 0)))
        await s.drain()

    async def main() -> None:
        double = ScriptedRolloutDouble([script])
        server, address = await serve(double)
        try:
            async with AsyncRolloutClient(address, failover_after=3600) as client:
                await client.submit("math", {"p": 1}, 1, task_id="a")
                groups = await asyncio.wait_for(take(client), 30)
                assert [(g.task_id, [s.sample_index for s in g.samples]) for g in groups] == [("a", [0])]
                await until(lambda: len(set(double.streams[0].acks())) >= n + 1, "every trajectory acked")
        finally:
            await server.stop(None)

    async def take(client: AsyncRolloutClient) -> list:
        return [g async for g in client.groups()]

    with caplog.at_level(logging.WARNING, logger="rollout_client"):
        run(main())
    said = [r for r in caplog.records if "outside [0, 1)" in r.getMessage()]
    assert 1 <= len(said) <= 20, f"{len(said)} warnings for {n} trajectories outside the group"


def test_a_tls_certificate_path_that_cannot_be_read_is_refused_by_the_constructor_naming_the_field(tmp_path):
    """TlsOptions(root_certificates=<a path with a typo>): the file was read when the runner made its channel, the
    FileNotFoundError ended the runner, and every call waited for ever (no stream, no failover, nothing logged). Now
    the constructor raises ValueError naming the field and the path."""
    missing = tmp_path / "no-such-ca.pem"

    async def main() -> None:
        with pytest.raises(ValueError, match=r"TlsOptions\.root_certificates: cannot read .*no-such-ca\.pem"):
            client = AsyncRolloutClient("127.0.0.1:1", tls=TlsOptions(root_certificates=str(missing)), failover_after=3600)
            try:
                await asyncio.wait_for(client.submit("math", {"p": 1}, 1), 5)
            finally:
                await client.close()

    run(main())
