"""Typed results: one Sample per trajectory, one Group per task (its num_samples samples)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List

from rollout.v1 import rollout_pb2

#: Statuses whose reward is the policy's outcome: the agent ran to an end (or to its turn/token budget) and was graded.
POLICY_OUTCOMES = frozenset({"completed", "truncated"})

_TIMING_FIELDS = ("queue_ms", "init_ms", "run_ms", "llm_ms", "tool_ms", "eval_ms", "total_ms")


#: Client-side status of a trajectory that breaks the invariants below (see malformed()): never training data.
MALFORMED = "malformed"


#: How far above 0 a sampled token's logprob may be (float noise; the server's engine-answer check allows the same).
_LOGPROB_TOLERANCE = 1e-4


def malformed(t: Any) -> str:
    """Why a policy-outcome trajectory cannot be trained on as sent ("" when it can).

    The server checks the same invariants before sending; this is the trainer's last line against a faulty or
    mismatched server: a batch cannot tell a NaN reward (which makes every advantage of its group NaN) or a mask
    shifted by one token from good data.
    """
    n = len(t.response_token_ids)
    if not (n == len(t.response_mask) == len(t.response_logprobs)):
        return f"lengths differ: {n} response ids, {len(t.response_mask)} mask entries, {len(t.response_logprobs)} logprobs"
    if not math.isfinite(t.reward):
        return f"reward is not finite: {t.reward}"
    if not set(t.response_mask) <= {0, 1}:
        return "mask holds values other than 0 and 1"
    if not all(map(math.isfinite, t.response_logprobs)):
        return "a logprob is not finite"
    for i, (m, lp) in enumerate(zip(t.response_mask, t.response_logprobs)):
        # The contract: a sampled token's logprob is a log-probability (<= 0; the server allows 1e-4 of float noise),
        # and a template or environment token's is 0. Else a PPO ratio would be computed from a number no policy gave.
        if m == 1 and lp > _LOGPROB_TOLERANCE:
            return f"logprob of sampled token {i} is positive: {lp}"
        if m == 0 and lp != 0:
            return f"logprob of masked token {i} is {lp}, not 0"
    if t.turns:
        at = 0
        for turn in t.turns:
            if turn.start != at or turn.end < turn.start:
                return f"turns do not tile the response: a turn spans [{turn.start}, {turn.end}) after position {at}"
            want = 1 if turn.role == rollout_pb2.ROLE_ASSISTANT else 0
            # An empty span is legal (an engine call aborted before its first token).
            if turn.end > turn.start and set(t.response_mask[turn.start:turn.end]) != {want}:
                return f"turns disagree with the mask: [{turn.start}, {turn.end}) is {'an assistant' if want else 'a non-assistant'} turn"
            at = turn.end
        if at != n:
            return f"turns do not tile the response: they end at {at} of {n}"
    return ""


def status_name(status: int) -> str:
    """TRAJECTORY_STATUS_BACKEND_ERROR -> 'backend_error' (unknown numbers from a newer server -> 'status_<n>')."""
    try:
        return rollout_pb2.TrajectoryStatus.Name(status)[len("TRAJECTORY_STATUS_"):].lower()
    except ValueError:
        return f"status_{status}"


@dataclass
class Sample:
    """One trajectory as a trainer reads it.

    Invariants (checked by the server, kept here): len(response_ids) == len(loss_mask) == len(logprobs) ==
    len(policy_versions); loss_mask is 1 exactly on tokens the engine sampled, whose logprob and policy version are
    the engine's; template and environment tokens have mask 0, logprob 0 and policy version 0.
    A sample with is_infra_failure=True carries no policy outcome: its reward is meaningless, never a 0 to train on.
    A completed/truncated trajectory that breaks those invariants or has a non-finite reward arrives as status
    'malformed' (a failure; ``error`` says what was wrong and the status the server sent).
    """

    task_id: str
    sample_index: int
    group_id: str
    prompt_ids: List[int]
    response_ids: List[int]
    loss_mask: List[int]
    logprobs: List[float]
    policy_versions: List[int]
    reward: float
    status: str
    is_infra_failure: bool
    finish_reason: str
    num_turns: int
    error: str
    timing: Dict[str, float]
    stale: bool
    raw: Any = field(repr=False, default=None)

    @classmethod
    def from_proto(cls, t: Any) -> "Sample":
        mask = list(t.response_mask)
        versions = [0] * len(mask)
        # An assistant span's tokens were sampled by its turn's policy version (policy_version_start differs only when
        # the weights changed mid-request; the span's last version is then the one that finished it). Each token is
        # looked at once, from where the turns before ended: turns that tile the response (all a sound server sends)
        # are read the same, and a faulty server's overlapping ones (malformed below) cost no more than the message,
        # where N turns each over all N tokens were N x N steps on the client's event loop.
        at = 0
        for turn in t.turns:
            start, end = max(turn.start, at), min(turn.end, len(mask))
            if turn.role == rollout_pb2.ROLE_ASSISTANT:
                for i in range(start, end):
                    if mask[i] == 1:
                        versions[i] = int(turn.policy_version)
            at = max(at, end)
        status = status_name(t.status)
        error = t.error
        if status in POLICY_OUTCOMES:
            why = malformed(t)
            if why:
                status, error = MALFORMED, f"malformed trajectory (sent as {status}): {why}"
        return cls(
            task_id=t.task_id,
            sample_index=t.sample_index,
            group_id=t.group_id,
            prompt_ids=list(t.prompt_token_ids),
            response_ids=list(t.response_token_ids),
            loss_mask=mask,
            logprobs=list(t.response_logprobs),
            policy_versions=versions,
            reward=float(t.reward),
            status=status,
            is_infra_failure=status not in POLICY_OUTCOMES,
            finish_reason=t.finish_reason,
            num_turns=t.num_turns,
            error=error,
            timing={name: getattr(t.timing, name) for name in _TIMING_FIELDS},
            stale=t.stale,
            raw=t,
        )

    @property
    def ok(self) -> bool:
        """The reward is the policy's outcome (completed or truncated)."""
        return not self.is_infra_failure


@dataclass
class Group:
    """The samples of one task (a GRPO group), ordered by sample_index."""

    task_id: str
    group_id: str
    samples: List[Sample]

    @property
    def ok(self) -> List[Sample]:
        """Samples whose reward is a policy outcome."""
        return [s for s in self.samples if not s.is_infra_failure]

    @property
    def failed(self) -> List[Sample]:
        """Samples that ended in an infrastructure failure, a cancel, a timeout or an invalid task: not training data."""
        return [s for s in self.samples if s.is_infra_failure]

    @property
    def rewards(self) -> List[float]:
        """Rewards of the policy-outcome samples (failed samples have none)."""
        return [s.reward for s in self.ok]
