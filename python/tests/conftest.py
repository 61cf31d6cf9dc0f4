"""Fixtures: real Rollout servers (`rollout serve --fake-engine`: the server with the fake vLLM engine, a test double
speaking vLLM's HTTP API, and bubblewrap sandboxes) on 127.0.0.1:0, started from the repository (ROLLOUT_REPO, or the
checkout these tests sit in)."""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Set

import pytest

REPO = Path(os.environ.get("ROLLOUT_REPO") or Path(__file__).resolve().parents[2])


class Server:
    """One `rollout serve --fake-engine` process (its own process group, so kill() takes its sandboxes too)."""

    def __init__(self, latency_ms: int = 1, port: int = 0, extra_args: Optional[List[str]] = None) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="rollout-pyclient-server-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            ["node", str(REPO / "bin" / "rollout.js"), "serve", "--fake-engine", "--fake-latency-ms", str(latency_ms), "--host", "127.0.0.1", "--port", str(port), *(extra_args or [])],
            cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while True:
            text = Path(self.log.name).read_text(errors="replace")
            found = re.search(r"rollout server listening on (\S+)", text)
            if found:
                self.address = found.group(1)
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server did not start:\n{text[-4000:]}")
            time.sleep(0.1)

    def kill(self) -> None:
        """kill -9 of the server's process group: the server, its fake engine and its sandboxes are gone at once."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if not os.path.exists(self.log.name):
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        os.unlink(self.log.name)


@pytest.fixture(scope="session")
def server():
    s = Server(latency_ms=1)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def slow_server():
    """Tokens at 20 ms each: a sample runs for seconds, long enough to break its stream mid-run."""
    s = Server(latency_ms=20)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def stalled_server():
    """Tokens at 10 minutes each: a sample never ends on its own within a test, so a cancel always finds it running
    (at 20 ms per token, a busy machine could let the samples finish before the cancel reached the server)."""
    s = Server(latency_ms=600_000)
    yield s
    s.stop()


class Proxy:
    """A TCP proxy in front of a server whose connections the test can cut (a broken network, the server alive)."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.writers: Set[asyncio.StreamWriter] = set()
        self.cuts = 0
        self._server: Optional[asyncio.AbstractServer] = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self.writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self.writers.difference_update((writer, up_writer))

    def cut(self) -> None:
        """Resets every connection through the proxy (new ones are still accepted)."""
        self.cuts += 1
        for w in list(self.writers):
            w.transport.abort()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def paused_server(tmp_path, latency_ms: int = 1) -> Server:
    """A server whose sessions pause delivery at their first unacked trajectory (sessions.maxUnackedBytes 1)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"sessions": {"maxUnackedBytes": 1}}))
    return Server(latency_ms=latency_ms, extra_args=["--config", str(config)])


async def until(predicate, what: str, timeout: float = 30.0) -> None:
    """Waits (polling every 10 ms) until predicate() is true; fails the test after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"never: {what}"
        await asyncio.sleep(0.01)


async def take_groups(client) -> list:
    """Every group client.groups() hands out until it is idle."""
    return [g async for g in client.groups()]


def math_instance(i: int) -> dict:
    a, b = 7 + i % 50, 3 + i % 17
    return {"problem": f"What is {a} + {b}?", "answer": str(a + b)}


def check_sample(s) -> List[str]:
    """The invariants a trainer relies on; returns the violations."""
    out = []
    n = len(s.response_ids)
    if not (n == len(s.loss_mask) == len(s.logprobs) == len(s.policy_versions)):
        out.append(f"lengths {n}/{len(s.loss_mask)}/{len(s.logprobs)}/{len(s.policy_versions)}")
    for i, (m, lp) in enumerate(zip(s.loss_mask, s.logprobs)):
        if m == 0 and (lp != 0.0 or s.policy_versions[i] != 0):
            out.append(f"token {i}: mask 0 with logprob {lp} / version {s.policy_versions[i]}")
        if m == 1 and lp > 0.0:
            out.append(f"token {i}: logprob {lp} > 0")
    if s.ok and (not s.prompt_ids or 1 not in s.loss_mask):
        out.append("policy outcome without prompt or sampled tokens")
    return out
