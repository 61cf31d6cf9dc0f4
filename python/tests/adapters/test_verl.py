"""The verl adapter against verl 0.9.1's real classes and a real rollout server.

Each test builds the loop objects exactly as verl's AgentLoopWorker._run_agent_loop does (hydra.utils.instantiate of
the registry entry, verl's own config file, a real Hugging Face tokenizer), starts every row's run() with
create_task before gathering, as AgentLoopWorker.generate_sequences does, and checks the AgentLoopOutput against the
trajectory the server stored (GetTrajectory).
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import uuid

import hydra
import pytest
import torch
from omegaconf import OmegaConf

import verl
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    AgentLoopWorker,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.utils.dataset.rl_dataset import RLHFDataset

from adapter_support import TOKENIZER, fetch_trajectory
from rollout_client.adapters import _common
from rollout_client.adapters.verl import RolloutServiceAgentLoop



def trainer_config(target: str, prompt_length: int = 2048, response_length: int = 1024):
    """verl's own generated PPO config with the lengths and the rollout_service section a user would set."""
    cfg = OmegaConf.load(os.path.join(os.path.dirname(verl.__file__), "trainer", "config", "_generated_ppo_trainer.yaml"))
    cfg.data.max_prompt_length = prompt_length
    cfg.data.max_response_length = response_length
    cfg.rollout_service = {"targets": target, "environment": "math"}
    return cfg


def make_loop(cfg, name: str = "rollout_service"):
    """As AgentLoopWorker._run_agent_loop builds one loop object per row."""
    return hydra.utils.instantiate(
        config=_agent_loop_registry[name],
        trainer_config=DictConfigWrap(config=cfg),
        server_manager=None,
        tokenizer=TOKENIZER,
        processor=None,
        hf_model_type="qwen3",
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(cfg.data),
        tools=ToolListWrap([]),
    )


def math_rows(n_prompts: int, n: int, seed: int, *, temperature_marker: float | None = None) -> list[dict]:
    """A verl gsm8k-style batch, repeated n times with interleave=True under one uid per prompt."""
    rows = []
    for p in range(n_prompts):
        a, b, c = 3 + p + seed, 7 + 2 * p, 5 + seed
        uid = str(uuid.uuid4())
        for _ in range(n):
            rows.append({
                "data_source": "openai/gsm8k",
                "raw_prompt": [{"role": "user", "content": f"What is {a} * {b} + {c}?"}],
                "reward_model": {"style": "rule", "ground_truth": str(a * b + c)},
                "extra_info": {"split": "train", "index": p},
                "index": p,
                "uid": uid,
            })
    return rows


