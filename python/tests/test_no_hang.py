"""Waits that must end: a call of the client that waits for something (room under max_in_flight, a group whose samples
the server holds while delivery is paused, ...) must end when that can no longer come, or get it, never wait for
ever. Real servers (see conftest.py); each test waits for the state it needs, never for a time."""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid

import grpc
import pytest

from conftest import math_instance, paused_server, take_groups
from conftest import until as _until
from rollout.v1 import rollout_pb2, rollout_pb2_grpc
from rollout_client import AsyncRolloutClient, ClientClosedError, RolloutClient, SessionTakenOverError
from rollout_client import client as client_module

SAMPLING = {"temperature": 1.0, "max_tokens_per_turn": 64}


def test_a_submit_waiting_for_room_fails_when_the_client_fails_instead_of_waiting_for_ever(server):
    """A submit (or run_group) waiting for room under max_in_flight when a stream status fails the client (here: the
    session taken over by another stream) raises that error. Before, only the calls waiting for an answer were failed:
    one waiting for room waited until someone closed the client - for ever under asyncio.gather(return_exceptions=True),
    or in a sync client's thread."""
    session_id = f"room-then-fatal-{uuid.uuid4().hex}"

    async def main():
        async with AsyncRolloutClient(server.address, session_id=session_id, max_in_flight=1) as client:
            await client.submit("math", math_instance(1), 1, sampling=SAMPLING)  # its sample is never taken: no room
            waiting = asyncio.ensure_future(client.submit("math", math_instance(2), 1, sampling=SAMPLING))
            await _until(lambda: len(client._room._waiters) == 1, "the second submit waits for room")
            channel = grpc.aio.insecure_channel(server.address)
            other = rollout_pb2_grpc.RolloutServiceStub(channel).Rollout()
            try:
                await other.write(rollout_pb2.RolloutRequest(open=rollout_pb2.OpenSession(session_id=session_id, resume=True)))
                while (await other.read()).WhichOneof("kind") != "opened":
                    pass
                with pytest.raises(SessionTakenOverError):
                    await asyncio.wait_for(waiting, 20)
            finally:
                other.cancel()
                await channel.close()

    asyncio.run(main())


def test_run_group_whose_samples_the_server_holds_behind_submitted_samples_nobody_reads_yet_completes(tmp_path):
    """A trainer prefetches its next batch with submit() and, before it reads it, runs an evaluation group with
    run_group. The batch's samples, unread, fill the server's sessions.maxUnackedBytes: the server pauses delivery and
    holds the evaluation group's samples until it gets acks - which nothing sent ("consumed": the caller, inside
    run_group, cannot consume the batch), so run_group waited for ever. They are acked early (stats['acked_early'],
    the WARNING), as for a refused submit; the batch still arrives, whole, once read."""
    server = paused_server(tmp_path, latency_ms=600_000)  # samples end only when cancelled: the test orders them

    async def main():
        async with AsyncRolloutClient(server.address) as client:
            batch = await client.submit("math", math_instance(1), 2, sampling=SAMPLING)
            evaluation = asyncio.ensure_future(client.run_group("math", math_instance(2), 1, task_id="eval", sampling=SAMPLING))
            await _until(lambda: "eval" in client._tasks and client._tasks["eval"].accepted.done(), "the evaluation task is accepted")
            # The batch finishes first (its samples fill the bound: delivery pauses), then the evaluation sample (held).
            await client.cancel(batch)
            await _until(lambda: client.connection_stats()[0]["delivery_paused"] > 0, "delivery pauses")
            await client.cancel("eval")
            group = await asyncio.wait_for(evaluation, 30)
            groups = await asyncio.wait_for(take_groups(client), 30)
            return batch, group, groups, client.stats["acked_early"]

    try:
        batch, group, groups, acked_early = asyncio.run(main())
    finally:
        server.stop()
    assert [s.sample_index for s in group.samples] == [0]
    assert [(g.task_id, [s.sample_index for s in g.samples]) for g in groups] == [(batch, [0, 1])]
    assert acked_early > 0


