"""Example trainer loop over the generated Python stubs (gen/python).

Opens one Rollout stream, submits GRPO groups of math tasks (plus one deliberately invalid spec), receives every
trajectory as it finishes, acks it, checks the trajectory invariants a trainer relies on, and prints a JSON
summary as its last line. Exits non-zero when anything is missing, duplicated or inconsistent.

    .venv/bin/python examples/python/train_loop.py --target 127.0.0.1:50051 --groups 4 --group-size 4

Against a server with a bearer token and TLS (mTLS when the server asks for a client certificate):

    ROLLOUT_TOKEN=... .venv/bin/python examples/python/train_loop.py --target host:50051 --ca ca.pem \
        [--client-cert client.pem --client-key client.key]

The token comes from --token-file or the ROLLOUT_TOKEN environment variable, never from a command-line literal
(which any user can read in the process list).
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import random
import sys
from collections import Counter, defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "gen", "python"))

import grpc  # noqa: E402
from google.protobuf import struct_pb2  # noqa: E402
from rollout.v1 import rollout_pb2, rollout_pb2_grpc  # noqa: E402

OK_STATUSES = {rollout_pb2.TRAJECTORY_STATUS_COMPLETED, rollout_pb2.TRAJECTORY_STATUS_TRUNCATED}


def math_task(task_id: str, group_size: int, rng: random.Random) -> rollout_pb2.TaskSpec:
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(1, 50)
    instance = struct_pb2.Struct()
    instance.update({"problem": f"What is {a} * {b} + {c}?", "answer": str(a * b + c)})
    return rollout_pb2.TaskSpec(
        task_id=task_id,
        group_id=f"group-{task_id}",
        num_samples=group_size,
        environment="math",
        instance=instance,
        sampling=rollout_pb2.SamplingParams(temperature=1.0, seed=rng.randint(0, 1 << 30), max_tokens_per_turn=256),
        limits=rollout_pb2.TaskLimits(max_turns=4),
        metadata={"source": "examples/python"},
    )


def check_invariants(t: rollout_pb2.Trajectory) -> list[str]:
    """What a trainer assumes of every trajectory; returns the violations."""
    problems = []
    n = len(t.response_token_ids)
    if not (n == len(t.response_mask) == len(t.response_logprobs)):
        problems.append(f"lengths differ: ids {n}, mask {len(t.response_mask)}, logprobs {len(t.response_logprobs)}")
    for i, (m, lp) in enumerate(zip(t.response_mask, t.response_logprobs)):
        if m not in (0, 1):
            problems.append(f"mask[{i}] = {m}")
        if m == 0 and lp != 0.0:
            problems.append(f"logprob[{i}] = {lp} where mask is 0")
        if m == 1 and lp > 0.0:
            problems.append(f"logprob[{i}] = {lp} > 0")
    position = 0
    for turn in t.turns:
        if turn.start != position or turn.end < turn.start:
            problems.append(f"turns do not tile: [{turn.start}, {turn.end}) after {position}")
        want = 1 if turn.role == rollout_pb2.ROLE_ASSISTANT else 0
        if any(t.response_mask[i] != want for i in range(turn.start, min(turn.end, n))):
            problems.append(f"turn [{turn.start}, {turn.end}) role {turn.role} has mask != {want}")
        position = turn.end
    if position != n:
        problems.append(f"turns end at {position}, response has {n} tokens")
    if t.status in OK_STATUSES and not t.prompt_token_ids:
        problems.append("empty prompt")
    return problems


def read_file(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def open_channel(args: argparse.Namespace) -> grpc.Channel:
    """Plaintext, or TLS trusting --ca (with a client certificate when given)."""
    if args.ca is None and args.client_cert is None:
        return grpc.insecure_channel(args.target)
    if (args.client_cert is None) != (args.client_key is None):
        raise SystemExit("--client-cert and --client-key go together")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=read_file(args.ca),
        private_key=read_file(args.client_key),
        certificate_chain=read_file(args.client_cert),
    )
    return grpc.secure_channel(args.target, credentials)


def auth_metadata(args: argparse.Namespace) -> list[tuple[str, str]]:
    """`authorization: Bearer <token>` on every call (as metadata, so it works over plaintext too)."""
    token = read_file(args.token_file).decode().strip() if args.token_file else os.environ.get("ROLLOUT_TOKEN")
    return [("authorization", f"Bearer {token}")] if token else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--token-file", help="file holding the RolloutService bearer token (default: $ROLLOUT_TOKEN)")
    parser.add_argument("--ca", help="PEM CA of the server's certificate: connect with TLS")
    parser.add_argument("--client-cert", help="PEM client certificate, for a server that requires one (mTLS)")
    parser.add_argument("--client-key", help="PEM key of --client-cert")
    args = parser.parse_args()
    rng = random.Random(args.seed)

    channel = open_channel(args)
    grpc.channel_ready_future(channel).result(timeout=30)
    stub = rollout_pb2_grpc.RolloutServiceStub(channel)

    outgoing: queue.Queue = queue.Queue()

    def requests():
        while True:
            item = outgoing.get()
            if item is None:
                return
            yield item

    tasks = {f"py-{args.seed}-{g}": math_task(f"py-{args.seed}-{g}", args.group_size, rng) for g in range(args.groups)}
    invalid = rollout_pb2.TaskSpec(task_id=f"py-{args.seed}-invalid", environment="math", num_samples=0)
    outgoing.put(rollout_pb2.RolloutRequest(open=rollout_pb2.OpenSession(session_id=f"python-example-{args.seed}")))
    for spec in tasks.values():
        outgoing.put(rollout_pb2.RolloutRequest(task=spec))
    outgoing.put(rollout_pb2.RolloutRequest(task=invalid))

    answered: set[str] = set()
    accepted: dict[str, int] = {}
    rejected: dict[str, tuple[str, str]] = {}
    received: Counter = Counter()
    by_group: dict[str, list[rollout_pb2.Trajectory]] = defaultdict(list)
    violations: list[str] = []
    closed = False

    responses = stub.Rollout(requests(), timeout=args.timeout, metadata=auth_metadata(args))
    for response in responses:
        kind = response.WhichOneof("kind")
        if kind == "accepted":
            accepted[response.accepted.task_id] = response.accepted.num_samples
            answered.add(response.accepted.task_id)
        elif kind == "rejected":
            rejected[response.rejected.task_id] = (response.rejected.field, response.rejected.reason)
            answered.add(response.rejected.task_id)
        elif kind == "trajectory":
            t = response.trajectory
            received[(t.task_id, t.sample_index)] += 1
            by_group[t.group_id].append(t)
            violations += [f"{t.task_id}#{t.sample_index}: {p}" for p in check_invariants(t)]
            outgoing.put(rollout_pb2.RolloutRequest(ack=rollout_pb2.Ack(trajectories=[rollout_pb2.TrajectoryRef(task_id=t.task_id, sample_index=t.sample_index)])))
        expected = sum(accepted.values())
        if not closed and len(answered) == len(tasks) + 1 and len(received) >= expected:
            outgoing.put(None)  # half-close: the server ends the stream after the last trajectory
            closed = True

    missing = [(tid, i) for tid, n in accepted.items() for i in range(n) if received[(tid, i)] == 0]
    duplicated = [k for k, c in received.items() if c > 1]
    for gid, group in by_group.items():
        indices = sorted(t.sample_index for t in group)
        if indices != list(range(len(group))):
            violations.append(f"group {gid}: sample indices {indices}")
    statuses = Counter(rollout_pb2.TrajectoryStatus.Name(t.status) for g in by_group.values() for t in g)
    rewards = {gid: [t.reward for t in sorted(g, key=lambda t: t.sample_index)] for gid, g in by_group.items()}
    summary = {
        "accepted": len(accepted),
        "rejected": {tid: {"field": f, "reason": r} for tid, (f, r) in rejected.items()},
        "trajectories": sum(received.values()),
        "expected": sum(accepted.values()),
        "missing": len(missing),
        "duplicated": len(duplicated),
        "violations": violations[:20],
        "statuses": dict(statuses),
        "rewards": rewards,
    }
    print(json.dumps(summary))
    ok = not missing and not duplicated and not violations and invalid.task_id in rejected and len(accepted) == len(tasks)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
