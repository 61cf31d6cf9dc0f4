"""One server address: a channel and this client's Rollout stream on it, kept open across broken connections.

A broken stream is re-opened with OpenSession(resume=true) and the same session id: the server then re-sends every
trajectory not acked, and the samples still running arrive on the new stream. Task specs the server had not answered
and cancels not known to have arrived are sent again (the server is idempotent on task_id; a spec the session had
accepted already is answered `already_owed`, which needs no bookkeeping here: the client counts samples per task).
When the session is gone (NOT_FOUND: the server restarted, or the session outlived its resume window) the session is
opened afresh and every unfinished task is submitted again. A server that stays unreachable for `failover_after`
seconds while another one is up is declared lost: the client moves its unfinished tasks elsewhere (see
AsyncRolloutClient).

What a re-open would meet again is not retried. A status no retry changes (a bad token, no such service, ...) fails
the client, and so does ABORTED: another client resumed this session (SessionTakenOverError), and resuming it back
would have the two evict each other for ever. A stream that ended on a message over a size limit fails the task specs
over it (TaskTooLargeError), since they would end every stream they were re-sent on, and the stream is re-opened for
the others; a trajectory over this channel's receive limit (re-sent on every resume) fails the client. A message
this client cannot decode breaks the stream, re-opened at most _UNDECODABLE_RETRIES times in a row; the next such one,
or at once a failure while handling a message, ends this server's runner: with other servers left it
alone is lost for good (its tasks moved to them), else the client fails (see _run). A resume answered with another
session id is the session gone (as NOT_FOUND); a fresh open answered so, a faulty server (as an undecodable message).
Any other status is a broken stream, re-opened: RESOURCE_EXHAUSTED that names no size limit among them (the server
ended or reset a stream whose client took nothing for its sessions.stalledMs, "Bandwidth exhausted or memory limit
exceeded"), and a call this client cancelled itself (see _writer_done).

A dead peer that sends no RST (a host that vanished, a silently dropped NAT entry) is found by HTTP/2 keepalive
pings: without them the stream would wait forever and failover would never fire. The failover clock runs on its own
timer, so a reconnect attempt that hangs (a black-holed address) does not stop it either.
"""
from __future__ import annotations

import asyncio
import logging
import re
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import grpc
import grpc.aio

from rollout.v1 import rollout_pb2, rollout_pb2_grpc

from .errors import RolloutClientError, SessionTakenOverError, TaskTooLargeError
from .tls import TlsOptions

if TYPE_CHECKING:
    from .client import AsyncRolloutClient, _Task

log = logging.getLogger("rollout_client.connection")

#: Trajectories can be large (long agent transcripts); grpc's 4 MiB default would break the stream on one of them.
_DEFAULT_OPTIONS: List[Tuple[str, Any]] = [("grpc.max_receive_message_length", 256 << 20)]

#: Stream statuses that the same request will get again: retrying would hide a configuration error forever.
#: ALREADY_EXISTS answers a fresh open of a session id another stream holds (two trainers with one session_id);
#: a resume never gets it (it takes the session over), so it is fatal only when the open was not a resume.
#: ABORTED (handled apart, as SessionTakenOverError) is how the server ends a stream whose session another stream
#: resumed; it sends ABORTED on a Rollout stream for nothing else (src/contract/rollout-service.ts: evict).
_FATAL = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.INVALID_ARGUMENT})

#: What grpc says when a message is over a size limit: "[CLIENT: ]Sent|Received message larger than max (N vs[.] M)",
#: from grpc core (this client's channel: "vs.", and "CLIENT: " in newer grpcio) or grpc-js (the server's transport: "vs").
_TOO_LARGE = re.compile(r"(CLIENT: )?(Sent|Received) message larger than max \((\d+) vs\.? (\d+)\)")

#: A broken stream is reported at WARNING when it starts failing, when its status changes, and then at most this often.
_WARN_EVERY = 30.0

#: Seconds a call whose write failed gets to end with its own status before it is cancelled (see _writer_done).
_WRITE_FAILED_GRACE = 1.0

#: The details of the status grpcio sets on a call when a batch of it fails, before core's own status replaces it.
_CORE_PLACEHOLDER = "Internal error from Core"

#: How often _final_status looks again for core's status while the call still shows the placeholder.
_STATUS_POLL = 0.005

#: A flood of DeliveryPaused notices (a faulty server's, or a real one pausing and resuming at every ack while it
#: releases held samples) runs the client's pause scan (every task, every unacked sample) at most once per this many
#: seconds per server: the first notice at once, the others of a burst by one scan at its end (see _pause_scan).
_PAUSE_SCAN_EVERY = 0.1

