"""The slime adapters against slime's Sample contract and a real rollout server.

slime is not on PyPI (the name belongs to an unrelated package) and installs only from its repository with
Megatron/SGLang, so its classes are not imported here. ``SlimeSample`` restates the fields of
slime/utils/types.py ``Sample`` the adapters read or write (THUDM/slime main, 2026-11:
https://github.com/THUDM/slime/blob/main/slime/utils/types.py), and the calls mimic slime/rollout/sglang_rollout.py:
generate_and_rm_group starts every sample of a group with create_task; the rollout function is called as
``fn(args, rollout_id, data_source, evaluation=False)`` and reads ``data_source.get_samples(args.rollout_batch_size)``.
"""
from __future__ import annotations

import asyncio
import copy
import dataclasses
import threading
from argparse import Namespace
from enum import Enum
from typing import Any

import pytest

from adapter_support import TOKENIZER, fetch_trajectory
from rollout_client.adapters import _common, slime


@dataclasses.dataclass
class SlimeSample:
    """slime contract: slime.utils.types.Sample (the fields an adapter touches, with slime's defaults)."""

    group_index: int | None = None
    index: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = dataclasses.field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = dataclasses.field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    remove_sample: bool = False

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = dataclasses.field(default_factory=dict)


class DataSource:
    """A slime data source double: groups of n copies of one prompt (as RolloutDataSource.get_samples)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.next = n, seed, 0

    def get_samples(self, num_samples: int) -> list[list[SlimeSample]]:
        groups = []
        for _ in range(num_samples):
            p = self.next
            self.next += 1
            a, b = 5 + p + self.seed, 3 + p
            base = SlimeSample(group_index=p, prompt=[{"role": "user", "content": f"What is {a} * {b}?"}], label=str(a * b),
                               metadata={"environment": "math"})
            groups.append([dataclasses.replace(copy.deepcopy(base), index=p * self.n + i) for i in range(self.n)])
        return groups


def check_sample(s: SlimeSample, t: Any) -> None:
    """Every field slime trains on is the trajectory's."""
    assert s.tokens == list(t.prompt_token_ids) + list(t.response_token_ids)
    assert s.response_length == len(t.response_token_ids)
    assert s.loss_mask == list(t.response_mask) and len(s.loss_mask) == s.response_length
    assert s.rollout_log_probs == pytest.approx(list(t.response_logprobs))
    assert s.reward == pytest.approx(t.reward)
    assert s.status in (SlimeSample.Status.COMPLETED, SlimeSample.Status.TRUNCATED)
    assert s.remove_sample is False
    # One entry per engine call that sampled tokens (each piece of a continued turn its own), its start version first
    # when the weights changed while it was in flight (review s44).
    want = []
    for turn in t.turns:
        if turn.role == 3 and turn.end > turn.start:
            want += [str(turn.policy_version_start)] if turn.policy_version_start not in (0, turn.policy_version) else []
            want.append(str(turn.policy_version))
    assert s.weight_versions == want


def args_for(target: str, **more: Any) -> Namespace:
    return Namespace(rollout_service_targets=target, rollout_service_token=None, rollout_service_environment=None, **more)


async def group_rm(args, groups, sampling_params):
    """As slime's generate_and_rm_group: one task per sample, all created before any is awaited."""
    try:
        return await asyncio.gather(*(asyncio.gather(*[asyncio.create_task(slime.generate(args, s, dict(sampling_params))) for s in g]) for g in groups))
    finally:
        await _common.close_shared_clients()


def test_the_custom_generate_function_runs_each_group_as_one_task(target, stub):
    args = args_for(target)
    groups = DataSource(3, seed=1).get_samples(2)
    done = asyncio.run(group_rm(args, groups, {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 256}))
    for g in done:
        info = [s.metadata["rollout_service"] for s in g]
        assert len({i["task_id"] for i in info}) == 1 and sorted(i["sample_index"] for i in info) == [0, 1, 2]
        for s in g:
            t = fetch_trajectory(stub, s.metadata["rollout_service"]["task_id"], s.metadata["rollout_service"]["sample_index"])
            check_sample(s, t)
            assert s.prompt[0]["content"] in TOKENIZER.decode(t.prompt_token_ids)


