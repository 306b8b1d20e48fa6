"""tollgate.Limiter: the Rust limiter's promises, kept from Python. Windows on a ManualClock
give exact values without sleeping."""

import asyncio
import math
import threading
import time

import pytest

import tollgate
from tollgate import Limiter, ManualClock, NotYet, Permit


def fresh(key: str, **limits: str) -> Limiter:
    return Limiter(key, clock=ManualClock(), **limits)  # type: ignore[arg-type]


def test_a_call_pays_one_request_and_its_tokens():
    limiter = fresh("pays", requests="10/m", tokens="1000/m")
    permit = limiter.try_acquire(tokens=300)
    assert isinstance(permit, Permit)
    assert (permit.requests, permit.tokens, permit.output_tokens, permit.waited) == (1, 300, 0, 0.0)
    assert limiter.levels() == {"requests": 9, "tokens": 700}


def test_not_yet_says_exactly_when_and_is_false():
    clock = ManualClock()
    limiter = Limiter("when", requests="60/m", tokens="1000/m", clock=clock)
    assert limiter.try_acquire(tokens=1000)
    refused = limiter.try_acquire(tokens=100)
    assert isinstance(refused, NotYet) and not refused
    # 100 tokens at 1,000 a minute.
    assert refused.ready_in == 6.0
    clock.advance(5.999)
    assert not limiter.try_acquire(tokens=100)
    clock.advance(0.001)
    assert limiter.try_acquire(tokens=100)


def test_every_window_or_none():
    limiter = fresh("both", requests="1/m", tokens="1000/m")
    assert limiter.try_acquire(tokens=10)
    # The request window is empty: the token window must not pay either.
    assert not limiter.try_acquire(tokens=10)
    assert limiter.levels() == {"requests": 0, "tokens": 990}


def test_a_refusal_keeps_partial_credit():
    clock = ManualClock()
    limiter = Limiter("partial", tokens="60/m", clock=clock)
    assert limiter.try_acquire(tokens=60)
    clock.advance(0.5)  # half a token
    assert not limiter.try_acquire(tokens=1)
    clock.advance(0.5)
    assert limiter.try_acquire(tokens=1)


def test_a_long_silence_refills_to_capacity_never_beyond():
    clock = ManualClock()
    limiter = Limiter("silence", requests="5/s burst 10", clock=clock)
    for _ in range(10):
        assert limiter.try_acquire()
    clock.advance(3600)
    assert limiter.levels() == {"requests": 10}


def test_rates_are_written_as_in_rust():
    assert fresh("several", requests="60/m; 1000/d").limits == {"requests": "60/m; 1000/d"}
    limiter = fresh("burst", requests="5/s burst 10")
    assert limiter.levels() == {"requests": 10}
    assert fresh("per", tokens="100000 per minute").try_acquire(tokens=100_000)


@pytest.mark.parametrize("rate, message", [
    ("500/q", "rate `500/q`: unknown unit `q`; expected s, m, h or d (or ms), optionally with a count like `5m`"),
    ("", None),
    ("0/m", None),
    ("-5/m", None),
    ("abc", None),
    ("99999999999999999999999/s", None),
    ("5/s burst 0", None),
    ("60/m;", None),
])
def test_a_bad_rate_is_a_value_error_with_the_grammars_message(rate, message):
    with pytest.raises(ValueError) as raised:
        Limiter("bad", requests=rate, clock=ManualClock())
    if message is not None:
        assert str(raised.value) == message
    assert rate in str(raised.value) or rate == ""


def test_no_limits_is_a_value_error():
    with pytest.raises(ValueError, match="no limits given"):
        Limiter("none", clock=ManualClock())


