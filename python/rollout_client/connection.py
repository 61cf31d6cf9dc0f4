"""One server address: a channel and this client's Rollout stream on it, kept open across broken connections.

A broken stream is re-opened with OpenSession(resume=true) and the same session id: the server then re-sends every
trajectory not acked, and the samples still running arrive on the new stream. Task specs the server had not answered
and cancels not known to have arrived are sent again (the server is idempotent on task_id). When the session is gone
(NOT_FOUND: the server restarted, or the session outlived its resume window) the session is opened afresh and every
unfinished task is submitted again. A server that stays unreachable for `failover_after` seconds while another one
is up is declared lost: the client moves its unfinished tasks elsewhere (see AsyncRolloutClient).
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import grpc
import grpc.aio

from rollout.v1 import rollout_pb2, rollout_pb2_grpc

from .tls import TlsOptions

if TYPE_CHECKING:
    from .client import AsyncRolloutClient, _Task

log = logging.getLogger("rollout_client.connection")

#: Trajectories can be large (long agent transcripts); grpc's 4 MiB default would break the stream on one of them.
_DEFAULT_OPTIONS: List[Tuple[str, Any]] = [("grpc.max_receive_message_length", 256 << 20)]


class _StreamEnded(Exception):
    """The server ended the stream without an error (e.g. it is shutting down)."""


class Connection:
    def __init__(
        self,
        target: str,
        client: "AsyncRolloutClient",
        *,
        session_id: str,
        metadata: Sequence[Tuple[str, str]],
        tls: Optional[TlsOptions],
        channel_options: Sequence[Tuple[str, Any]],
        failover_after: float,
    ) -> None:
        self.target = target
        self.session_id = session_id
        self._client = client
        self._metadata = tuple(metadata)
        self._tls = tls
        self._channel_options = list(_DEFAULT_OPTIONS) + list(channel_options) + (tls.channel_options() if tls else [])
        self._failover_after = failover_after
        #: Unfinished tasks this server runs for us, by task id.
        self.tasks: Dict[str, "_Task"] = {}
        self._outbox: "asyncio.Queue[Any]" = asyncio.Queue()
        self.connected = asyncio.Event()
        #: Declared lost (its tasks moved elsewhere); it keeps reconnecting and takes new tasks again once back.
        self.dead = False
        self._closing = False
        self._opened_once = False
        self._resend_all = False
        self._call: Optional[Any] = None
        self._runner: Optional["asyncio.Task[None]"] = None
        self.stats = {"reconnects": 0, "redelivered": 0, "sessions_lost": 0}

    # -- what the client calls ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._runner = asyncio.ensure_future(self._run())

    @property
    def load(self) -> int:
        """Samples this server still owes us: the routing key (least loaded first)."""
        return sum(t.num_samples - len(t.samples) for t in self.tasks.values())

    def assign(self, task: "_Task") -> None:
        self.tasks[task.task_id] = task
        task.conn = self
        task.answered = False
        self._outbox.put_nowait(rollout_pb2.RolloutRequest(task=task.spec))

    def cancel(self, task_id: str) -> None:
        self._outbox.put_nowait(rollout_pb2.RolloutRequest(cancel=rollout_pb2.CancelTask(task_id=task_id)))

    def ack(self, refs: List[Tuple[str, int]]) -> None:
        if refs and not self._closing:
            ack = rollout_pb2.Ack(trajectories=[rollout_pb2.TrajectoryRef(task_id=t, sample_index=i) for t, i in refs])
            self._outbox.put_nowait(rollout_pb2.RolloutRequest(ack=ack))

    async def close(self, grace: float = 1.0) -> None:
        """Ends the stream: sends what is queued (acks, cancels), half-closes, and drops the call after `grace`."""
        self._closing = True
        self._outbox.put_nowait(None)
        if self._runner is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._runner), grace)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - closing: whatever the stream did, drop it
                pass
            if self._call is not None:
                self._call.cancel()
            self._runner.cancel()
            try:
                await self._runner
            except BaseException:  # noqa: BLE001
                pass

    # -- the stream --------------------------------------------------------------------------------------------

    def _channel(self) -> grpc.aio.Channel:
        if self._tls is not None:
            return grpc.aio.secure_channel(self.target, self._tls.credentials(), options=self._channel_options)
        return grpc.aio.insecure_channel(self.target, options=self._channel_options)

    async def _run(self) -> None:
        channel = self._channel()
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        loop = asyncio.get_running_loop()
        failing_since: Optional[float] = None
        backoff = 0.05
        try:
            while not self._closing:
                resume = self._opened_once and not self._resend_all
                try:
                    await self._attach(stub, resume)
                    if self._closing:
                        return
                    raise _StreamEnded()
                except grpc.aio.AioRpcError as err:
                    if self._closing:
                        return
                    if err.code() == grpc.StatusCode.NOT_FOUND and resume:
                        # The server no longer knows the session: open it afresh and submit every unfinished task again.
                        log.warning("%s: session %s is gone (%s); re-submitting %d tasks", self.target, self.session_id, err.details(), len(self.tasks))
                        self.stats["sessions_lost"] += 1
                        self._resend_all = True
                        continue
                    if err.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                        self._client._on_fatal(self, err)
                        return
                    log.info("%s: stream broke (%s: %s)", self.target, err.code().name, err.details())
                except _StreamEnded:
                    log.info("%s: the server ended the stream", self.target)
                finally:
                    self.connected.clear()
                    self._call = None
                if self._closing:
                    return
                if self._opened_at is not None:
                    failing_since, backoff = None, 0.05
                    self._opened_at = None
                now = loop.time()
                failing_since = now if failing_since is None else failing_since
                if not self.dead and now - failing_since >= self._failover_after and self._client._has_live_peer(self):
                    self.dead = True
                    log.warning("%s: unreachable for %.1f s; moving its tasks to the other servers", self.target, now - failing_since)
                    self._client._failover(self)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                self.stats["reconnects"] += 1
        finally:
            await channel.close(None)

    _opened_at: Optional[float] = None

    async def _attach(self, stub: Any, resume: bool) -> None:
        call = stub.Rollout(metadata=self._metadata)
        self._call = call
        try:
            await self._stream(call, resume)
        finally:
            call.cancel()  # a no-op once the call ended; otherwise the server would keep the session attached to it

    async def _stream(self, call: Any, resume: bool) -> None:
        await call.write(rollout_pb2.RolloutRequest(open=rollout_pb2.OpenSession(session_id=self.session_id, resume=resume)))
        while True:
            # A resumed session's re-sent trajectories may come before SessionOpened: they are ours, take them.
            first = await call.read()
            if first is grpc.aio.EOF:
                raise _StreamEnded()
            if first.WhichOneof("kind") == "opened":
                break
            self._dispatch(first)
        self.session_id = first.opened.session_id or self.session_id
        self.stats["redelivered"] += first.opened.redelivered
        self._opened_at = asyncio.get_running_loop().time()
        if self.dead:
            log.info("%s: back; taking new tasks again", self.target)
            self.dead = False
        resend_all, self._resend_all, self._opened_once = self._resend_all, False, True
        # What this server may not have: specs it never answered (all of them when the session is new), and cancels.
        resend: List[Any] = []
        for task in self.tasks.values():
            if resend_all or not task.answered:
                resend.append(rollout_pb2.RolloutRequest(task=task.spec))
            if task.cancel_requested:
                resend.append(rollout_pb2.RolloutRequest(cancel=rollout_pb2.CancelTask(task_id=task.task_id)))
        self.connected.set()
        writer = asyncio.ensure_future(self._write(call, resend))
        try:
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    return
                self._dispatch(response)
        finally:
            writer.cancel()

    async def _write(self, call: Any, resend: List[Any]) -> None:
        for request in resend:
            await call.write(request)
        while True:
            request = await self._outbox.get()
            if request is None:  # close(): nothing more to send
                await call.done_writing()
                return
            await call.write(request)

    def _dispatch(self, response: Any) -> None:
        kind = response.WhichOneof("kind")
        if kind == "trajectory":
            self._client._on_trajectory(self, response.trajectory)
        elif kind == "accepted":
            task = self.tasks.get(response.accepted.task_id)
            if task is not None:
                task.answered = True
                self._client._on_accepted(task, response.accepted.num_samples)
        elif kind == "rejected":
            task = self.tasks.get(response.rejected.task_id)
            if task is not None:
                self._client._on_rejected(task, response.rejected.field, response.rejected.reason)
