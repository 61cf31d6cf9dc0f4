"""AsyncRolloutClient: submit tasks and whole GRPO groups over one stream per server, and get typed results back."""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import uuid
from typing import Any, AsyncIterator, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union

from google.protobuf import json_format, struct_pb2

from rollout.v1 import rollout_pb2

from .connection import Connection, task_request_size
from .errors import ClientClosedError, RolloutClientError, TaskRejectedError, TaskTooLargeError
from .results import Group, Sample
from .tls import TlsOptions, call_metadata

log = logging.getLogger("rollout_client")

#: How many finished task ids are remembered, so a trajectory re-sent after a lost ack is dropped, not re-delivered.
_FINISHED_MEMORY = 65536

#: With resume: the most predecessor's trajectories (see _orphans) held for a submit of their task, in samples and in
#: bytes (the server's default sessions.maxUnackedBytes: what a predecessor can leave unacked). Past either, the
#: oldest task's are dropped (acked): trajectories nobody claims (a task finished long ago, past _FINISHED_MEMORY, re-sent
#: after a lost ack; a task the trainer never submits again) would otherwise be held for the whole run.
_ORPHANS_MAX_SAMPLES = 65536
_ORPHANS_MAX_BYTES = 256 << 20

#: A warning that a faulty server (or a resumed session) could repeat thousands of times is said at most
#: _WARN_REPEAT_BURST times per _WARN_REPEAT_EVERY seconds (see _warn_throttled); the others go to DEBUG and are counted
#: in the next one said.
_WARN_REPEAT_EVERY = 30.0
_WARN_REPEAT_BURST = 5

#: Backoff between the submits of a task the server refused for now (TaskRejectedError.retryable): first, cap.
_RETRY_FIRST, _RETRY_CAP = 0.05, 2.0

#: The TaskRejected code the client gives a task it refuses itself (grpc's FAILED_PRECONDITION): not retried.
_FAILED_PRECONDITION = 9

#: When the client acks a trajectory (see AsyncRolloutClient, "Acks").
ACK_MODES = ("consumed", "manual", "received")

#: submit_timeout's default: no bound. A server answers a spec once it admits the task: at once, unless it is full (its
#: maxAdmitted samples running, other trainers' included: src/runtime.ts waits for room before answering, without a
#: bound), and behind SWE-length samples that wait is legitimately tens of minutes: a default bound would fail healthy
#: work of a long run. As the TypeScript client's submitTimeoutMs, it is opt-in.
_SUBMIT_TIMEOUT: Optional[float] = None

#: Samples acked before consumption (a paused delivery) are logged at WARNING at most this often.
_WARN_EARLY_EVERY = 30.0

#: A submit waiting this long for room while queued samples go untaken is said at WARNING (again as long as it waits).
_WARN_ROOM_AFTER = 30.0


#: Queued to wake a samples()/groups() reader waiting on the queue when its until_idle end may have come without a
#: sample (a task refused when sent again: _reject); the reader looks again whether it is idle.
_WAKE: Any = object()


class _GiveBack(Exception):
    """Thrown into samples()/groups() at their yield when what they yielded never reached the caller (the sync
    client's caller was interrupted meanwhile): the samples go back to the head of the queue, not handed off."""


class _Task:
    """The client's record of one submitted task until all its samples were handed to the caller."""

    def __init__(self, spec: Any, via_run_group: bool) -> None:
        self.spec = spec
        self.task_id: str = spec.task_id
        self.num_samples: int = spec.num_samples
        self.via_run_group = via_run_group
        self.conn: Optional[Connection] = None
        self.answered = False
        self.accepted: "asyncio.Future[int]" = asyncio.get_running_loop().create_future()
        self.complete: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()
        self.samples: Dict[int, Sample] = {}
        self.handed: Set[int] = set()
        self.cancel_requested = False
        #: run_group's caller went away: hand the samples off (free their slots) as soon as they are complete.
        self.abandoned = False
        #: A temporary rejection (server busy, draining, delivery paused): retried until this loop time, with backoff.
        self.retry_until: Optional[float] = None
        self.retry_delay = _RETRY_FIRST
        self._refused_by_pause: Optional[Connection] = None
        #: Ends the wait for the answer to its spec (submit_timeout), while one is awaited (see _expect_answer).
        self.answer_timer: Optional[asyncio.TimerHandle] = None

    @property
    def refused_by_pause(self) -> Optional[Connection]:
        """The server that last refused it because delivery to the session was paused, while it waits to be retried.
        Each server counts the tasks naming it (Connection.refused_by_pause), so AsyncRolloutClient._submit_waits is
        O(1): it runs for every trajectory that arrives while delivery is paused."""
        return self._refused_by_pause

    @refused_by_pause.setter
    def refused_by_pause(self, conn: Optional[Connection]) -> None:
        if conn is self._refused_by_pause:
            return
        if self._refused_by_pause is not None:
            self._refused_by_pause.refused_by_pause -= 1
        if conn is not None:
            conn.refused_by_pause += 1
        self._refused_by_pause = conn

    @property
    def waiting_group(self) -> bool:
        """A run_group task whose group is not whole yet (counted by its server: Connection.run_groups_waiting)."""
        return self.via_run_group and len(self.samples) < self.num_samples

    def group(self) -> Group:
        return Group(self.task_id, self.spec.group_id, [self.samples[i] for i in sorted(self.samples)])


def _message(cls: Any, value: Optional[Mapping[str, Any]], name: str) -> Any:
    """A proto message from a mapping (snake_case or camelCase keys); a bad key or value names the field."""
    if value is None:
        return None
    try:
        return json_format.ParseDict(dict(value), cls())
    except json_format.ParseError as err:
        raise ValueError(f"{name}: {err}") from err