#: A stream that ends on a message the client cannot decode is re-opened (resumed, with the backoff of any broken
#: stream) this many times in a row before the server is lost for good: bytes garbled once (a bug in a server's encoder
#: that does not repeat, a proxy's fault) cost a resume, not the server; the same undecodable trajectory, which the
#: server re-sends on every resume, fails it after _UNDECODABLE_RETRIES + 1 streams instead of re-opening for ever.
#: "In a row": no other kind of break in between, and no stream that stayed open _UNDECODABLE_FRESH_AFTER seconds.
_UNDECODABLE_RETRIES = 2
_UNDECODABLE_FRESH_AFTER = 30.0

#: Acks wait this long for others to go with them (a consumer acks one sample at a time): one Ack message per stream per
#: interval at most, whatever the rate. Sent at once when the server has paused delivery (it waits for them).
_ACK_DELAY = 0.02


def keepalive_options(keepalive_time: Optional[float], keepalive_timeout: float) -> List[Tuple[str, Any]]:
    """grpc channel options for HTTP/2 keepalive pings every `keepalive_time` seconds (None or 0: off), the connection
    being dropped when a ping is not answered within `keepalive_timeout`. Pings go out with no call open and without
    data frames in between (a stream that waits minutes for a long sample sends nothing): the server (grpc-js) does
    not police client pings."""
    if not keepalive_time:
        return []
    return [
        ("grpc.keepalive_time_ms", max(1, int(keepalive_time * 1000))),
        ("grpc.keepalive_timeout_ms", max(1, int(keepalive_timeout * 1000))),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # Newer grpc cores (1.85) time the keepalive ping out by this one and no longer by keepalive_timeout_ms.
        ("grpc.http2.ping_timeout_ms", max(1, int(keepalive_timeout * 1000))),
    ]


def _limit(value: Any) -> Optional[int]:
    """A grpc message size option as a bound in bytes; None when unlimited (-1) or not set."""
    return None if value is None or int(value) < 0 else int(value)


def task_request_size(spec: Any) -> int:
    """Bytes of RolloutRequest(task=spec) on the wire (what a channel's message size limit counts), without copying
    the spec: the field's tag, its length as a varint, the spec."""
    n = spec.ByteSize()
    return 1 + max(1, (n.bit_length() + 6) // 7) + n


#: The most entries one Ack may list when the server does not say (a server older than the `rollout-max-ack-entries`
#: response header): the protocol's bound, which a server may only lower (it refuses a larger ack whole).
DEFAULT_MAX_ACK_ENTRIES = 65_536

_DIGITS = re.compile(r"[0-9]{1,15}")


def max_ack_entries_of(metadata: Optional[Iterable[Tuple[str, Any]]]) -> int:
    """The per-Ack bound a Rollout stream's response headers advertise (`rollout-max-ack-entries`). Missing, garbage or
    not positive: DEFAULT_MAX_ACK_ENTRIES (acking must go on whatever a server sends; a 0 taken at its word would split
    acks into nothing). Repeated: the smallest."""
    found = [int(v) for k, v in (metadata or ()) if k == "rollout-max-ack-entries" and isinstance(v, str) and _DIGITS.fullmatch(v)]
    positive = [n for n in found if n > 0]
    return min(positive) if positive else DEFAULT_MAX_ACK_ENTRIES


def _ack_requests(refs: List[Tuple[str, int]], limit: Optional[int], max_entries: int = DEFAULT_MAX_ACK_ENTRIES) -> List[Any]:
    """Ack messages for refs, each of at most `max_entries` refs and under `limit` bytes: a burst of acks (the
    trajectories a resume re-sends arrive together) must not make one message the channel refuses, which would end
    the stream and lose the acks with it, nor one the server refuses."""
    if len(refs) > max_entries:
        return [r for i in range(0, len(refs), max_entries) for r in _ack_requests(refs[i : i + max_entries], limit, max_entries)]
    request = rollout_pb2.RolloutRequest(ack=rollout_pb2.Ack(trajectories=[rollout_pb2.TrajectoryRef(task_id=t, sample_index=i) for t, i in refs]))
    if limit is None or len(refs) <= 1 or request.ByteSize() <= limit:
        return [request]
    half = len(refs) // 2
    return _ack_requests(refs[:half], limit, max_entries) + _ack_requests(refs[half:], limit, max_entries)


class _Acks:
    """Refs to ack, queued in the outbox as they are: split into Ack messages when written, by the bound of the
    stream they go out on (a re-opened stream may reach a server configured otherwise)."""

    def __init__(self, refs: List[Tuple[str, int]]) -> None:
        self.refs = refs


async def _final_status(call: Any, err: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
    """The status the call ended with, when `err` hides it: grpcio >= 1.68 raises a failed batch (a write the channel
    refused, and a read pending meanwhile) as INTERNAL "Internal error from Core", while the call's own status says
    what happened (e.g. RESOURCE_EXHAUSTED "Sent message larger than max"), which decides what is retried.

    The call's status is not final when first set: the failed write itself sets that same INTERNAL status
    (set_internal_error), and core's real status, delivered a few loop turns later, overwrites it. Read at once, the
    status can still be the placeholder (seen under CI load: the too-big spec was then re-sent on the re-opened
    stream and broke it a second time). So it is read until it is not the placeholder, for at most
    _WRITE_FAILED_GRACE seconds (a call whose real status is INTERNAL too costs that wait, once)."""
    if err.code() != grpc.StatusCode.INTERNAL:
        return err
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _WRITE_FAILED_GRACE
    try:
        while True:
            code = await asyncio.wait_for(call.code(), max(0.0, deadline - loop.time()))
            if code is not None and code != grpc.StatusCode.INTERNAL:
                return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), await call.trailing_metadata(), await call.details(), err.debug_error_string())
            if code is None or await call.details() != _CORE_PLACEHOLDER or loop.time() >= deadline:
                return err
            await asyncio.sleep(_STATUS_POLL)
    except (asyncio.TimeoutError, grpc.RpcError):
        return err


