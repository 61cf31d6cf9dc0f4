"""NeMo-RL adapter: an actor with the NeMo Gym actor's shape, backed by the rollout service.

NeMo-RL's per-turn ``EnvironmentInterface`` assumes NeMo-RL does the generation, so it is not the fit. Its NeMo Gym
path is: the driver hands a batch of rows to the Gym actor (``nemo_rl/environments/nemo_gym.py``, class ``NemoGym``)
and iterates ``run_rollouts(rows, tokenizer, timer_prefix)``, an async generator yielding
``(row["_rowidx"], result, timing_metrics)`` in completion order, ``timing_metrics`` only with the last one. A result
is ``{"message_log", "input_message_log", "full_result"}``; the driver reads ``full_result["reward"]`` and trains
on the message log, where ``assistant`` entries carry ``token_ids`` and ``generation_logprobs`` (trained) and the
others carry ``token_ids`` only (not trained), and each assistant turn's prompt is every token before it.

This actor builds that message log from the trajectory's turn spans: the prompt ids as the first ``user`` entry,
then one ``assistant`` entry per assistant turn (the parts of an aborted-and-continued turn joined) and one ``user``
entry per run of environment/template tokens, so the entries concatenate to exactly prompt + response and every
assistant entry's prompt extends the previous one by construction. Rows that ask the same thing (the n copies of a
prompt NeMo-RL makes for a GRPO group) become one TaskSpec with ``num_samples = n``; results are yielded as groups
finish.

Failures: a failed sample yields a result with no ``assistant`` entry (nothing trained; its tokens, if any, as a
``user`` entry), the group-neutral reward, ``full_result["instance_config"]["mask_sample"] = True`` (NeMo-RL's
per-sample mask flag for environments) and ``full_result["rollout_service"]`` saying what happened. A rejected spec
or a lost server raises, as NeMo Gym's own actor does on a failed ``/run``.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from ._common import (
    ServiceSettings,
    TaskRequest,
    as_plain,
    failure_info,
    last_user_text,
    logprobs_mode,
    neutral_reward,
    pad_token_id,
    shared_client,
    spans,
    timing_seconds,
    usable,
)

logger = logging.getLogger("rollout_client.adapters.nemo_rl")

try:  # NeMo-RL holds token ids and logprobs as tensors; the lists work where torch is absent
    import torch

    def _ids(values: Sequence[int]) -> Any:
        return torch.tensor(list(values), dtype=torch.int64)

    def _floats(values: Sequence[float]) -> Any:
        return torch.tensor(list(values), dtype=torch.float32)
except ImportError:  # pragma: no cover - NeMo-RL always has torch
    def _ids(values: Sequence[int]) -> Any:
        return list(values)

    def _floats(values: Sequence[float]) -> Any:
        return [float(v) for v in values]


class RolloutServiceGym:
    """The NeMo Gym actor's ``run_rollouts`` over the rollout service (wrap with ``ray.remote`` as NeMo-RL does).

    ``environments`` maps a row's ``agent_ref.name`` to a service environment. Instances come from the row's
    ``instance`` field, else (NeMo Gym math rows) the last user message of ``responses_create_params.input`` is the
    problem and ``expected_answer`` (or ``ground_truth``/``answer``) the answer. Override :meth:`task_for`.
    """

    def __init__(self, settings: ServiceSettings | Mapping[str, Any] | None = None, *, environments: Mapping[str, str] | None = None) -> None:
        self.settings = settings if isinstance(settings, ServiceSettings) else ServiceSettings.resolve(settings)
        self.environments = dict(environments or {})

    def task_for(self, row: Mapping[str, Any]) -> TaskRequest:
        row = as_plain(row)
        agent = (row.get("agent_ref") or {}).get("name")
        environment = row.get("environment") or self.environments.get(agent) or self.settings.environment
        if not environment:
            raise ValueError(f"row {row.get('_rowidx')}: no environment (set 'environment', map agent_ref.name, or ROLLOUT_ENVIRONMENT)")
        instance = row.get("instance")
        if instance is None:
            params = row.get("responses_create_params") or {}
            messages = params.get("input")
            problem = messages if isinstance(messages, str) else last_user_text(messages or [])
            answer = next((row[k] for k in ("expected_answer", "ground_truth", "answer") if row.get(k) is not None), "")
            instance = {"problem": problem, "answer": str(answer)}
        params = row.get("responses_create_params") or {}
        sampling = {k: float(params[k]) for k in ("temperature", "top_p") if params.get(k) is not None}
        if params.get("max_output_tokens"):
            sampling["max_tokens_per_turn"] = int(params["max_output_tokens"])
        return TaskRequest(environment=str(environment), instance=dict(instance), sampling=sampling or None,
                           metadata={"trainer": "nemo-rl"})

    async def run_rollouts(
        self, nemo_gym_examples: list[dict], tokenizer: Any = None, timer_prefix: str = "rollout_service", **_: Any
    ) -> AsyncIterator[tuple[int, dict, dict | None]]:
        if not nemo_gym_examples:
            raise ValueError("NeMo-Gym rollout batch must not be empty")
        started = time.monotonic()
        groups: dict[str, tuple[TaskRequest, list[dict]]] = {}
        for row in nemo_gym_examples:
            request = self.task_for(row)
            groups.setdefault(request.fingerprint(), (request, []))[1].append(row)
        client = shared_client(self.settings)

        async def run(request: TaskRequest, rows: list[dict]) -> tuple[Any, list[dict]]:
            group = await client.run_group(request.environment, request.instance, len(rows), sampling=request.sampling,
                                           metadata=request.metadata)
            return group, rows

        pending = [asyncio.ensure_future(run(r, rows)) for r, rows in groups.values()]
        done = 0
        try:
            for next_group in asyncio.as_completed(pending):
                group, rows = await next_group
                for i, row in enumerate(rows):
                    done += 1
                    timing = None
                    if done == len(nemo_gym_examples):
                        timing = {f"{timer_prefix}/run_rollouts_total": time.monotonic() - started}
                    yield row["_rowidx"], to_result(group, i, row, tokenizer), timing
        finally:
            for p in pending:
                p.cancel()


def message_log(sample: Any) -> list[dict[str, Any]]:
    """NeMo-RL's message log of a usable sample: prompt, then one entry per turn span (see the module doc)."""
    log: list[dict[str, Any]] = [{"role": "user", "content": "", "token_ids": _ids(sample.prompt_ids)}]
    for span in spans(sample):
        ids = sample.response_ids[span.start:span.end]
        if not ids:
            continue
        if span.assistant:
            log.append({"role": "assistant", "content": "", "token_ids": _ids(ids),
                        "generation_logprobs": _floats(sample.logprobs[span.start:span.end]),
                        "is_invalid_tool_call": False, "has_malformed_thinking": False})
        else:
            log.append({"role": "user", "content": "", "token_ids": _ids(ids)})
    return log


