"""Acknowledge after consumption: a trajectory is acked once the trainer has moved past it (the "consumed" mode, the
default) or when the trainer says so ("manual"), never on receipt: a trainer process that dies holding samples, or with
samples queued in its client, loses none of them; a process that resumes the session gets them again. Real servers
(see conftest.py) and a real consumer process killed with SIGKILL."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap

from conftest import Proxy, math_instance, paused_server, take_groups
from conftest import until as _until
from rollout_client import AsyncRolloutClient

SAMPLING = {"temperature": 1.0, "max_tokens_per_turn": 64}

#: A trainer's collection loop: submits six groups, takes them with groups(), and stops dead (SIGKILL from the test)
#: while it holds the third, with the others received and queued in its client.
CONSUMER = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from rollout_client import AsyncRolloutClient
    target, session_id, instances = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])

    async def main():
        client = AsyncRolloutClient(target, session_id=session_id)
        for task_id, instance in instances.items():
            await client.submit("math", instance, 2, task_id=task_id, sampling={"temperature": 1.0, "max_tokens_per_turn": 64})
        taken = 0
        async for group in client.groups():
            taken += 1
            if taken == 3:
                # Wait until everything has arrived (queued here, unacked), then report the group in hand and hang.
                while client._stream.qsize() + sum(len(p) for p in client._partial.values()) < 2 * (len(instances) - 3):
                    await asyncio.sleep(0.01)
                # And until the acks of the two groups it moved past have left (they go in batches, _ACK_DELAY apart,
                # on this event loop, which time.sleep below stops): when everything had arrived already, the second
                # group's ack was still waiting here at the kill, and the server rightly sent that group again (CI).
                while any(c._acks or not c._outbox.empty() for c in client._conns):
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.3)
                print(json.dumps({"holding": group.task_id}), flush=True)
                time.sleep(600)
            print(json.dumps({"consumed": group.task_id}), flush=True)

    asyncio.run(main())
    """
)


def test_a_consumer_killed_mid_batch_loses_nothing_the_resumed_session_gets_every_group_it_had_not_moved_past(server):
    session_id = f"py-killed-consumer-{os.getpid()}"
    instances = {f"kill-{i}": math_instance(40 + i) for i in range(6)}
    child = subprocess.Popen([sys.executable, "-c", CONSUMER, server.address, session_id, json.dumps(instances)], stdout=subprocess.PIPE, text=True)
    consumed, holding = [], None
    try:
        for line in child.stdout:
            event = json.loads(line)
            if "holding" in event:
                holding = event["holding"]
                break
            consumed.append(event["consumed"])
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert holding is not None and len(consumed) == 2

    async def resume():
        async with AsyncRolloutClient(server.address, session_id=session_id, resume=True) as client:
            # A restarted trainer submits again what it has not trained on, with the same task ids: the server answers
            # them as owed by the session (no re-run) and re-sends what was never acked.
            rest = [t for t in instances if t not in consumed]
            for task_id in rest:
                await client.submit("math", instances[task_id], 2, task_id=task_id, sampling=SAMPLING)
            got = {g.task_id: [s.sample_index for s in g.samples] async for g in client.groups()}
            return rest, got, client.connection_stats()[0]["redelivered"]

    rest, got, redelivered = asyncio.run(asyncio.wait_for(resume(), 120))
    assert holding in rest
    assert got == {t: [0, 1] for t in rest}
    # From the session: every sample the killed consumer had received and not moved past was still unacked.
    assert redelivered == 2 * len(rest)