async def _leave_orphans(address: str, session_id: str, kept: str, running: str) -> None:
    """A predecessor on a paused server (bound 1, tokens that never end: cancels end the samples in the order a test
    needs): the sample of `kept` fills the bound and is received, never acked ("manual"); `running` is still running.
    The process then goes away (its tasks keep their session)."""
    client = AsyncRolloutClient(address, session_id=session_id, ack="manual")
    await client.submit("math", math_instance(1), 1, task_id=kept, sampling=SAMPLING)
    await client.submit("math", math_instance(2), 1, task_id=running, sampling=SAMPLING)
    await client.cancel(kept)
    await _until(lambda: client._stream.qsize() == 1 and client.connection_stats()[0]["delivery_paused"] > 0, "the first sample arrives")
    await client.close(cancel_pending=False)


def test_a_new_task_refused_while_only_a_predecessors_samples_keep_delivery_paused_is_accepted(tmp_path):
    """resume=True: the predecessor's unacked samples (kept for a resubmit of their task) fill the server's
    sessions.maxUnackedBytes, and the trainer, which had used that task (its ack was lost with the crash), submits new
    work. The server refuses it until it gets acks, and nothing else here could be acked: the submit was retried for
    retry_rejected_for (60 s) and failed. The predecessor's samples are acked early instead (the server forgets them;
    the client keeps them, so a resubmit of their task still gets them)."""
    server = paused_server(tmp_path, latency_ms=600_000)
    session_id = f"orphans-refuse-{uuid.uuid4().hex}"

    async def main():
        await _leave_orphans(server.address, session_id, "used", "unused")
        async with AsyncRolloutClient(server.address, session_id=session_id, resume=True) as client:
            await _until(lambda: client.connection_stats()[0]["delivery_paused"] > 0, "the resumed session is paused")
            fresh = asyncio.ensure_future(client.submit("math", math_instance(3), 1, task_id="fresh", sampling=SAMPLING))
            await asyncio.wait_for(fresh, 20)
            # The predecessor's task, submitted again after all: its sample comes from the client's keeping.
            await client.submit("math", math_instance(1), 1, task_id="used", sampling=SAMPLING)
            await client.submit("math", math_instance(2), 1, task_id="unused", sampling=SAMPLING)
            await client.cancel("fresh")
            await client.cancel("unused")
            groups = await asyncio.wait_for(take_groups(client), 30)
            return sorted(g.task_id for g in groups), client.stats["acked_early"]

    try:
        task_ids, acked_early = asyncio.run(main())
    finally:
        server.stop()
    assert task_ids == ["fresh", "unused", "used"]
    assert acked_early >= 1


def test_a_resubmitted_task_whose_sample_the_server_holds_behind_a_predecessors_samples_arrives(tmp_path):
    """resume=True: the trainer submits again the task it had not used; the server holds that task's sample behind the
    predecessor's unacked samples of a task the trainer had used (and does not submit again), and groups() waited for
    ever (a WARNING asked the caller to ack() samples it never had). Those are acked early instead, and kept."""
    server = paused_server(tmp_path, latency_ms=600_000)
    session_id = f"orphans-hold-{uuid.uuid4().hex}"

    async def main():
        await _leave_orphans(server.address, session_id, "used", "unused")
        async with AsyncRolloutClient(server.address, session_id=session_id, resume=True) as client:
            await client.submit("math", math_instance(2), 1, task_id="unused", sampling=SAMPLING)
            await client.cancel("unused")  # it ends now: held by the server behind the predecessor's sample
            groups = await asyncio.wait_for(take_groups(client), 20)
            return [g.task_id for g in groups], client.stats["acked_early"]

    try:
        task_ids, acked_early = asyncio.run(main())
    finally:
        server.stop()
    assert task_ids == ["unused"]
    assert acked_early >= 1