def to_result(group: Any, i: int, row: Mapping[str, Any], tokenizer: Any = None) -> dict[str, Any]:
    """The ``run_rollouts`` result of sample ``i`` of ``group`` for ``row``.

    A failed sample that never had its prompt rendered (it failed before: sandbox error, timeout in the queue) has no
    token at all; its message log still gets one ``user`` entry with a token (NeMo-RL's batching and forward expect
    no empty sequence): the tokenizer's pad (else eos) token, else 0. Nothing of it is trained either way."""
    sample = group.samples[i]
    ok = usable(sample)
    info = {"task_id": sample.task_id, "sample_index": sample.sample_index, "status": sample.status,
            "finish_reason": sample.finish_reason, "error": sample.error or "", "stale": bool(sample.stale),
            "logprobs_mode": logprobs_mode(sample),
            "llm_seconds": timing_seconds(sample, "llm"), "total_seconds": timing_seconds(sample, "total")}
    full: dict[str, Any] = {"reward": float(sample.reward) if ok else neutral_reward(group),
                            "responses_create_params": as_plain(row.get("responses_create_params") or {}),
                            "rollout_service": info}
    if ok:
        log = message_log(sample)
    else:
        logger.warning("rollout sample failed, masked: %s", failure_info(sample))
        log = [{"role": "user", "content": "", "token_ids": _ids(sample.prompt_ids or [pad_token_id(tokenizer)])}]
        if sample.response_ids:
            log.append({"role": "user", "content": "", "token_ids": _ids(sample.response_ids)})
        full["instance_config"] = {"mask_sample": True}
    return {"message_log": log, "input_message_log": log[:1], "full_result": full}

