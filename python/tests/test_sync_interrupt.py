"""Ctrl-C (KeyboardInterrupt) in the sync client's samples()/groups() loops, against a real server (see conftest.py).

Samples are acked on arrival, so a sample the client took from its queue and never handed to the caller is lost for
good. Whatever point the interrupt lands on, the sample must either be bound to the caller's loop variable or go back
to the queue, for the next loop. The interrupt is raised at each bytecode in turn that the main thread runs inside
the client (deterministic: every point where a signal handler could run, and more), and real SIGINTs are sent at
random moments of a long loop.
"""
from __future__ import annotations

import asyncio
import dis
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from conftest import math_instance
from rollout_client import RolloutClient
from rollout_client import sync as sync_module

SAMPLING = {"temperature": 1.0, "max_tokens_per_turn": 64}
SYNC_FILE = sync_module.__file__  # as the code objects name it (co_filename)

#: Opcodes at which CPython never runs a signal handler (it does so on a function's entry, a generator's resumption,
#: a backward jump and the return of a call into C): those the interpreter runs from the return of the call that fetches the item in `_run`
#: to the yield in `_iterate` must all be such.
NO_CHECK_POINT = {"STORE_FAST", "LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_CONST", "NOP", "JUMP_FORWARD", "POP_TOP", "RETURN_VALUE", "YIELD_VALUE"}


def _path(code, start: Callable[[List[dis.Instruction], int], bool], end: str) -> List[dis.Instruction]:
    """The instructions of `code` run from the one after the first where `start` holds to the first `end`, jumps
    followed."""
    instructions = list(dis.get_instructions(code))
    by_offset = {x.offset: i for i, x in enumerate(instructions)}
    i = next(i for i in range(len(instructions)) if start(instructions, i)) + 1
    path = []
    while True:
        x = instructions[i]
        path.append(x)
        if x.opname == end:
            return path
        i = by_offset[x.argval] if x.opname == "JUMP_FORWARD" else i + 1


def _handoff_gap() -> Dict[Any, List[dis.Instruction]]:
    """By code object: the bytecodes from the return of `box[0].result()` in RolloutClient._run to its return, and
    from the store of `item` in RolloutClient._iterate to its yield. No signal handler can run there (see above)."""
    def result_call(xs: List[dis.Instruction], i: int) -> bool:
        return xs[i].opname.startswith("CALL") and any(x.argval == "result" for x in xs[max(0, i - 3) : i])

    def before_item(xs: List[dis.Instruction], i: int) -> bool:
        return i + 1 < len(xs) and xs[i + 1].opname == "STORE_FAST" and xs[i + 1].argval == "item"

    return {
        RolloutClient._run.__code__: _path(RolloutClient._run, result_call, "RETURN_VALUE"),
        RolloutClient._iterate.__code__: _path(RolloutClient._iterate, before_item, "YIELD_VALUE"),
    }


#: Where the main thread runs Python code during a hand-off: the sync client, and the threading and asyncio code it
#: calls. (Not weakref callbacks and finalizers that run in its frames: an exception there is printed and dropped by
#: Python, an interrupt lost, not a sample.)
INTERRUPTIBLE = (SYNC_FILE, threading.__file__, str(Path(asyncio.__file__).parent))