def test_a_submit_waiting_for_room_is_not_overtaken_by_later_smaller_ones(server):
    """Room under max_in_flight goes to the submits in the order they came. Before, every freed slot went to whichever
    waiting submit fitted: a group larger than what one hand-off frees (an evaluation group among training groups, a
    group over max_in_flight that runs alone) was overtaken by every smaller submit behind it, for as long as a
    producer kept submitting - for ever in a trainer whose producers keep the client full."""

    async def main():
        async with AsyncRolloutClient(server.address, max_in_flight=2) as client:
            first = await client.submit("math", math_instance(1), 1, sampling=SAMPLING)
            large = asyncio.ensure_future(client.submit("math", math_instance(2), 2, task_id="large", sampling=SAMPLING))
            await _until(lambda: len(client._room._waiters) == 1, "the larger submit waits for room")
            small = asyncio.ensure_future(client.submit("math", math_instance(3), 1, task_id="small", sampling=SAMPLING))
            await _until(lambda: len(client._room._waiters) == 2 or "small" in client._tasks, "the smaller submit waits or has room")
            overtaken = "small" in client._tasks and "large" not in client._tasks
            order = []
            async for s in client.samples(until_idle=False):
                order.append(s.task_id)
                if len(order) == 4:
                    break
            await asyncio.gather(large, small)
            return first, overtaken, order

    first, overtaken, order = asyncio.run(asyncio.wait_for(main(), 120))
    assert not overtaken
    assert sorted(order) == sorted([first, "large", "large", "small"])


def test_groups_after_a_samples_loop_hands_out_the_rest_of_a_group_it_had_begun(server):
    """samples() then groups() (one after the other, as the docs allow): a task some of whose samples the samples()
    loop handed out can never be whole in groups(). Its other samples were kept there as a partial group for ever -
    never handed out nor acked, and never freeing their room: with max_in_flight reached, every later submit waited
    for ever. groups() now hands out the rest as the group's remainder."""

    async def main():
        async with AsyncRolloutClient(server.address, max_in_flight=2) as client:
            task_id = await client.submit("math", math_instance(1), 2, sampling=SAMPLING)
            async for first in client.samples():
                break
            client.ack(first)
            rest = await asyncio.wait_for(take_groups(client), 30)
            # The room the task took is free again.
            await asyncio.wait_for(client.submit("math", math_instance(2), 2, sampling=SAMPLING), 20)
            later = await asyncio.wait_for(take_groups(client), 30)
            return task_id, first.sample_index, rest, later

    task_id, first, rest, later = asyncio.run(main())
    assert [(g.task_id, [s.sample_index for s in g.samples]) for g in rest] == [(task_id, [1 - first])]
    assert [len(g.samples) for g in later] == [2]


def test_a_submit_waiting_for_room_while_nothing_takes_the_queued_samples_is_said(server, monkeypatch, caplog):
    """A trainer submits its batch before it reads, and the batch is larger than max_in_flight: the submit that does
    not fit waits for room only a reader frees, and the reader is the caller itself - for ever, and before, silently.
    Once a submit has waited a while (30 s; here 0.2) with samples queued and none taken, that is said at WARNING,
    naming max_in_flight; reading frees the room as before."""
    monkeypatch.setattr(client_module, "_WARN_ROOM_AFTER", 0.2, raising=False)

    async def main():
        async with AsyncRolloutClient(server.address, max_in_flight=1) as client:
            await client.submit("math", math_instance(1), 1, sampling=SAMPLING)
            await _until(lambda: client._stream.qsize() == 1, "the first sample is queued")
            second = asyncio.ensure_future(client.submit("math", math_instance(2), 1, sampling=SAMPLING))
            await _until(lambda: any("max_in_flight" in r.getMessage() for r in caplog.records), "the wait is said")
            assert not second.done()
            got = []
            async for s in client.samples(until_idle=False):
                got.append(s)
                if len(got) == 2:
                    break
            await second
            return len(got)

    with caplog.at_level(logging.WARNING, logger="rollout_client"):
        assert asyncio.run(asyncio.wait_for(main(), 120)) == 2


