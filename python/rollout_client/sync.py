"""RolloutClient: the AsyncRolloutClient for synchronous code, on an event loop in a background thread."""
from __future__ import annotations

import asyncio
import threading
from typing import Any, AsyncIterator, Callable, Coroutine, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union

from .client import AsyncRolloutClient
from .results import Group, Sample
from .tls import TlsOptions

T = TypeVar("T")


class RolloutClient:
    """Same methods as AsyncRolloutClient, blocking. Thread-safe: many threads may call run_group at once (they
    share the one stream per server). Use as a context manager or call close().

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
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rollout-client", daemon=True)
        self._thread.start()

        async def make() -> AsyncRolloutClient:
            return AsyncRolloutClient(targets, token=token, tls=tls, session_id=session_id, max_in_flight=max_in_flight, failover_after=failover_after, channel_options=channel_options)

        self._client = self._run(make())
        self.session_id = self._client.session_id

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _iterate(self, make: Callable[[], AsyncIterator[T]]) -> Iterator[T]:
        iterator = make()
        try:
            while True:
                try:
                    yield self._run(iterator.__anext__())  # type: ignore[arg-type]
                except StopAsyncIteration:
                    return
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
