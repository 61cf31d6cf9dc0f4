"""group_advantages and trainer_batch on hand-made groups (pure functions; no server needed)."""
from __future__ import annotations

import math

import pytest

from rollout_client import Group, Sample, group_advantages, trainer_batch


def sample(i: int, reward: float, status: str = "completed", stale: bool = False) -> Sample:
    return Sample(
        task_id="t", sample_index=i, group_id="g", prompt_ids=[1], response_ids=[2, 3], loss_mask=[1, 0], logprobs=[-0.1, 0.0],
        policy_versions=[1, 0], reward=reward, status=status, is_infra_failure=status not in ("completed", "truncated"),
        finish_reason="stop", num_turns=1, error="", timing={}, stale=stale,
    )


def test_grpo_advantages_normalise_over_the_policy_outcomes_and_leave_failures_out():
    g = Group("t", "g", [sample(0, 1.0), sample(1, 0.0), sample(2, 0.0, "backend_error"), sample(3, 1.0, "truncated"), sample(4, 0.0)])
    # Over rewards [1, 0, 1, 0]: mean 0.5, population std 0.5.
    assert group_advantages(g) == pytest.approx([1.0, -1.0, 1.0, -1.0], rel=1e-5)
    assert group_advantages(g, drop_failed=False) == pytest.approx([1.0, -1.0, 0.0, 1.0, -1.0], rel=1e-5)
    assert group_advantages(g, normalize="mean") == pytest.approx([0.5, -0.5, 0.5, -0.5])
    assert group_advantages(g, normalize="none") == [1.0, 0.0, 1.0, 0.0]
    assert g.rewards == [1.0, 0.0, 1.0, 0.0] and [s.sample_index for s in g.failed] == [2]


def test_a_group_of_equal_rewards_or_only_failures_has_zero_advantages():
    assert group_advantages(Group("t", "g", [sample(0, 1.0), sample(1, 1.0)])) == [0.0, 0.0]
    assert group_advantages(Group("t", "g", [sample(0, 0.0, "timeout")])) == []
    assert group_advantages(Group("t", "g", [sample(0, 0.0, "timeout")]), drop_failed=False) == [0.0]
    with pytest.raises(ValueError):
        group_advantages(Group("t", "g", []), normalize="z")


def test_trainer_batch_flattens_policy_outcomes_with_their_advantages():
    g1 = Group("a", "ga", [sample(0, 1.0), sample(1, 0.0, "sandbox_error"), sample(2, 0.0)])
    g2 = Group("b", "gb", [sample(0, 0.5)])
    batch = trainer_batch([g1, g2])
    assert batch["sample_indices"] == [0, 2, 0]
    assert batch["rewards"] == [1.0, 0.0, 0.5]
    assert batch["advantages"][2] == 0.0 and math.isclose(batch["advantages"][0], -batch["advantages"][1])
    assert batch["loss_mask"] == [[1, 0]] * 3 and batch["policy_versions"] == [[1, 0]] * 3


def test_trainer_batch_carries_the_stale_flag_of_each_sample():
    """A task's max_staleness with FLAG delivers past-bound samples marked stale: the batch must keep the mark."""
    batch = trainer_batch([Group("a", "ga", [sample(0, 1.0), sample(1, 0.0, stale=True), sample(2, 0.0, "timeout", stale=True)])])
    assert batch["stale"] == [False, True]