def test_a_sync_call_from_another_thread_as_close_stops_the_loop_raises_instead_of_waiting_for_ever(server):
    """RolloutClient: a thread that calls the client while another thread's close() stops its event loop (a consumer
    thread whose groups() loop ended because of that close, and closes its iterator) scheduled its coroutine on a
    loop that would never run it again, and waited for it for ever (no timeout off the main thread). It raises
    ClientClosedError. The test holds close() between the loop's stop and its end until the other call is scheduled."""
    client = RolloutClient(server.address)
    loop_thread = client._thread
    outcome: list = []

    def call() -> None:
        try:
            client.connection_stats()
            outcome.append("returned")
        except ClientClosedError:
            outcome.append("closed")

    other = threading.Thread(target=call, daemon=True)

    class Joining:
        def join(self) -> None:
            loop_thread.join()  # the loop has stopped
            other.start()
            while not client._loop._ready:  # the other thread's call is scheduled on the stopped loop
                time.sleep(0.01)

    client._thread = Joining()
    client.close()
    other.join(20)
    assert not other.is_alive(), "the call waited for a loop that was gone"
    assert outcome == ["closed"]


def test_samples_after_a_groups_loop_was_left_hands_out_the_samples_of_its_unfinished_groups(server):
    """groups() then samples() (one after the other, as the docs allow): the samples a groups() loop had gathered into
    groups not yet whole when it was left were kept for groups() alone, so samples() never handed them out and, until
    idle, waited for them for ever (and their room was never freed). samples() takes them first. (The first loop
    leaves such groups when the tasks' samples arrive interleaved, as they do: several tasks run at once.)"""

    async def main():
        async with AsyncRolloutClient(server.address) as client:
            for i in range(6):
                await client.submit("math", math_instance(i), 4, sampling=SAMPLING)
            await _until(lambda: client._stream.qsize() == 24, "every sample is queued")
            async for first in client.groups():
                break
            client.ack(first)
            rest = await asyncio.wait_for(_take_samples(client), 30)
            return first, rest

    first, rest = asyncio.run(main())
    assert len(first.samples) == 4
    assert len(rest) == 20 and first.task_id not in {s.task_id for s in rest}


async def _take_samples(client):
    return [s async for s in client.samples()]


def test_a_submit_refused_while_many_held_samples_come_one_ack_at_a_time_is_accepted_within_its_retry_budget(tmp_path):
    """The server holds many finished samples for a session at its sessions.maxUnackedBytes and releases them one per
    ack. A refused submit acked early what was here - one sample - and the server sent the next, which paused delivery
    again until the next refusal: one sample per retry, the retries backing off to 2 s, so a few dozen held samples
    outlasted retry_rejected_for and the submit failed. While a submit waits to be retried after such a refusal, what
    the paused server sends is acked early on arrival ("consumed"): the held samples drain at once."""
    server = paused_server(tmp_path, latency_ms=600_000)

    async def main():
        async with AsyncRolloutClient(server.address, retry_rejected_for=20) as client:
            batch = await client.submit("math", math_instance(1), 40, sampling=SAMPLING)
            await client.cancel(batch)  # its 40 samples end at once: one is sent, 39 are held
            await _until(lambda: client.connection_stats()[0]["delivery_paused"] > 0, "delivery pauses")
            late = await asyncio.wait_for(client.submit("math", math_instance(2), 1, sampling=SAMPLING), 60)
            await client.cancel(late)
            groups = await asyncio.wait_for(take_groups(client), 60)
            return batch, late, groups

    try:
        batch, late, groups = asyncio.run(main())
    finally:
        server.stop()
    assert sorted((g.task_id, len(g.samples)) for g in groups) == sorted([(batch, 40), (late, 1)])
