"""What every trainer adapter shares: the per-process client, the group coalescer, and the sample policies.

Each trainer calls its extension point once per sample (verl, slime) or once per batch (SkyRL, NeMo-RL), often from
objects it creates per trajectory. The service wants the opposite shape: one long-lived stream per process and one
TaskSpec per GRPO group. This module bridges the two without timing guesses:

- ``shared_client`` keeps one ``AsyncRolloutClient`` per (event loop, settings) in the process, so thousands of
  per-trajectory loop objects share one stream.
- ``GroupCoalescer`` turns the n per-sample calls of one group that a trainer starts together into one TaskSpec
  with ``num_samples = n``: callers register under a group key, and the batch is flushed by ``loop.call_soon`` —
  after every task that was already runnable has run to its first await. Trainers start a group's samples with
  ``asyncio.gather``/``create_task`` in one go, so they all land in the same flush; a sample that arrives later
  simply forms a smaller group of its own (still correct: each sample is an independent draw of the same prompt).
- The failure policy: a sample whose status is not ``completed``/``truncated`` never carries a gradient and never
  counts as a reward of 0. Trainers that can drop a sample drop it (slime: ``remove_sample``); the others get it with
  every token masked and the *group-neutral* reward (the mean of the group's usable rewards), so the group mean does
  not move, and a flag says what happened. The group's std does: k samples at the mean shrink it, so under GRPO's
  std normalisation the n - k usable samples' advantages grow by sqrt((n - 1) / (n - k - 1)) (unbiased std, as verl
  and SkyRL compute it; 1.22x for 2 of 4 failed). No reward for a sample the trainer cannot drop keeps both mean and
  std; count the failures (each adapter's flag) and mind batches with many.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollout.v1 import backend_pb2

from .. import AsyncRolloutClient, Group, Sample, TlsOptions

logger = logging.getLogger("rollout_client.adapters")

#: Statuses whose tokens and reward a trainer may learn from. Everything else (timeout, cancelled, invalid task,
#: environment/sandbox/backend errors) is a failed sample.
USABLE_STATUSES = frozenset({"completed", "truncated"})

#: Role names of ``rollout.v1.Role`` (the turn spans of a trajectory).
ROLE_ASSISTANT = 3


@dataclass(frozen=True)
class ServiceSettings:
    """Where the rollout service is and how to reach it.

    Read from the trainer's own config where the adapter has one, else from the environment, because trainer workers
    are usually Ray actors whose only shared input is ``runtime_env.env_vars``:
    ``ROLLOUT_TARGETS`` (comma-separated ``host:port`` list), ``ROLLOUT_TOKEN``, ``ROLLOUT_TLS_CA`` (a PEM file),
    ``ROLLOUT_ENVIRONMENT`` (default environment name).
    """

    targets: tuple[str, ...]
    token: str | None = None
    tls_ca_file: str | None = None
    environment: str | None = None
    max_in_flight: int = 1024

    @staticmethod
    def resolve(config: Mapping[str, Any] | None = None) -> ServiceSettings:
        cfg = dict(config or {})
        raw = cfg.get("targets") or os.environ.get("ROLLOUT_TARGETS", "")
        targets = tuple(t.strip() for t in (raw.split(",") if isinstance(raw, str) else raw) if str(t).strip())
        if not targets:
            raise ValueError("rollout service targets: set ROLLOUT_TARGETS (host:port[,host:port...]) or the adapter's 'targets'")
        return ServiceSettings(
            targets=targets,
            token=cfg.get("token") or os.environ.get("ROLLOUT_TOKEN") or None,
            tls_ca_file=cfg.get("tls_ca_file") or os.environ.get("ROLLOUT_TLS_CA") or None,
            environment=cfg.get("environment") or os.environ.get("ROLLOUT_ENVIRONMENT") or None,
            max_in_flight=int(cfg.get("max_in_flight") or 1024),
        )


_clients: dict[tuple[int, ServiceSettings], AsyncRolloutClient] = {}


def shared_client(settings: ServiceSettings) -> AsyncRolloutClient:
    """The process's client for ``settings`` on the running event loop (one stream, shared by every caller).

    Keyed by loop because a gRPC aio channel belongs to the loop that made it; a trainer that runs several loops
    (threads) gets one client per loop.
    """
    loop = asyncio.get_running_loop()
    key = (id(loop), settings)
    client = _clients.get(key)
    if client is None:
        tls = TlsOptions(root_certificates=settings.tls_ca_file) if settings.tls_ca_file else None
        client = AsyncRolloutClient(
            list(settings.targets), token=settings.token, tls=tls, max_in_flight=settings.max_in_flight
        )
        _clients[key] = client
    return client


async def close_shared_clients() -> None:
    """Closes the clients of the running loop (tests, and trainers that shut down cleanly)."""
    loop_id = id(asyncio.get_running_loop())
    for key in [k for k in _coalescers if k[0] == loop_id]:
        del _coalescers[key]
    for key in [k for k in _clients if k[0] == loop_id]:
        await _clients.pop(key).close()


@dataclass
class TaskRequest:
    """One group's TaskSpec, as the adapters build it from a trainer's row."""

    environment: str
    instance: dict[str, Any]
    sampling: dict[str, Any] | None = None
    limits: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None

    def fingerprint(self) -> str:
        """Identifies rows that are the same prompt (used where the trainer gives no group id)."""
        return json.dumps([self.environment, self.instance, self.sampling, self.limits], sort_keys=True, default=str)


@dataclass
class _Pending:
    request: TaskRequest
    waiters: list[asyncio.Future[tuple[Group, int]]] = field(default_factory=list)
    #: The run_group call, once flushed.
    task: asyncio.Future[None] | None = None


class GroupCoalescer:
    """Coalesces per-sample calls that share a group key into one ``run_group`` call (see the module doc).

    ``sample(key, request)`` resolves to ``(group, i)``: the whole group (for group-neutral rewards), its samples
    ordered by sample_index, and the index of the caller's own sample in it. A failure of the call itself (the client
    raising) reaches every caller. A caller that is cancelled gives up its sample; once every caller of a group has,
    the group is not sent, or its ``run_group`` is cancelled (which cancels the task on the server: nobody wants its
    rollouts). One coalescer per event loop (``shared_coalescer``): its futures belong to a loop.
    """

    def __init__(self, client_factory: Callable[[], AsyncRolloutClient]) -> None:
        self._client_factory = client_factory
        self._pending: dict[str, _Pending] = {}
        self._scheduled = False
        self._running: set[asyncio.Future[None]] = set()  # the loop holds tasks weakly: keep them alive here

    async def sample(self, key: str, request: TaskRequest) -> tuple[Group, int]:
        # The key is the trainer's group id, the request what is asked: callers under one key that ask different
        # things (a trainer's fallback id shared by two prompts, e.g. verl's per-source row index without a uid) are
        # different groups, never one whose samples go to rows of another prompt.
        key = f"{key}\x00{request.fingerprint()}"
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[Group, int]] = loop.create_future()
        pending = self._pending.setdefault(key, _Pending(request))
        pending.waiters.append(future)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        try:
            return await future
        except asyncio.CancelledError:
            if all(w.cancelled() for w in pending.waiters):
                if pending.task is None:
                    if self._pending.get(key) is pending:
                        del self._pending[key]  # not flushed yet: never sent
                else:
                    pending.task.cancel()
            raise

    def _flush(self) -> None:
        self._scheduled = False
        batch, self._pending = self._pending, {}
        for pending in batch.values():
            task = asyncio.ensure_future(self._run(pending))
            pending.task = task
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run(self, pending: _Pending) -> None:
        pending.waiters = [w for w in pending.waiters if not w.cancelled()]  # a sample nobody waits for is not drawn
        n = len(pending.waiters)
        r = pending.request
        try:
            group = await self._client_factory().run_group(
                r.environment, r.instance, n, sampling=r.sampling, limits=r.limits, metadata=r.metadata
            )
        except BaseException as error:  # every caller must hear of it, not only the first
            for w in pending.waiters:
                if not w.done():
                    w.set_exception(error)
            if not isinstance(error, Exception):
                raise
            return
        group.samples = sorted(group.samples, key=lambda s: s.sample_index)
        if [s.sample_index for s in group.samples] != list(range(n)):
            error = RuntimeError(f"group {group.group_id}: asked for {n} samples, got indices {[s.sample_index for s in group.samples]}")
            for w in pending.waiters:
                if not w.done():
                    w.set_exception(error)
            return
        for i, w in enumerate(pending.waiters):
            if not w.done():
                w.set_result((group, i))


_coalescers: dict[tuple[int, ServiceSettings], GroupCoalescer] = {}


def shared_coalescer(settings: ServiceSettings) -> GroupCoalescer:
    """The process's coalescer for ``settings`` on the running event loop, over ``shared_client(settings)``."""
    key = (id(asyncio.get_running_loop()), settings)
    coalescer = _coalescers.get(key)
    if coalescer is None:
        coalescer = _coalescers[key] = GroupCoalescer(lambda: shared_client(settings))
    return coalescer


