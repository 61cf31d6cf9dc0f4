"""The SkyRL adapter against SkyRL 0.4.0's generator contract and a real rollout server.

SkyRL 0.4.0 needs Python >= 3.12 and this machine has 3.11, so its classes cannot be imported here. The contract
below restates, field for field, skyrl/train/generators/base.py of the skyrl 0.4.0 wheel on PyPI
(https://github.com/NovaSky-AI/SkyRL/blob/main/skyrl/train/generators/base.py), and ``check_generator_output``
asserts what SkyRL's trainer asserts of a generator's output (skyrl/train/utils/trainer_utils.py,
validate_generator_output, 0.4.0).
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Dict, List, Optional, TypedDict, Union, get_type_hints

import pytest

from adapter_support import TOKENIZER, fetch_trajectory
from rollout_client.adapters import _common
from rollout_client.adapters.skyrl import RolloutServiceGenerator


@dataclasses.dataclass
class TrajectoryID:
    """SkyRL 0.4.0 contract: skyrl.train.generators.base.TrajectoryID."""

    instance_id: str
    repetition_id: int


class SkyRLGeneratorOutput(TypedDict):
    """SkyRL 0.4.0 contract: skyrl.train.generators.base.GeneratorOutput (tensor-typed fields as Any)."""

    prompt_token_ids: List[List[int]]
    response_ids: List[List[int]]
    rewards: Union[List[float], List[List[float]]]
    loss_masks: List[List[int]]
    stop_reasons: Optional[List[str]]
    rollout_metrics: Optional[Dict[str, Any]]
    rollout_logprobs: Optional[List[List[float]]]
    trajectory_ids: Optional[List[TrajectoryID]]
    trajectory_generation_times: Optional[List[float]]
    trajectory_time_splits: Optional[Dict[str, List[float]]]
    rollout_expert_indices: Optional[List[Any]]
    rollout_sample_support: Optional[List[Any]]
    is_last_step: Optional[List[bool]]
    env_metrics: Optional[List[Dict[str, Any]]]
    pixel_values: Optional[List[Any]]
    image_grid_thw: Optional[List[Any]]


def check_generator_output(num_prompts: int, out: dict) -> None:
    """What SkyRL 0.4.0's trainer requires of a generator's output (validate_generator_output)."""
    assert set(out) == set(get_type_hints(SkyRLGeneratorOutput)), set(out) ^ set(get_type_hints(SkyRLGeneratorOutput))
    assert len(out["response_ids"]) == num_prompts == len(out["prompt_token_ids"])
    for key in ("response_ids", "loss_masks", "rewards", "rollout_logprobs", "stop_reasons", "trajectory_ids"):
        if isinstance(out[key], list):
            assert len(out[key]) == num_prompts, key
    for i, (ids, mask) in enumerate(zip(out["response_ids"], out["loss_masks"])):
        assert len(ids) == len(mask) == len(out["rollout_logprobs"][i]) > 0
        assert all(isinstance(x, int) for x in ids) and set(mask) <= {0, 1}
    assert all(not isinstance(r, list) for r in out["rewards"])
    assert len(out["trajectory_generation_times"]) == num_prompts


def batch(n_prompts: int, n: int, seed: int, env_class: str = "gsm8k", temperature: float = 1.0) -> dict:
    """A SkyRL GeneratorInput: every repetition of every prompt, tagged by TrajectoryID."""
    prompts, extras, ids = [], [], []
    for p in range(n_prompts):
        a, b = 4 + p + seed, 6 + p
        for r in range(n):
            prompts.append([{"role": "user", "content": f"What is {a} * {b}?"}])
            extras.append({"reward_spec": {"method": "rule", "ground_truth": str(a * b)}})
            ids.append(TrajectoryID(instance_id=f"s{seed}-p{p}", repetition_id=r))
    return {"prompts": prompts, "env_classes": [env_class] * len(prompts), "env_extras": extras,
            "sampling_params": {"temperature": temperature, "top_p": 1.0, "max_generate_length": 256},
            "trajectory_ids": ids, "batch_metadata": None}


async def run(generator: RolloutServiceGenerator, input_batch: dict) -> dict:
    try:
        return await generator.generate(input_batch)
    finally:
        await _common.close_shared_clients()


def test_a_batch_becomes_one_task_per_instance_and_rows_keep_input_order(target, stub):
    gen = RolloutServiceGenerator({"targets": target}, environments={"gsm8k": "math"})
    inp = batch(2, 3, seed=1)
    out = asyncio.run(run(gen, inp))
    check_generator_output(6, out)
    tasks = {}
    for i, metrics in enumerate(out["env_metrics"]):
        tasks.setdefault(inp["trajectory_ids"][i].instance_id, set()).add((metrics["rollout_task_id"], metrics["rollout_sample_index"]))
        t = fetch_trajectory(stub, metrics["rollout_task_id"], metrics["rollout_sample_index"])
        assert out["prompt_token_ids"][i] == list(t.prompt_token_ids)
        assert out["response_ids"][i] == list(t.response_token_ids)
        assert out["loss_masks"][i] == list(t.response_mask)
        assert out["rollout_logprobs"][i] == pytest.approx(list(t.response_logprobs))
        assert out["rewards"][i] == pytest.approx(t.reward)
        assistant_turns = [x for x in t.turns if x.role == 3]
        assert out["stop_reasons"][i] == assistant_turns[-1].finish_reason  # the engine's, as SkyRL's own generator
        assert metrics["rollout_finish_reason"] == t.finish_reason
        assert inp["prompts"][i][0]["content"] in TOKENIZER.decode(t.prompt_token_ids)  # each row got its own prompt's sample
    for samples in tasks.values():
        assert len({task for task, _ in samples}) == 1 and sorted(i for _, i in samples) == [0, 1, 2]
    assert out["trajectory_ids"] == inp["trajectory_ids"]
    assert out["rollout_metrics"]["rollout_service/failed_samples"] == 0


def test_it_cuts_to_the_given_widths(target, stub):
    gen = RolloutServiceGenerator({"targets": target}, environments={"gsm8k": "math"}, max_prompt_length=10, max_response_length=7)
    out = asyncio.run(run(gen, batch(1, 2, seed=3)))
    check_generator_output(2, out)
    for i, metrics in enumerate(out["env_metrics"]):
        t = fetch_trajectory(stub, metrics["rollout_task_id"], metrics["rollout_sample_index"])
        assert len(t.prompt_token_ids) > 10, "the test needs a prompt longer than the configured width"
        assert out["prompt_token_ids"][i] == list(t.prompt_token_ids)[-10:]
        assert out["response_ids"][i] == list(t.response_token_ids)[:7]
        # Sampled after the whole prompt: masked, not trained on a context it was not sampled in (review s37).
        assert out["loss_masks"][i] == [0] * len(out["response_ids"][i])
        assert out["stop_reasons"][i] == "rollout_service:prompt_cut"
        assert "prompt width" in metrics["rollout_error"]
    gen = RolloutServiceGenerator({"targets": target}, environments={"gsm8k": "math"}, max_prompt_length=4096, max_response_length=7)
    out = asyncio.run(run(gen, batch(1, 2, seed=3)))
    for i, metrics in enumerate(out["env_metrics"]):
        t = fetch_trajectory(stub, metrics["rollout_task_id"], metrics["rollout_sample_index"])
        assert out["prompt_token_ids"][i] == list(t.prompt_token_ids)
        assert out["loss_masks"][i] == list(t.response_mask)[:7] and sum(out["loss_masks"][i]) > 0


def test_it_never_raises_a_rejected_spec_becomes_a_masked_row(target):
    gen = RolloutServiceGenerator({"targets": target})
    out = asyncio.run(run(gen, batch(1, 2, seed=4, env_class="no-such-environment")))
    check_generator_output(2, out)
    assert out["loss_masks"] == [[0], [0]]
    assert all(s.startswith("rollout_service:error:") for s in out["stop_reasons"])
    assert out["rollout_metrics"]["rollout_service/failed_samples"] == 2


def test_engine_failures_are_masked_rows_not_rewards_to_learn_from(target):
    """The fake engine (test double) answers HTTP 500 to temperature 0.125 (see adapters.test.ts)."""
    gen = RolloutServiceGenerator({"targets": target}, environments={"gsm8k": "math"})
    out = asyncio.run(run(gen, batch(1, 2, seed=6, temperature=0.125)))
    check_generator_output(2, out)
    assert all(sum(m) == 0 for m in out["loss_masks"])
    assert all(s.startswith("rollout_service:") for s in out["stop_reasons"])
    assert out["rollout_metrics"]["rollout_service/failed_samples"] == 2


def test_a_failed_sample_gets_the_group_neutral_reward(target):
    gen = RolloutServiceGenerator({"targets": target}, environments={"gsm8k": "math"})

    async def go():
        try:
            group = await _common.shared_client(gen.settings).run_group("math", {"problem": "What is 6 * 7?", "answer": "42"}, 3)
        finally:
            await _common.close_shared_clients()
        return group

    group = asyncio.run(go())
    group.samples[2] = dataclasses.replace(group.samples[2], status="backend_error", is_infra_failure=True, error="engine gone")
    row = gen._row(group, 2)
    assert row["mask"] == [0] * len(row["response"]) and row["logprobs"] == [0.0] * len(row["response"])
    assert row["reward"] == pytest.approx((group.samples[0].reward + group.samples[1].reward) / 2)
    assert row["stop"] == "rollout_service:backend_error" and row["failed"] is True


def test_a_stale_sample_is_flagged_in_its_env_metrics():
    """A task's max_staleness with FLAG delivers past-bound samples marked stale: SkyRL must see the mark."""
    from adapter_support import hand_made_group

    generator = RolloutServiceGenerator({"targets": "127.0.0.1:1"}, tokenizer=TOKENIZER)
    group = hand_made_group(stale=(1,))
    rows = [generator._row(group, j) for j in range(3)]
    assert [r["env_metrics"]["rollout_stale"] for r in rows] == [False, True, False]
    assert rows[1]["mask"] == [1, 1, 0, 1]
