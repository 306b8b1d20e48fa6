#!/usr/bin/env python3
"""The latency tollgate-proxy adds to the official Python SDK's calls, one after another.

    python3 proxy/benches/sdk_latency.py PROXY_BINARY STAND_IN_BINARY [--calls N] [--runs R]

The stand-in (`cargo build --release -p tollgate-proxy --example stand_in`) is started with
windows no call reaches (100,000 requests and 100,000,000 tokens per 10 s), so that nothing
waits and only the path is measured; it still takes its 20 ms plus 1 ms an output token to
answer (5 output tokens here). One `OpenAI` client sends `--calls` chat calls (default 200)
straight to the stand-in and one sends them through the proxy (given the same windows), in
alternating rounds of 20, each prompt new (the proxy counts every one). Per run: p50 and p99
of each, and "added", the percentile through the proxy less the same percentile straight.
Medians of `--runs` runs (default 3) at the end.
"""

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pool import free_port, sdk_python, wait_http  # noqa: E402  (the pool bench's helpers)

CLIENT = r"""
import json, sys, time
from openai import OpenAI
straight, through, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
clients = {
    "straight": OpenAI(base_url=straight, api_key="sk-anything", max_retries=0),
    "through": OpenAI(base_url=through, api_key="sk-anything", max_retries=0),
}
times = {"straight": [], "through": []}
words = ["rate", "limits", "keep", "agents", "polite", "and", "calls", "cheap"]
n = 0
# One call each to open the connections.
for client in clients.values():
    client.chat.completions.create(model="gpt-4o", max_tokens=5,
                                   messages=[{"role": "user", "content": "warm up"}])
while n < calls:
    for name, client in clients.items():
        for _ in range(20):
            n += 1
            text = " ".join(words[(i * n + i) % 8] for i in range(150)) + f" {n}"
            start = time.perf_counter()
            client.chat.completions.create(model="gpt-4o", max_tokens=5,
                                           messages=[{"role": "user", "content": text}])
            times[name].append(time.perf_counter() - start)
print(json.dumps(times))
"""


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def run(proxy, stand_in, calls):
    upstream = subprocess.Popen([stand_in, "openai", "100000", "100000000", "10"],
                                stdout=subprocess.PIPE, text=True)
    url = upstream.stdout.readline().strip().rsplit(" ", 1)[-1]
    port = free_port()
    config = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    config.write(f'listen = "127.0.0.1:{port}"\n[[upstream]]\nname = "openai"\nurl = "{url}"\n'
                 'profile = "openai"\nrequests = "100000/10s"\ntokens = "100000000/10s"\n')
    config.close()
    process = subprocess.Popen([proxy, "--config", config.name],
                               env=dict(os.environ, RUST_LOG="warn"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz")
        python, extra = sdk_python()
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        env.update(extra, NO_PROXY="*")
        out = subprocess.run([python, "-c", CLIENT, f"{url}/v1", f"http://127.0.0.1:{port}/v1",
                              str(calls)], env=env, capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
        times = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=40)
        upstream.send_signal(signal.SIGINT)
        upstream.communicate(timeout=10)
        os.unlink(config.name)
    ms = {name: [t * 1000 for t in values] for name, values in times.items()}
    row = {}
    for p in (50, 99):
        row[f"straight p{p}"] = percentile(ms["straight"], p)
        row[f"through p{p}"] = percentile(ms["through"], p)
        row[f"added p{p}"] = row[f"through p{p}"] - row[f"straight p{p}"]
    return row


def main():
    args = sys.argv[1:]
    if len(args) < 2:
        sys.exit(__doc__)
    proxy, stand_in = args[0], args[1]
    calls = int(args[args.index("--calls") + 1]) if "--calls" in args else 200
    runs = int(args[args.index("--runs") + 1]) if "--runs" in args else 3
    rows = []
    for i in range(runs):
        row = run(proxy, stand_in, calls)
        rows.append(row)
        print(f"run {i + 1}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in row.items()), flush=True)
    print("medians: " + ", ".join(f"{k} {statistics.median(r[k] for r in rows):.2f} ms"
                                  for k in rows[0]))


if __name__ == "__main__":
    main()