def usable(sample: Sample) -> bool:
    """Whether a trainer may learn from this sample's tokens and reward."""
    return sample.status in USABLE_STATUSES and not sample.is_infra_failure


def neutral_reward(group: Group) -> float:
    """The reward that leaves the group's mean, and so every advantage, where the usable samples put them."""
    rewards = [s.reward for s in group.samples if usable(s)]
    return sum(rewards) / len(rewards) if rewards else 0.0


@dataclass
class Truncated:
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    policy_versions: list[int]
    prompt_cut: int
    response_cut: int


def truncate(sample: Sample, max_prompt: int | None, max_response: int | None) -> Truncated:
    """Cuts a sample to a trainer's fixed widths: the prompt from the left (its end conditions the response), the
    response from the right, keeping ids, mask, logprobs and versions aligned. Cutting never creates or alters a
    token, so every kept token is still exactly what was sampled or rendered. A cut prompt is only a width fix: the
    response was sampled from the whole prompt, so such a sample must not be trained on (see :func:`prompt_cut_error`)."""
    prompt = list(sample.prompt_ids)
    prompt_cut = 0
    if max_prompt is not None and len(prompt) > max_prompt:
        prompt_cut = len(prompt) - max_prompt
        prompt = prompt[prompt_cut:]
    n = len(sample.response_ids)
    keep = n if max_response is None else min(n, max_response)
    versions = list(sample.policy_versions) if sample.policy_versions else [0] * n
    return Truncated(
        prompt_ids=prompt,
        response_ids=list(sample.response_ids[:keep]),
        loss_mask=list(sample.loss_mask[:keep]),
        logprobs=[float(x) for x in sample.logprobs[:keep]],
        policy_versions=list(versions[:keep]),
        prompt_cut=prompt_cut,
        response_cut=n - keep,
    )


