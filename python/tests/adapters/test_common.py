"""The adapters' shared pieces on their own: group coalescing, cutting, spans, the neutral reward.

The coalescer is driven by a recording client (a TEST DOUBLE of run_group that answers from memory); everything
else runs on Sample values.
"""
from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import pytest

from rollout_client import Group, Sample
from rollout_client.adapters._common import GroupCoalescer, TaskRequest, neutral_reward, spans, truncate


def sample(i: int, *, prompt=(1, 2, 3), response=(), mask=(), status="completed", reward=0.0, turns=None) -> Sample:
    assert len(response) == len(mask)
    return Sample(task_id="t", sample_index=i, group_id="g", prompt_ids=list(prompt), response_ids=list(response),
                  loss_mask=list(mask), logprobs=[-0.5 if m else 0.0 for m in mask], policy_versions=[7 if m else 0 for m in mask],
                  reward=reward, status=status, is_infra_failure=status not in ("completed", "truncated"), finish_reason="stop",
                  num_turns=1, error="", timing={}, stale=False, raw=SimpleNamespace(turns=turns or []) if turns is not None else None)


class RecordingClient:
    """TEST DOUBLE of AsyncRolloutClient.run_group: records each call, answers with n samples (in reverse order, as
    a server may deliver them), or raises when told to."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail = fail

    async def run_group(self, environment, instance, num_samples, **_):
        self.calls.append((instance["q"], num_samples))
        await asyncio.sleep(0)
        if self.fail:
            raise ConnectionError("server gone")
        samples = [sample(i, response=(5,), mask=(1,), reward=float(i)) for i in reversed(range(num_samples))]
        return Group(task_id=instance["q"], group_id=instance["q"], samples=samples)


def req(q: str) -> TaskRequest:
    return TaskRequest(environment="math", instance={"q": q})


def test_calls_started_together_become_one_group_per_key_and_each_gets_its_own_sample():
    client = RecordingClient()

    async def go():
        c = GroupCoalescer(lambda: client)
        return await asyncio.gather(*[c.sample(k, req(k)) for k in ["a", "b", "a", "a", "b"]])

    results = asyncio.run(go())
    assert sorted(client.calls) == [("a", 3), ("b", 2)]
    assert sorted(i for g, i in results if g.task_id == "a") == [0, 1, 2]
    assert sorted(i for g, i in results if g.task_id == "b") == [0, 1]
    for g, _ in results:
        assert [s.sample_index for s in g.samples] == list(range(len(g.samples)))  # ordered for the adapters


def test_a_late_caller_forms_a_group_of_its_own():
    client = RecordingClient()

    async def go():
        c = GroupCoalescer(lambda: client)
        first = asyncio.gather(c.sample("a", req("a")), c.sample("a", req("a")))
        await asyncio.sleep(0.01)
        late = await c.sample("a", req("a"))
        return await first, late

    (_, late) = asyncio.run(go())
    assert client.calls == [("a", 2), ("a", 1)]
    assert late[1] == 0


def test_a_failing_call_reaches_every_caller():
    async def go():
        c = GroupCoalescer(lambda: RecordingClient(fail=True))
        return await asyncio.gather(*[c.sample("a", req("a")) for _ in range(3)], return_exceptions=True)

    assert all(isinstance(r, ConnectionError) for r in asyncio.run(go()))


def test_cutting_keeps_ids_mask_logprobs_and_versions_aligned():
    rng = random.Random(1)
    for _ in range(200):
        n, p = rng.randint(0, 30), rng.randint(1, 30)
        mask = [rng.randint(0, 1) for _ in range(n)]
        s = sample(0, prompt=range(100, 100 + p), response=range(n), mask=mask)
        max_p, max_r = rng.choice([None, rng.randint(1, 30)]), rng.choice([None, rng.randint(0, 30)])
        cut = truncate(s, max_p, max_r)
        keep = n if max_r is None else min(n, max_r)
        assert cut.response_ids == list(range(keep)) and cut.loss_mask == mask[:keep]
        assert cut.logprobs == s.logprobs[:keep] and cut.policy_versions == s.policy_versions[:keep]
        assert cut.response_cut == n - keep
        assert cut.prompt_ids == list(range(100, 100 + p))[-(max_p or p):] and cut.prompt_cut == p - len(cut.prompt_ids)


def test_spans_join_a_continued_assistant_turn_and_fall_back_to_mask_runs():
    turns = [SimpleNamespace(role=3, start=0, end=2, policy_version=1, continues_turn=False),
             SimpleNamespace(role=3, start=2, end=4, policy_version=2, continues_turn=True),
             SimpleNamespace(role=4, start=4, end=6, policy_version=0, continues_turn=False),
             SimpleNamespace(role=3, start=6, end=7, policy_version=2, continues_turn=False)]
    s = sample(0, response=range(7), mask=(1, 1, 1, 1, 0, 0, 1), turns=turns)
    assert [(x.assistant, x.start, x.end) for x in spans(s)] == [(True, 0, 4), (False, 4, 6), (True, 6, 7)]
    no_turns = sample(0, response=range(5), mask=(0, 1, 1, 0, 0))
    assert [(x.assistant, x.start, x.end) for x in spans(no_turns)] == [(False, 0, 1), (True, 1, 3), (False, 3, 5)]


def test_the_neutral_reward_is_the_mean_of_usable_samples():
    g = Group(task_id="t", group_id="g", samples=[sample(0, reward=1.0), sample(1, reward=0.0), sample(2, reward=0.0, status="backend_error")])
    assert neutral_reward(g) == pytest.approx(0.5)
    assert neutral_reward(Group(task_id="t", group_id="g", samples=[sample(0, status="timeout", reward=3.0)])) == 0.0


class BlockingClient:
    """TEST DOUBLE of AsyncRolloutClient.run_group that never finishes on its own: records each call and whether it was
    cancelled (the real run_group cancels the task on the server when cancelled)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.calls = 0
        self.cancelled = asyncio.Event()

    async def run_group(self, environment, instance, num_samples, **_):
        self.calls += 1
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


def test_a_group_whose_every_caller_was_cancelled_is_cancelled_on_the_server():
    client = BlockingClient()

    async def go():
        c = GroupCoalescer(lambda: client)
        callers = [asyncio.ensure_future(c.sample("a", req("a"))) for _ in range(3)]
        await client.started.wait()
        callers[0].cancel()
        callers[1].cancel()
        await asyncio.sleep(0)
        assert not client.cancelled.is_set()  # one caller still wants the group
        callers[2].cancel()
        await asyncio.wait_for(client.cancelled.wait(), 5)
        await asyncio.gather(*callers, return_exceptions=True)

    asyncio.run(go())


def test_a_group_whose_callers_were_cancelled_before_it_was_sent_is_never_sent():
    client = BlockingClient()

    async def go():
        c = GroupCoalescer(lambda: client)
        callers = [asyncio.ensure_future(c.sample("a", req("a"))) for _ in range(2)]
        await asyncio.sleep(0)  # both registered; the flush is scheduled after them
        for caller in callers:
            caller.cancel()
        await asyncio.gather(*callers, return_exceptions=True)
        for _ in range(5):
            await asyncio.sleep(0)
        assert client.calls == 0

    asyncio.run(go())
