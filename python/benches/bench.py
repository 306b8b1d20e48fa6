"""tollgate for Python beside its peers, every figure in one run:

    cd python && maturin develop --release && pip install tiktoken aiolimiter openlimit
    python benches/bench.py

1. An uncontended `Limiter.try_acquire` in memory (and `acquire` awaited, `acquire_blocking`).
2. `count_tokens` on 1 KB prompts against tiktoken in Python on the same vocabulary
   (o200k_base, built from the file the tiktoken-rs crate carries): each prompt new (no
   cache can help) and the same prompt again (tollgate remembers counts of texts that come
   back, as an agent's conversation does).
3. Two pacing workloads (calls fired at once on 50 requests/s and 1,000 tokens/s, each with a
   burst of one second's worth: 40 calls of 50 to 500 tokens, where tokens bind, and 150 of 5
   tokens, where requests do) through tollgate, aiolimiter and openlimit: the wall time
   against the ideal (efficiency), and whether each window's bound held (in every interval of
   length dt, admitted <= burst + rate * dt).

Medians of repeated runs; real time throughout.
"""

import asyncio
import random
import statistics
import sys
import time
import timeit
from pathlib import Path
from typing import Callable, List, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import tollgate  # noqa: E402

REPEATS = 7


def median_seconds(run: Callable[[], None], number: int) -> float:
    """The median over REPEATS runs of `number` calls, in seconds per call."""
    return statistics.median(timeit.repeat(run, number=number, repeat=REPEATS)) / number


def limiter_figures() -> None:
    limiter = tollgate.Limiter("bench:try", requests="1000000000/s", tokens="1000000000000/s")
    per_call = median_seconds(lambda: limiter.try_acquire(tokens=100), 200_000)
    print(f"try_acquire, uncontended, in memory: {per_call * 1e6:.2f} µs")

    blocking = median_seconds(lambda: limiter.acquire_blocking(tokens=100), 50_000)
    print(f"acquire_blocking, uncontended:       {blocking * 1e6:.2f} µs")

    async def awaited(n: int) -> float:
        started = time.perf_counter()
        for _ in range(n):
            await limiter.acquire(tokens=100)
        return (time.perf_counter() - started) / n

    runs = [asyncio.run(awaited(20_000)) for _ in range(REPEATS)]
    print(f"await acquire, uncontended:          {statistics.median(runs) * 1e6:.2f} µs")
    return per_call


def prompts(count: int, size: int = 1024) -> List[str]:
    words = (HERE.parent.parent / "estimators" / "tests" / "data" / "english.txt").read_text().split()
    rng = random.Random(7)
    out = []
    for _ in range(count):
        text = ""
        while len(text) < size:
            text += rng.choice(words) + " "
        out.append(text[:size])
    return out


def count_figures() -> Tuple[float, float]:
    import local_tiktoken

    path = local_tiktoken.vocabulary_file("o200k_base")
    if path is None:
        print("count_tokens: o200k_base.tiktoken not found; skipped")
        return 0.0, 0.0
    encoding = local_tiktoken.encoding("o200k_base", path)
    texts = prompts(2_000)
    assert all(tollgate.count_tokens(t) == len(encoding.encode_ordinary(t)) for t in texts[:50])

    def each(count: Callable[[str], int]) -> Callable[[], None]:
        def run() -> None:
            for text in texts:
                count(text)
        return run

    # Fresh prompts: a new estimator cache per repeat would be unfair to neither; instead the
    # cache is defeated by making every repeat's texts new.
    def fresh_tollgate() -> float:
        runs = []
        for r in range(REPEATS):
            batch = [f"{r} {text}"[:1024] for text in texts]
            started = time.perf_counter()
            for text in batch:
                tollgate.count_tokens(text)
            runs.append((time.perf_counter() - started) / len(batch))
        return statistics.median(runs)

    ours = fresh_tollgate()
    theirs = median_seconds(each(encoding.encode_ordinary), 1) / len(texts)
    same = texts[0]
    ours_again = median_seconds(lambda: tollgate.count_tokens(same), 100_000)
    theirs_again = median_seconds(lambda: encoding.encode_ordinary(same), 10_000)
    print(f"count_tokens, 1 KB, each prompt new: {ours * 1e6:.1f} µs; tiktoken {theirs * 1e6:.1f} µs "
          f"({theirs / ours:.1f}x)")
    print(f"count_tokens, 1 KB, the same prompt: {ours_again * 1e6:.2f} µs; tiktoken {theirs_again * 1e6:.1f} µs "
          f"({theirs_again / ours_again:.0f}x)")
    return ours, theirs


# The pacing workloads: (name, calls as token costs), on the same windows for every library.
TOKENS_PER_SECOND = 1_000
REQUESTS_PER_SECOND = 50


def workloads() -> List[Tuple[str, List[int]]]:
    rng = random.Random(11)
    mixed = [rng.randint(50, 500) for _ in range(40)]
    tiny = [5] * 150
    return [("40 calls of 50 to 500 tokens", mixed), ("150 calls of 5 tokens", tiny)]


def ideal_seconds(costs: List[int]) -> float:
    """The earliest time the last call can pass in arrival order: each window's burst (one
    second's worth), then its rate."""
    tokens, latest = 0, 0.0
    for n, cost in enumerate(costs, 1):
        tokens += cost
        latest = max(latest, (tokens - TOKENS_PER_SECOND) / TOKENS_PER_SECOND,
                     (n - REQUESTS_PER_SECOND) / REQUESTS_PER_SECOND)
    return latest