def end_on_sampled_token(cut: Truncated) -> Truncated:
    """Drops the environment/template tokens (mask 0) that a right cut left at the end of a response, so that its last
    token is a sampled one; counted in ``response_cut``. Only after a cut (a whole trajectory ends on its last sampled
    turn) and only while a sampled token remains.

    The trainers put a sample's reward on its last response token (verl's ``rm_scores``, SkyRL's float rewards), and
    the estimators that walk the tokens skip mask-0 positions: verl's GAE and REINFORCE++ carry nothing from them, so
    a reward on a trailing tool token is lost and the sample trains as if it had reward 0. GRPO, which sums the
    rewards, does not care. The tokens dropped carry no gradient and no kept token follows them. SkyRL's own generator
    ends its responses the same way (it drops the last observation)."""
    if cut.response_cut == 0 or not any(cut.loss_mask):
        return cut
    keep = len(cut.loss_mask)
    while cut.loss_mask[keep - 1] == 0:
        keep -= 1
    dropped = len(cut.loss_mask) - keep
    if dropped:
        cut.response_ids, cut.loss_mask = cut.response_ids[:keep], cut.loss_mask[:keep]
        cut.logprobs, cut.policy_versions = cut.logprobs[:keep], cut.policy_versions[:keep]
        cut.response_cut += dropped
    return cut


@dataclass(frozen=True)
class Span:
    """A run of the response: ``assistant`` spans were sampled (mask 1), the others are environment/template."""

    assistant: bool
    start: int
    end: int
    policy_version: int


def spans(sample: Sample) -> list[Span]:
    """The trajectory's turn spans, with the pieces of one aborted-and-continued assistant message joined.

    Falls back to runs of equal mask when the sample carries no turns (a raw message without them)."""
    turns = list(getattr(getattr(sample, "raw", None), "turns", []) or [])
    out: list[Span] = []
    if turns:
        for t in turns:
            assistant = int(t.role) == ROLE_ASSISTANT
            if out and assistant and out[-1].assistant and getattr(t, "continues_turn", False) and out[-1].end == t.start:
                out[-1] = Span(True, out[-1].start, int(t.end), out[-1].policy_version)
            elif out and not assistant and not out[-1].assistant and out[-1].end == t.start:
                out[-1] = Span(False, out[-1].start, int(t.end), 0)
            else:
                out.append(Span(assistant, int(t.start), int(t.end), int(getattr(t, "policy_version", 0))))
        return out
    mask = sample.loss_mask
    i = 0
    while i < len(mask):
        j = i
        while j < len(mask) and mask[j] == mask[i]:
            j += 1
        version = sample.policy_versions[i] if mask[i] and sample.policy_versions else 0
        out.append(Span(bool(mask[i]), i, j, int(version)))
        i = j
    return out