class Interrupter:
    """Raises KeyboardInterrupt, as a signal handler would, at the `at`-th bytecode the main thread runs while armed in
    sync.py or in the threading and asyncio code sync.py called. Skips the hand-off gap (checked above to hold no
    point where a signal handler can run)."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.count = 0
        self.armed = False
        self.fired = False
        self.gap = {(code, x.offset) for code, path in _handoff_gap().items() for x in path}

    @staticmethod
    def _inside_client(frame) -> bool:
        while frame is not None:
            if frame.f_code.co_filename == SYNC_FILE:
                return True
            frame = frame.f_back
        return False

    def trace(self, frame, event, arg):  # noqa: ANN001 - sys.settrace's signature
        if event == "call" and self._inside_client(frame):
            frame.f_trace_opcodes = True
            return self._local
        return None

    def _local(self, frame, event, arg):  # noqa: ANN001
        if event != "opcode" or not self.armed or self.fired or not frame.f_code.co_filename.startswith(INTERRUPTIBLE):
            return self._local
        if (frame.f_code, frame.f_lasti) in self.gap:
            return self._local
        if self.count == self.at:
            self.fired = True
            raise KeyboardInterrupt(f"injected at bytecode {self.at}")
        self.count += 1
        return self._local


def state(client: RolloutClient) -> Tuple[int, int, int, int]:
    """(samples queued, lent, outstanding, in flight) of the client, read on its loop."""
    c = client._client
    return client._run(sync_module._call(lambda: (c._stream.qsize(), c._lent, c._stream_outstanding, c._in_flight)))


def wait_queued(client: RolloutClient, n: int) -> None:
    deadline = time.monotonic() + 60
    while state(client)[0] < n:
        assert time.monotonic() < deadline, f"{n} samples never arrived: {state(client)}"
        time.sleep(0.02)


def interrupt_everywhere(client: RolloutClient, loop: Callable[[Callable[[], None]], object], queued: int) -> Tuple[int, object]:
    """Runs `loop` (it takes one item from a fresh iterator, calls `disarm` once its loop variable holds it, and
    returns it) with an interrupt at bytecode 0, 1, 2, ... until one run ends before the interrupt fires; after each
    interrupted run, everything must be back in the queue."""
    before = state(client)
    assert before[0] == queued and before[1] == 0
    at = 0
    while True:
        interrupter = Interrupter(at)
        got: Optional[object] = None
        sys.settrace(interrupter.trace)
        try:
            interrupter.armed = True
            got = loop(lambda: setattr(interrupter, "armed", False))
        except KeyboardInterrupt:
            pass
        finally:
            interrupter.armed = False
            sys.settrace(None)
        if not interrupter.fired:
            return at, got
        assert got is None
        assert state(client) == before, f"interrupted at bytecode {at}: {state(client)} != {before}"
        at += 1
        assert at < 20_000


def test_the_hand_off_gap_holds_no_point_where_cpython_runs_a_signal_handler():
    run_gap, iterate_gap = _handoff_gap().values()
    assert [x.opname for x in run_gap] == ["RETURN_VALUE"]
    assert iterate_gap[0].argval == "item" and iterate_gap[-1].opname == "YIELD_VALUE"
    assert {x.opname for x in iterate_gap} <= NO_CHECK_POINT, [x.opname for x in iterate_gap]


def test_an_interrupt_at_any_bytecode_of_a_samples_loop_loses_no_sample(server):
    with RolloutClient(server.address) as client:
        task_id = client.submit("math", math_instance(1), 1, sampling=SAMPLING)
        wait_queued(client, 1)

        def take_one(disarm):
            it = client.samples(until_idle=False)
            try:
                for s in it:
                    disarm()  # the caller holds it: an interrupt from here on is the caller's
                    return s
            finally:
                it.close()

        points, got = interrupt_everywhere(client, take_one, queued=1)
        assert points > 50  # the interrupt really went through the whole hand-off
        assert (got.task_id, got.sample_index) == (task_id, 0)
        assert state(client) == (0, 0, 0, 0)


def test_an_interrupt_at_any_bytecode_of_a_groups_loop_loses_no_sample(server):
    with RolloutClient(server.address) as client:
        task_id = client.submit("math", math_instance(2), 2, sampling=SAMPLING)
        wait_queued(client, 2)

        def take_one(disarm):
            it = client.groups(until_idle=False)
            try:
                for g in it:
                    disarm()
                    return g
            finally:
                it.close()

        points, got = interrupt_everywhere(client, take_one, queued=2)
        assert points > 50
        assert got.task_id == task_id and [s.sample_index for s in got.samples] == [0, 1]
        assert state(client) == (0, 0, 0, 0)


def test_real_sigints_at_random_moments_of_a_samples_loop_neither_lose_nor_repeat_a_sample(server):
    """SIGINT sent by another thread every few milliseconds; the handler raises KeyboardInterrupt once per armed loop
    (a second one inside the first one's handling is a double Ctrl-C, not covered). Each loop is begun again after
    the interrupt; in the end every sample was bound by a loop exactly once."""
    tasks, per_task = 12, 4
    armed = [False]
    interrupts = [0]

    def handler(signum, frame):  # noqa: ANN001
        if armed[0]:
            armed[0] = False
            interrupts[0] += 1
            raise KeyboardInterrupt

    with RolloutClient(server.address) as client:
        ids = [client.submit("math", math_instance(i), per_task, sampling=SAMPLING) for i in range(tasks)]
        stop = threading.Event()
        main = threading.main_thread().ident

        def pester() -> None:
            rng = random.Random(1)
            while not stop.is_set():
                time.sleep(rng.uniform(0.0005, 0.01))
                signal.pthread_kill(main, signal.SIGINT)

        previous = signal.signal(signal.SIGINT, handler)
        pesterer = threading.Thread(target=pester, daemon=True)
        pesterer.start()
        got: List[Tuple[str, int]] = []
        try:
            deadline = time.monotonic() + 120
            while len(got) < tasks * per_task and time.monotonic() < deadline:
                try:
                    armed[0] = True
                    for s in client.samples():
                        got.append((s.task_id, s.sample_index))
                except KeyboardInterrupt:
                    pass
                finally:
                    armed[0] = False
        finally:
            stop.set()
            pesterer.join()
            signal.signal(signal.SIGINT, previous)
        assert sorted(got) == sorted((t, i) for t in ids for i in range(per_task))
        assert interrupts[0] >= 20
        assert state(client) == (0, 0, 0, 0)


def _interrupted_as_it_receives(pull: Callable[[], object]) -> None:
    """Runs pull(), whose `got = next(it)` gets a SIGINT as the call returns, before `got` is bound: the point where
    CPython runs a signal handler on the return of a call into C (the handler's frame is the caller's, the item on its
    stack). The installed handler is called there as CPython would call it (a real signal cannot be timed to it), at
    the opcode that would bind the item; it raises KeyboardInterrupt, and the item is dropped with the stack."""
    code = pull.__code__
    binding = {x.offset for x in dis.get_instructions(code) if x.opname.startswith("STORE") and x.argval == "got"}
    fired = []

    def local(frame, event, arg):  # noqa: ANN001
        if event == "opcode" and not fired and frame.f_lasti in binding:
            fired.append(True)
            signal.getsignal(signal.SIGINT)(signal.SIGINT, frame)
        return local

    def trace(frame, event, arg):  # noqa: ANN001
        if frame.f_code is code:
            frame.f_trace_opcodes = True
            return local
        return None

    sys.settrace(trace)
    try:
        pull()
    finally:
        sys.settrace(None)
    raise AssertionError("the interrupt did not fire")


def test_an_interrupt_as_next_returns_a_sample_hands_the_same_sample_again_on_the_next_call(server):
    with RolloutClient(server.address) as client:
        task_id = client.submit("math", math_instance(5), 1, sampling=SAMPLING)
        wait_queued(client, 1)
        it = client.samples()

        def pull():
            got = next(it)
            return got

        try:
            _interrupted_as_it_receives(pull)
        except KeyboardInterrupt:
            pass
        s = next(it)  # the caller never had it: the next call hands it (before: the iterator was done, the sample lost)
        assert (s.task_id, s.sample_index) == (task_id, 0)
        assert list(it) == []
        assert state(client) == (0, 0, 0, 0)


def test_an_interrupt_as_next_returns_a_sample_then_a_new_loop_gets_it(server):
    with RolloutClient(server.address) as client:
        task_id = client.submit("math", math_instance(6), 1, sampling=SAMPLING)
        wait_queued(client, 1)
        it = client.samples()

        def pull():
            got = next(it)
            return got

        try:
            _interrupted_as_it_receives(pull)
        except KeyboardInterrupt:
            pass
        it.close()  # the caller gives up this iterator: the sample it never received goes back to the queue
        assert [(s.task_id, s.sample_index) for s in client.samples()] == [(task_id, 0)]
        assert state(client) == (0, 0, 0, 0)
