"""A small GRPO loop over the installable client (pip install ./python): no GPU, no model, just the data path.

Each step submits a batch of math problems as GRPO groups (one task of --group-size samples each), streams the groups
back as they complete, computes group-normalised advantages, and prints per-step reward and token statistics. The
policy update is a stub: a real trainer would feed `trainer_batch(...)` (ids, loss masks, logprobs, advantages) to
its loss. The last line printed is a JSON summary.

    node bin/rollout.js serve --fake-engine --port 50051 &      # the demo server (fake vLLM engine, a test double)
    python examples/python/grpo_loop.py --target 127.0.0.1:50051 --steps 3
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time

from rollout_client import AsyncRolloutClient, Group, group_advantages, trainer_batch


def problem(rng: random.Random) -> dict:
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(1, 50)
    return {"problem": f"What is {a} * {b} + {c}?", "answer": str(a * b + c)}


def policy_update(batch: dict) -> None:
    """Where the trainer's loss goes: sum over tokens of -advantage * logprob * loss_mask (here only checked)."""
    for mask, logprobs, adv in zip(batch["loss_mask"], batch["logprobs"], batch["advantages"]):
        assert len(mask) == len(logprobs) and all(lp == 0.0 for m, lp in zip(mask, logprobs) if m == 0)
        assert isinstance(adv, float)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", action="append", required=True, help="server address (repeat for several servers)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--groups-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--token", default=None, help="bearer token, when the server requires one")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    summary = {"steps": [], "failed_samples": 0}
    async with AsyncRolloutClient(args.target, token=args.token) as client:
        for step in range(args.steps):
            started = time.monotonic()
            for g in range(args.groups_per_step):
                await client.submit("math", problem(rng), args.group_size, sampling={"temperature": 1.0, "seed": rng.randint(0, 1 << 30), "max_tokens_per_turn": 256},
                                    limits={"max_turns": 4}, task_id=f"grpo-{args.seed}-{step}-{g}", metadata={"step": str(step)})
            groups: list[Group] = [g async for g in client.groups()]  # in completion order
            batch = trainer_batch(groups)
            policy_update(batch)
            failed = sum(len(g.failed) for g in groups)
            rewards = batch["rewards"]
            sampled = [sum(m) for m in batch["loss_mask"]]
            total = [len(ids) for ids in batch["response_ids"]]
            adv = [a for g in groups for a in group_advantages(g)]
            row = {
                "step": step,
                "groups": len(groups),
                "samples": len(rewards),
                "failed": failed,
                "reward_mean": round(statistics.fmean(rewards), 4) if rewards else None,
                "solved_groups": sum(1 for g in groups if any(r > 0 for r in g.rewards)),
                "zero_variance_groups": sum(1 for g in groups if len(set(g.rewards)) <= 1),
                "sampled_tokens_mean": round(statistics.fmean(sampled), 1) if sampled else 0,
                "response_tokens_mean": round(statistics.fmean(total), 1) if total else 0,
                "prompt_tokens_mean": round(statistics.fmean(len(p) for p in batch["prompt_ids"]), 1) if rewards else 0,
                "advantage_abs_mean": round(statistics.fmean(abs(a) for a in adv), 4) if adv else 0.0,
                "seconds": round(time.monotonic() - started, 2),
            }
            print(f"step {step}: reward {row['reward_mean']}  groups {row['groups']} (solved {row['solved_groups']}, zero-variance {row['zero_variance_groups']})  "
                  f"tokens/sample {row['response_tokens_mean']} ({row['sampled_tokens_mean']} sampled)  failed {failed}  {row['seconds']} s", file=sys.stderr)
            summary["steps"].append(row)
            summary["failed_samples"] += failed
    print(json.dumps(summary))
    complete = all(r["groups"] == args.groups_per_step for r in summary["steps"])
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
