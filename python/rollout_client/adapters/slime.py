"""slime adapters: a custom generate function (per sample) and a rollout function (per rollout step).

Two extension points, pick one:

- ``--custom-generate-function-path rollout_client.adapters.slime.generate``: slime's default rollout keeps its
  data source, filters and reward post-processing and calls ``generate(args, sample, sampling_params)`` once per
  sample, the n samples of a prompt (same ``group_index``) started together by ``generate_and_rm_group``. They are
  coalesced into one TaskSpec with ``num_samples = n`` (see ``_common.GroupCoalescer``; samples held back by slime's
  concurrency semaphore form smaller groups of their own, which is still correct).
- ``--rollout-function-path rollout_client.adapters.slime.generate_rollout``: the whole step — take
  ``args.rollout_batch_size`` groups from slime's data source and run each as one TaskSpec. Evaluation is left to
  slime (``--eval-function-path slime.rollout.sglang_rollout.generate_rollout``).

Each slime ``Sample`` is filled in place: ``tokens`` = prompt ids + response ids, ``response_length``, ``loss_mask``
(1 = sampled), ``rollout_log_probs`` (the engine's; 0 where masked), ``reward`` (the environment's, so slime's
reward model is not called), ``status`` (COMPLETED or TRUNCATED), ``weight_versions`` (the policy version of each
engine call that sampled tokens, as strings, like slime's one entry per engine call — each piece of a turn continued
after an abort its own entry, and a call whose weights changed in flight two: the version it started and the one
that finished it), and ``metadata["rollout_service"]`` (with ``logprobs_mode``). A sample without
a response token, or without a prompt token, gets a masked placeholder token where one is missing (see ``fill``).

Failures: slime can drop a sample, so it is dropped: ``remove_sample = True`` (slime zeroes its loss mask),
``status = FAILED``, its loss mask and logprobs 0, and the group-neutral reward (the mean of the group's usable
rewards) so the group mean is not pulled by a number that is not a policy outcome (its std is, where slime's
normalisation counts removed samples: see ``_common``).
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from typing import Any

from ._common import (
    ServiceSettings,
    TaskRequest,
    as_plain,
    failure_info,
    last_user_text,
    logprobs_mode,
    neutral_reward,
    sampled_versions,
    shared_client,
    shared_coalescer,
    usable,
)

logger = logging.getLogger("rollout_client.adapters.slime")


def settings_from_args(args: Any) -> ServiceSettings:
    """``--rollout-service-targets`` style attributes on slime's args when a launcher adds them, else the
    environment (``ROLLOUT_TARGETS``, ...; see ServiceSettings)."""
    return ServiceSettings.resolve({
        "targets": getattr(args, "rollout_service_targets", None),
        "token": getattr(args, "rollout_service_token", None),
        "environment": getattr(args, "rollout_service_environment", None),
    })


def task_for(sample: Any, sampling_params: Mapping[str, Any] | None, settings: ServiceSettings) -> TaskRequest:
    """A slime sample's TaskSpec: ``metadata["environment"]``/``metadata["instance"]`` (slime's
    ``--metadata-key`` column) when given, else a math row: the prompt (its last user message) and ``label``."""
    metadata = as_plain(sample.metadata or {})
    environment = metadata.get("environment") or settings.environment
    if not environment:
        raise ValueError("no environment: set metadata.environment in the data or ROLLOUT_ENVIRONMENT")
    instance = metadata.get("instance")
    if instance is None:
        prompt = sample.prompt
        problem = prompt if isinstance(prompt, str) else last_user_text(prompt)
        instance = {"problem": problem, "answer": "" if sample.label is None else str(sample.label)}
    return TaskRequest(environment=str(environment), instance=dict(instance), sampling=_sampling(sampling_params),
                       metadata={"trainer": "slime"})


def fill(sample: Any, group: Any, i: int) -> Any:
    """Writes sample ``i`` of ``group`` into slime's ``sample`` (see the module doc) and returns it."""
    got = group.samples[i]
    status = type(sample).Status
    prompt, response = list(got.prompt_ids), list(got.response_ids)
    mask, logprobs = list(got.loss_mask), [float(x) for x in got.logprobs]
    # slime slices a sample's response as tokens[-response_length:] against the logits of the positions before it
    # (megatron_utils/loss.py get_responses): a response of 0 tokens selects the whole sequence against no logits,
    # and a sequence without a prompt token has no position before its response. Both would fail the training step
    # of the whole batch, and both are common: a sample that fails before its prompt was rendered (sandbox error,
    # timeout in the queue) has neither, a TRUNCATED one whose first turn found the engine's context full has no
    # response. Such a sample gets a masked placeholder token where one is missing (trained on never, as verl and
    # SkyRL get a masked pad token); ``metadata["rollout_service"]["placeholder_tokens"]`` counts them.
    placeholder = prompt[-1] if prompt else 0
    added = 0
    if not prompt:
        prompt, added = [placeholder], added + 1
    if not response:
        response, mask, logprobs, added = [placeholder], [0], [0.0], added + 1
    sample.tokens = prompt + response
    sample.response_length = len(response)
    sample.loss_mask = mask
    sample.rollout_log_probs = logprobs
    sample.weight_versions = [str(v) for v in sampled_versions(got)]
    sample.metadata = dict(sample.metadata or {})
    sample.metadata["rollout_service"] = {"task_id": got.task_id, "sample_index": got.sample_index, "status": got.status,
                                          "finish_reason": got.finish_reason, "error": got.error or "",
                                          "stale": bool(got.stale), "logprobs_mode": logprobs_mode(got),
                                          "placeholder_tokens": added}
    if usable(got):
        sample.reward = float(got.reward)
        sample.status = status.TRUNCATED if got.status == "truncated" else status.COMPLETED
        sample.remove_sample = False
    else:
        logger.warning("rollout sample failed, removed: %s", failure_info(got))
        sample.reward = neutral_reward(group)
        sample.status = status.FAILED
        sample.remove_sample = True
        # Masked here too, not only by slime's handling of remove_sample: a failed sample's tokens are never trained.
        sample.loss_mask = [0] * sample.response_length
        sample.rollout_log_probs = [0.0] * sample.response_length
    if sample.response is None or not isinstance(sample.response, str):
        sample.response = ""
    return sample


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False) -> Any:
    """slime custom generate function (``--custom-generate-function-path``)."""
    settings = settings_from_args(args)
    request = task_for(sample, sampling_params, settings)
    key = f"group-{sample.group_index}" if sample.group_index is not None else request.fingerprint()
    group, i = await shared_coalescer(settings).sample(key, request)
    return fill(sample, group, i)