def sampled_versions(sample: Sample, keep: int | None = None) -> list[int]:
    """Every policy version that sampled a token of the response's first ``keep`` tokens (all when None), one entry per
    engine call in order: a span's ``policy_version_start`` before its ``policy_version`` when the weights changed
    while its request was in flight (PauseGeneration KEEP), and each piece of an aborted-and-continued turn on its own
    (its pieces can be sampled by different versions). ``Sample.policy_versions`` holds one version per token (the
    span's last), so it alone would hide the older one: staleness read from it would look smaller than it was.

    A ``policy_version_start`` of 0 under a later ``policy_version`` is read as unset (servers older than the field)."""
    end_at = len(sample.response_ids) if keep is None else min(keep, len(sample.response_ids))
    turns = list(getattr(getattr(sample, "raw", None), "turns", []) or [])
    out: list[int] = []
    if turns:
        for t in turns:
            start, end = int(t.start), min(int(t.end), end_at)
            if int(t.role) != ROLE_ASSISTANT or end <= start or not any(sample.loss_mask[start:end]):
                continue
            version, first = int(t.policy_version), int(getattr(t, "policy_version_start", 0) or 0)
            if first and first != version:
                out.append(first)
            out.append(version)
        return out
    return [s.policy_version for s in spans(sample) if s.assistant and s.start < end_at]


def logprobs_mode(sample: Sample) -> str:
    """Which logprobs the sample holds: 'processed' (of the distribution sampled from, what an importance ratio needs),
    'raw' (before temperature/top-p/top-k: equal to processed only at temperature 1 without top-p/top-k), 'mixed'
    (turns from engines of both modes) or 'unspecified' (an engine did not say); see README.md, "Logprobs"."""
    raw = getattr(sample, "raw", None)
    value = int(getattr(raw, "logprobs_mode", 0) or 0) if raw is not None else 0
    try:
        return backend_pb2.LogprobsMode.Name(value)[len("LOGPROBS_MODE_"):].lower()
    except ValueError:  # a mode from a newer server
        return f"mode_{value}"


def pad_token_id(tokenizer: Any) -> int:
    """The token a placeholder or padding position gets: the tokenizer's pad token, else its eos, else 0 (no tokenizer)."""
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None) if tokenizer is not None else None
        if value is not None:
            return int(value)
    return 0


def timing_seconds(sample: Sample, name: str) -> float:
    """A timing figure of the sample in seconds (the service reports milliseconds)."""
    timing = sample.timing or {}
    for key in (f"{name}_ms", name):
        if key in timing:
            return float(timing[key]) / 1000.0
    return 0.0


def prompt_cut_error(cut: Truncated) -> str | None:
    """Why a sample whose prompt had to be cut to the trainer's width cannot be learned from; None when it was not cut.

    The engine sampled the response after the whole prompt; the trainer would score it after the cut one, so its
    log-probabilities (and any importance ratio against the rollout's) belong to another context: an off-policy
    sample that looks on-policy. Masked instead, with the reason in the trainer's logs. (A response cut from the
    right is fine: every kept token still follows exactly the context it was sampled in.)"""
    if cut.prompt_cut == 0:
        return None
    kept = len(cut.prompt_ids)
    return (f"prompt of {kept + cut.prompt_cut} tokens is longer than the trainer's prompt width ({kept}): cut from the"
            " left to fit, its response is masked (it was sampled after the whole prompt); raise the prompt width or"
            " filter long prompts")


def trainable(sample: Sample, cut: Truncated, log: logging.Logger) -> tuple[bool, str | None]:
    """Whether a trainer may learn from ``sample`` as ``cut`` (usable, its prompt not cut), logging why not; and the
    prompt-cut error (:func:`prompt_cut_error`), for the trainer's record of the sample."""
    cut_error = prompt_cut_error(cut)
    if not usable(sample):
        log.warning("rollout sample failed, masked: %s", failure_info(sample))
        return False, cut_error
    if cut_error is not None:
        log.warning("rollout sample not trainable, masked: %s", {**failure_info(sample), "error": cut_error})
        return False, cut_error
    return True, None


def failure_info(sample: Sample) -> dict[str, Any]:
    """What a trainer's logs should say about a sample it cannot learn from."""
    return {
        "task_id": sample.task_id,
        "sample_index": sample.sample_index,
        "status": sample.status,
        "is_infra_failure": bool(sample.is_infra_failure),
        "error": sample.error,
    }


def as_plain(value: Any) -> Any:
    """Trainer rows hold numpy arrays and scalars, OmegaConf containers and the like: make them JSON-able."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): as_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_plain(v) for v in value]
    if hasattr(value, "items") and callable(value.items):
        return {str(k): as_plain(v) for k, v in value.items()}
    return value


def last_user_text(messages: Sequence[Any]) -> str:
    """The text of the last user message of an OpenAI-style chat (the problem statement of single-prompt rows)."""
    for m in reversed(list(messages or [])):
        m = as_plain(m)
        if isinstance(m, Mapping) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    raise ValueError("no user message in the prompt")
