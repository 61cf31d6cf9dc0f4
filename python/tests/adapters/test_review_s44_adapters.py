"""Review s44: what the adapters hand each trainer (versions, logprobs mode, length cuts, placeholders, groups), on
hand-made trajectories that are odd but valid (Sample.from_proto accepts them: none of them is 'malformed').

The trajectory: 3 prompt tokens; an assistant span [0, 2) whose weights changed while it was sampled
(policy_version_start 3, policy_version 4: PauseGeneration KEEP), a tool span [2, 3), then one assistant message
aborted for a weight update and continued: [3, 5) by version 5 (finish "abort"), [5, 6) by version 6
(continues_turn, finish "stop"). No server is needed.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from rollout.v1 import rollout_pb2
from rollout_client import Group, Sample

from adapter_support import TOKENIZER

A, T = rollout_pb2.ROLE_ASSISTANT, rollout_pb2.ROLE_TOOL


def trajectory(i: int = 0, *, status=rollout_pb2.TRAJECTORY_STATUS_COMPLETED, finish_reason: str = "answer",
               logprobs_mode: int = 0, reward: float = 1.0) -> Any:
    return rollout_pb2.Trajectory(
        task_id="odd", sample_index=i, group_id="odd", status=status, finish_reason=finish_reason, reward=reward,
        prompt_token_ids=[11, 12, 13], response_token_ids=[21, 22, 23, 24, 25, 26], response_mask=[1, 1, 0, 1, 1, 1],
        response_logprobs=[-0.5, -0.25, 0.0, -1.0, -0.125, -2.0], logprobs_mode=logprobs_mode,
        policy_version_min=3, policy_version_max=6,
        turns=[
            rollout_pb2.Turn(role=A, start=0, end=2, policy_version_start=3, policy_version=4, finish_reason="stop"),
            rollout_pb2.Turn(role=T, start=2, end=3),
            rollout_pb2.Turn(role=A, start=3, end=5, policy_version_start=5, policy_version=5, finish_reason="abort"),
            rollout_pb2.Turn(role=A, start=5, end=6, policy_version_start=6, policy_version=6, finish_reason="stop",
                             continues_turn=True),
        ],
    )


def group(*trajectories: Any) -> Group:
    samples = [Sample.from_proto(t) for t in trajectories]
    assert all(s.status in ("completed", "truncated") for s in samples), [s.error for s in samples]
    return Group(task_id="odd", group_id="odd", samples=samples)


def verl_loop(response_length: int = 1024):
    from test_verl import make_loop, trainer_config

    return make_loop(trainer_config("127.0.0.1:1", prompt_length=64, response_length=response_length))


# --- policy versions: a span sampled by two versions, a turn continued by another version ---------------------------


def test_verl_reports_every_version_that_sampled_a_kept_token():
    out = verl_loop().to_output(group(trajectory()), 0)
    assert out.response_mask == [1, 1, 0, 1, 1, 1]
    # The trajectory's own range (the server's policy_version_min/max): [3, 6]. Read from the per-token versions
    # (each span's last) alone it was [4, 6]: the first span's older version hidden, its staleness understated.
    assert (out.extra_fields["rollout_policy_version_min"], out.extra_fields["rollout_policy_version_max"]) == (3, 6)


def test_verl_version_range_covers_only_the_tokens_it_kept():
    out = verl_loop(response_length=4).to_output(group(trajectory()), 0)
    assert out.response_ids == [21, 22, 23, 24] and out.extra_fields["rollout_cut_tokens"] == 2
    assert (out.extra_fields["rollout_policy_version_min"], out.extra_fields["rollout_policy_version_max"]) == (3, 5)


def test_slime_weight_versions_hold_each_engine_calls_versions():
    from test_slime import SlimeSample
    from rollout_client.adapters import slime

    s = slime.fill(SlimeSample(), group(trajectory()), 0)
    # One entry per engine call as slime's own generate appends them (the continued piece is a call of its own,
    # sampled by version 6), and the start version of the call whose weights changed in flight. It was ["4", "5"].
    assert s.weight_versions == ["3", "4", "5", "6"]
    assert s.loss_mask == [1, 1, 0, 1, 1, 1] and s.remove_sample is False


# --- SkyRL's stop reason: what its overlong filtering reads -----------------------------------------------------------


def skyrl(max_response_length: int | None = None):
    from rollout_client.adapters.skyrl import RolloutServiceGenerator

    return RolloutServiceGenerator({"targets": "127.0.0.1:1"}, tokenizer=TOKENIZER, max_response_length=max_response_length)


def test_skyrl_says_length_for_a_response_the_adapter_cut():
    row = skyrl(max_response_length=4)._row(group(trajectory()), 0)
    assert row["response"] == [21, 22, 23, 24] and row["cut"] == 2 and row["failed"] is False
    # The last engine call said "stop", but the row SkyRL trains on was cut: overlong filtering (stop reason other
    # than "stop" -> masked) must see a cut row, as SkyRL's own generator reports one.
    assert row["stop"] == "length"


def test_skyrl_says_length_for_a_trajectory_the_service_cut_at_its_token_budget():
    truncated = rollout_pb2.TRAJECTORY_STATUS_TRUNCATED
    gen = skyrl()
    budget = gen._row(group(trajectory(status=truncated, finish_reason="max_total_tokens")), 0)
    assert budget["stop"] == "length" and budget["mask"] == [1, 1, 0, 1, 1, 1]
    turns = gen._row(group(trajectory(status=truncated, finish_reason="max_turns")), 0)
    assert turns["stop"] == "stop"  # out of turns, not of tokens: the engine's own, as SkyRL's generator says
    done = gen._row(group(trajectory()), 0)
    assert done["stop"] == "stop"


# --- logprobs mode: which distribution the logprobs are of ----------------------------------------------------------


@pytest.mark.parametrize("mode,name", [(0, "unspecified"), (1, "raw"), (2, "processed"), (3, "mixed")])
def test_every_adapter_passes_the_logprobs_mode_on(mode, name):
    from test_slime import SlimeSample
    from rollout_client.adapters import slime
    from rollout_client.adapters.nemo_rl import to_result

    g = group(trajectory(logprobs_mode=mode))
    assert verl_loop().to_output(g, 0).extra_fields["rollout_logprobs_mode"] == name
    assert skyrl()._row(g, 0)["env_metrics"]["rollout_logprobs_mode"] == name
    assert slime.fill(SlimeSample(), g, 0).metadata["rollout_service"]["logprobs_mode"] == name
    assert to_result(g, 0, {"_rowidx": 0})["full_result"]["rollout_service"]["logprobs_mode"] == name


def test_skyrl_env_metrics_keep_the_same_keys_on_a_placeholder_row():
    gen = skyrl()
    assert set(gen._placeholder([{"role": "user", "content": "hi"}], "rollout_service:error:X")["env_metrics"]) == set(
        gen._row(group(trajectory()), 0)["env_metrics"])


# --- group coalescing: a key never merges two different prompts ---------------------------------------------------


def test_rows_under_one_key_that_ask_different_things_are_never_one_group():
    """verl keys a group by ``uid``, else the row's ``index``: two data sources' rows with the same index (gsm8k's row 0
    and MATH's row 0, no uid) arrive under one key. Merged, half the rows got the other prompt's trajectories and
    rewards, silently. The coalescer (driven by its test double of run_group) must keep them apart."""
    import asyncio

    from test_common import RecordingClient, req
    from rollout_client.adapters._common import GroupCoalescer

    client = RecordingClient()

    async def go():
        c = GroupCoalescer(lambda: client)
        return await asyncio.gather(*[c.sample("0", req(q)) for q in ["gsm8k-0", "math-0", "gsm8k-0", "math-0"]])

    results = asyncio.run(go())
    assert [g.task_id for g, _ in results] == ["gsm8k-0", "math-0", "gsm8k-0", "math-0"]  # each row its own prompt's
    assert sorted(client.calls) == [("gsm8k-0", 2), ("math-0", 2)]
    assert sorted(i for g, i in results if g.task_id == "math-0") == [0, 1]


# --- a cut that ends inside a tool span: the reward must land on a sampled token -----------------------------------


def test_verl_cut_inside_a_tool_span_ends_on_a_sampled_token_so_gae_keeps_the_reward():
    """verl puts reward_score on the last response token (AgentLoopWorker._postprocess: rm_scores at the last
    attention position), and verl's own GAE skips mask-0 tokens: a reward there never reaches any advantage."""
    from verl.trainer.ppo.core_algos import compute_gae_advantage_return
    import torch

    out = verl_loop(response_length=3).to_output(group(trajectory()), 0)  # the cut ends on the tool token [2, 3)
    assert out.response_ids == [21, 22] and out.response_mask == [1, 1] and out.response_logprobs == [-0.5, -0.25]
    assert out.extra_fields["rollout_cut_tokens"] == 4 and out.extra_fields["rollout_failed"] is False
    n = len(out.response_mask)
    rewards = torch.zeros(1, n)
    rewards[0, n - 1] = out.reward_score  # where verl puts it
    mask = torch.tensor([out.response_mask], dtype=torch.float32)
    _, returns = compute_gae_advantage_return(rewards, torch.zeros(1, n), mask, gamma=torch.tensor(1.0), lam=torch.tensor(1.0))
    assert returns[0].tolist() == [1.0, 1.0]  # with the tool token last, these were [0.0, 0.0]: the reward lost


def test_skyrl_cut_inside_a_tool_span_ends_on_a_sampled_token():
    row = skyrl(max_response_length=3)._row(group(trajectory()), 0)
    assert row["response"] == [21, 22] and row["mask"] == [1, 1] and row["logprobs"] == [-0.5, -0.25]
    assert row["cut"] == 4 and row["stop"] == "length"


def test_an_uncut_response_and_a_failed_one_keep_every_token():
    g = group(trajectory())
    assert verl_loop().to_output(g, 0).response_ids == [21, 22, 23, 24, 25, 26]
    failed = Group("odd", "odd", [dataclasses.replace(g.samples[0], status="timeout", is_infra_failure=True)])
    out = verl_loop(response_length=3).to_output(failed, 0)
    assert out.response_ids == [21, 22, 23] and out.response_mask == [0, 0, 0]  # masked, tokens as cut, none dropped


# --- slime: never a sample of 0 response tokens (or 0 prompt tokens) ----------------------------------------------


def slime_alignment(s) -> None:
    """What slime's get_responses (megatron_utils/loss.py, context parallel 1) does with one sample at the start of a
    packed batch: the response's tokens against the logits of the positions before them; they must pair up."""
    total, n = len(s.tokens), s.response_length
    logits_rows = list(range(total))[total - n - 1: total - 1]  # logits[start - 1 : end - 1], start = end - n
    tokens_chunk = s.tokens[-n:]
    assert len(logits_rows) == len(tokens_chunk) == n == len(s.loss_mask) == len(s.rollout_log_probs) >= 1


def test_slime_gets_a_masked_placeholder_for_an_empty_response_of_a_truncated_sample():
    from test_slime import SlimeSample
    from rollout_client.adapters import slime

    # The engine's context was full at the first turn: TRUNCATED (a policy outcome, graded) with no response token.
    t = rollout_pb2.Trajectory(task_id="odd", sample_index=0, group_id="odd", status=rollout_pb2.TRAJECTORY_STATUS_TRUNCATED,
                               finish_reason="max_model_len", reward=0.0, prompt_token_ids=[11, 12, 13])
    s = slime.fill(SlimeSample(), group(t), 0)
    slime_alignment(s)  # was: response_length 0, tokens[-0:] = the whole prompt against no logits
    assert s.tokens == [11, 12, 13, 13] and s.loss_mask == [0] and s.rollout_log_probs == [0.0]
    assert s.status == SlimeSample.Status.TRUNCATED and s.remove_sample is False and s.reward == 0.0
    assert s.metadata["rollout_service"]["placeholder_tokens"] == 1


def test_slime_gets_placeholders_for_a_sample_that_failed_before_its_prompt_was_rendered():
    from test_slime import SlimeSample
    from rollout_client.adapters import slime

    ok = trajectory(0, reward=1.0)
    failed = rollout_pb2.Trajectory(task_id="odd", sample_index=1, group_id="odd", error="sandbox did not start",
                                    status=rollout_pb2.TRAJECTORY_STATUS_SANDBOX_ERROR, finish_reason="error")
    g = Group("odd", "odd", [Sample.from_proto(ok), Sample.from_proto(failed)])
    s = slime.fill(SlimeSample(), g, 1)
    slime_alignment(s)
    assert s.loss_mask == [0] and s.remove_sample is True and s.status == SlimeSample.Status.FAILED
    assert s.reward == 1.0 and s.metadata["rollout_service"]["placeholder_tokens"] == 2
    whole = slime.fill(SlimeSample(), g, 0)
    assert whole.metadata["rollout_service"]["placeholder_tokens"] == 0 and whole.response_length == 6


def test_nemo_rl_never_yields_an_empty_message_for_a_sample_that_failed_before_its_prompt():
    """The NeMo-RL driver contract (test_nemo_rl.consume): every message_log entry has at least one token."""
    from test_nemo_rl import consume
    from rollout_client.adapters.nemo_rl import to_result

    failed = rollout_pb2.Trajectory(task_id="odd", sample_index=1, group_id="odd", error="sandbox did not start",
                                    status=rollout_pb2.TRAJECTORY_STATUS_SANDBOX_ERROR, finish_reason="error")
    g = Group("odd", "odd", [Sample.from_proto(trajectory(0)), Sample.from_proto(failed)])
    results = [(i, to_result(g, i, {"_rowidx": i}, TOKENIZER), None) for i in range(2)]
    consume(results[:1] + [(1, results[1][1], {"t": 1.0})], 2)
    log = results[1][1]["message_log"]
    assert [m["role"] for m in log] == ["user"] and log[0]["token_ids"].tolist() == [TOKENIZER.pad_token_id]
    assert results[1][1]["full_result"]["instance_config"] == {"mask_sample": True}