class _StreamEnded(Exception):
    """The server ended the stream without an error (e.g. it is shutting down)."""


class _Undecodable(RolloutClientError):
    """A message of the stream could not be decoded (see Connection._read): a broken stream, re-opened a bounded number
    of times (see _UNDECODABLE_RETRIES)."""


class _SessionGone(Exception):
    """A resume answered with another session than the one asked for: the server no longer has ours (as NOT_FOUND)."""


def _task_of(request: Any) -> Optional[str]:
    """The task id a queued spec or cancel is about (None for acks and the close marker)."""
    if request is None or isinstance(request, _Acks):
        return None
    kind = request.WhichOneof("kind")
    if kind == "task":
        return request.task.task_id
    if kind == "cancel":
        return request.cancel.task_id
    return None


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
        keepalive_time: Optional[float] = 30.0,
        keepalive_timeout: float = 10.0,
        resume: bool = False,
    ) -> None:
        self.target = target
        #: The first open resumes the session too (a process taking over a predecessor's session id).
        self._resume_first = resume
        self.session_id = session_id
        self._client = client
        self._metadata = tuple(metadata)
        self._tls = tls
        #: Made here, not in the runner: a PEM path that cannot be read (or a certificate without its key) raises from
        #: the constructor, naming the field, where in the runner it ended the runner and every call waited for ever.
        self._credentials = tls.credentials() if tls is not None else None
        # Later entries win: the caller's channel_options override the defaults and the keepalive settings.
        options: Dict[str, Any] = {}
        for key, value in [*_DEFAULT_OPTIONS, *keepalive_options(keepalive_time, keepalive_timeout), *channel_options, *(tls.channel_options() if tls else [])]:
            options[key] = value
        self._channel_options = list(options.items())
        #: The channel's message size bounds in bytes (None: unlimited); grpc's default receive bound is 4 MiB.
        self.max_send_bytes = _limit(options.get("grpc.max_send_message_length"))
        self.max_receive_bytes = _limit(options.get("grpc.max_receive_message_length", 4 << 20))
        self._failover_after = failover_after
        #: Unfinished tasks this server runs for us, by task id. Changed through add_task/drop_task only (they keep
        #: run_groups_waiting).
        self.tasks: Dict[str, "_Task"] = {}
        #: Tasks in `tasks` of run_group whose group is not whole yet, and tasks refused by this server because its
        #: delivery was paused that wait to be submitted again (_Task.refused_by_pause): counts, not scans, because the
        #: client asks for both on every trajectory that arrives while delivery is paused.
        self.run_groups_waiting = 0
        self.refused_by_pause = 0
        self._outbox: "asyncio.Queue[Any]" = asyncio.Queue()
        #: Acks waiting to go together (see _ACK_DELAY), and the timer that sends them.
        self._acks: List[Tuple[str, int]] = []
        self._ack_timer: Optional[asyncio.TimerHandle] = None
        #: The most refs the server takes in one Ack (its stream's `rollout-max-ack-entries` header).
        self.max_ack_entries = DEFAULT_MAX_ACK_ENTRIES
        #: The server has paused delivery to this session until it gets acks (DeliveryPaused).
        self.paused = False
        self.connected = asyncio.Event()
        #: Declared lost (its tasks moved elsewhere); it keeps reconnecting and takes new tasks again once back.
        self.dead = False
        #: Lost for good (see _run): what ended its runner. Its tasks went elsewhere; it takes none again.
        self.failed: Optional[RolloutClientError] = None
        self._closing = False
        self._opened_once = False
        self._resend_all = False
        self._call: Optional[Any] = None
        self._runner: Optional["asyncio.Task[None]"] = None
        self._opened_at: Optional[float] = None
        #: Since when the stream is down (None while it is open), and the timer that declares the server lost.
        self._down_since: Optional[float] = None
        self._failover_timer: Optional[asyncio.TimerHandle] = None
        #: The last status the stream broke with ("" before any), said when a submit times out (see no_answer).
        self.last_break = ""
        #: When the pause scan last ran, and the one due at the end of a burst of notices (see _pause_scan).
        self._pause_scanned_at = float("-inf")
        self._pause_scan_timer: Optional[asyncio.TimerHandle] = None
        #: The same for the scan a samples()/groups() reader runs before it waits while delivery is paused (reader_scan).
        self._reader_scanned_at = float("-inf")
        self._reader_scan_timer: Optional[asyncio.TimerHandle] = None
        self.stats = {"reconnects": 0, "redelivered": 0, "sessions_lost": 0, "delivery_paused": 0}

    # -- what the client calls ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._runner = asyncio.ensure_future(self._run())
        self._stream_down()  # not open yet: a server that never answers is failed over like one that went away

    @property
    def load(self) -> int:
        """Samples this server still owes us: the routing key (least loaded first)."""
        return sum(t.num_samples - len(t.samples) for t in self.tasks.values())

    def add_task(self, task: "_Task") -> None:
        self.drop_task(task.task_id)
        self.tasks[task.task_id] = task
        if task.waiting_group:
            self.run_groups_waiting += 1

    def drop_task(self, task_id: str) -> Optional["_Task"]:
        task = self.tasks.pop(task_id, None)
        if task is not None and task.waiting_group:
            self.run_groups_waiting -= 1
        return task

    def assign(self, task: "_Task") -> None:
        self.add_task(task)
        task.conn = self
        task.answered = False
        self._outbox.put_nowait(rollout_pb2.RolloutRequest(task=task.spec))
        self._client._expect_answer(task)

    def no_answer(self, task_id: str, waited: float) -> str:
        """What a submit that got no answer from this server within `waited` seconds is told: which server, and what it
        waited for (the answer to the spec on an open session, or the session itself)."""
        head = f"{self.target}: no answer to task {task_id}'s spec within {waited:g} s (submit_timeout)"
        if self.connected.is_set():
            return f"{head}: the session is open, but the server sent neither TaskAccepted nor TaskRejected for it; cancelled there"
        if self._opened_once:
            what = "the stream broke and is not open again (waiting for the server's SessionOpened)"
        elif self._call is not None and not self.last_break:
            what = "the session never opened: the server took the stream but sent no SessionOpened"
        else:
            what = "the session never opened (no SessionOpened)"
        return f"{head}: {what}" + (f"; last stream status {self.last_break}" if self.last_break else "")

    def release(self, task_ids: Iterable[str]) -> None:
        """Forgets tasks that now run elsewhere (failover) or wait to be submitted again (a temporary rejection): their
        specs and cancels still queued here are dropped, so this server does not start them when it comes back."""
        ids: Set[str] = set(task_ids)
        for task_id in ids:
            task = self.drop_task(task_id)
            if task is not None:
                self._client._stop_answer_timer(task)
        kept: List[Any] = []
        while not self._outbox.empty():
            request = self._outbox.get_nowait()
            if _task_of(request) not in ids:
                kept.append(request)
        for request in kept:
            self._outbox.put_nowait(request)

    def cancel(self, task_id: str) -> None:
        self._outbox.put_nowait(rollout_pb2.RolloutRequest(cancel=rollout_pb2.CancelTask(task_id=task_id)))

    def ack(self, refs: List[Tuple[str, int]]) -> None:
        """Acks trajectories; those of _ACK_DELAY seconds go together (at once while delivery is paused)."""
        if not refs or self._closing or self.failed is not None:
            return
        self._acks.extend(refs)
        if self.paused or len(self._acks) >= self.max_ack_entries:
            self._flush_acks()
        elif self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(_ACK_DELAY, self._flush_acks)

    def _flush_acks(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        refs, self._acks = self._acks, []
        if refs and not self._closing:
            self._outbox.put_nowait(_Acks(refs))

    async def close(self, grace: float = 1.0) -> None:
        """Ends the stream: sends what is queued (acks, cancels), half-closes, and drops the call after `grace`."""
        self._flush_acks()
        self._closing = True
        self._cancel_failover_timer()
        for timer in (self._pause_scan_timer, self._reader_scan_timer):
            if timer is not None:
                timer.cancel()
        self._pause_scan_timer = self._reader_scan_timer = None
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

    # -- failover ----------------------------------------------------------------------------------------------

    def _stream_down(self) -> None:
        """The stream is not open: start the failover clock (once per outage)."""
        if self._down_since is None:
            self._down_since = asyncio.get_running_loop().time()
        if self._failover_timer is None and not self.dead and not self._closing:
            self._failover_timer = asyncio.get_running_loop().call_later(self._failover_after, self._check_failover)

    def _stream_up(self) -> None:
        self._down_since = None
        self._cancel_failover_timer()

    def _cancel_failover_timer(self) -> None:
        if self._failover_timer is not None:
            self._failover_timer.cancel()
            self._failover_timer = None

    def _check_failover(self) -> None:
        """`failover_after` seconds without an open stream: move the tasks if another server can take them."""
        self._failover_timer = None
        if self._closing or self.dead or self.connected.is_set():
            return
        loop = asyncio.get_running_loop()
        if not self._client._has_live_peer(self):
            # Nowhere to move them now: look again soon (a peer may come up; this server may come back first).
            self._failover_timer = loop.call_later(min(self._failover_after, 1.0), self._check_failover)
            return
        self.dead = True
        down_for = loop.time() - (self._down_since if self._down_since is not None else loop.time())
        log.warning("%s: unreachable for %.1f s; moving its tasks to the other servers", self.target, down_for)
        self._client._failover(self)

    # -- the stream --------------------------------------------------------------------------------------------

    def _channel(self) -> grpc.aio.Channel:
        if self._credentials is not None:
            return grpc.aio.secure_channel(self.target, self._credentials, options=self._channel_options)
        return grpc.aio.insecure_channel(self.target, options=self._channel_options)

    async def _run(self) -> None:
        """The runner: never ends silently while the client is open. What ends it other than close() fails the client,
        so every waiting and later call raises instead of waiting for ever on a runner that is gone (no re-open, no
        failover): a status a retry would get again (see _reconnect), a message this client cannot decode on
        _UNDECODABLE_RETRIES + 1 streams in a row (_read; fewer are re-opened: nothing was handled, the state is whole), and
        any other exception (a bug in the client's own bookkeeping met while handling a message, a channel that cannot
        be made). The last two are this server's: with other servers left, it alone is lost for good and its unfinished
        tasks go to them (AsyncRolloutClient._on_server_failed); the others' work is not theirs to fail. Not retried: the state a failed handler left is unknown (a sample handed out twice, a slot
        lost for good would be silent), and a resume re-sends the same messages; resume=True with this session_id, in a
        new client, gets every unacked sample again."""
        try:
            await self._reconnect()
        except RolloutClientError as err:
            if not self._closing:
                self._lost_for_good(err)
        except Exception as err:  # noqa: BLE001 - whatever it is, the callers must hear of it
            if not self._closing:
                log.exception("%s: the client failed handling its Rollout stream", self.target)
                self._lost_for_good(RolloutClientError(
                    f"{self.target}: the client failed handling its Rollout stream ({err!r}): a bug in rollout_client, "
                    "please report it with the traceback logged"
                ))
        finally:
            self._cancel_failover_timer()

    def _lost_for_good(self, error: RolloutClientError) -> None:
        """The runner ended on `error` (not re-opened: see _run). With other servers this one alone is lost, for good,
        its tasks moved to them; the last one fails the client (AsyncRolloutClient._on_server_failed)."""
        self.failed = error
        self.connected.clear()
        self._acks = []
        self._client._on_server_failed(self, error)

    async def _reconnect(self) -> None:
        """Opens the stream, and opens it again whenever it breaks, until close() or a status a retry would get again."""
        channel = self._channel()
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        loop = asyncio.get_running_loop()
        backoff = 0.05
        failures = 0
        last_code: Optional[str] = None
        warned_at = float("-inf")
        undecodable = 0  # streams in a row that ended on a message this client cannot decode (_UNDECODABLE_RETRIES)
        try:
            while not self._closing:
                resume = (self._opened_once or self._resume_first) and not self._resend_all
                code, detail = "", ""
                garbled = False
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
                    if err.code() == grpc.StatusCode.ABORTED:
                        # Another stream resumed this session and the server moved it there: resuming it again would
                        # take it back, and the two clients would evict each other for ever.
                        self._client._on_fatal(self, SessionTakenOverError(self.target, self.session_id, err.details() or ""))
                        return
                    if err.code() in _FATAL or (err.code() == grpc.StatusCode.ALREADY_EXISTS and not resume):
                        self._client._on_fatal(self, RolloutClientError(f"{self.target}: {err.code().name}: {err.details()}"))
                        return
                    if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                        fatal = self._message_too_large(err.details() or "")
                        if fatal is not None:
                            self._client._on_fatal(self, fatal)
                            return
                    code, detail = err.code().name, err.details() or ""
                except _SessionGone as gone:
                    # As NOT_FOUND: open the session afresh under our id (never take another's) and submit again.
                    log.warning("%s: %s; re-submitting %d tasks", self.target, gone, len(self.tasks))
                    self.stats["sessions_lost"] += 1
                    self._resend_all = True
                    code, detail = "OK", str(gone)
                except _StreamEnded:
                    code, detail = "OK", "the server ended the stream"
                except _Undecodable as err:
                    garbled = True
                    if self._opened_at is not None and loop.time() - self._opened_at >= _UNDECODABLE_FRESH_AFTER:
                        undecodable = 0  # after a long healthy stream: garbled once, not again
                    undecodable += 1
                    if undecodable > _UNDECODABLE_RETRIES:
                        raise RolloutClientError(f"{err}: it came on {undecodable} streams in a row (each re-opened with resume)") from None
                    code, detail = "UNDECODABLE", str(err)
                finally:
                    self.connected.clear()
                    self._call = None
                    if not self._closing:
                        self._stream_down()
                if self._closing:
                    return
                if not garbled:
                    undecodable = 0
                self.last_break = f"{code}: {detail}"
                now = loop.time()
                if self._opened_at is not None:
                    # It had opened: a new outage starts, unless it broke at once again (a stream that opens and then
                    # fails every time, e.g. on a write the channel refuses, must not be retried in a tight loop).
                    if now - self._opened_at >= 1.0:
                        backoff, failures, last_code = 0.05, 0, None
                    self._opened_at = None
                failures += 1
                if code != last_code or now - warned_at >= _WARN_EVERY:
                    log.warning("%s: stream broke (%s: %s); reconnecting (attempt %d, next in %.2f s)", self.target, code, detail, failures, backoff)
                    last_code, warned_at = code, now
                else:
                    log.debug("%s: stream broke (%s: %s); reconnecting (attempt %d)", self.target, code, detail, failures)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                self.stats["reconnects"] += 1
        finally:
            self._cancel_failover_timer()
            await channel.close(None)

    def _message_too_large(self, details: str) -> Optional[RolloutClientError]:
        """The stream ended on a message over a size limit, which the same message would meet again after the re-open.

        A task spec: this channel could not send it (a limit the client does not know, e.g. its service config's
        maxRequestMessageBytes: grpc.max_send_message_length is checked before sending), or the server's transport
        refused it. Every spec not answered yet that is over the limit fails (TaskTooLargeError) and is not re-sent; the
        stream is re-opened for the others. A message this channel could not receive, and no spec to blame: a
        trajectory, which the server re-sends on every resume; the error returned fails the client. Anything else (an
        ack over the server's bound: re-sent smaller after the redelivery) is retried like any broken stream.
        """
        found = _TOO_LARGE.search(details)
        if found is None:
            return None
        client_side = found.group(1) is not None or " vs. " in found.group(0)
        sent, size, limit = found.group(2) == "Sent", int(found.group(3)), int(found.group(4))
        sizes = {t.task_id: task_request_size(t.spec) for t in self.tasks.values() if not t.answered}
        over = [t for t in list(self.tasks.values()) if sizes.get(t.task_id, 0) > limit]
        if over:
            where = "this client's channel (a limit of its service config)" if sent else f"the server's transport at {self.target}"
            for task in over:
                log.warning("%s: task %s: its spec is %d bytes, over the %d-byte limit of %s; failing it", self.target, task.task_id, sizes[task.task_id], limit, where)
                self._client._reject(task, TaskTooLargeError.of(task.spec, sizes[task.task_id], limit, where))
            return None
        if not sent and (client_side or limit == self.max_receive_bytes):
            return RolloutClientError(
                f"{self.target}: RESOURCE_EXHAUSTED: {details}: a message of {size} bytes from the server is over this client's "
                f"max_receive_message_length ({limit} bytes), and the server sends it again on every resume: raise "
                '("grpc.max_receive_message_length", ...) in channel_options'
            )
        return None

    async def _attach(self, stub: Any, resume: bool) -> None:
        call = stub.Rollout(metadata=self._metadata)
        self._call = call
        try:
            await self._stream(call, resume)
        except grpc.aio.AioRpcError as err:
            raise await _final_status(call, err) from None
        except asyncio.CancelledError:
            # grpc.aio raises CancelledError, not a status, from a call cancelled locally: by _writer_done (a write that
            # failed other than with a status, or a failed call that lingers). Let through, it would end this runner for
            # good, silently (no re-open, no failover, callers waiting for ever): it is a broken stream, re-opened. A
            # cancel of the runner itself (close(), the loop shutting down) still ends it.
            task = asyncio.current_task()
            if self._closing or not call.cancelled() or (task is not None and getattr(task, "cancelling", lambda: 0)()):
                raise
            raise grpc.aio.AioRpcError(grpc.StatusCode.CANCELLED, grpc.aio.Metadata(), grpc.aio.Metadata(), "the client dropped the call (a write on it failed)", None) from None
        finally:
            call.cancel()  # a no-op once the call ended; otherwise the server would keep the session attached to it
            # A pause is of the stream: believed on while the server is out of reach, a waiting reader would ack early
            # for nothing. The resumed stream is told again if the server still holds delivery.
            self.paused = False

    async def _stream(self, call: Any, resume: bool) -> None:
        await call.write(rollout_pb2.RolloutRequest(open=rollout_pb2.OpenSession(session_id=self.session_id, resume=resume)))
        # The server sends its headers before any answer; a restarted one may be configured with another bound.
        self.max_ack_entries = max_ack_entries_of(await call.initial_metadata())
        self.paused = False  # a pause was of the stream before: the server says so again if it still holds
        while True:
            # A resumed session's re-sent trajectories may come before SessionOpened: they are ours, take them.
            first = await self._read(call)
            if first is grpc.aio.EOF:
                raise _StreamEnded()
            if first.WhichOneof("kind") == "opened":
                break
            self._dispatch(first)
        answered = first.opened.session_id
        if answered and answered != self.session_id:
            if resume:
                raise _SessionGone(f"the resume of session {self.session_id!r} was answered with session {answered!r}: ours is gone")
            # The server opens the id it is given (src/contract/sessions.ts): taken, a later resume would take a
            # session not this client's.
            raise RolloutClientError(
                f"{self.target}: the server answered the open of session {self.session_id!r} with session {answered!r} "
                "(SessionOpened.session_id): a faulty server; this client takes no session but its own"
            )
        self.stats["redelivered"] += first.opened.redelivered
        self._opened_at = asyncio.get_running_loop().time()
        self._stream_up()
        if self.dead:
            log.info("%s: back; taking new tasks again", self.target)
            self.dead = False
        resend_all, self._resend_all, self._opened_once = self._resend_all, False, True
        # What this server may not have: specs it never answered (all of them when the session is new), and cancels.
        resend: List[Any] = []
        for task in self.tasks.values():
            if resend_all or not task.answered:
                resend.append(rollout_pb2.RolloutRequest(task=task.spec))
                if task.answered:  # a new session: the spec waits for its answer again (and for up to submit_timeout)
                    task.answered = False
                    self._client._expect_answer(task)
            if task.cancel_requested:
                resend.append(rollout_pb2.RolloutRequest(cancel=rollout_pb2.CancelTask(task_id=task.task_id)))
        self.connected.set()
        writer = asyncio.ensure_future(self._write(call, resend))
        writer.add_done_callback(lambda done: self._writer_done(done, call))
        try:
            while True:
                response = await self._read(call)
                if response is grpc.aio.EOF:
                    return
                self._dispatch(response)
        finally:
            writer.cancel()

    async def _read(self, call: Any) -> Any:
        """The next message of the stream. One grpc cannot decode (it logs "Exception deserializing message!" and
        returns None: bytes a server of another protocol version, or a faulty one, sent) breaks the stream before it is
        handled (what it was about is unknown; nothing here changed): re-opened with resume like any broken stream, at
        most _UNDECODABLE_RETRIES times in a row; after that the server is lost for good (see _run), since a trajectory
        comes again, the same bytes, on every resume."""
        response = await call.read()
        if response is None:
            raise _Undecodable(
                f"{self.target}: a message on the Rollout stream could not be decoded (grpc logged why: 'Exception "
                "deserializing message!'): a server of another protocol version, or a faulty one"
            )
        return response

    async def _write(self, call: Any, resend: List[Any]) -> None:
        for request in resend:
            await call.write(request)
        while True:
            request = await self._outbox.get()
            if request is None:  # close(): nothing more to send
                await call.done_writing()
                return
            if isinstance(request, _Acks):
                for ack in _ack_requests(request.refs, self.max_send_bytes, self.max_ack_entries):
                    await call.write(ack)
                continue
            await call.write(request)

    def _writer_done(self, writer: "asyncio.Future[None]", call: Any) -> None:
        """A writer that failed is logged (its exception retrieved) and ends the call: a stream that can no longer
        send would keep reading while its acks and specs pile up; ended, it is re-opened and they are sent again."""
        if writer.cancelled():
            return
        err = writer.exception()
        if err is None:
            return
        if isinstance(err, grpc.aio.AioRpcError):
            # The call failed under the write: the reader gets its status (e.g. a message over a size limit, which
            # decides what is retried), which a cancel now would turn into CANCELLED. Cancelled only if it lingers.
            log.debug("%s: write failed (%s); the stream is re-opened", self.target, err.code().name)
            asyncio.get_running_loop().call_later(_WRITE_FAILED_GRACE, call.cancel)
            return
        log.warning("%s: write failed (%r); re-opening the stream", self.target, err)
        call.cancel()

    def _dispatch(self, response: Any) -> None:
        kind = response.WhichOneof("kind")
        if kind == "trajectory":
            self._client._on_trajectory(self, response.trajectory)
        elif kind == "accepted":
            task = self.tasks.get(response.accepted.task_id)
            if task is not None:
                task.answered = True
                self._client._stop_answer_timer(task)
                self._client._on_accepted(task, response.accepted.num_samples)
        elif kind == "rejected":
            rejected = response.rejected
            task = self.tasks.get(rejected.task_id)
            if task is not None:
                self._client._stop_answer_timer(task)
                self._client._on_rejected(self, task, rejected.field, rejected.reason, rejected.code)
            elif not rejected.task_id:
                # A request of no task (an ack): nothing waits for its answer, but what it carried was not applied.
                self._client._warn_throttled("refused request", "%s: the server refused a request: %s", self.target, rejected.reason or rejected.field)
        elif kind == "delivery_paused":
            # The server waits for acks (see AsyncRolloutClient on acks and pauses): those waiting go at once.
            notice = response.delivery_paused
            self.paused = not notice.resumed
            if self.paused:
                self.stats["delivery_paused"] += 1
                self._flush_acks()
                self._pause_scan()
            log.debug("%s: delivery %s (%d unacked bytes, limit %d, %d held)", self.target, "resumed" if notice.resumed else "paused", notice.unacked_bytes, notice.limit_bytes, notice.held)

    def _pause_scan(self) -> None:
        """Runs the client's pause scan (AsyncRolloutClient._on_delivery_paused: every task, every unacked sample) for a
        pause notice: at once when none ran in the last _PAUSE_SCAN_EVERY seconds, else once at the end of that time
        (one for any number of notices meanwhile), if delivery is still paused then. A flood of notices costs O(1)
        each; what a scan acks early is at most _PAUSE_SCAN_EVERY late (samples arriving while paused are acked on
        arrival, see AsyncRolloutClient._on_trajectory)."""
        if self._pause_scan_timer is not None:
            return
        loop = asyncio.get_running_loop()
        wait = self._pause_scanned_at + _PAUSE_SCAN_EVERY - loop.time()
        if wait > 0:
            self._pause_scan_timer = loop.call_later(wait, self._deferred_pause_scan)
            return
        self._pause_scanned_at = loop.time()
        self._client._on_delivery_paused(self)

    def reader_scan(self) -> None:
        """A samples()/groups() reader is about to wait while this server holds delivery: runs the client's reader scan
        (AsyncRolloutClient._reader_waits_on: every task, every unacked sample) at once when none ran in the last
        _PAUSE_SCAN_EVERY seconds, else once at the end of that time if delivery is still paused and the reader still
        waits with nothing queued. A reader that keeps up with a paused server's trickle (one sample per ack) came here
        for every sample: a scan of every task each, max_in_flight² over a paused batch; now O(1) per sample."""
        if self._reader_scan_timer is not None:
            return
        loop = asyncio.get_running_loop()
        wait = self._reader_scanned_at + _PAUSE_SCAN_EVERY - loop.time()
        if wait > 0:
            self._reader_scan_timer = loop.call_later(wait, self._deferred_reader_scan)
            return
        self._reader_scanned_at = loop.time()
        self._client._reader_waits_on(self)

    def _deferred_reader_scan(self) -> None:
        self._reader_scan_timer = None
        client = self._client
        if self.paused and not self._closing and self.failed is None and client._readers_waiting > 0 and client._stream.empty():
            self._reader_scanned_at = asyncio.get_running_loop().time()
            client._reader_waits_on(self)

    def _deferred_pause_scan(self) -> None:
        self._pause_scan_timer = None
        if self.paused and not self._closing and self.failed is None:
            self._pause_scanned_at = asyncio.get_running_loop().time()
            self._client._on_delivery_paused(self)
