"""SkyRL (0.4.0) generator that delegates every group to the rollout service.

SkyRL's extension point is ``GeneratorInterface.generate(GeneratorInput) -> GeneratorOutput``
(``skyrl/train/generators/base.py``), returned in input order; a trainer picks its generator in
``BasePPOExp.get_generator(cfg, tokenizer, inference_engine_client)``. The batch holds every repetition of every
prompt, tagged by ``trajectory_ids`` (instance_id, repetition_id); the rows of one instance_id become one TaskSpec
with ``num_samples`` = their count, all groups run at once over the process's shared stream.

``generate`` never raises: in SkyRL's fully-async trainer any exception kills the run. Every failure — a sample
the service reports as failed, a rejected spec, a lost server — becomes a sample with every response token masked,
logprobs 0, the group-neutral reward (mean of the group's usable rewards: the group mean does not move, its std
shrinks, see ``_common``; 0.0 when none is usable, which moves
nothing since a group of all-masked samples has no gradient), stop reason ``rollout_service:<status>``, and a log
line. ``rollout_metrics`` counts them.

Widths: SkyRL does not cut what a generator returns; give ``max_prompt_length``/``max_response_length`` to cut
(prompt from the left, response from the right; ids, masks and logprobs together; environment tokens the cut leaves at
the end go too, so the reward SkyRL puts on the last token sits on a sampled one, as SkyRL's own generator ends). A
sample whose prompt had to be cut is masked (stop reason ``rollout_service:prompt_cut``): its response was sampled
after the whole prompt.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from ._common import (
    ROLE_ASSISTANT,
    ServiceSettings,
    TaskRequest,
    as_plain,
    end_on_sampled_token,
    last_user_text,
    logprobs_mode,
    neutral_reward,
    pad_token_id,
    shared_coalescer,
    timing_seconds,
    trainable,
    truncate,
    usable,
)

try:  # SkyRL 0.4.0 (Python >= 3.12); the adapter also works, duck-typed, where SkyRL is not installed
    from skyrl.train.generators.base import GeneratorInterface as _Base  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the trainer's environment
    _Base = object  # type: ignore[assignment,misc]

logger = logging.getLogger("rollout_client.adapters.skyrl")


class RolloutServiceGenerator(_Base):  # type: ignore[misc,valid-type]
    """A SkyRL ``GeneratorInterface`` over the rollout service.

    ``environments`` maps SkyRL env class names (``env_classes``) to service environment names; unmapped names are
    used as they are. Instances come from ``env_extras["instance"]``, else (SkyRL's gsm8k/math data) the last user
    message is the problem and ``env_extras["reward_spec"]["ground_truth"]`` the answer. Override :meth:`task_for`
    for other data.
    """

    def __init__(
        self,
        settings: ServiceSettings | Mapping[str, Any] | None = None,
        *,
        tokenizer: Any = None,
        environments: Mapping[str, str] | None = None,
        max_prompt_length: int | None = None,
        max_response_length: int | None = None,
    ) -> None:
        self.settings = settings if isinstance(settings, ServiceSettings) else ServiceSettings.resolve(settings)
        self.tokenizer = tokenizer
        self.environments = dict(environments or {})
        self.max_prompt_length = max_prompt_length
        self.max_response_length = max_response_length

    def task_for(self, prompt: Any, env_class: str, extras: Mapping[str, Any], sampling_params: Mapping[str, Any] | None) -> TaskRequest:
        extras = as_plain(extras or {})
        environment = extras.get("environment") or self.environments.get(env_class) or self.settings.environment or env_class
        instance = extras.get("instance")
        if instance is None:
            truth = (extras.get("reward_spec") or {}).get("ground_truth", "")
            instance = {"problem": last_user_text(prompt), "answer": str(truth)}
        return TaskRequest(environment=str(environment), instance=dict(instance), sampling=_sampling(sampling_params),
                           metadata={"trainer": "skyrl"})

    async def generate(self, input_batch: Mapping[str, Any]) -> dict[str, Any]:
        prompts = list(input_batch["prompts"])
        n = len(prompts)
        env_classes = list(input_batch.get("env_classes") or [""] * n)
        extras = list(input_batch.get("env_extras") or [{}] * n)
        trajectory_ids = input_batch.get("trajectory_ids")
        sampling_params = input_batch.get("sampling_params")

        async def one(i: int) -> dict[str, Any]:
            try:
                request = self.task_for(prompts[i], env_classes[i], extras[i], sampling_params)
                key = getattr(trajectory_ids[i], "instance_id", None) if trajectory_ids else None
                group, j = await shared_coalescer(self.settings).sample(str(key) if key is not None else request.fingerprint(), request)
                return self._row(group, j)
            except Exception as error:  # never raise into SkyRL: the row becomes a masked placeholder
                logger.error("rollout service failed for row %d (masked placeholder): %r", i, error)
                return self._placeholder(prompts[i], f"rollout_service:error:{type(error).__name__}")

        rows = await asyncio.gather(*(one(i) for i in range(n)))
        failed = sum(1 for r in rows if r["failed"])
        return {
            "prompt_token_ids": [r["prompt"] for r in rows],
            "response_ids": [r["response"] for r in rows],
            "rewards": [r["reward"] for r in rows],
            "loss_masks": [r["mask"] for r in rows],
            "stop_reasons": [r["stop"] for r in rows],
            "rollout_metrics": {
                "rollout_service/failed_samples": failed,
                "rollout_service/cut_tokens": sum(r["cut"] for r in rows),
            },
            "rollout_logprobs": [r["logprobs"] for r in rows],
            "trajectory_ids": list(trajectory_ids) if trajectory_ids else None,
            "trajectory_generation_times": [r["seconds"] for r in rows],
            "trajectory_time_splits": {"llm": [r["llm"] for r in rows], "env": [r["env"] for r in rows]},
            "rollout_expert_indices": None,
            "rollout_sample_support": None,
            "is_last_step": None,
            "env_metrics": [r["env_metrics"] for r in rows],
            "pixel_values": None,
            "image_grid_thw": None,
        }

    def _row(self, group: Any, j: int) -> dict[str, Any]:
        sample = group.samples[j]
        cut = truncate(sample, self.max_prompt_length, self.max_response_length)
        ok, cut_error = trainable(sample, cut, logger)
        if ok:
            end_on_sampled_token(cut)  # the reward goes on the last token: a sampled one, as SkyRL's generator ends
        mask = cut.loss_mask if ok else [0] * len(cut.response_ids)
        logprobs = cut.logprobs if ok else [0.0] * len(cut.response_ids)
        response = cut.response_ids
        if not response:  # SkyRL stacks responses; an empty one has no position to carry the reward
            response, mask, logprobs = [self._pad_id()], [0], [0.0]
        return {
            "prompt": cut.prompt_ids,
            "response": response,
            "mask": mask,
            "logprobs": logprobs,
            "reward": float(sample.reward) if ok else neutral_reward(group),
            "stop": engine_stop_reason(sample, cut.response_cut) if ok else f"rollout_service:{'prompt_cut' if usable(sample) else sample.status}",
            "failed": not ok,
            "cut": cut.response_cut,
            "seconds": timing_seconds(sample, "total"),
            "llm": timing_seconds(sample, "llm"),
            "env": timing_seconds(sample, "tool") + timing_seconds(sample, "eval") + timing_seconds(sample, "init"),
            "env_metrics": {"rollout_task_id": sample.task_id, "rollout_sample_index": sample.sample_index,
                            "rollout_status": sample.status, "rollout_finish_reason": sample.finish_reason or "",
                            "rollout_error": sample.error or cut_error or "", "rollout_stale": bool(sample.stale),
                            "rollout_logprobs_mode": logprobs_mode(sample)},
        }

    def _placeholder(self, prompt: Any, stop: str) -> dict[str, Any]:
        """A row for a prompt the service never answered: the chat template's prompt ids when a tokenizer was given
        (else one pad token), one masked pad token as response."""
        ids: list[int] = [self._pad_id()]
        if self.tokenizer is not None:
            try:
                ids = list(self.tokenizer.apply_chat_template(as_plain(prompt), add_generation_prompt=True, tokenize=True))
            except Exception as error:  # the placeholder must not fail either
                logger.error("could not tokenize the prompt of a failed row: %r", error)
        return {"prompt": ids, "response": [self._pad_id()], "mask": [0], "logprobs": [0.0], "reward": 0.0, "stop": stop,
                "failed": True, "cut": 0, "seconds": 0.0, "llm": 0.0, "env": 0.0,
                "env_metrics": {"rollout_task_id": "", "rollout_sample_index": -1, "rollout_status": "unreachable",
                                "rollout_finish_reason": "", "rollout_error": stop, "rollout_stale": False,
                                "rollout_logprobs_mode": "unspecified"}}

    def _pad_id(self) -> int:
        return pad_token_id(self.tokenizer)


#: Trajectory finish reasons that mean "ran out of tokens": SkyRL's own generator says "length" when the context
#: outgrows its budget, whatever the last engine call said.
LENGTH_FINISH_REASONS = frozenset({"max_total_tokens", "max_model_len", "max_tokens_per_turn"})


def engine_stop_reason(sample: Any, cut_tokens: int = 0) -> str:
    """SkyRL's stop reason: the engine's ("stop", "length", ...) for the last generation, as SkyRL's own generator
    reports it, except "length" whenever the trajectory was cut for length — by this adapter (``cut_tokens`` > 0:
    ``max_response_length``) or by the service's token budget (finish reason ``max_total_tokens``/``max_model_len``,
    whose last engine call may have said "stop" before the budget ran out) — as SkyRL's generator says "length" when
    the context outgrows its budget. SkyRL's overlong filtering masks every row whose stop reason is not "stop": a cut
    row must not pass it as a finished one. The trajectory's own finish reason (e.g. "answer") stays in
    ``env_metrics``."""
    if cut_tokens > 0 or getattr(sample, "finish_reason", "") in LENGTH_FINISH_REASONS:
        return "length"
    turns = [t for t in getattr(getattr(sample, "raw", None), "turns", []) or [] if int(t.role) == ROLE_ASSISTANT]
    if turns and turns[-1].finish_reason:
        return str(turns[-1].finish_reason)
    return "length" if sample.status == "truncated" else "stop"


def _sampling(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """SkyRL's sampling params (vLLM/SGLang names) as the service's SamplingParams."""
    if not params:
        return None
    out: dict[str, Any] = {}
    for key in ("temperature", "top_p"):
        if params.get(key) is not None:
            out[key] = float(params[key])
    if params.get("top_k") is not None and int(params["top_k"]) > 0:
        out["top_k"] = int(params["top_k"])
    max_tokens = params.get("max_tokens", params.get("max_generate_length", params.get("max_new_tokens")))
    if max_tokens:
        out["max_tokens_per_turn"] = int(max_tokens)
    if params.get("seed") is not None:
        out["seed"] = int(params["seed"])
    stop = params.get("stop")
    if stop:
        out["stop"] = [stop] if isinstance(stop, str) else list(stop)
    return out
