"""Cancelling a waiting task drops its Rust future: its place in line is freed, and it consumed
nothing. The line is read exactly through a newcomer's `ready_in` on a ManualClock."""

import asyncio
import gc
import math
import signal
import time

import pytest

from tollgate import Limiter, ManualClock, limit


async def until(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.001)


def test_cancelling_a_waiting_task_frees_its_place_in_line():
    # One request every 12 minutes: each waiter ahead of a newcomer costs it 720 s.
    limiter = Limiter("cancel-line", requests="5/h burst 1", clock=ManualClock())

    async def main() -> list:
        assert limiter.try_acquire()

        async def wait():
            return await limiter.acquire(timeout=math.inf)

        first, second = asyncio.ensure_future(wait()), asyncio.ensure_future(wait())
        await until(lambda: limiter.waiting == 2)
        seen = [limiter.try_acquire().ready_in]
        # A task cancelled while its question was on its way gives its place up when the
        # answer comes (the store's next step, in the background): the line is read once the
        # place is gone.
        first.cancel()
        await until(lambda: limiter.waiting == 1 and limiter.try_acquire().ready_in < seen[0])
        seen.append(limiter.try_acquire().ready_in)
        second.cancel()
        await until(lambda: limiter.waiting == 0 and limiter.try_acquire().ready_in < seen[1])
        seen.append(limiter.try_acquire().ready_in)
        for task in (first, second):
            with pytest.raises(asyncio.CancelledError):
                await task
        return seen

    assert asyncio.run(main()) == [2160.0, 1440.0, 720.0]
    assert limiter.levels() == {"requests": 0}


def test_a_cancelled_decorated_call_frees_its_place_and_its_body_never_runs():
    clock = ManualClock()
    ran = []

    @limit("cancel-deco", requests="5/h burst 1", timeout=math.inf, clock=clock)
    async def call():
        ran.append(1)

    async def main() -> float:
        await call()
        waiting = asyncio.ensure_future(call())
        await until(lambda: call.limiter.waiting == 1)
        waiting.cancel()
        await until(lambda: call.limiter.waiting == 0)
        return call.limiter.try_acquire().ready_in

    assert asyncio.run(main()) == 720.0
    assert ran == [1]


def test_a_timeout_from_asyncio_wait_for_frees_the_place_too():
    limiter = Limiter("cancel-wait-for", requests="5/h burst 1", clock=ManualClock())

    async def main() -> float:
        assert limiter.try_acquire()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(limiter.acquire(timeout=math.inf).__aenter__(), 0.05)
        await until(lambda: limiter.waiting == 0)
        return limiter.try_acquire().ready_in

    assert asyncio.run(main()) == 720.0


class Interrupted(Exception):
    pass


def test_a_signal_stops_a_blocking_wait_and_frees_its_place():
    limiter = Limiter("cancel-signal", requests="5/h burst 1", clock=ManualClock())
    assert limiter.try_acquire()

    def interrupt(signum, frame):
        raise Interrupted()

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        started = time.monotonic()
        with pytest.raises(Interrupted):
            limiter.acquire_blocking(timeout=math.inf)
        assert time.monotonic() - started < 2.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert limiter.waiting == 0
    assert limiter.try_acquire().ready_in == 720.0


def test_a_task_left_pending_when_its_loop_closes_gives_up_its_place():
    limiter = Limiter("cancel-loop", requests="5/h burst 1", clock=ManualClock())
    assert limiter.try_acquire()

    async def wait():
        return await limiter.acquire(timeout=math.inf)

    event_loop = asyncio.new_event_loop()
    task = event_loop.create_task(wait())
    event_loop.run_until_complete(until(lambda: limiter.waiting == 1))
    # Closed without cancelling the task: nobody will ever resume it.
    event_loop.close()
    del task, event_loop
    gc.collect()
    deadline = time.monotonic() + 5
    while limiter.waiting and time.monotonic() < deadline:
        time.sleep(0.001)
    assert limiter.waiting == 0
    assert limiter.try_acquire().ready_in == 720.0