async def generate_sequences(cfg, rows, sampling_params=None):
    """What AgentLoopWorker.generate_sequences does with a chunk: one task per row, all created, then gathered."""
    sampling_params = sampling_params or {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    tasks = [asyncio.create_task(make_loop(cfg).run(dict(sampling_params), **row)) for row in rows]
    try:
        return await asyncio.gather(*tasks)
    finally:
        await _common.close_shared_clients()


def test_the_loop_is_registered_under_its_name():
    assert _agent_loop_registry["rollout_service"] == {"_target_": "rollout_client.adapters.verl.RolloutServiceAgentLoop"}


def test_each_prompt_group_becomes_one_task_and_every_field_is_the_trajectory(target, stub):
    cfg = trainer_config(target)
    rows = math_rows(3, 4, seed=1)
    outputs = asyncio.run(generate_sequences(cfg, rows))

    assert all(isinstance(o, AgentLoopOutput) for o in outputs)
    by_uid: dict[str, set] = {}
    for row, out in zip(rows, outputs):
        by_uid.setdefault(row["uid"], set()).add((out.extra_fields["rollout_task_id"], out.extra_fields["rollout_sample_index"]))
    # one TaskSpec per prompt, its 4 samples handed to the 4 rows
    for samples in by_uid.values():
        assert len({task for task, _ in samples}) == 1
        assert sorted(i for _, i in samples) == [0, 1, 2, 3]
    assert len({t for s in by_uid.values() for t, _ in s}) == 3

    for out in outputs:
        t = fetch_trajectory(stub, out.extra_fields["rollout_task_id"], out.extra_fields["rollout_sample_index"])
        assert out.prompt_ids == list(t.prompt_token_ids)
        assert out.response_ids == list(t.response_token_ids)
        assert out.response_mask == list(t.response_mask)
        assert out.response_logprobs == pytest.approx(list(t.response_logprobs))
        assert out.reward_score == pytest.approx(t.reward)
        assert out.num_turns == 1 + len(t.turns)
        assert out.extra_fields["rollout_status"] in ("completed", "truncated")
        assert out.extra_fields["rollout_failed"] is False
        assert out.extra_fields["rollout_cut_tokens"] == 0
        assert sum(out.response_mask) > 0
        assert out.metrics.generate_sequences >= 0
    # extra_fields have the same keys on every sample: verl stacks them per key
    assert len({tuple(sorted(o.extra_fields)) for o in outputs}) == 1


def test_outputs_fit_verls_configured_widths(target, stub):
    cfg = trainer_config(target, prompt_length=12, response_length=9)
    rows = math_rows(2, 2, seed=5)
    outputs = asyncio.run(generate_sequences(cfg, rows))
    worker = AgentLoopWorker.__new__(AgentLoopWorker)  # only _pad_token_ids, which reads self.tokenizer
    worker.tokenizer = TOKENIZER
    for out in outputs:
        t = fetch_trajectory(stub, out.extra_fields["rollout_task_id"], out.extra_fields["rollout_sample_index"])
        assert len(t.prompt_token_ids) > 12, "the test needs a prompt longer than the configured width"
        assert out.prompt_ids == list(t.prompt_token_ids)[-12:]
        n = min(9, len(t.response_token_ids))
        assert out.response_ids == list(t.response_token_ids)[:n]
        # Sampled after the whole prompt, scored after the cut one: not trainable, so masked (review s37).
        assert out.response_mask == [0] * n and sum(t.response_mask) > 0
        assert out.response_logprobs == [0.0] * n
        assert out.extra_fields["rollout_failed"] is True and out.extra_fields["rollout_infra_failure"] is False
        assert out.extra_fields["rollout_prompt_cut_tokens"] == len(t.prompt_token_ids) - 12
        assert "prompt width" in out.extra_fields["rollout_error"]
        assert out.extra_fields["rollout_cut_tokens"] == len(t.response_token_ids) - n
        # verl's own padding now yields exactly its widths, so the batch stacks
        assert AgentLoopWorker._pad_token_ids(worker, out.prompt_ids, max_length=12, padding_side="left", return_attention_mask=True)["input_ids"].shape == (1, 12)
        assert AgentLoopWorker._pad_token_ids(worker, out.response_ids, max_length=9, padding_side="right", return_attention_mask=True)["input_ids"].shape == (1, 9)
        as_dict = out.as_dict()
        assert as_dict["responses"].dtype == torch.int64 and as_dict["rollout_log_probs"].shape == as_dict["responses"].shape


def test_a_response_cut_to_the_width_keeps_its_mask_and_logprobs(target, stub):
    cfg = trainer_config(target, prompt_length=2048, response_length=9)
    outputs = asyncio.run(generate_sequences(cfg, math_rows(1, 2, seed=15)))
    for out in outputs:
        t = fetch_trajectory(stub, out.extra_fields["rollout_task_id"], out.extra_fields["rollout_sample_index"])
        assert len(t.response_token_ids) > 9, "the test needs a response longer than the configured width"
        assert out.prompt_ids == list(t.prompt_token_ids)
        assert out.response_ids == list(t.response_token_ids)[:9]
        assert out.response_mask == list(t.response_mask)[:9]
        assert out.response_logprobs == pytest.approx(list(t.response_logprobs)[:9])
        assert out.extra_fields["rollout_failed"] is False and out.extra_fields["rollout_prompt_cut_tokens"] == 0


def test_a_failed_sample_is_masked_with_the_group_neutral_reward(target):
    cfg = trainer_config(target)
    rows = math_rows(1, 4, seed=9)
    outputs = asyncio.run(generate_sequences(cfg, rows))
    loop = make_loop(cfg)
    # Rebuild the group the loop saw, then say sample 1 failed in the sandbox (the mapping is what is under test).
    group = asyncio.run(_regroup(target, outputs))
    failed = dataclasses.replace(group.samples[1], status="sandbox_error", is_infra_failure=True, error="sandbox died")
    group.samples[1] = failed
    out = loop.to_output(group, 1)
    ok_rewards = [s.reward for i, s in enumerate(group.samples) if i != 1]
    assert out.response_mask == [0] * len(out.response_ids)
    assert out.response_logprobs == [0.0] * len(out.response_ids)
    assert out.reward_score == pytest.approx(sum(ok_rewards) / 3)
    assert out.extra_fields["rollout_failed"] is True and out.extra_fields["rollout_infra_failure"] is True
    assert out.extra_fields["rollout_status"] == "sandbox_error" and out.extra_fields["rollout_error"] == "sandbox died"
    assert out.response_ids == failed.response_ids  # tokens kept (masked), none invented


def test_a_group_the_engine_fails_comes_back_masked_not_as_reward_zero_training_data(target):
    """The fake engine (test double) answers HTTP 500 to temperature 0.125 (see adapters.test.ts)."""
    cfg = trainer_config(target)
    rows = math_rows(1, 2, seed=11)
    outputs = asyncio.run(generate_sequences(cfg, rows, {"temperature": 0.125, "top_p": 1.0, "top_k": -1}))
    for out in outputs:
        assert out.extra_fields["rollout_failed"] is True
        assert out.extra_fields["rollout_status"] not in ("completed", "truncated")
        assert sum(out.response_mask) == 0
        assert len(out.response_ids) >= 1  # verl indexes the last response position


async def _regroup(target, outputs):
    """The group behind outputs, as the client delivers it (re-read from the server)."""
    import grpc
    from rollout.v1 import rollout_pb2, rollout_pb2_grpc
    from rollout_client import Group, Sample

    task_id = outputs[0].extra_fields["rollout_task_id"]
    async with grpc.aio.insecure_channel(target.split(",")[0]) as channel:
        response = await rollout_pb2_grpc.RolloutServiceStub(channel).GetTrajectory(rollout_pb2.GetTrajectoryRequest(task_id=task_id))
    samples = sorted((Sample.from_proto(t) for t in response.trajectories), key=lambda s: s.sample_index)
    return Group(task_id=task_id, group_id=samples[0].group_id, samples=samples)


def test_it_is_a_verl_agent_loop():
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase

    assert issubclass(RolloutServiceAgentLoop, AgentLoopBase)


def test_an_agent_loop_config_file_entry_registers_and_configures_it(target, tmp_path):
    """docs/trainers/verl.md's route: agent_loop_config_path, loaded as AgentLoopWorker.__init__ loads it."""
    from omegaconf import OmegaConf

    path = tmp_path / "rollout_service_agent.yaml"
    path.write_text(
        "- name: rollout_service_file\n"
        "  _target_: rollout_client.adapters.verl.RolloutServiceAgentLoop\n"
        f"  targets: {target}\n"
        "  environment: math\n"
    )
    for entry in OmegaConf.load(path):  # what AgentLoopWorker does with rollout.agent.agent_loop_config_path
        _agent_loop_registry[entry.name] = entry
    cfg = trainer_config(target)
    del cfg["rollout_service"]  # settings come from the file entry alone
    loop = make_loop(cfg, "rollout_service_file")
    assert loop.settings.targets == (target,) and loop.settings.environment == "math"
    rows = math_rows(1, 2, seed=13)

    async def go():
        try:
            return await asyncio.gather(*[asyncio.create_task(make_loop(cfg, "rollout_service_file").run({"temperature": 1.0}, **r)) for r in rows])
        finally:
            await _common.close_shared_clients()

    outs = asyncio.run(go())
    assert len({o.extra_fields["rollout_task_id"] for o in outs}) == 1
    assert all(o.extra_fields["rollout_failed"] is False for o in outs)


def test_a_stale_sample_is_flagged_in_extra_fields(target):
    """A task's max_staleness with FLAG delivers past-bound samples marked stale: verl must see the mark."""
    from adapter_support import hand_made_group

    loop = make_loop(trainer_config(target))
    group = hand_made_group(stale=(1,))
    outs = [loop.to_output(group, i) for i in range(3)]
    assert [o.extra_fields["rollout_stale"] for o in outs] == [False, True, False]
    assert outs[1].response_mask == [1, 1, 0, 1]  # flagged, not dropped: the trainer decides
