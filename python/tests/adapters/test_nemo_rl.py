"""The NeMo-RL adapter against the NeMo Gym actor's run_rollouts contract and a real rollout server.

NeMo-RL is not installable here (GitHub only; the PyPI name holds a 0.0.0 placeholder; nemo-gym needs Python >= 3.13).
``consume`` restates what NeMo-RL's driver requires of ``NemoGym.run_rollouts`` (NVIDIA-NeMo/RL main, 2026-11:
https://github.com/NVIDIA-NeMo/RL/blob/main/nemo_rl/environments/nemo_gym.py, and the driver's
_result_to_completion in nemo_rl/experience/): ``(rowidx, result, timing)`` tuples, timing only with the last;
``result["message_log"]`` entries with ``role`` and int64 ``token_ids``, assistant entries with float
``generation_logprobs`` of the same length; ``full_result["reward"]``; every assistant turn's prompt (all tokens
before it) extending the previous turn's prompt and generation.
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
import torch

from adapter_support import TOKENIZER, fetch_trajectory
from rollout_client.adapters import _common
from rollout_client.adapters.nemo_rl import RolloutServiceGym, to_result


def rows(n_prompts: int, n: int, seed: int, temperature: float = 1.0) -> list[dict]:
    """NeMo Gym rows as NeMo-RL hands them to the actor: n copies per prompt, each with its _rowidx."""
    out = []
    for p in range(n_prompts):
        a, b = 2 + p + seed, 9 + p
        for _ in range(n):
            out.append({"_rowidx": len(out), "agent_ref": {"name": "math_simple_agent"}, "expected_answer": str(a * b),
                        "responses_create_params": {"input": [{"role": "user", "content": f"What is {a} * {b}?"}], "temperature": temperature}})
    return out


async def collect(gym: RolloutServiceGym, batch: list[dict]) -> list[tuple[int, dict, Any]]:
    try:
        return [item async for item in gym.run_rollouts(batch, TOKENIZER, "train")]
    finally:
        await _common.close_shared_clients()


def consume(items: list[tuple[int, dict, Any]], num_rows: int) -> None:
    """What NeMo-RL's driver asserts or relies on when it reads run_rollouts."""
    assert sorted(i for i, _, _ in items) == list(range(num_rows))
    assert [t is not None for _, _, t in items] == [False] * (num_rows - 1) + [True]
    for _, result, _ in items:
        assert set(result) >= {"message_log", "input_message_log", "full_result"}
        assert result["input_message_log"] == result["message_log"][:1]
        float(result["full_result"]["reward"])
        seen: list[int] = []
        for m in result["message_log"]:
            assert m["role"] in ("user", "assistant") and m["token_ids"].dtype == torch.int64 and len(m["token_ids"]) > 0
            if m["role"] == "assistant":
                assert m["generation_logprobs"].shape == m["token_ids"].shape
                assert not torch.isnan(m["generation_logprobs"]).any()
                assert seen, "an assistant turn needs a prompt"
            seen += m["token_ids"].tolist()


def test_rows_of_one_prompt_run_as_one_task_and_the_message_log_is_the_trajectory(target, stub):
    gym = RolloutServiceGym({"targets": target}, environments={"math_simple_agent": "math"})
    batch = rows(2, 3, seed=1)
    items = asyncio.run(collect(gym, batch))
    consume(items, 6)
    tasks: dict[str, set] = {}
    for rowidx, result, _ in items:
        info = result["full_result"]["rollout_service"]
        tasks.setdefault(batch[rowidx]["expected_answer"], set()).add((info["task_id"], info["sample_index"]))
        t = fetch_trajectory(stub, info["task_id"], info["sample_index"])
        log = result["message_log"]
        assert torch.cat([m["token_ids"] for m in log]).tolist() == list(t.prompt_token_ids) + list(t.response_token_ids)
        assert log[0]["token_ids"].tolist() == list(t.prompt_token_ids)
        assert batch[rowidx]["responses_create_params"]["input"][0]["content"] in TOKENIZER.decode(t.prompt_token_ids)
        at = 0
        for m in log[1:]:
            k = len(m["token_ids"])
            want = 1 if m["role"] == "assistant" else 0
            assert list(t.response_mask)[at:at + k] == [want] * k
            if want:
                assert m["generation_logprobs"].tolist() == pytest.approx(list(t.response_logprobs)[at:at + k], abs=1e-6)
            at += k
        assert at == len(t.response_token_ids)
        assert sum(1 for m in log if m["role"] == "assistant") == sum(1 for x in t.turns if x.role == 3 and not x.continues_turn)
        assert result["full_result"]["reward"] == pytest.approx(t.reward)
        assert "instance_config" not in result["full_result"]
    for samples in tasks.values():
        assert len({task for task, _ in samples}) == 1 and sorted(i for _, i in samples) == [0, 1, 2]


def test_engine_failures_yield_untrained_masked_results(target):
    """The fake engine (test double) answers HTTP 500 to temperature 0.125 (see adapters.test.ts)."""
    gym = RolloutServiceGym({"targets": target}, environments={"math_simple_agent": "math"})
    items = asyncio.run(collect(gym, rows(1, 2, seed=3, temperature=0.125)))
    consume(items, 2)
    for _, result, _ in items:
        assert all(m["role"] == "user" for m in result["message_log"])
        assert result["full_result"]["instance_config"] == {"mask_sample": True}
        assert result["full_result"]["rollout_service"]["status"] not in ("completed", "truncated")
        assert result["full_result"]["reward"] == 0.0  # group-neutral: nothing usable in the group


def test_a_failed_sample_gets_the_group_neutral_reward(target):
    settings = _common.ServiceSettings.resolve({"targets": target})

    async def go():
        try:
            return await _common.shared_client(settings).run_group("math", {"problem": "What is 4 * 4?", "answer": "16"}, 3)
        finally:
            await _common.close_shared_clients()

    group = asyncio.run(go())
    group.samples[1] = dataclasses.replace(group.samples[1], status="environment_error", is_infra_failure=True, error="env crashed")
    result = to_result(group, 1, {"_rowidx": 0})
    assert result["full_result"]["reward"] == pytest.approx((group.samples[0].reward + group.samples[2].reward) / 2)
    assert result["full_result"]["instance_config"]["mask_sample"] is True
    assert all(m["role"] == "user" for m in result["message_log"])


def test_an_empty_batch_is_refused_like_nemo_gyms_actor(target):
    gym = RolloutServiceGym({"targets": target})
    with pytest.raises(ValueError):
        asyncio.run(collect(gym, []))


def test_a_stale_sample_is_flagged_in_its_full_result():
    """A task's max_staleness with FLAG delivers past-bound samples marked stale: NeMo-RL must see the mark."""
    from adapter_support import hand_made_group

    group = hand_made_group(stale=(1,))
    results = [to_result(group, i, {"_rowidx": i}) for i in range(3)]
    assert [r["full_result"]["rollout_service"]["stale"] for r in results] == [False, True, False]
    assert [e["role"] for e in results[1]["message_log"]] == ["user", "assistant", "user", "assistant"]