class _BackgroundLoop:
    """One event loop thread per process: slime calls the rollout function synchronously, step after step, and the
    shared client's stream must outlive each call."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="rollout-service-slime", daemon=True).start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


_background: _BackgroundLoop | None = None


async def run_groups(groups: list[list[Any]], sampling_params: Mapping[str, Any] | None, settings: ServiceSettings) -> list[list[Any]]:
    """Runs each slime group (the n copies of one prompt) as one TaskSpec; fills the samples in place."""
    client = shared_client(settings)

    async def one(group: list[Any]) -> list[Any]:
        request = task_for(group[0], sampling_params, settings)
        got = await client.run_group(request.environment, request.instance, len(group), sampling=request.sampling,
                                     metadata=request.metadata)
        return [fill(sample, got, i) for i, sample in enumerate(group)]

    return list(await asyncio.gather(*(one(g) for g in groups)))


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime rollout function (``--rollout-function-path``): ``args.rollout_batch_size`` groups per step."""
    global _background
    if evaluation:
        raise NotImplementedError("evaluation: keep slime's (--eval-function-path slime.rollout.sglang_rollout.generate_rollout)")
    if _background is None:
        _background = _BackgroundLoop()
    groups = data_source.get_samples(args.rollout_batch_size)
    sampling = {"temperature": getattr(args, "rollout_temperature", None), "top_p": getattr(args, "rollout_top_p", None),
                "top_k": getattr(args, "rollout_top_k", None), "max_new_tokens": getattr(args, "rollout_max_response_len", None)}
    samples = _background.run(run_groups(groups, sampling, settings_from_args(args)))
    failed = sum(1 for g in samples for s in g if s.remove_sample)
    metrics = {"rollout_service/removed_samples": failed}
    try:
        from slime.rollout.base_types import RolloutFnTrainOutput  # type: ignore[import-not-found]
    except ImportError:  # older slime: a bare list of groups is its legacy return shape
        return samples
    return RolloutFnTrainOutput(samples=samples, metrics=metrics)


def _sampling(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """slime's SGLang sampling params as the service's SamplingParams."""
    if not params:
        return None
    out: dict[str, Any] = {}
    for key in ("temperature", "top_p"):
        if params.get(key) is not None:
            out[key] = float(params[key])
    if params.get("top_k") is not None and int(params["top_k"]) > 0:
        out["top_k"] = int(params["top_k"])
    if params.get("max_new_tokens"):
        out["max_tokens_per_turn"] = int(params["max_new_tokens"])
    stop = params.get("stop")
    if stop:
        out["stop"] = [stop] if isinstance(stop, str) else list(stop)
    return out