def worst_excess(admitted: List[Tuple[float, int]], rate: float) -> float:
    """The most any interval admitted above burst + rate * dt (a millisecond of slack for the
    timestamps), as a fraction of the burst; <= 0 when the bound held."""
    admitted = sorted(admitted)
    worst = -1.0
    for i in range(len(admitted)):
        total = 0
        for j in range(i, len(admitted)):
            total += admitted[j][1]
            dt = admitted[j][0] - admitted[i][0]
            worst = max(worst, total - rate * (1 + dt + 0.001))
    return worst


async def run_tollgate(costs: List[int]) -> List[Tuple[float, int]]:
    limiter = tollgate.Limiter(f"bench:pace:{time.monotonic()}", requests=f"{REQUESTS_PER_SECOND}/s",
                               tokens=f"{TOKENS_PER_SECOND}/s", timeout="none")
    admitted: List[Tuple[float, int]] = []

    async def call(cost: int) -> None:
        await limiter.acquire(tokens=cost)
        admitted.append((time.monotonic(), cost))

    await asyncio.gather(*(call(c) for c in costs))
    return admitted


async def run_aiolimiter(costs: List[int]) -> List[Tuple[float, int]]:
    from aiolimiter import AsyncLimiter

    requests = AsyncLimiter(REQUESTS_PER_SECOND, 1)
    tokens = AsyncLimiter(TOKENS_PER_SECOND, 1)
    admitted: List[Tuple[float, int]] = []

    async def call(cost: int) -> None:
        # Two limiters, one after the other: aiolimiter has no notion of a call that pays two
        # currencies at once.
        await requests.acquire(1)
        await tokens.acquire(cost)
        admitted.append((time.monotonic(), cost))

    await asyncio.gather(*(call(c) for c in costs))
    return admitted


def offline_tiktoken() -> None:
    """openlimit asks tiktoken for cl100k_base and p50k_base when it is imported, which would
    download them: the encodings are registered first, built from the local files."""
    import types

    import local_tiktoken
    import tiktoken.registry

    # openlimit 0.3.0 imports aioredis (for its Redis buckets), which no longer imports on
    # Python 3.11 ("duplicate base class TimeoutError"); its in-memory limiter doesn't use it.
    try:
        import aioredis  # noqa: F401
    except Exception:
        sys.modules["aioredis"] = types.ModuleType("aioredis")
    for name in ("cl100k_base", "p50k_base"):
        path = local_tiktoken.vocabulary_file(name)
        if path is not None and name not in tiktoken.registry.ENCODINGS:
            tiktoken.registry.ENCODINGS[name] = local_tiktoken.encoding(name, path)


async def run_openlimit(costs: List[int]) -> List[Tuple[float, int]]:
    offline_tiktoken()
    from openlimit.rate_limiters import RateLimiter

    # openlimit's own limiter, with the cost given as is (its ChatRateLimiter counts with
    # tiktoken, which would download a vocabulary). Its limits are per minute; its burst is
    # one second's worth of them.
    limiter = RateLimiter(request_limit=REQUESTS_PER_SECOND * 60, token_limit=TOKENS_PER_SECOND * 60,
                          token_counter=lambda cost: cost)
    admitted: List[Tuple[float, int]] = []

    async def call(cost: int) -> None:
        async with limiter.limit(cost=cost):
            admitted.append((time.monotonic(), cost))

    await asyncio.gather(*(call(c) for c in costs))
    return admitted


def pacing_figures() -> None:
    print(f"pacing: calls fired at once on {REQUESTS_PER_SECOND} requests/s and {TOKENS_PER_SECOND} tokens/s, "
          "each with a burst of one second's worth")
    for title, costs in workloads():
        ideal = ideal_seconds(costs)
        print(f"  {title} ({sum(costs)} tokens): ideal {ideal:.2f} s")
        for name, run in (("tollgate", run_tollgate), ("aiolimiter", run_aiolimiter),
                          ("openlimit", run_openlimit)):
            try:
                if name == "openlimit":
                    offline_tiktoken()
                __import__(name)
            except ImportError:
                print(f"    {name:<11} not installed (pip install {name}); skipped")
                continue
            started = time.monotonic()
            admitted = asyncio.run(run(costs))
            seconds = max(t for t, _ in admitted) - started
            relative = [(t - started, c) for t, c in admitted]
            verdicts = []
            for currency, rate, calls in (("tokens", TOKENS_PER_SECOND, relative),
                                          ("requests", REQUESTS_PER_SECOND, [(t, 1) for t, _ in relative])):
                excess = worst_excess(calls, rate)
                verdicts.append(f"{currency} held" if excess <= 0 else f"{currency} BROKEN (+{excess:.0f})")
            print(f"    {name:<11} {seconds:6.2f} s  efficiency {ideal / seconds * 100:5.1f}%  "
                  f"window bound: {', '.join(verdicts)}")


def main() -> None:
    print(f"tollgate {tollgate.__version__}, Python {sys.version.split()[0]}")
    per_call = limiter_figures()
    count_figures()
    pacing_figures()
    if per_call > 5e-6:
        print("note: try_acquire is above 5 µs: build with `maturin develop --release`")


if __name__ == "__main__":
    main()
