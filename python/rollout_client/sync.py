"""RolloutClient: the AsyncRolloutClient for synchronous code, on an event loop in a background thread."""
from __future__ import annotations

import asyncio
import threading
from typing import Any, AsyncIterator, Callable, Coroutine, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union

from .client import AsyncRolloutClient, _GiveBack
from .results import Group, Sample
from .tls import TlsOptions

T = TypeVar("T")

#: How long an interrupted call waits for its coroutine to finish cancelling (cancel on the server, give samples back).
_CANCEL_GRACE = 5.0
#: The main thread waits in slices this long: Python runs signal handlers (Ctrl-C) between them even when the signal
#: did not interrupt the wait itself (it went to another thread, or came from _thread.interrupt_main).
_SIGNAL_SLICE = 0.1


class RolloutClient:
    """Same methods as AsyncRolloutClient, blocking. Thread-safe: many threads may call run_group at once (they
    share the one stream per server). Use as a context manager or call close().

    A call interrupted while it waits (Ctrl-C: KeyboardInterrupt) is cancelled as an async caller's cancellation
    would be: run_group/submit cancel the task on the server, and a samples()/groups() loop loses nothing (a sample
    that arrived as the interrupt did goes back to the queue; the next loop gets it).

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
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rollout-client", daemon=True)
        self._thread.start()

        async def make() -> AsyncRolloutClient:
            return AsyncRolloutClient(
                targets, token=token, tls=tls, session_id=session_id, max_in_flight=max_in_flight, failover_after=failover_after,
                channel_options=channel_options, keepalive_time=keepalive_time, keepalive_timeout=keepalive_timeout,
                retry_rejected_for=retry_rejected_for,
            )

        self._client = self._run(make())
        self.session_id = self._client.session_id

    def _run(self, coro: Coroutine[Any, Any, T], abandoned: Optional[Callable[[T], None]] = None) -> T:
        """Runs coro on the client's loop and returns its result.

        When this thread is interrupted while it waits (KeyboardInterrupt, or any exception a signal handler raises),
        the coroutine's task is cancelled and waited for (up to _CANCEL_GRACE s), so what it does when cancelled (run_group
        cancels the task on the server) is done before the interrupt propagates. A result it produced all the same (it
        finished as the interrupt came) is passed to `abandoned`. (run_coroutine_threadsafe's future cannot do this:
        cancelling it drops a result that was on its way.)
        """
        done = threading.Event()
        box: List["asyncio.Task[T]"] = []

        def start() -> None:
            task = self._loop.create_task(coro)
            task.add_done_callback(lambda _: done.set())
            box.append(task)

        self._loop.call_soon_threadsafe(start)
        try:
            if threading.current_thread() is threading.main_thread():
                while not done.wait(_SIGNAL_SLICE):
                    pass
            else:
                done.wait()
        except BaseException:
            # start() ran before this (call_soon_threadsafe keeps the order): box holds the task.
            self._loop.call_soon_threadsafe(lambda: box[0].cancel())
            if done.wait(_CANCEL_GRACE):
                task = box[0]
                if not task.cancelled() and task.exception() is None and abandoned is not None:
                    abandoned(task.result())
            raise
        return box[0].result()

    def _iterate(self, make: Callable[[], AsyncIterator[T]]) -> Iterator[T]:
        iterator = make()

        def give_back(_: T) -> None:
            # The iterator yielded to a caller that was interrupted: its samples go back to the head of the queue.
            async def throw() -> None:
                try:
                    await iterator.athrow(_GiveBack())  # type: ignore[attr-defined]
                except (StopAsyncIteration, _GiveBack):
                    pass

            asyncio.run_coroutine_threadsafe(throw(), self._loop).result(_CANCEL_GRACE)

        try:
            while True:
                try:
                    item = self._run(iterator.__anext__(), give_back)  # type: ignore[arg-type]
                except StopAsyncIteration:
                    return
                yield item
        finally:
            if self._loop.is_running():
                self._run(iterator.aclose())  # type: ignore[attr-defined]

    def submit(self, environment: str, instance: Any, num_samples: int = 1, **kwargs: Any) -> str:
        return self._run(self._client.submit(environment, instance, num_samples, **kwargs))

    def run_group(self, environment: str, instance: Any, num_samples: int, **kwargs: Any) -> Group:
        return self._run(self._client.run_group(environment, instance, num_samples, **kwargs))

    def cancel(self, task_id: str) -> None:
        self._run(self._client.cancel(task_id))

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
            self._loop.close()

    def __enter__(self) -> "RolloutClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


async def _call(fn: Callable[[], T]) -> T:
    return fn()
