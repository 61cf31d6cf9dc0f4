"""RolloutClient: the AsyncRolloutClient for synchronous code, on an event loop in a background thread."""
from __future__ import annotations

import _thread
import asyncio
import dis
import signal
import sys
import threading
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple, TypeVar, Union

from .client import AsyncRolloutClient, _GiveBack
from .errors import ClientClosedError
from .results import Group, Sample
from .tls import TlsOptions

T = TypeVar("T")

#: How long an interrupted call waits for its coroutine to finish cancelling (cancel on the server, give samples back).
_CANCEL_GRACE = 5.0
#: The main thread waits in slices this long: Python runs signal handlers (Ctrl-C) between them even when the signal
#: did not interrupt the wait itself (it went to another thread, or came from _thread.interrupt_main).
_SIGNAL_SLICE = 0.1


class _HandOff:
    """Where the caller of a samples()/groups() iterator receives the item it yields: the caller's frame (by id: a
    reference would tie the frame, its locals and so the iterator into a cycle only the GC breaks), its code, and the
    offsets of the call that returns the item and of the instruction after it (which binds it). A SIGINT handler that
    raises there (`next(it)` returning: a check point for signals) drops the item before the caller has it."""

    __slots__ = ("frame_id", "code", "offsets", "interrupted")

    def __init__(self) -> None:
        self.frame_id = 0
        self.code: Any = None
        self.offsets: Tuple[int, ...] = ()
        self.interrupted = False

    def arm(self, frame: Any) -> None:
        self.frame_id = id(frame)
        self.code = frame.f_code
        self.offsets = _receiving_offsets(frame.f_code, frame.f_lasti)

    def receiving(self, frame: Any) -> bool:
        return frame is not None and id(frame) == self.frame_id and frame.f_code is self.code and frame.f_lasti in self.offsets


_offsets_cache: Dict[Tuple[Any, int], Tuple[int, ...]] = {}


def _receiving_offsets(code: Any, lasti: int) -> Tuple[int, ...]:
    key = (code, lasti)
    found = _offsets_cache.get(key)
    if found is None:
        after = next((x.offset for x in dis.get_instructions(code) if x.offset > lasti), lasti)
        found = _offsets_cache[key] = (lasti, after)
    return found


#: Hand-offs under way (their item yielded, not known to be bound), watched by the SIGINT handler.
_handoffs: Set[_HandOff] = set()


def _watch_interrupts() -> None:
    """Wraps the main thread's SIGINT handler so that one raising as a hand-off's caller receives its item marks the
    hand-off interrupted (the item is handed again, or given back: see _iterate). Main thread only (Python runs
    signal handlers there alone); a handler that is not a Python callable (SIG_IGN, SIG_DFL) raises nothing to watch."""
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGINT)
    if not callable(current) or getattr(current, "_rollout_watcher", False):
        return

    def watcher(signum: int, frame: Any) -> Any:
        try:
            return current(signum, frame)
        except BaseException:
            for h in list(_handoffs):
                if h.receiving(frame):
                    h.interrupted = True
            raise

    watcher._rollout_watcher = True  # type: ignore[attr-defined]
    watcher._rollout_wrapped = current  # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, watcher)


def _unwatch_interrupts() -> None:
    """Puts the wrapped SIGINT handler back once no hand-off is watched (unless the caller replaced ours meanwhile)."""
    if _handoffs or threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGINT)
    if getattr(current, "_rollout_watcher", False):
        signal.signal(signal.SIGINT, current._rollout_wrapped)  # type: ignore[union-attr]