def test_a_cost_above_capacity_raises_too_large_at_once():
    limiter = fresh("large", tokens="1000/m")
    with pytest.raises(tollgate.TooLarge) as raised:
        limiter.try_acquire(tokens=1001)
    err = raised.value
    assert isinstance(err, ValueError) and isinstance(err, tollgate.TollgateError)
    assert (err.key, err.cost, err.capacity) == ("large", 1001, 1000)
    assert str(err) == ("key `large`: a cost of 1001 tokens exceeds the capacity 1000 of the tokens "
                        "window `1000/m`; waiting cannot help: raise the burst or split the call")
    with pytest.raises(tollgate.TooLarge):
        limiter.acquire_blocking(tokens=1001, timeout=math.inf)
    assert limiter.levels() == {"tokens": 1000}


def test_a_wait_past_the_deadline_raises_timeout_at_once_and_charges_nothing():
    limiter = fresh("deadline", tokens="600/m")
    assert limiter.try_acquire(tokens=600)
    started = time.monotonic()
    with pytest.raises(tollgate.Timeout) as raised:
        limiter.acquire_blocking(tokens=100, timeout=1)
    assert time.monotonic() - started < 0.5
    err = raised.value
    assert isinstance(err, TimeoutError) and err.key == "deadline"
    # 100 tokens at 10 a second: the wait it would have needed from the start.
    assert err.needed == 10.0
    assert limiter.levels() == {"tokens": 0}
    assert limiter.waiting == 0


@pytest.mark.parametrize("timeout", [0, 0.0, "0s", "0 ms"])
def test_timeout_zero_never_waits(timeout):
    limiter = fresh("zero", requests="1/h")
    assert limiter.try_acquire()
    with pytest.raises(tollgate.Timeout):
        limiter.acquire_blocking(timeout=timeout)


def test_settle_gives_back_an_overestimate_and_charges_a_shortfall():
    limiter = fresh("settle", requests="10/m", tokens="1000/m")
    over = limiter.try_acquire(tokens=300)
    assert over.settle(input_tokens=200) == {"tokens": 100, "output_tokens": 0}
    assert limiter.levels() == {"requests": 9, "tokens": 800}
    under = limiter.try_acquire(tokens=100)
    assert under.settle(input_tokens=150, output_tokens=50) == {"tokens": -100, "output_tokens": 0}
    assert limiter.levels() == {"requests": 8, "tokens": 600}


def test_output_tokens_settle_apart_where_the_key_meters_them():
    limiter = fresh("apart", requests="50/m", tokens="40000/m", output_tokens="8000/m")
    permit = limiter.try_acquire(tokens=500, output_tokens=1000)
    assert (permit.tokens, permit.output_tokens) == (500, 1000)
    assert permit.settle(input_tokens=480, output_tokens=300) == {"tokens": 20, "output_tokens": 700}
    assert limiter.levels() == {"requests": 49, "tokens": 39520, "output_tokens": 7700}


def test_a_permit_settles_once():
    permit = fresh("once", tokens="100/m").try_acquire(tokens=10)
    permit.settle(tokens=5)
    with pytest.raises(RuntimeError, match="already settled"):
        permit.settle(tokens=5)


def test_limiters_of_one_key_share_its_windows():
    clock = ManualClock()
    a = Limiter("shared", requests="3/m", clock=clock)
    b = Limiter("shared", requests="3/m", clock=clock)
    assert a.try_acquire() and b.try_acquire() and a.try_acquire()
    assert not b.try_acquire()


def test_conflicting_limits_on_a_live_key_are_a_value_error():
    clock = ManualClock()
    kept = Limiter("conflict", requests="3/m", clock=clock)
    with pytest.raises(ValueError, match="conflict"):
        Limiter("conflict", requests="4/m", clock=clock)
    assert kept.try_acquire()


@pytest.mark.parametrize("tokens, error", [
    (-1, ValueError), (2**64, ValueError), (2**200, ValueError), (1.5, TypeError),
    ("10", TypeError), (True, TypeError),
])
def test_absurd_amounts_are_refused_and_change_nothing(tokens, error):
    limiter = fresh("absurd", tokens="1000/m")
    with pytest.raises(error):
        limiter.try_acquire(tokens=tokens)
    assert limiter.levels() == {"tokens": 1000}


def test_the_largest_amount_is_too_large_not_a_crash():
    limiter = fresh("huge", tokens="1000/m")
    with pytest.raises(tollgate.TooLarge):
        limiter.try_acquire(tokens=2**64 - 1)


