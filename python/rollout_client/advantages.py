"""From groups to what a trainer's loss needs: group-normalised advantages (GRPO) and flat per-sample lists."""
from __future__ import annotations

import math
from typing import Dict, Iterable, List

from .results import Group, Sample

EPS = 1e-6


def group_advantages(group: Group, *, normalize: str = "std", drop_failed: bool = True) -> List[float]:
    """GRPO advantages of a group: (r - mean) / (std + eps) over its policy-outcome samples.

    normalize: 'std' (GRPO), 'mean' (r - mean, Dr. GRPO style), or 'none' (the raw rewards).
    drop_failed=True returns one advantage per policy-outcome sample (group.ok order): infrastructure failures are
    left out of both the statistics and the result. drop_failed=False returns one per sample (group.samples order)
    with 0.0 for failed samples, which stay out of the statistics, so a caller keeping fixed-size groups can zero
    their loss instead. The std is the population std (numpy's default). verl and TRL use torch's unbiased std, which is
    larger by sqrt(n / (n - 1)) for n samples: their advantages are that much smaller than these (0.87x for n = 4).
    """
    if normalize not in ("std", "mean", "none"):
        raise ValueError(f"normalize must be 'std', 'mean' or 'none', not {normalize!r}")
    rewards = group.rewards
    if rewards:
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    else:
        mean = std = 0.0

    def advantage(r: float) -> float:
        if normalize == "none":
            return r
        if normalize == "mean":
            return r - mean
        return (r - mean) / (std + EPS)

    if drop_failed:
        return [advantage(s.reward) for s in group.ok]
    return [0.0 if s.is_infra_failure else advantage(s.reward) for s in group.samples]


def trainer_batch(groups: Iterable[Group], *, normalize: str = "std") -> Dict[str, list]:
    """Flattens groups into per-sample lists, policy-outcome samples only (infrastructure failures dropped).

    Keys: prompt_ids, response_ids, loss_mask, logprobs, policy_versions (lists of lists), rewards, advantages
    (one float per sample), group_ids, task_ids, sample_indices, stale (the sample's tokens span more policy versions
    than the task's max_staleness allows: kept, for the trainer to weigh or drop). Turn them into padded tensors with the trainer's
    own collate (e.g. torch.nn.utils.rnn.pad_sequence); nothing here depends on torch.
    """
    out: Dict[str, list] = {k: [] for k in ("prompt_ids", "response_ids", "loss_mask", "logprobs", "policy_versions", "rewards", "advantages", "group_ids", "task_ids", "sample_indices", "stale")}
    for group in groups:
        samples: List[Sample] = group.ok
        for sample, adv in zip(samples, group_advantages(group, normalize=normalize, drop_failed=True)):
            out["prompt_ids"].append(sample.prompt_ids)
            out["response_ids"].append(sample.response_ids)
            out["loss_mask"].append(sample.loss_mask)
            out["logprobs"].append(sample.logprobs)
            out["policy_versions"].append(sample.policy_versions)
            out["rewards"].append(sample.reward)
            out["advantages"].append(adv)
            out["group_ids"].append(sample.group_id)
            out["task_ids"].append(sample.task_id)
            out["sample_indices"].append(sample.sample_index)
            out["stale"].append(bool(sample.stale))
    return out
