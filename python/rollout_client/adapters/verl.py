"""verl (0.9.1) agent loop that delegates every group to the rollout service.

verl's agent-loop worker (``verl/experimental/agent_loop/agent_loop.py``) receives a chunk of the batch, in which
the trainer has already repeated each prompt ``rollout.n`` times with ``interleave=True`` under one ``uid``; it
instantiates one agent-loop object *per row* (hydra) and starts all rows' ``run()`` with ``asyncio.create_task``
before gathering them. So the n samples of a prompt arrive as n ``run()`` calls of n objects, all started in the
same event-loop pass of one worker. This loop turns them back into one TaskSpec with ``num_samples = n`` through the
process-wide ``GroupCoalescer`` (keyed by ``uid``), over one shared client stream per worker process. Counting the
rows that really arrived, instead of trusting ``rollout.n``, keeps it right when verl's chunking splits a group
across two workers or when validation uses ``val_kwargs.n``.

Register it by importing this module (``@register("rollout_service")``) or with an ``agent_loop_config_path`` entry
(see docs/trainers/verl.md), and select it per row with the dataset's ``agent_name`` column or
``actor_rollout_ref.rollout.agent.default_agent_loop=rollout_service``.

Output (``AgentLoopOutput``): prompt_ids and response_ids exactly as the service tokenised and the engine sampled
them, response_mask (1 = sampled), response_logprobs (the engine's, 0 where masked), reward_score (the
environment's reward), num_turns (the prompt message plus every response turn, as verl counts), metrics (LLM, tool
and eval time) and extra_fields (status, ids, ``rollout_stale``, the mark of a task's max_staleness,
``rollout_policy_version_min/max`` over every version that sampled a kept token — a span's start version included
when the weights changed while it was sampled — and ``rollout_logprobs_mode``; same keys on every sample so verl can
stack them).

Lengths: verl pads every sample to ``rollout.prompt_length`` / ``rollout.response_length`` and does not truncate,
so a longer sample fails the whole batch when it is stacked. The response is cut from the right, and with it the
environment tokens the cut leaves at its end (verl puts the reward on the last response token, and its GAE and
REINFORCE++ skip mask-0 tokens: a reward there would be lost); ``extra_fields["rollout_cut_tokens"]`` says how many
response tokens were cut. A prompt longer than ``prompt_length``
is cut from the left to fit (as verl's own ``_cap_text_prompt_length`` does), but unlike verl's the response was
sampled after the whole prompt, so that sample is masked like a failed one (``rollout_failed``, the reason in
``rollout_error``, ``extra_fields["rollout_prompt_cut_tokens"]`` > 0): raise ``prompt_length`` or filter long prompts. The service is also asked for at most ``response_length`` tokens per turn; set
the environment's token budget (``sampling.max_total_tokens`` through :meth:`task_for`) to keep cuts rare.

Failures: verl has no per-sample drop. A sample the service reports as failed (timeout, cancelled, environment,
sandbox or backend error) comes back with every response token masked (no gradient), its logprobs 0, the
group-neutral reward (the mean of the group's usable rewards: the group mean does not move, but the std shrinks, so
the usable samples' GRPO advantages grow; see ``_common``), and
``extra_fields["rollout_failed"] = True`` with the status and error. An empty response gets one masked pad token,
because verl indexes the last response position for the reward.
"""
from __future__ import annotations

import logging
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from ._common import (
    ServiceSettings,
    TaskRequest,
    as_plain,
    end_on_sampled_token,
    last_user_text,
    logprobs_mode,
    neutral_reward,
    pad_token_id,
    sampled_versions,
    shared_coalescer,
    spans,
    timing_seconds,
    trainable,
    truncate,
)

logger = logging.getLogger("rollout_client.adapters.verl")