@pytest.mark.parametrize("timeout, error", [
    (-1, ValueError), (math.nan, ValueError), ("30 parsecs", ValueError), (True, TypeError),
    ("-5s", ValueError), (1e300, ValueError), ([], TypeError),
])
def test_absurd_timeouts_are_refused(timeout, error):
    with pytest.raises(error):
        fresh("timeouts", tokens="1000/m").acquire_blocking(tokens=1, timeout=timeout)


def test_an_unknown_estimator_is_a_value_error():
    with pytest.raises(ValueError, match="unknown estimator `nonsense`"):
        Limiter("est", tokens="10/m", estimator="nonsense", clock=ManualClock())


def test_a_manual_clock_moves_only_forward():
    clock = ManualClock()
    clock.advance(1.5)
    assert clock.now == 1.5
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            clock.advance(bad)
    assert clock.now == 1.5


def test_threads_share_a_key_and_every_call_is_admitted_once():
    # Real time: 40 calls on 100/s with a burst of 10 take at least 0.3 s.
    limiter = Limiter("threads", requests="100/s burst 10")
    permits = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(5):
            permit = limiter.acquire_blocking(timeout=30)
            with lock:
                permits.append(permit)

    started = time.monotonic()
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    assert len(permits) == 40
    assert elapsed >= 0.29
    assert limiter.waiting == 0


def test_a_blocking_wait_releases_the_gil():
    limiter = Limiter("gil", requests="4/s burst 1")
    assert limiter.acquire_blocking()
    returned = []
    waiter = threading.Thread(target=lambda: returned.append(limiter.acquire_blocking(timeout=5)))
    waiter.start()
    # The waiter sleeps about 0.25 s in Rust; Python code runs here meanwhile.
    spins = 0
    while waiter.is_alive():
        spins += 1
    waiter.join()
    assert returned and returned[0].waited > 0.2
    assert spins > 1000


def test_async_acquire_waits_on_the_loop_without_blocking_it():
    async def main() -> tuple:
        limiter = Limiter("loop", requests="10/s burst 1")
        await limiter.acquire()
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        async with limiter.acquire() as permit:
            waited = permit.waited
        ticker.cancel()
        return waited, ticks

    waited, ticks = asyncio.run(main())
    assert waited > 0.05
    assert ticks >= 3


def test_asettle_settles_on_the_loop():
    async def main() -> dict:
        limiter = fresh("asettle", tokens="1000/m")
        permit = await limiter.acquire(tokens=400)
        return await permit.asettle(input_tokens=100)

    assert asyncio.run(main()) == {"tokens": 300, "output_tokens": 0}


@pytest.mark.parametrize("shared, quiet_place", [(True, 2), (False, 10)])
def test_tenants_sharing_a_key_pass_in_fair_order_not_arrival_order(shared, quiet_place):
    # 5 requests a second, burst 1: the burst is taken, ten calls of `noisy` queue (one every
    # 200 ms), and a call of `quiet` comes once they all wait. As tenants, the quiet call goes
    # behind the noisy call first in line and the one its place ties with: third. Without
    # tenants, arrival order puts it last.
    limiter = Limiter("fair-order-%s" % shared, requests="5/s burst 1")
    assert limiter.try_acquire()
    order = []

    async def call(name):
        kwargs = {"tenant": name} if shared else {}
        async with limiter.acquire(**kwargs):
            order.append(name)

    async def main():
        noisy = [asyncio.ensure_future(call("noisy")) for _ in range(10)]
        while limiter.waiting < 10:
            await asyncio.sleep(0.001)
        quiet = asyncio.ensure_future(call("quiet"))
        await asyncio.gather(*noisy, quiet)

    asyncio.run(main())
    assert order.index("quiet") == quiet_place, order


def test_a_tenants_weight_must_be_at_least_one():
    limiter = fresh("weights", requests="10/s")
    with pytest.raises(ValueError, match="weight: 0"):
        limiter.acquire(tenant="a", weight=0)