class AsyncRolloutClient:
    """Streams rollouts from one or several Rollout Service servers.

    One Rollout stream per server carries every task of this client, so `run_group` may be awaited by thousands of
    coroutines at once. Tasks go to the server that owes the fewest samples. A broken stream is resumed (the server
    re-sends what was not acked); a server unreachable for `failover_after` seconds while another is up has its
    unfinished tasks submitted again, with the same task ids, to the others. Samples are handed to the caller at
    most once per (task_id, sample_index): when a moved task's samples come from two servers, the first to arrive is
    kept and the other dropped (acked with it). The group may then mix samples of two servers; each sample is whole.

    Acks: an acked trajectory is forgotten by the server; one not acked is kept for the session (for its resume window,
    the server's sessions.ttlMs) and re-sent when the session is resumed: by this process after a broken stream, or by
    another process with resume=True (a trainer restarted after a crash). `ack` says when the client acks a sample:
    - "consumed" (default): samples()/groups(): when the caller comes back to the iterator for the next item (a sync
      caller: the next iteration of its loop); the item a loop is left on (break, an exception, close) is not acked
      (ack() it once used). run_group: when it returns the group (or its caller is cancelled: nobody will use it).
    - "manual": only when the caller calls ack() (e.g. after the training step that used the samples, or its
      checkpoint). What a step holds unacked counts towards the server's sessions.maxUnackedBytes.
    - "received": on receipt (what the process has not handed out is lost if it dies).
    Besides, a trajectory nobody will take is acked on arrival: a duplicate of one handed out and acked already (the
    ack was lost with a stream), one outside its group, one of a task this client never submitted (without resume).
    The one exception: when a server pauses delivery (the session's unacked bytes reached its sessions.maxUnackedBytes)
    while samples of incomplete groups (run_group's, or groups()' once it has taken all that is queued) wait here, they
    are acked before consumption so the groups can complete instead of waiting for ever; logged at WARNING and counted
    in stats["acked_early"]. Likewise when a submit is refused because delivery is paused, or a run_group waits for
    samples of the paused server ("consumed"): the caller is inside submit()/run_group and cannot take what keeps the
    pause (a batch submitted before it is read, an evaluation group run before the prefetched batch is read), so what
    the client holds unacked from that server is acked early, and so is what it sends while the call waits (the
    server releases held samples one ack at a time); in "manual" the call waits for the caller's acks, said at
    WARNING. A predecessor's samples (resume) are acked early, in both modes, whenever a caller waits on the paused
    server: they may never be submitted again, and only acks would free the session; the client keeps them for a
    later submit of their task. Keep maxUnackedBytes above what the client holds (max_in_flight samples, plus in
    "manual" what the caller has not acked) and a sample is never acked before the moment its mode says. A
    samples()/groups() caller that waits while the pause is kept by samples it holds unacked itself ("manual": a batch
    kept until its step) gets nothing more until it acks some: that wait is logged at WARNING (at most every 30 s), not
    left silent. Acks wait up to 20 ms for others (one Ack message per server per 20 ms, split by the bound each server
    advertises): a crash may re-send a few consumed samples to the resumed session (at least once), never lose one.

    resume=True (with the session_id of a process that died): the first open resumes the session (a session the server
    no longer knows is opened afresh, logged, connection_stats()' sessions_lost). The predecessor's trajectories are
    held unacked until a task with their task_id is submitted again (the same spec; while delivery is paused and a
    caller waits, acked early and kept here, see "Acks"): the server answers it as owed, without running it again, and
    the re-sent and still-running samples complete it as usual. Submit again what the predecessor had not used; a task
    it acked in full is gone from the session (submitted again, it is run again or replayed from the server's cache of
    finished tasks). What is held for submits is bounded (65,536 samples, 256 MiB): past it the oldest tasks' are
    dropped and acked, said at WARNING, stats["orphans_dropped"] (a later submit of such a task runs it again). A task
    it acked in part (samples() acks sample by sample) is whole again: the server sends its acked samples again too
    (TaskAccepted.resent_sample_indexes), so a group cut by the crash comes complete.

    max_in_flight bounds the samples submitted and not yet handed to the caller (submit waits for room, in the order
    the submits came: a larger group is never overtaken for ever by smaller ones), which also bounds what the client
    buffers. A sample yielded by samples() (a group by groups()) counts as handed out once the
    caller comes back for the next one or leaves the loop. Call close() (or use `async with`) to end the streams.

    A task the server refuses for now (TaskRejectedError.retryable: RESOURCE_EXHAUSTED, UNAVAILABLE) is submitted
    again, to the least-loaded server, with backoff (50 ms doubling to 2 s) for up to `retry_rejected_for` seconds;
    then submit/run_group raise the TaskRejectedError. A stream status that a retry would get again
    (UNAUTHENTICATED, PERMISSION_DENIED, UNIMPLEMENTED, INVALID_ARGUMENT, and ALREADY_EXISTS: another stream holds
    this session id) fails every call with RolloutClientError, and so does ABORTED, with SessionTakenOverError: another
    client resumed this session id and the server moved the session to it (resuming it back would start a fight).
    Other broken streams are re-opened, logged at WARNING.

    A spec over a message size limit fails alone with TaskTooLargeError (naming its size, the limit and its largest
    field), never retried: over the channel's grpc.max_send_message_length, submit/run_group raise it before anything
    is sent; over a limit met on the way (the channel's service config, the server's transport), once that ended the
    stream, which is re-opened for the other tasks. A trajectory over the channel's max_receive_message_length (the
    server would re-send it on every resume) fails every call, naming the option to raise.

    submit_timeout (seconds; default None: no bound): how long a spec waits for its server's answer (TaskAccepted or
    TaskRejected), the server's SessionOpened included, from when it is given to that server (not while the submit
    waits for room under max_in_flight; a temporary refusal's retries have retry_rejected_for). A full server (at its
    maxAdmitted samples, other trainers' included) answers only once it has room: raise it, or None, where
    a submit may wait longer than that behind other work. Past it the task fails
    with RolloutClientError naming the server and what it waited for (the answer on an open session, or SessionOpened
    and the stream's last status) and is cancelled there: submit/run_group raise it, and a task whose spec was sent
    again (a new session after its server lost ours) fails as a refused one does (see _reject). With several servers,
    one out of reach is failed over after failover_after first.

    A server that sends a message the client cannot decode on _UNDECODABLE_RETRIES + 1 (3) streams in a row (each
    re-opened with resume and backoff, as any broken stream: bytes garbled once cost a resume), or while handling whose
    messages the client fails (at once), is lost for good when other servers remain (never re-opened again: it would
    send the same bytes on every resume): its unfinished
    tasks are submitted again to the others as after a failover, and connection_stats() says why ("failed"). The last
    server left fails every call with that error.

    keepalive_time/keepalive_timeout (seconds): HTTP/2 pings that find a connection whose peer vanished without a
    reset (None turns them off); without them such a stream would wait forever and failover would never fire.

    Example:
        async with AsyncRolloutClient(["10.0.0.1:50051", "10.0.0.2:50051"], token=os.environ["ROLLOUT_TOKEN"]) as client:
            group = await client.run_group("math", {"problem": "1+1?", "answer": "2"}, num_samples=8)
            advantages = group_advantages(group)
    """

    def __init__(
        self,
        targets: Union[str, Sequence[str]],
        *,
        token: Optional[str] = None,
        tls: Optional[TlsOptions] = None,
        session_id: Optional[str] = None,
        max_in_flight: int = 1024,
        failover_after: float = 10.0,
        channel_options: Sequence[Tuple[str, Any]] = (),
        keepalive_time: Optional[float] = 30.0,
        keepalive_timeout: float = 10.0,
        retry_rejected_for: float = 60.0,
        ack: str = "consumed",
        resume: bool = False,
        submit_timeout: Optional[float] = _SUBMIT_TIMEOUT,
    ) -> None:
        names = [targets] if isinstance(targets, str) else list(targets)
        if not names:
            raise ValueError("targets: at least one server address is needed")
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        if ack not in ACK_MODES:
            raise ValueError(f"ack: must be one of {', '.join(ACK_MODES)}, got {ack!r}")
        if resume and not session_id:
            raise ValueError("resume: needs the session_id of the session to resume")
        if submit_timeout is not None and not submit_timeout > 0:
            raise ValueError(f"submit_timeout: must be a number of seconds > 0, or None for no bound; got {submit_timeout!r}")
        self.submit_timeout = submit_timeout
        self.session_id = session_id or f"py-{uuid.uuid4().hex}"
        self.ack_mode = ack
        self._resume = resume
        self.max_in_flight = max_in_flight
        self.retry_rejected_for = retry_rejected_for
        self._loop = asyncio.get_running_loop()  # raises outside a coroutine: the client belongs to one event loop
        metadata = call_metadata(token)
        self._conns = [
            Connection(
                t, self, session_id=self.session_id, metadata=metadata, tls=tls, channel_options=channel_options,
                failover_after=failover_after, keepalive_time=keepalive_time, keepalive_timeout=keepalive_timeout, resume=resume,
            )
            for t in names
        ]
        #: The smallest send bound of the channels: a spec over it could never be sent (see TaskTooLargeError).
        self._max_send_bytes = min((c.max_send_bytes for c in self._conns if c.max_send_bytes is not None), default=None)
        self._tasks: Dict[str, _Task] = {}
        self._finished: "collections.OrderedDict[str, None]" = collections.OrderedDict()
        self._stream: "asyncio.Queue[Any]" = asyncio.Queue()  # samples; None: closed; _WAKE
        self._stream_outstanding = 0  # samples of submit()ted tasks not yet handed out
        #: samples()/groups() iterators waiting for the queue (a pause while they wait may need saying, see _on_delivery_paused).
        self._readers_waiting = 0
        self._lent = 0  # samples yielded by samples()/groups() whose caller has not come back yet (still outstanding)
        self._partial: Dict[str, Dict[int, Sample]] = {}
        #: Samples held in _partial (kept as a count: groups() looks at it for every sample it takes).
        self._partial_samples = 0
        self._in_flight = 0
        self._released = 0  # samples whose room was freed so far (see _warn_no_room)
        self._room = asyncio.Condition()
        #: Submits waiting for room, in the order they came: room goes to the first (see _submit).
        self._room_line: "collections.deque[object]" = collections.deque()
        self._closed = False
        self._fatal: Optional[BaseException] = None
        #: Set when the client fails, closes, or loses a server for good: wait_connected() must not wait on.
        self._gone = asyncio.Event()
        self._waiters: Set["asyncio.Future[Any]"] = set()
        self._round_robin = itertools.count()
        #: Samples stored and not acked yet (ack modes other than "received"), with the servers that sent them.
        self._unacked: Dict[Tuple[str, int], Set[Connection]] = {}
        #: With resume: trajectories of tasks this process has not submitted (its predecessor's), held unacked until
        #: their task is submitted again, by task id and sample index.
        self._orphans: Dict[str, Dict[int, Any]] = {}
        #: What _orphans holds: samples, and their bytes (bounded by _ORPHANS_MAX_SAMPLES, _ORPHANS_MAX_BYTES).
        self._orphan_samples = self._orphan_bytes = 0
        #: _warn_throttled's state, by kind of warning: when its window began, how many it said in it, and how many were
        #: held back since the last one said.
        self._throttled: Dict[str, Tuple[float, int, int]] = {}
        self._warned_early_at = self._warned_waiting_at = float("-inf")
        self.stats: Dict[str, int] = {"resubmitted": 0, "duplicates_dropped": 0, "rejections_retried": 0, "acked_early": 0, "orphans_dropped": 0}
        for conn in self._conns:
            conn.start()

    async def __aenter__(self) -> "AsyncRolloutClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- submitting ----------------------------------------------------------------------------------------------

    async def submit(
        self,
        environment: str,
        instance: Mapping[str, Any],
        num_samples: int = 1,
        *,
        sampling: Optional[Mapping[str, Any]] = None,
        limits: Optional[Mapping[str, Any]] = None,
        task_id: Optional[str] = None,
        group_id: Optional[str] = None,
        metadata: Optional[Mapping[str, str]] = None,
    ) -> str:
        """Submits one task of num_samples samples; returns its task id once a server accepted it.

        Its samples arrive through samples() or, whole, through groups(). Raises TaskRejectedError (naming the field)
        when the server rejects the spec (a temporary refusal only once retry_rejected_for has passed), its subclass
        TaskTooLargeError when the spec is over a message size limit, ValueError when sampling/limits hold an unknown
        field or task_id is already in flight on this client.
        """
        task = await self._submit(environment, instance, num_samples, sampling, limits, task_id, group_id, metadata, via_run_group=False)
        return task.task_id

    async def run_group(
        self,
        environment: str,
        instance: Mapping[str, Any],
        num_samples: int,
        *,
        sampling: Optional[Mapping[str, Any]] = None,
        limits: Optional[Mapping[str, Any]] = None,
        task_id: Optional[str] = None,
        group_id: Optional[str] = None,
        metadata: Optional[Mapping[str, str]] = None,
    ) -> Group:
        """Runs one task of num_samples samples and returns the whole group (samples ordered by sample_index).

        Cancelling the awaiting coroutine cancels the task on the server. Failed samples are in the group with
        is_infra_failure=True (see Group.ok / Group.failed); only a rejected spec raises (TaskRejectedError, or
        TaskTooLargeError over a message size limit), besides the client-wide errors (closed, fatal stream status).
        """
        task = await self._submit(environment, instance, num_samples, sampling, limits, task_id, group_id, metadata, via_run_group=True)
        try:
            await self._wait(task.complete)
        except asyncio.CancelledError:
            task.abandoned = True
            if not task.complete.done():
                self._cancel_task(task)
            else:
                self._hand_off(task, list(task.samples), ack=True)  # nobody will use them: the session need not keep them
            raise
        self._hand_off(task, list(task.samples), ack=True)
        return task.group()

    async def _submit(self, environment, instance, num_samples, sampling, limits, task_id, group_id, metadata, *, via_run_group: bool) -> _Task:  # type: ignore[no-untyped-def]
        self._check_open()
        task_id = task_id or uuid.uuid4().hex
        if task_id in self._tasks:
            raise ValueError(f"task_id: {task_id!r} is already in flight on this client")
        struct = struct_pb2.Struct()
        try:
            struct.update(dict(instance))
        except (TypeError, ValueError) as err:
            raise ValueError(f"instance: {err}") from err
        spec = rollout_pb2.TaskSpec(task_id=task_id, group_id=group_id or task_id, num_samples=num_samples, environment=environment, instance=struct, metadata=dict(metadata or {}))
        if sampling is not None:
            spec.sampling.CopyFrom(_message(rollout_pb2.SamplingParams, sampling, "sampling"))
        if limits is not None:
            spec.limits.CopyFrom(_message(rollout_pb2.TaskLimits, limits, "limits"))
        size = task_request_size(spec)
        if self._max_send_bytes is not None and size > self._max_send_bytes:
            # The channel would refuse it and end the stream, every time it was sent again: it fails here, alone.
            raise TaskTooLargeError.of(spec, size, self._max_send_bytes, "this client's channel (grpc.max_send_message_length)")
        need = max(num_samples, 0)
        ticket = object()
        async with self._room:
            # A group larger than max_in_flight still runs, alone; otherwise wait until the caller has taken enough.
            # In turn: were room given to whichever waiting submit fits, a larger group would be overtaken by every
            # smaller submit behind it, for as long as producers keep the client full (for ever in a long run).
            def room() -> bool:
                return self._room_line[0] is ticket and (self._in_flight == 0 or self._in_flight + need <= self.max_in_flight)

            self._room_line.append(ticket)
            if not room():
                self._loop.call_later(_WARN_ROOM_AFTER, self._warn_no_room, ticket, need, self._released)
            try:
                await self._room.wait_for(lambda: self._closed or self._fatal is not None or room())
            finally:
                self._room_line.remove(ticket)
                self._room.notify_all()  # the next in line may fit too
            self._check_open()
            # Again, under the lock: a call with the same task_id may have got room (and the id) while this one waited.
            if task_id in self._tasks:
                raise ValueError(f"task_id: {task_id!r} is already in flight on this client")
            self._in_flight += need
            task = _Task(spec, via_run_group)
            self._tasks[task_id] = task
        if not via_run_group:
            self._stream_outstanding += need
        for _, t in sorted(self._take_orphans(task_id).items()):
            # The predecessor's, re-sent before this submit: this task's now.
            if self._unstorable(task, t):
                self._ack_refs([(t.task_id, t.sample_index)])
            else:
                self._store(task, t)
        self._pick().assign(task)
        try:
            await self._wait(task.accepted)
        except BaseException:
            if not task.accepted.done():  # the caller went away before the answer: cancel on the server
                task.abandoned = True
                self._cancel_task(task)
            raise
        return task

    async def cancel(self, task_id: str) -> None:
        """Cancels a task: its unfinished samples end with status 'cancelled' (and still arrive, as failed samples)."""
        task = self._tasks.get(task_id)
        if task is None:
            raise KeyError(f"task_id: {task_id!r} is not in flight on this client")
        self._cancel_task(task)

    def _cancel_task(self, task: _Task) -> None:
        task.cancel_requested = True
        if task.conn is not None:
            task.conn.cancel(task.task_id)

    # -- receiving -----------------------------------------------------------------------------------------------

    async def samples(self, *, until_idle: bool = True) -> AsyncIterator[Sample]:
        """Samples of submit()ted tasks in completion order (run_group's samples go to their caller only).

        With until_idle (default) the iteration ends once every task submitted so far has been handed out; otherwise
        it runs until close(). Use either samples() or groups(), not both at once: they share one queue.
        """
        if self._partial:
            # A groups() loop was left with groups not whole yet: their samples were never handed out, and only
            # groups() would ever take them (this loop would wait for them for ever). They come first.
            self._give_back([s for partial in self._partial.values() for _, s in sorted(partial.items())])
            self._partial.clear()
            self._partial_samples = 0
        while True:
            if until_idle and self._stream_outstanding - self._lent <= 0 and self._stream.empty():
                # Yield to the loop first: a caller that iterates again in a loop (waiting for a submit that is
                # itself waiting for room) must not spin without letting that submit run.
                await asyncio.sleep(0)
                return
            sample = await self._next_stream_sample()
            if sample is None:
                return
            if sample is _WAKE:
                continue
            # Handed off (its slot freed) once the caller comes back for the next one or leaves the loop holding it;
            # acked ("consumed") only when it comes back: the one a loop left on may not have been used.
            self._lent += 1
            given_back = came_back = False
            try:
                yield sample
                came_back = True
            except _GiveBack:
                given_back = True
                self._give_back([sample])
                return
            finally:
                self._lent -= 1
                if not given_back:
                    self._hand_off_samples([sample], ack=came_back)

    async def groups(self, *, until_idle: bool = True) -> AsyncIterator[Group]:
        """Complete groups of submit()ted tasks, in the order they completed (see samples() for until_idle). A group some
        of whose samples an earlier samples() loop handed out comes with the others only."""
        while True:
            if until_idle and self._stream_outstanding - self._lent <= self._partial_samples and self._stream.empty():
                await asyncio.sleep(0)  # as in samples(): never a busy loop for a caller that iterates again
                return
            sample = await self._next_stream_sample()
            if sample is None:
                return
            if sample is _WAKE:
                continue
            task = self._tasks.get(sample.task_id)
            if task is None:
                # Its task was refused when sent again (see _reject): no group to hand out; acked, as nobody gets it.
                self._ack_refs([(sample.task_id, sample.sample_index)])
                continue
            partial = self._partial.setdefault(task.task_id, {})
            held = len(partial)
            partial[sample.sample_index] = sample
            self._partial_samples += len(partial) - held
            # Whole, or the rest of a group a samples() loop before this one had begun: kept here, that one would wait
            # for ever, never handed out (nor acked, nor its room freed).
            if len(partial) + len(task.handed) >= task.num_samples:
                del self._partial[task.task_id]
                self._partial_samples -= len(partial)
                samples = [partial[i] for i in sorted(partial)]
                # As in samples(): handed off once the caller comes back for the next group or leaves the loop.
                self._lent += len(samples)
                given_back = came_back = False
                try:
                    yield Group(task.task_id, task.spec.group_id, samples)
                    came_back = True
                except _GiveBack:
                    given_back = True
                    self._give_back(samples)
                    return
                finally:
                    self._lent -= len(samples)
                    if not given_back:
                        self._hand_off_samples(samples, ack=came_back)

    async def _next_stream_sample(self) -> Any:
        """The next sample of the shared queue; None once the client is closed (or failed: then it raises); _WAKE when
        the caller should look again whether it is idle."""
        if self._stream.empty():
            # The caller is about to wait: if a server waits for acks meanwhile, groups() must not hold its partial
            # groups unacked (see "Acks" in the class doc). A scan of every task: throttled (Connection.reader_scan),
            # a reader keeping up with a paused server's trickle would run it for every sample.
            for conn in self._conns:
                if conn.paused:
                    conn.reader_scan()
        self._readers_waiting += 1
        try:
            sample = await self._stream.get()
        finally:
            self._readers_waiting -= 1
        if sample is None:
            self._stream.put_nowait(None)  # every other iterator stops too
            if self._fatal is not None:
                raise self._fatal
        return sample

    async def _wait(self, fut: "asyncio.Future[Any]") -> Any:
        """Awaits a shared future without cancelling it when the caller is cancelled; close() and a fatal server
        answer (bad token) fail it, so no caller waits forever."""
        if self._fatal is not None:
            raise self._fatal
        self._waiters.add(fut)
        try:
            return await asyncio.shield(fut)
        finally:
            self._waiters.discard(fut)

    def _give_back(self, samples: List[Sample]) -> None:
        """Puts samples an iterator yielded to nobody back at the head of the queue, in order."""
        rest: List[Any] = []
        while not self._stream.empty():
            rest.append(self._stream.get_nowait())
        for item in [*samples, *rest]:
            self._stream.put_nowait(item)

    def _hand_off_samples(self, samples: List[Sample], *, ack: bool) -> None:
        task = self._tasks.get(samples[0].task_id) if samples else None
        if task is not None:
            self._hand_off(task, [s.sample_index for s in samples], ack=ack)
        elif ack and self.ack_mode == "consumed":
            # Its task was refused when sent again after this sample came (see _reject): consumed all the same.
            self._ack_refs([(s.task_id, s.sample_index) for s in samples])

    def _hand_off(self, task: _Task, indices: List[int], *, ack: bool) -> None:
        """The caller now holds these samples: free their slots, and with `ack` (they are consumed) ack them in the
        "consumed" mode."""
        fresh = [i for i in indices if i not in task.handed]
        task.handed.update(fresh)
        if ack and self.ack_mode == "consumed":
            self._ack_refs([(task.task_id, i) for i in fresh])
        self._release(len(fresh), stream=not task.via_run_group)
        if len(task.handed) >= task.num_samples:
            self._forget(task)

    # -- acks ----------------------------------------------------------------------------------------------------

    def ack(self, items: Union[Sample, Group, Iterable[Union[Sample, Group]]]) -> None:
        """Acks samples (or whole groups) the caller is done with: the server forgets them, a resumed session does not
        get them again. What the "manual" mode needs (after the training step that used them, or its checkpoint); in
        the "consumed" mode, the sample a loop left on. Acking one twice, or one acked already, does nothing. Call it on
        the client's event loop (RolloutClient.ack from any thread)."""
        if isinstance(items, (Sample, Group)):
            items = [items]
        refs: List[Tuple[str, int]] = []
        for item in items:
            for s in item.samples if isinstance(item, Group) else [item]:
                refs.append((s.task_id, s.sample_index))
        self._ack_refs(refs)

    def _ack_refs(self, refs: List[Tuple[str, int]]) -> None:
        """Acks stored samples to every server that sent them (twice after a failover)."""
        by_conn: Dict[Connection, List[Tuple[str, int]]] = {}
        for ref in refs:
            for conn in self._unacked.pop(ref, ()):
                by_conn.setdefault(conn, []).append(ref)
        for conn, conn_refs in by_conn.items():
            conn.ack(conn_refs)

    def _ack_waiting_groups(self, conn: Connection, *, with_partial: bool = True) -> int:
        """`conn`'s server paused delivery: acks what the caller cannot take before more arrives (samples of groups
        still incomplete: run_group's, and with_partial groups()'), so the groups can complete; how many. See "Acks" in
        the class doc."""
        refs = [
            (task.task_id, i)
            for task in self._tasks.values()
            if len(task.samples) < task.num_samples and (task.via_run_group or (with_partial and task.task_id in self._partial))
            for i in task.samples
            if conn in self._unacked.get((task.task_id, i), ())
        ]
        self._ack_early(conn, refs)
        return len(refs)

    def _ack_orphans(self, conn: Connection) -> int:
        """A caller waits while `conn`'s server holds delivery for acks: the predecessor's samples this client holds
        unacked from it (resume) are acked early (see "Acks" in the class doc), how many. They belong to tasks the
        trainer has not submitted again - maybe never will (it had used them; their acks were lost with the crash) - so
        nothing else might ever ack them, and delivery would stay paused for good. They are kept: a later submit of
        their task still gets them from here (the server, having forgotten them, may run it again; its samples are then
        dropped as duplicates)."""
        refs = [ref for ref, conns in self._unacked.items() if conn in conns and ref[0] in self._orphans]
        self._ack_early(conn, refs)
        return len(refs)

    def _reader_waits_on(self, conn: Connection) -> None:
        """A samples()/groups() caller is about to wait (or still waits) while `conn`'s server holds delivery for acks:
        what it holds of incomplete groups and the predecessor's samples are acked early, else the wait is said."""
        if not self._ack_waiting_groups(conn) + self._ack_orphans(conn):
            self._warn_waiting_on_acks(conn)

    def _warn_waiting_on_acks(self, conn: Connection) -> None:
        """A samples()/groups() caller waits while `conn`'s server holds delivery for acks and nothing here may be acked
        early: what keeps it paused is what the caller holds unacked ("manual": a batch kept until its step), so
        nothing more arrives until the caller acks (from another thread or task) — said, or the wait looks like a
        hang."""
        now = self._loop.time()
        if now - self._warned_waiting_at < _WARN_EARLY_EVERY:
            return
        held = sum(1 for conns in self._unacked.values() if conn in conns)
        if held == 0:
            return
        self._warned_waiting_at = now
        log.warning(
            "%s: waiting for samples while the server holds delivery to session %s until it gets acks (its unacked bytes "
            "reached sessions.maxUnackedBytes): %d samples it sent are unacked here (ack mode %r); nothing more arrives "
            "until the caller ack()s some, or raise sessions.maxUnackedBytes above what a batch holds",
            conn.target, conn.session_id, held, self.ack_mode,
        )

    def _ack_early(self, conn: Connection, refs: List[Tuple[str, int]]) -> None:
        if not refs:
            return
        self.stats["acked_early"] += len(refs)
        now = self._loop.time()
        if now - self._warned_early_at >= _WARN_EARLY_EVERY:
            self._warned_early_at = now
            log.warning(
                "%s: delivery to session %s is paused (its unacked bytes reached the server's sessions.maxUnackedBytes) while "
                "callers wait on it for what it holds back (samples of incomplete groups, room for a submit): samples held "
                "here are acked before consumption so delivery goes on (lost if this process dies before handing them out; "
                "%d so far, stats['acked_early']; raise sessions.maxUnackedBytes above what this client holds)",
                conn.target, conn.session_id, self.stats["acked_early"],
            )
        self._ack_refs(refs)

    def _on_delivery_paused(self, conn: Connection) -> None:
        if self.ack_mode == "received":
            return
        # run_group callers wait on nothing else; groups() only once it has taken what is queued (_next_stream_sample).
        waiting = self._stream.empty()
        acked = self._ack_waiting_groups(conn, with_partial=waiting)
        if self._run_group_waits(conn):
            self._unpause(conn, "run_group")
        elif self._submit_waits(conn):
            self._unpause(conn, "a submit")
        elif waiting and self._readers_waiting > 0 and not acked + self._ack_orphans(conn):
            self._warn_waiting_on_acks(conn)

    def _run_group_waits(self, conn: Connection) -> bool:
        """Whether a run_group task on `conn` still waits for samples: while `conn`'s server holds delivery, they come
        only after acks of what keeps the pause, which its caller (inside run_group) cannot consume."""
        return conn.run_groups_waiting > 0

    def _submit_waits(self, conn: Connection) -> bool:
        """Whether a task `conn`'s server refused because delivery was paused waits to be submitted again: the server
        releases what it holds one ack at a time, and each sample it then sends pauses delivery again; acked only at
        the next refusal, one per retry (the retries backing off to 2 s), many held samples would outlast the retry
        budget. While it waits, what `conn` sends is acked on arrival instead (see _on_trajectory)."""
        return conn.refused_by_pause > 0

    def _release(self, n: int, *, stream: bool) -> None:
        if n <= 0:
            return
        self._in_flight -= n
        self._released += n
        if stream:
            self._stream_outstanding -= n
        self._wake_room()

    def _warn_no_room(self, ticket: object, need: int, released: int) -> None:
        """A submit has waited _WARN_ROOM_AFTER seconds for room under max_in_flight (`released`: self._released when
        that time began). When no room was freed meanwhile while samples wait in the queue, nothing reads them: a
        caller that submits a batch larger than max_in_flight before it reads (one coroutine, a sync client's thread)
        would wait for ever, silently. Said at WARNING, and looked at again as long as the submit waits."""
        if self._closed or ticket not in self._room_line:
            return
        if self._released == released and not self._stream.empty():
            log.warning(
                "a submit of %d samples has waited %.0f s for room under max_in_flight (%d samples in flight) while %d "
                "samples wait here untaken: nothing reads samples()/groups() meanwhile (a batch larger than max_in_flight, "
                "submitted before it is read, waits for ever); read them from another task or thread, or raise max_in_flight",
                need, _WARN_ROOM_AFTER, self._in_flight, self._stream.qsize(),
            )
        self._loop.call_later(_WARN_ROOM_AFTER, self._warn_no_room, ticket, need, self._released)

    def _wake_room(self) -> None:
        """Has the submits waiting for room look again (room freed, or the client failed: they must raise)."""

        async def notify() -> None:
            async with self._room:
                self._room.notify_all()

        asyncio.ensure_future(notify())

    def _forget(self, task: _Task) -> None:
        self._stop_answer_timer(task)
        self._tasks.pop(task.task_id, None)
        task.refused_by_pause = None
        if task.conn is not None:
            task.conn.drop_task(task.task_id)
        self._finished[task.task_id] = None
        while len(self._finished) > _FINISHED_MEMORY:
            self._finished.popitem(last=False)

    # -- what the connections report ---------------------------------------------------------------------------

    def _expect_answer(self, task: _Task) -> None:
        """`task`'s spec now waits for its server's answer: for up to submit_timeout seconds (see _no_answer)."""
        self._stop_answer_timer(task)
        if self.submit_timeout is not None:
            task.answer_timer = self._loop.call_later(self.submit_timeout, self._no_answer, task, task.conn)

    def _stop_answer_timer(self, task: _Task) -> None:
        if task.answer_timer is not None:
            task.answer_timer.cancel()
            task.answer_timer = None

    def _no_answer(self, task: _Task, conn: Optional[Connection]) -> None:
        """submit_timeout passed with no answer to `task`'s spec from `conn`: the task fails naming the server and what
        it waited for, and is cancelled there (it may have got the spec; its samples, should they come, are dropped)."""
        task.answer_timer = None
        if conn is None or task.conn is not conn or task.answered or self._tasks.get(task.task_id) is not task or self._closed or self._fatal is not None:
            return
        if len(task.samples) >= task.num_samples:
            return  # a spec sent again (new session) for a group already whole here: nothing waits on its answer
        error = RolloutClientError(conn.no_answer(task.task_id, self.submit_timeout or 0.0))
        log.warning("%s", error)
        self._reject(task, error)
        conn.cancel(task.task_id)

    def _on_server_failed(self, conn: Connection, error: RolloutClientError) -> None:
        """`conn`'s runner ended on `error` (a message it cannot decode, a failure handling one): with other servers
        left, it alone is lost for good and its unfinished tasks go to them (as after a failover); the last one fails
        the client."""
        if not any(c is not conn and c.failed is None for c in self._conns):
            self._on_fatal(conn, error)
            return
        log.error("%s; this server is lost for good, its unfinished tasks go to the other servers", error)
        conn.dead = True
        self._failover(conn)
        self._gone.set()

    def _on_accepted(self, task: _Task, num_samples: int) -> None:
        if num_samples != task.num_samples:
            # A faulty server's: it runs another group than the spec's. Fewer samples, the group would never complete
            # (run_group and groups() waiting for ever); more, the extra ones are dropped as outside the group. Failed
            # here, naming it, and cancelled there (after _reject, which drops what is still queued for the task).
            conn = task.conn
            where = f"the server at {conn.target}" if conn is not None else "the server"
            self._reject(task, TaskRejectedError(
                task.task_id, "num_samples",
                f"{where} accepted it with num_samples {num_samples}, not the {task.num_samples} of its spec (a faulty "
                "server: the group would never come whole); cancelled there",
                _FAILED_PRECONDITION,
            ))
            if conn is not None:
                conn.cancel(task.task_id)
            return
        task.retry_until, task.retry_delay = None, _RETRY_FIRST  # a later refusal (a re-sent spec) gets a fresh budget
        task.refused_by_pause = None
        if not task.accepted.done():
            task.accepted.set_result(num_samples)

    def _on_rejected(self, conn: Connection, task: _Task, field: str, reason: str, code: int = 0) -> None:
        error = TaskRejectedError(task.task_id, field, reason, code)
        task.refused_by_pause = conn if error.retryable and conn.paused else None
        if task.refused_by_pause is not None:
            self._unpause(conn, "a submit")
        if error.retryable and self._retry_later(conn, task, error):
            return
        task.refused_by_pause = None
        self._reject(task, error)

    def _unpause(self, conn: Connection, waiter: str) -> None:
        """A caller waits for `conn`'s server while it holds delivery for acks: `waiter` is "a submit" (refused for
        now: the session admits no task until it gets acks) or "run_group" (its samples are held, or will be when they
        finish). The caller waits inside that call and cannot consume (a trainer that submits its batch, or runs an
        evaluation group, before it reads), so in the "consumed" mode nothing would ever ack what keeps the pause: the
        samples this client holds from `conn` (queued, in partial groups, lent, run_group's) are acked early (see
        "Acks" in the class doc). In "manual" the caller holds them: said, not acked. A predecessor's samples (resume)
        go in both modes (_ack_orphans)."""
        self._ack_orphans(conn)
        refs = [ref for ref, conns in self._unacked.items() if conn in conns]
        if self.ack_mode == "consumed":
            self._ack_early(conn, refs)
        elif self.ack_mode == "manual" and refs:
            held = len(refs)
            now = self._loop.time()
            if now - self._warned_waiting_at >= _WARN_EARLY_EVERY:
                self._warned_waiting_at = now
                log.warning(
                    "%s: %s waits: the server holds delivery to session %s and admits no new task until it gets acks (its "
                    "unacked bytes reached sessions.maxUnackedBytes), and %d samples it sent are unacked here (ack mode "
                    "'manual'); it waits until the caller ack()s some (a submit for up to retry_rejected_for), or raise "
                    "sessions.maxUnackedBytes above what a batch holds",
                    conn.target, waiter, conn.session_id, held,
                )

    def _retry_later(self, conn: Connection, task: _Task, error: TaskRejectedError) -> bool:
        """Schedules a temporarily refused task to be submitted again; False when its time is up (or nobody wants it)."""
        if self._closed or self._fatal is not None or task.cancel_requested or task.abandoned:
            return False
        now = self._loop.time()
        if task.retry_until is None:
            task.retry_until = now + self.retry_rejected_for
        if now + task.retry_delay > task.retry_until:
            return False
        delay, task.retry_delay = task.retry_delay, min(task.retry_delay * 2, _RETRY_CAP)
        conn.release([task.task_id])
        task.conn = None
        self.stats["rejections_retried"] += 1
        # INFO, not WARNING: a busy server or paused delivery refusing for a moment is ordinary backpressure.
        log.info("%s: task %s refused for now (%s); submitting it again in %.2f s", conn.target, task.task_id, error, delay)
        self._loop.call_later(delay, self._resubmit, task, error)
        return True

    def _resubmit(self, task: _Task, error: TaskRejectedError) -> None:
        if self._tasks.get(task.task_id) is not task or self._closed or self._fatal is not None:
            return
        if task.cancel_requested or task.abandoned:
            self._reject(task, error)  # cancelled while it waited: it never ran, it ends refused
            return
        self._pick().assign(task)

    def _reject(self, task: _Task, error: RolloutClientError) -> None:
        self._stop_answer_timer(task)
        if task.conn is not None:
            task.conn.release([task.task_id])  # a copy of its spec still queued there is not sent
        if task.accepted.done() and task.accepted.exception() is None and not task.via_run_group:
            # Accepted before (submit() returned), refused when its spec was sent again (a new session after a server
            # restart without its journal, a failover): nobody waits on it to hear it, and its group never comes.
            log.warning(
                "task %s, accepted before, was refused when submitted again (%s): %d of its %d samples came, the rest never "
                "will; groups() drops it (samples() hands out those that came)", task.task_id, error, len(task.samples), task.num_samples,
            )
        partial = self._partial.pop(task.task_id, None)
        self._partial_samples -= len(partial or ())
        if partial:
            # Samples a groups() loop held for the group: never handed out now, acked (the server need not keep them). Kept,
            # they would count for ever as samples waiting for their group, and end later loops before their groups came.
            self._ack_refs([(task.task_id, i) for i in partial])
        if not task.accepted.done():
            task.accepted.set_exception(error)
        if not task.complete.done():
            task.complete.set_exception(error)
            task.complete.exception()  # retrieved: nobody else awaits it
        self._release(task.num_samples - len(task.handed), stream=not task.via_run_group)
        task.handed.update(range(task.num_samples))
        self._forget(task)
        if not task.via_run_group and self._readers_waiting > 0 and self._stream.empty():
            # A samples()/groups() loop waiting for this task's samples (submit() had returned) would wait for ever:
            # with until_idle, it may be done now.
            self._stream.put_nowait(_WAKE)

    def _on_trajectory(self, conn: Connection, t: Any) -> None:
        ref = (t.task_id, t.sample_index)
        if self.ack_mode == "received":
            # Acked at once, whatever follows: stored below (the caller gets it from this process), or a duplicate of
            # one stored before, or nobody's (see "Acks" in the class doc).
            conn.ack([ref])
        task = self._tasks.get(t.task_id)
        if ref in self._unacked:
            # Re-sent (a resumed stream, or the other server after a failover) while this process holds it unacked:
            # whoever holds it acks it, to every server that sent it.
            self._unacked[ref].add(conn)
            self.stats["duplicates_dropped"] += 1
            return
        if task is None:
            if t.task_id in self._finished:
                # Handed out and acked before, re-sent because the ack was lost with a broken stream.
                self.stats["duplicates_dropped"] += 1
                self._ack_dropped(conn, ref)
            elif self._resume and self.ack_mode != "received":
                # The predecessor's (a resumed session): kept for its task's submit, unacked meanwhile.
                self._unacked[ref] = {conn}  # first: a bound _keep_orphan meets may drop (ack) this one at once
                self._keep_orphan(t)
            else:
                self._warn_throttled("unknown task", "%s: trajectory of unknown task %s (session %s): acked and dropped", conn.target, t.task_id, conn.session_id)
                self._ack_dropped(conn, ref)
            return
        if self._unstorable(task, t):
            self._ack_dropped(conn, ref)
            return
        if self.ack_mode != "received":
            self._unacked[ref] = {conn}
        self._store(task, t)
        if conn.paused and ref in self._unacked and (
            (task.via_run_group and len(task.samples) < task.num_samples)
            or (self.ack_mode == "consumed" and (self._run_group_waits(conn) or self._submit_waits(conn)))
        ):
            # Sent while delivery stays paused (the server releases held samples one ack at a time): a group of
            # run_group, or a refused submit, needs the rest to come, so this one cannot wait for its consumer (see
            # "Acks" in the class doc, _unpause).
            self._ack_early(conn, [ref])

    def _keep_orphan(self, t: Any) -> None:
        """Holds a predecessor's trajectory for its task's submit, within _ORPHANS_MAX_SAMPLES and _ORPHANS_MAX_BYTES:
        past either, the oldest tasks' are dropped and acked (the server forgets them; a later submit of such a task
        is run again, or replayed from the server's cache of finished tasks), said at WARNING (throttled) and counted
        in stats["orphans_dropped"]."""
        held = self._orphans.setdefault(t.task_id, {})
        before = held.get(t.sample_index)
        if before is not None:  # re-sent after it was acked early: the copy replaces it
            self._orphan_samples -= 1
            self._orphan_bytes -= before.ByteSize()
        held[t.sample_index] = t
        self._orphan_samples += 1
        self._orphan_bytes += t.ByteSize()
        dropped: List[Tuple[str, int]] = []
        while self._orphans and (self._orphan_samples > _ORPHANS_MAX_SAMPLES or self._orphan_bytes > _ORPHANS_MAX_BYTES):
            oldest = next(iter(self._orphans))
            dropped.extend((oldest, i) for i in self._take_orphans(oldest))
        if dropped:
            self.stats["orphans_dropped"] += len(dropped)
            self._ack_refs(dropped)  # those acked early already are not acked twice (_unacked no longer lists them)
            self._warn_throttled(
                "orphans dropped",
                "resumed session %s: %d trajectories of tasks not submitted again (the oldest: %s) were dropped and acked: "
                "over the %d samples / %d bytes held for a submit of their task (a later submit of it runs it again); "
                "%d so far, stats['orphans_dropped']",
                self.session_id, len(dropped), dropped[0][0], _ORPHANS_MAX_SAMPLES, _ORPHANS_MAX_BYTES, self.stats["orphans_dropped"],
            )

    def _take_orphans(self, task_id: str) -> Dict[int, Any]:
        """The predecessor's trajectories held for `task_id` (by sample index), no longer held."""
        held = self._orphans.pop(task_id, {})
        self._orphan_samples -= len(held)
        self._orphan_bytes -= sum(t.ByteSize() for t in held.values())
        return held

    def _warn_throttled(self, kind: str, msg: str, *args: Any) -> None:
        """A warning a faulty server could have repeated thousands of times: said at WARNING at most
        _WARN_REPEAT_BURST times per _WARN_REPEAT_EVERY seconds per kind, the next one said with how many were held
        back meanwhile (those at DEBUG)."""
        now = self._loop.time()
        began, said, held_back = self._throttled.get(kind, (float("-inf"), 0, 0))
        if now - began >= _WARN_REPEAT_EVERY:
            began, said = now, 0
        if said >= _WARN_REPEAT_BURST:
            self._throttled[kind] = (began, said, held_back + 1)
            log.debug(msg, *args)
            return
        self._throttled[kind] = (began, said + 1, 0)
        if held_back:
            msg += " (and %d more like it held back before this one, at DEBUG)"
            args += (held_back,)
        log.warning(msg, *args)

    def _ack_dropped(self, conn: Connection, ref: Tuple[str, int]) -> None:
        """Acks a trajectory nobody will get (a duplicate, a faulty server's) in the modes that did not ack it on receipt."""
        self._unacked.pop(ref, None)
        if self.ack_mode != "received":
            conn.ack([ref])

    def _unstorable(self, task: _Task, t: Any) -> bool:
        """A trajectory `task` cannot take: a duplicate of a sample it has, or outside its group."""
        index = t.sample_index
        if not 0 <= index < task.num_samples:
            # A faulty server's: stored, it would complete the group in place of a real sample (dropped as a
            # duplicate when it came).
            self._warn_throttled("outside group", "trajectory of task %s with sample_index %d outside [0, %d): acked and dropped", t.task_id, index, task.num_samples)
            return True
        if index in task.samples:
            self.stats["duplicates_dropped"] += 1
            return True
        return False

    def _store(self, task: _Task, t: Any) -> None:
        """Stores a trajectory of `task` for its caller (in the task's record; samples() also queues it)."""
        sample = Sample.from_proto(t)
        waiting = task.waiting_group
        task.samples[t.sample_index] = sample
        if waiting and not task.waiting_group and task.conn is not None and task.conn.tasks.get(task.task_id) is task:
            task.conn.run_groups_waiting -= 1  # whole now: its server no longer counts it as waiting
        if not task.via_run_group:
            self._stream.put_nowait(sample)
        if len(task.samples) >= task.num_samples:
            # Kept until answered: a resumed session re-sends a task's samples before it answers the spec sent again.
            if task.conn is not None and task.answered:
                task.conn.drop_task(task.task_id)
            if not task.complete.done():
                task.complete.set_result(None)
            if task.abandoned:
                self._hand_off(task, list(task.samples), ack=True)

    def _on_fatal(self, conn: Connection, error: RolloutClientError) -> None:
        """A stream status a retry would get again (see Connection): every waiting and later call raises `error`."""
        log.error("%s", error)
        if self._fatal is None:
            self._fatal = error
        self._gone.set()
        self._fail_waiters(self._fatal)
        self._stream.put_nowait(None)
        self._wake_room()  # a submit waiting for room would wait until close() (for ever in a sync client's thread)

    def _fail_waiters(self, error: BaseException) -> None:
        for fut in list(self._waiters):
            if not fut.done():
                fut.set_exception(error)
                fut.exception()  # marked retrieved: the waiter raises it through the shield

    def _has_live_peer(self, conn: Connection) -> bool:
        return any(c is not conn and not c.dead and c.connected.is_set() for c in self._conns)

    def _pick(self) -> Connection:
        """The least-loaded server among those not lost, connected ones first; ties rotate."""
        usable = [c for c in self._conns if c.failed is None] or self._conns
        live = [c for c in usable if not c.dead] or usable
        up = [c for c in live if c.connected.is_set()] or live
        start = next(self._round_robin) % len(up)
        rotated = up[start:] + up[:start]
        return min(rotated, key=lambda c: c.load)

    def _failover(self, lost: Connection) -> None:
        moved = [t for t in list(lost.tasks.values()) if len(t.samples) < t.num_samples]
        # Their specs (and cancels) still queued for the lost server are dropped: it would start them when it came back.
        lost.release(t.task_id for t in moved)
        for task in moved:
            target = self._pick()
            target.assign(task)
            if task.cancel_requested:
                target.cancel(task.task_id)
        self.stats["resubmitted"] += len(moved)
        if moved:
            log.warning("%s lost: %d unfinished tasks submitted again to the other servers", lost.target, len(moved))

    # -- lifecycle -----------------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        if self._closed:
            raise ClientClosedError("the client is closed")

    def connection_stats(self) -> List[Dict[str, Any]]:
        """Per server: address, connected, lost (dead), failed (why it is lost for good, else None), load (samples owed),
        reconnects, redelivered, sessions_lost, delivery_paused."""
        return [
            {"target": c.target, "connected": c.connected.is_set(), "dead": c.dead, "failed": str(c.failed) if c.failed else None, "load": c.load, **c.stats}
            for c in self._conns
        ]

    async def wait_connected(self, timeout: Optional[float] = None) -> None:
        """Waits until every server's stream is open (tests and scripts that want to fail early). Raises the client's
        error once it failed (or ClientClosedError), and a server's once it is lost for good: neither opens again."""

        async def wait() -> None:
            up = asyncio.ensure_future(asyncio.gather(*(c.connected.wait() for c in self._conns)))
            gone = asyncio.ensure_future(self._gone.wait())
            try:
                await asyncio.wait({up, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                up.cancel()
                gone.cancel()

        self._check_open()
        await asyncio.wait_for(wait(), timeout)
        self._check_open()
        failed = next((c.failed for c in self._conns if c.failed is not None), None)
        if failed is not None:
            raise failed

    async def close(self, *, cancel_pending: bool = True) -> None:
        """Ends the streams. With cancel_pending (default) unfinished tasks are cancelled on the servers first;
        otherwise they keep running there (and stay resumable under this session id for the server's resume window)."""
        if self._closed:
            return
        self._closed = True
        self._gone.set()
        if cancel_pending:
            for task in list(self._tasks.values()):
                if len(task.samples) < task.num_samples:
                    self._cancel_task(task)
        self._fail_waiters(ClientClosedError("the client was closed"))
        self._stream.put_nowait(None)
        async with self._room:
            self._room.notify_all()
        await asyncio.gather(*(c.close() for c in self._conns))
