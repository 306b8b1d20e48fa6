"""The agent fan-out from Python, in real time: 60 calls fired at once through
`@tollgate.limit` on "5/s burst 10".

The first ten pass at once (the burst), the rest are paced at five a second, so the last
passes at 10 s. Prints every admission and ends with one summary line:

    python python/examples/fanout.py
    python python/examples/fanout.py --calls 31 --requests "100/s burst 1"
    python python/examples/fanout.py --redis redis://127.0.0.1:6379   # the key in Redis
"""

import argparse
import asyncio
import time

import tollgate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--rate", type=float, default=5.0, help="calls per second")
    parser.add_argument("--burst", type=int, default=10)
    parser.add_argument("--redis", default=None, help="a Redis URL: the key lives there")
    args = parser.parse_args()
    requests = f"{args.rate:g}/s burst {args.burst}"
    # A fresh key per run, so that a Redis shared with earlier runs starts full.
    key = f"fanout:{time.time_ns()}"

    @tollgate.limit(key, requests=requests, redis=args.redis, timeout="none")
    async def call(i: int) -> int:
        return i

    async def run() -> list:
        started = time.monotonic()
        admitted = []

        async def one(i: int) -> None:
            await call(i)
            at = time.monotonic() - started
            admitted.append(at)
            print(f"call {i:3} admitted at {at:6.3f} s")

        await asyncio.gather(*(one(i) for i in range(args.calls)))
        return sorted(admitted)

    admitted = asyncio.run(run())
    ideal = max(0.0, (args.calls - args.burst) / args.rate)
    # The window bound: in any interval of length dt, at most burst + rate * dt calls (a
    # millisecond allowed for the time between the admission and its timestamp).
    held = all(j - i + 1 <= args.burst + args.rate * (admitted[j] - admitted[i] + 0.001)
               for i in range(len(admitted)) for j in range(i, len(admitted)))
    took = admitted[-1]
    efficiency = ideal / took * 100 if took > 0 else 100.0
    print(f"fanout: {args.calls} calls in {took:.2f} s, ideal {ideal:.2f} s, efficiency "
          f"{min(efficiency, 100.0):.1f}%, window bound {'held' if held else 'BROKEN'}")


if __name__ == "__main__":
    main()