#: A streaming trainer: takes one group's samples one by one with samples(), moves past two (acked: "consumed") and
#: stops dead (SIGKILL from the test) while it holds the third.
SAMPLE_CONSUMER = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from rollout_client import AsyncRolloutClient
    target, session_id, instance = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])

    async def main():
        client = AsyncRolloutClient(target, session_id=session_id)
        await client.submit("math", instance, 4, task_id="part", sampling={"temperature": 1.0, "max_tokens_per_turn": 64})
        taken = []
        async for sample in client.samples():
            taken.append(sample.sample_index)
            if len(taken) == 3:
                await asyncio.sleep(0.5)  # the acks of the two moved past go (they wait up to 20 ms for others)
                print(json.dumps({"moved_past": taken[:2]}), flush=True)
                time.sleep(600)

    asyncio.run(main())
    """
)


def test_a_task_acked_in_part_before_a_crash_is_whole_when_the_resumed_trainer_submits_it_again(server):
    """samples() acks sample by sample, so a streaming trainer killed mid-group leaves a task acked in part. Submitted
    again on resume, it waited for ever: the server re-sent only the unacked samples and never said the acked ones
    would not come. The server now sends those again too (TaskAccepted.resent_sample_indexes): the group is whole."""
    session_id = f"py-acked-in-part-{os.getpid()}"
    instance = math_instance(60)
    child = subprocess.Popen([sys.executable, "-c", SAMPLE_CONSUMER, server.address, session_id, json.dumps(instance)], stdout=subprocess.PIPE, text=True)
    try:
        moved_past = json.loads(child.stdout.readline())["moved_past"]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()

    async def resume():
        async with AsyncRolloutClient(server.address, session_id=session_id, resume=True) as client:
            await client.submit("math", instance, 4, task_id="part", sampling=SAMPLING)
            groups = [g async for g in client.groups()]
            return [(g.task_id, [s.sample_index for s in g.samples]) for g in groups], client.connection_stats()[0]["redelivered"]

    groups, redelivered = asyncio.run(asyncio.wait_for(resume(), 60))
    assert len(moved_past) == 2
    assert groups == [("part", [0, 1, 2, 3])]
    # Owed from the session at the resume: the two samples not acked (held and queued), not the two acked.
    assert redelivered == 2


def test_in_the_manual_mode_nothing_is_acked_until_the_caller_acks_it(server):
    session_id = f"py-manual-acks-{os.getpid()}"

    async def first():
        client = AsyncRolloutClient(server.address, session_id=session_id, ack="manual")
        await client.submit("math", math_instance(60), 3, task_id="manual-a", sampling=SAMPLING)
        await client.submit("math", math_instance(61), 3, task_id="manual-b", sampling=SAMPLING)
        groups = [g async for g in client.groups()]
        client.ack([g for g in groups if g.task_id == "manual-a"])
        await client.close(cancel_pending=False)

    async def second():
        async with AsyncRolloutClient(server.address, session_id=session_id, resume=True, ack="manual") as client:
            await client.submit("math", math_instance(61), 3, task_id="manual-b", sampling=SAMPLING)
            groups = [g async for g in client.groups()]
            client.ack(groups)
            return [g.task_id for g in groups], client.connection_stats()[0]["redelivered"]

    asyncio.run(asyncio.wait_for(first(), 120))
    assert asyncio.run(asyncio.wait_for(second(), 120)) == (["manual-b"], 3)


def test_manual_mode_samples_waiting_on_a_server_paused_by_its_own_unacked_samples_is_logged_and_ends_once_acked(tmp_path, caplog):
    """'manual' with samples(): a caller that holds its samples unacked until it has a batch, against a server whose
    sessions.maxUnackedBytes those samples exceed, waits for samples the server will not send until it gets acks.
    Nothing can be acked early (the caller holds them), so the wait is said, at WARNING, naming the bound and ack();
    once the caller acks, delivery resumes and the batch completes."""
    server = paused_server(tmp_path)

    class Said(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.stuck = asyncio.Event()

        def emit(self, record: logging.LogRecord) -> None:
            if "ack()" in record.getMessage():
                self.stuck.set()

    async def main():
        said = Said()
        logging.getLogger("rollout_client").addHandler(said)
        try:
            async with AsyncRolloutClient(server.address, ack="manual") as client:
                await client.submit("math", math_instance(5), 4, sampling=SAMPLING)
                got = []

                async def take():
                    async for s in client.samples():
                        got.append(s)
                        if said.stuck.is_set():
                            client.ack(s)  # told: from then on it acks as it goes

                taking = asyncio.ensure_future(take())
                await asyncio.wait_for(said.stuck.wait(), 30)
                assert 0 < len(got) < 4
                assert not taking.done()
                client.ack(got)  # what a trainer does once its step used them: delivery resumes
                await asyncio.wait_for(asyncio.shield(taking), 60)
                assert sorted(s.sample_index for s in got) == [0, 1, 2, 3]
        finally:
            logging.getLogger("rollout_client").removeHandler(said)

    try:
        asyncio.run(main())
    finally:
        server.stop()


def test_a_submit_refused_while_samples_nobody_has_taken_yet_keep_delivery_paused_is_accepted_not_left_to_time_out(tmp_path):
    """The caller submits its batch first and reads after (a trainer's usual loop), and the first samples arrive while
    it is still submitting: they fill the server's sessions.maxUnackedBytes, the server pauses delivery and refuses
    new tasks on the session until it gets acks - and in the "consumed" mode nothing would ack them, since the
    caller is inside submit(). Before, the refusals were retried for retry_rejected_for (60 s) and the submit then
    failed. Such samples are acked early (stats['acked_early'], the WARNING), as groups() does for its partial
    groups: the submit is accepted, and every group still arrives once."""
    server = paused_server(tmp_path)

    async def main():
        async with AsyncRolloutClient(server.address) as client:
            first = await client.submit("math", math_instance(1), 2, sampling=SAMPLING)
            # Wait for the pause the first task's samples cause (deterministic: the second submit meets it).
            while client.connection_stats()[0]["delivery_paused"] == 0:
                await asyncio.sleep(0.01)
            second = await asyncio.wait_for(client.submit("math", math_instance(2), 2, sampling=SAMPLING), 20)
            groups = await asyncio.wait_for(take_groups(client), 60)
            return first, second, groups, client.stats["acked_early"]

    try:
        first, second, groups, acked_early = asyncio.run(main())
    finally:
        server.stop()
    assert sorted((g.task_id, sorted(s.sample_index for s in g.samples)) for g in groups) == sorted([(first, [0, 1]), (second, [0, 1])])
    assert acked_early > 0


def test_manual_mode_a_submit_refused_while_the_callers_own_unacked_samples_keep_delivery_paused_is_said(tmp_path, caplog):
    """In the "manual" mode the caller holds what it has not acked: nothing is acked early, and the refused submit
    waits for the caller's acks (until retry_rejected_for) - said at WARNING, naming ack() and the bound, not left
    silent; once the caller acks (from another task), the submit is accepted."""
    server = paused_server(tmp_path)

    async def main():
        async with AsyncRolloutClient(server.address, ack="manual") as client:
            await client.submit("math", math_instance(3), 2, sampling=SAMPLING)
            while client.connection_stats()[0]["delivery_paused"] == 0:
                await asyncio.sleep(0.01)
            caplog.clear()
            submitting = asyncio.ensure_future(client.submit("math", math_instance(4), 1, sampling=SAMPLING))
            deadline = asyncio.get_running_loop().time() + 20
            while not any("ack()" in r.getMessage() and "submit" in r.getMessage() for r in caplog.records):
                assert asyncio.get_running_loop().time() < deadline, "the waiting submit was never said"
                assert not submitting.done(), "accepted although the caller acked nothing"
                await asyncio.sleep(0.02)
            got = []
            async def take():
                async for s in client.samples():
                    got.append(s)
                    client.ack(s)
            taking = asyncio.ensure_future(take())
            await asyncio.wait_for(submitting, 30)
            await asyncio.wait_for(taking, 60)
            assert client.stats["acked_early"] == 0
            return len(got)

    with caplog.at_level(logging.WARNING, logger="rollout_client"):
        try:
            assert asyncio.run(main()) == 3
        finally:
            server.stop()


def test_a_pause_of_a_stream_that_broke_does_not_ack_early_while_the_server_is_out_of_reach(tmp_path):
    """Delivery was paused (the client holds a group's first sample unacked), then the connection broke. The client
    kept believing the server waited for acks, so a groups() caller that began to wait meanwhile acked its partial
    group early - to a server out of reach, for nothing, and a crash after those acks went out would lose the sample.
    A pause is of the stream: it ends with it (the server says so again on the resumed stream if it still holds)."""
    server = paused_server(tmp_path)

    async def main():
        proxy = Proxy(server.address)
        address = await proxy.start()
        try:
            async with AsyncRolloutClient(address) as client:
                await client.submit("math", math_instance(70), 2, task_id="pair", sampling=SAMPLING)
                # The first sample arrives (queued, unacked), the second is held: delivery paused.
                await _until(lambda: client._stream.qsize() == 1 and client.connection_stats()[0]["delivery_paused"] > 0, "the pause")
                await proxy.close()  # the connection breaks; new ones are refused: the server is out of reach
                await _until(lambda: client.connection_stats()[0]["reconnects"] >= 1, "the stream seen broken")
                reader = asyncio.ensure_future(take_groups(client))
                await asyncio.sleep(0.5)  # the reader takes the sample into its partial group and waits for the other
                acked_early = client.stats["acked_early"]
                reader.cancel()
                return acked_early
        finally:
            await proxy.close()

    try:
        acked_early = asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        server.stop()
    assert acked_early == 0