@register("rollout_service")
class RolloutServiceAgentLoop(AgentLoopBase):
    """An ``AgentLoopBase`` whose ``run()`` is one sample of a group run by the rollout service.

    Settings come from the agent-loop config entry's keys (``targets``, ``token``, ``environment``, ...), then the
    trainer config's top-level ``rollout_service`` mapping (``+rollout_service.targets=...`` on verl's command
    line), then the environment variables of :class:`ServiceSettings`. Override :meth:`task_for` to map your rows.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        own = {k: kwargs.pop(k) for k in list(kwargs) if k in _SETTING_KEYS}
        kwargs.pop("name", None)  # the agent_loop_config_path entry's own name
        super().__init__(*args, **kwargs)
        from_trainer = as_plain(self.config.get("rollout_service", None) or {})
        self.settings = ServiceSettings.resolve({**from_trainer, **{k: v for k, v in own.items() if v is not None}})

    def task_for(self, sampling_params: dict[str, Any], row: dict[str, Any]) -> TaskRequest:
        """Maps a verl dataset row to the group's TaskSpec.

        Default: ``extra_info["environment"]`` (else the configured environment) and ``extra_info["instance"]``;
        without an instance, the row is taken as a verl math row (gsm8k/MATH preprocessing): the last user message
        is the problem and ``reward_model["ground_truth"]`` the answer.
        """
        extra = as_plain(row.get("extra_info") or {})
        environment = extra.get("environment") or self.settings.environment
        if not environment:
            raise ValueError("no environment: set extra_info.environment in the data or the loop's 'environment'")
        instance = extra.get("instance")
        if instance is None:
            reward_model = as_plain(row.get("reward_model") or {})
            instance = {"problem": last_user_text(row.get("raw_prompt") or []), "answer": str(reward_model.get("ground_truth", ""))}
        return TaskRequest(
            environment=str(environment),
            instance=dict(instance),
            sampling=_sampling(sampling_params, self.rollout_config),
            metadata={"trainer": "verl", "uid": str(row.get("uid", ""))},
        )

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        request = self.task_for(sampling_params, kwargs)
        key = str(kwargs.get("uid") or kwargs.get("index") or id(self))
        group, i = await shared_coalescer(self.settings).sample(key, request)
        return self.to_output(group, i)

    def to_output(self, group: Any, i: int) -> AgentLoopOutput:
        """verl's record of sample ``i`` of ``group``, cut to the configured widths (see the module doc)."""
        sample = group.samples[i]
        cut = truncate(sample, int(self.rollout_config.prompt_length), int(self.rollout_config.response_length))
        ok, cut_error = trainable(sample, cut, logger)
        if ok:
            end_on_sampled_token(cut)  # verl puts the reward on the last token: a sampled one (see _common)
        mask, logprobs, response = cut.loss_mask, cut.logprobs, cut.response_ids
        if not ok:
            mask = [0] * len(response)
            logprobs = [0.0] * len(response)
        if not response:
            response, mask, logprobs = [pad_token_id(self.tokenizer)], [0], [0.0]
        versions = sampled_versions(sample, len(cut.response_ids)) if ok else []
        return AgentLoopOutput(
            prompt_ids=cut.prompt_ids,
            response_ids=response,
            response_mask=mask,
            response_logprobs=logprobs,
            reward_score=float(sample.reward) if ok else neutral_reward(group),
            num_turns=1 + len(spans(sample)),
            metrics=AgentLoopMetrics(
                generate_sequences=timing_seconds(sample, "llm"),
                tool_calls=timing_seconds(sample, "tool"),
                compute_score=timing_seconds(sample, "eval"),
            ),
            extra_fields={
                "rollout_task_id": sample.task_id,
                "rollout_sample_index": sample.sample_index,
                "rollout_status": sample.status,
                "rollout_failed": not ok,
                "rollout_infra_failure": bool(sample.is_infra_failure),
                "rollout_error": sample.error or cut_error or "",
                "rollout_cut_tokens": cut.response_cut,
                "rollout_prompt_cut_tokens": cut.prompt_cut,
                "rollout_policy_version_min": min(versions) if versions else None,
                "rollout_policy_version_max": max(versions) if versions else None,
                "rollout_stale": bool(sample.stale),
                "rollout_logprobs_mode": logprobs_mode(sample),
            },
        )


_SETTING_KEYS = ("targets", "token", "tls_ca_file", "environment", "max_in_flight")


def _sampling(params: dict[str, Any], rollout_config: Any) -> dict[str, Any]:
    """verl's per-request sampling params as the service's SamplingParams (top_k -1 = off = unset)."""
    out: dict[str, Any] = {}
    if params.get("temperature") is not None:
        out["temperature"] = float(params["temperature"])
    if params.get("top_p") is not None:
        out["top_p"] = float(params["top_p"])
    top_k = params.get("top_k")
    if top_k is not None and int(top_k) > 0:
        out["top_k"] = int(top_k)
    # No total budget from verl's widths: the service renders the prompt with the environment's own system prompt
    # and tools, so its length is not verl's. A longer trajectory is cut (and counted) by to_output.
    out["max_tokens_per_turn"] = int(rollout_config.response_length)
    return out