class RolloutClient:
    """Same methods as AsyncRolloutClient, blocking. Thread-safe: many threads may call run_group at once (they
    share the one stream per server). Use as a context manager or call close().

    A call interrupted while it waits (Ctrl-C: KeyboardInterrupt) is cancelled as an async caller's cancellation
    would be: run_group/submit cancel the task on the server (a group that completed just as the interrupt came is
    dropped with the call, as an async caller's would be), and a samples()/groups() loop loses nothing (a sample that
    arrived as the interrupt did goes back to the queue; the next loop gets it).

    Ctrl-C and samples()/groups(): a sample the caller never gets must go back to the queue, not count as handed out
    (nor, in the "consumed" ack mode, be acked when the caller comes back). CPython runs a signal handler (which raises
    KeyboardInterrupt) between bytecodes, and only at its check points: a function's entry, a generator's resumption,
    a backward jump, the return of a call into C. From scheduling the fetch of a sample to `_run` returning it, every
    such point lies inside `_run`'s `try`, and an interrupt there hands the sample back to the queue (`_abandon`), for
    the next loop. From `_run`'s return to the yield in `_iterate`, and from the yield to the binding of a `for` loop's
    variable (FOR_ITER, then STORE_*), there is none. A caller that pulls with `next(it)` has one: the return of that
    call, with the sample in hand but not bound yet. The SIGINT handler is wrapped while an iterator runs (main thread;
    a Python-level handler): one that raises exactly there, in the caller's frame at that call, marks the hand-off
    interrupted, and the iterator hands the same sample again on the next `next(it)`, or gives it back to the queue
    when the iterator is closed instead. (python/tests/test_sync_interrupt.py raises the interrupt at every bytecode of
    the hand-off in turn, at the return of next(), and sends real SIGINTs; measured on CPython 3.11.) Not covered: a
    caller that replaces the SIGINT handler while iterating with next(), and a second interrupt landing in the few
    bytecodes of the first one's handler before `_abandon` has scheduled the give-back on the loop.

    Example:
        with RolloutClient("127.0.0.1:50051") as client:
            group = client.run_group("math", {"problem": "2+2?", "answer": "4"}, num_samples=4)
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
        submit_timeout: Optional[float] = None,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        #: The loop has stopped for good (close()), and the calls waiting on it when it did (their `done` locks).
        self._stopped = False
        self._runs: Set[Any] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rollout-client", daemon=True)
        self._thread.start()

        async def make() -> AsyncRolloutClient:
            return AsyncRolloutClient(
                targets, token=token, tls=tls, session_id=session_id, max_in_flight=max_in_flight, failover_after=failover_after,
                channel_options=channel_options, keepalive_time=keepalive_time, keepalive_timeout=keepalive_timeout,
                retry_rejected_for=retry_rejected_for, ack=ack, resume=resume, submit_timeout=submit_timeout,
            )

        try:
            self._client = self._run(make())
        except BaseException:
            # A refused argument (ValueError naming it): the loop's thread would be left running for the process's life.
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
            raise
        self.session_id = self._client.session_id

    def _run(self, coro: Awaitable[T], abandoned: Optional[Callable[[T], Awaitable[None]]] = None) -> T:
        """Runs coro on the client's loop and returns its result.

        When this thread is interrupted (KeyboardInterrupt, or any exception a signal handler raises) anywhere from
        scheduling the coroutine to handing its result back, even after the result came in, the coroutine's task is
        cancelled and waited for (up to _CANCEL_GRACE s), so what it does when cancelled (run_group cancels the task
        on the server) is done before the interrupt propagates; a result it produced all the same (it finished as the
        interrupt came) goes to `abandoned`, on the loop (see _abandon). (run_coroutine_threadsafe's future cannot do
        this: cancelling it drops a result that was on its way.)

        The wait is on a bare lock the loop thread only releases: a threading.Event would take its condition's lock
        in both threads, and an interrupt landing in this thread between that lock's acquire and the `with` that
        releases it would leave the loop thread blocked for ever on the Event's set(). close() (from another thread)
        releases it too once the loop has stopped for good: a call scheduled on it as it stopped, or waiting on it
        then, would wait for ever; it raises ClientClosedError.
        """
        done = _thread.allocate_lock()
        done.acquire()
        box: List["asyncio.Task[T]"] = []
        finished = False

        def start() -> None:
            task = self._loop.create_task(coro)  # type: ignore[arg-type]
            task.add_done_callback(lambda _: done.release())
            box.append(task)

        self._runs.add(done)  # before _stopped is read: close() sets it, then releases what it finds here
        try:
            if self._stopped:
                raise ClientClosedError("the client is closed")
            try:
                self._loop.call_soon_threadsafe(start)
            except RuntimeError:  # the loop is closed: close() ran between the check above and here
                raise ClientClosedError("the client is closed") from None
            if threading.current_thread() is threading.main_thread():
                while not done.acquire(timeout=_SIGNAL_SLICE):
                    pass
            else:
                done.acquire()
            finished = True
            self._runs.discard(done)
            if not (box and box[0].done()):
                raise ClientClosedError("the client was closed")  # released by close(): the coroutine never ends
            return box[0].result()
        except BaseException:
            self._runs.discard(done)
            if self._stopped:
                if not box and hasattr(coro, "close"):
                    coro.close()  # never started, never will: not left to warn that it was never awaited
                raise  # nothing runs on the loop any more: nothing to cancel or give back there
            if not (finished and (box[0].cancelled() or box[0].exception() is not None)):
                self._abandon(coro, box, abandoned)  # not the coroutine's own failure: it may hold a result
            raise

    def _abandon(self, coro: Awaitable[T], box: List["asyncio.Task[T]"], abandoned: Optional[Callable[[T], Awaitable[None]]]) -> None:
        """The caller of _run was interrupted: cancel the task (a no-op once it finished) and hand a result it produced
        all the same to `abandoned`. All of it runs on the loop, scheduled by the one call below: once that call is
        made, nothing more has to run in this thread for it to happen (a second interrupt may cut the wait short)."""
        settled = _thread.allocate_lock()
        settled.acquire()

        def settle() -> None:
            if not box:  # start() was never scheduled (interrupted before): the coroutine never ran
                close = getattr(coro, "close", None)
                if close is not None:
                    close()
                settled.release()
                return
            task = box[0]

            def on_done(_: Any) -> None:
                if abandoned is None or task.cancelled() or task.exception() is not None:
                    settled.release()
                    return
                asyncio.ensure_future(abandoned(task.result())).add_done_callback(lambda _: settled.release())

            task.cancel()
            task.add_done_callback(on_done)

        self._loop.call_soon_threadsafe(settle)  # after start() if that was scheduled: the loop keeps the order
        settled.acquire(timeout=_CANCEL_GRACE)

    def _iterate(self, make: Callable[[], AsyncIterator[T]]) -> Iterator[T]:
        iterator = make()

        async def give_back(_: T) -> None:
            # The iterator yielded to a caller that was interrupted: its samples go back to the head of the queue.
            try:
                await iterator.athrow(_GiveBack())  # type: ignore[attr-defined]
            except (StopAsyncIteration, _GiveBack):
                pass

        handoff = _HandOff()
        pending = False  # an item was yielded and the caller has not come back since
        _handoffs.add(handoff)
        try:
            while True:
                # Before the fetch: from its return to the yield no check point may run (see the class doc).
                _watch_interrupts()
                handoff.arm(sys._getframe(1))
                try:
                    item = self._run(iterator.__anext__(), give_back)
                except StopAsyncIteration:
                    return
                pending = True
                # No check point for signals from _run's return to the caller's loop variable (see the class doc).
                yield item
                while handoff.interrupted:
                    # The caller was interrupted as next() returned the item, before binding it: it never had it.
                    handoff.arm(sys._getframe(1))
                    handoff.interrupted = False
                    yield item
                pending = False
        finally:
            _handoffs.discard(handoff)
            _unwatch_interrupts()
            if self._loop.is_running():
                try:
                    if pending and handoff.interrupted:
                        self._run(give_back(item))  # never received: back to the queue, for the next loop
                    self._run(iterator.aclose())  # type: ignore[attr-defined]
                except ClientClosedError:
                    pass  # close() (another thread) stopped the loop meanwhile: the iterator ended with it

    def submit(self, environment: str, instance: Any, num_samples: int = 1, **kwargs: Any) -> str:
        return self._run(self._client.submit(environment, instance, num_samples, **kwargs))

    def run_group(self, environment: str, instance: Any, num_samples: int, **kwargs: Any) -> Group:
        return self._run(self._client.run_group(environment, instance, num_samples, **kwargs))

    def cancel(self, task_id: str) -> None:
        self._run(self._client.cancel(task_id))

    def ack(self, items: Union[Sample, Group, Iterable[Union[Sample, Group]]]) -> None:
        """AsyncRolloutClient.ack: the server forgets these samples (see "Acks" there)."""
        items = list(items) if not isinstance(items, (Sample, Group)) else [items]  # iterated here, not on the loop
        self._run(_call(lambda: self._client.ack(items)))

    def samples(self, *, until_idle: bool = True) -> Iterator[Sample]:
        return self._iterate(lambda: self._client.samples(until_idle=until_idle))

    def groups(self, *, until_idle: bool = True) -> Iterator[Group]:
        return self._iterate(lambda: self._client.groups(until_idle=until_idle))

    def wait_connected(self, timeout: Optional[float] = None) -> None:
        self._run(self._client.wait_connected(timeout))

    def connection_stats(self) -> List[dict]:
        return self._run(_call(self._client.connection_stats))

    def close(self, *, cancel_pending: bool = True) -> None:
        if not self._loop.is_running():
            return
        try:
            self._run(self._client.close(cancel_pending=cancel_pending))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._stopped = True
            for done in list(self._runs):  # other threads' calls the loop stopped under (see _run)
                try:
                    done.release()
                except RuntimeError:
                    pass  # released already (its call ended, or a close() in another thread got there first)
            self._loop.close()

    def __enter__(self) -> "RolloutClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


async def _call(fn: Callable[[], T]) -> T:
    return fn()