def test_the_rollout_function_fills_every_group_of_the_step(target, stub):
    args = args_for(target, rollout_batch_size=2, rollout_temperature=1.0, rollout_top_p=1.0, rollout_top_k=-1, rollout_max_response_len=256)
    out = slime.generate_rollout(args, 0, DataSource(2, seed=4))
    samples = out.samples if hasattr(out, "samples") else out
    assert len(samples) == 2 and all(len(g) == 2 for g in samples)
    for g in samples:
        for s in g:
            check_sample(s, fetch_trajectory(stub, s.metadata["rollout_service"]["task_id"], s.metadata["rollout_service"]["sample_index"]))
    with pytest.raises(NotImplementedError):
        slime.generate_rollout(args, 0, DataSource(2, seed=4), evaluation=True)
    # the next step reuses the process's stream on the same background loop
    again = slime.generate_rollout(args, 1, DataSource(1, seed=5))
    assert threading.active_count() >= 2 and len(again if isinstance(again, list) else again.samples) == 2


def test_engine_failures_are_removed_samples(target):
    """The fake engine (test double) answers HTTP 500 to temperature 0.125 (see adapters.test.ts)."""
    args = args_for(target)
    groups = DataSource(2, seed=7).get_samples(1)
    (g,) = asyncio.run(group_rm(args, groups, {"temperature": 0.125}))
    for s in g:
        assert s.remove_sample is True and s.status == SlimeSample.Status.FAILED
        assert s.metadata["rollout_service"]["status"] not in ("completed", "truncated")
        assert s.reward == 0.0  # group-neutral: no usable sample in the group
        assert len(s.loss_mask) == s.response_length


def test_a_failed_sample_gets_the_group_neutral_reward(target):
    settings = _common.ServiceSettings.resolve({"targets": target})

    async def go():
        try:
            return await _common.shared_client(settings).run_group("math", {"problem": "What is 9 * 8?", "answer": "72"}, 3)
        finally:
            await _common.close_shared_clients()

    group = asyncio.run(go())
    group.samples[0] = dataclasses.replace(group.samples[0], status="timeout", is_infra_failure=True, error="too slow")
    s = slime.fill(SlimeSample(), group, 0)
    assert s.remove_sample is True and s.status == SlimeSample.Status.FAILED
    assert s.reward == pytest.approx((group.samples[1].reward + group.samples[2].reward) / 2)


def test_a_stale_sample_is_flagged_in_its_metadata():
    """A task's max_staleness with FLAG delivers past-bound samples marked stale: slime must see the mark."""
    from adapter_support import hand_made_group

    group = hand_made_group(stale=(1,))
    samples = [slime.fill(SlimeSample(), group, i) for i in range(3)]
    assert [s.metadata["rollout_service"]["stale"] for s in samples] == [False, True, False]
    assert samples[1].remove_sample is False and samples[1].loss_mask == [1, 1, 0, 1]


def test_a_removed_sample_carries_no_trainable_token_of_its_own():
    """remove_sample is slime's drop; the sample must not depend on it: a failed sample's mask and logprobs are 0."""
    from adapter_support import hand_made_group

    group = hand_made_group(failed=(1,))
    s = slime.fill(SlimeSample(), group, 1)
    assert s.remove_sample is True and s.status == SlimeSample.Status.FAILED
    assert s.loss_mask == [0, 0, 0, 0] and s.rollout_log_probs == [0.0, 0.0, 0.0, 0.0]
    assert s.reward == pytest.approx(1.0)  # group-neutral: the mean of samples 0 and 2
