#!/usr/bin/env python3
"""A deployment pool against one deployment, and LiteLLM's router on the same mocks (issue 25).

    python3 proxy/benches/pool.py PROXY_BINARY STAND_IN_BINARY [--runs N] [--litellm LITELLM]

Each deployment is the tests' stand-in provider (`cargo build --release -p tollgate-proxy
--example stand_in`) at 30 requests and 10,000 tokens per 10 s, OpenAI-style: it refuses what
its windows can't pay with a 429 and `retry-after`, counts the refused request, bills its own
count of the input (within 3% of tiktoken's) plus the 100 output tokens each call reserves, and
takes 20 ms plus 1 ms an output token to answer. The workload is the tests' (`provider::chats(0,
80)`): 80 chat calls of 40 to 940 words, all at once, from the official Python SDK
(`AsyncOpenAI`, its default two retries), run by `proxy/tests/clients/sdk_calls.py burst`.

Configurations, each run `--runs` times (default 3), medians printed at the end:

- `one`: tollgate-proxy in front of one deployment (its windows as the proxy's limits);
- `pool`: tollgate-proxy with two deployments, each an upstream with its own windows, in one pool;
- `litellm-<strategy>`, with `--litellm PATH` (the `litellm` command of a venv holding
  `litellm[proxy]`): LiteLLM's proxy with the two deployments as one model group (rpm 180 and
  tpm 60,000 each: the same windows per minute), for the strategies usage-based-routing-v2,
  simple-shuffle and least-busy. LiteLLM refuses to start without a master key: it is given a
  random one (LITELLM_MASTER_KEY), which the SDK sends as its API key.

`POOL_BENCH_ONLY=one,pool` runs only the configurations named. The figures are in
BENCHMARKS.md, "Deployment pools".

For each run: seconds until the last of the 80 answered, how many succeeded, and the 429s the
stand-ins sent (what a provider would have refused). The SDK's Python is found through
TOLLGATE_PROXY_CLIENTS (as the tests find it), or `python3`.
"""

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "tests", "clients", "sdk_calls.py")
REQUESTS, TOKENS, PERIOD = 30, 10_000, 10
LITELLM_KEY = "sk-pool-bench-" + os.urandom(16).hex()
WORDS = ["rate", "limits", "keep", "agents", "polite", "and", "calls", "cheap"]


def chats(first, count):
    """The tests' workload (`provider::chats`), word for word."""
    bodies = []
    for i in range(first, first + count):
        length = 40 + (i * 97) % 900
        text = " ".join(WORDS[(w + i) % len(WORDS)] for w in range(length))
        bodies.append({
            "model": "gpt-4o",
            "max_tokens": 100,
            "messages": [
                {"role": "system", "content": "Answer in one line."},
                {"role": "user", "content": text},
            ],
        })
    return bodies


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except Exception:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {seconds} s")


class StandIn:
    """One mock deployment."""

    def __init__(self, binary):
        self.process = subprocess.Popen(
            [binary, "openai", str(REQUESTS), str(TOKENS), str(PERIOD)],
            stdout=subprocess.PIPE, text=True,
        )
        line = self.process.stdout.readline()
        self.url = line.strip().rsplit(" ", 1)[-1]
        assert self.url.startswith("http://"), line

    def stop(self):
        """Stops it; answers (answered, refused with 429)."""
        self.process.send_signal(signal.SIGINT)
        out, _ = self.process.communicate(timeout=10)
        words = out.split()
        at = words.index("answered,")
        return int(words[at - 1]), int(words[at + 1])


def tollgate(binary, stand_ins):
    port = free_port()
    lines = [f'listen = "127.0.0.1:{port}"']
    names = []
    for i, stand_in in enumerate(stand_ins):
        name = f"deployment-{i}"
        names.append(name)
        lines += [
            "[[upstream]]",
            f'name = "{name}"',
            f'url = "{stand_in.url}"',
            'profile = "openai"',
            f'requests = "{REQUESTS}/{PERIOD}s"',
            f'tokens = "{TOKENS}/{PERIOD}s"',
        ]
    if len(names) > 1:
        lines += ["[[pool]]", 'name = "gpt-4o"', f"members = {json.dumps(names)}", 'models = ["gpt-4o"]']
    config = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    config.write("\n".join(lines) + "\n")
    config.close()
    process = subprocess.Popen(
        [binary, "--config", config.name, "--log", "text"],
        env=dict(os.environ, RUST_LOG="warn"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    wait_http(f"http://127.0.0.1:{port}/healthz")
    return process, f"http://127.0.0.1:{port}/v1", config.name, "sk-anything"


def litellm(command, stand_ins, strategy):
    port = free_port()
    deployments = "".join(
        f"""  - model_name: gpt-4o
    litellm_params:
      model: openai/gpt-4o
      api_base: {s.url}/v1
      api_key: sk-anything
      rpm: {REQUESTS * 60 // PERIOD}
      tpm: {TOKENS * 60 // PERIOD}
"""
        for s in stand_ins
    )
    config = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    config.write(f"model_list:\n{deployments}router_settings:\n  routing_strategy: {strategy}\n")
    config.close()
    log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
    process = subprocess.Popen(
        [command, "--config", config.name, "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
        stdout=log, stderr=subprocess.STDOUT,
        # It refuses to start without a master key; the SDK sends it as its API key.
        env=dict(os.environ, LITELLM_LOG="ERROR", LITELLM_MASTER_KEY=LITELLM_KEY),
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health/liveliness", seconds=180)
    except RuntimeError:
        process.kill()
        process.wait()
        with open(log.name) as f:
            sys.stderr.write(f.read()[-3000:])
        raise
    finally:
        os.unlink(log.name)
    return process, f"http://127.0.0.1:{port}/v1", config.name, LITELLM_KEY


def sdk_python():
    clients = os.environ.get("TOLLGATE_PROXY_CLIENTS")
    if clients and os.path.exists(os.path.join(clients, "python", "bin", "python")):
        return os.path.join(clients, "python", "bin", "python"), {}
    if clients:
        return "python3", {"PYTHONPATH": os.path.join(clients, "python-packages")}
    return "python3", {}


def burst(base_url, api_key, bodies_file):
    python, extra = sdk_python()
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(extra, OPENAI_BASE_URL=base_url, OPENAI_API_KEY=api_key, NO_PROXY="*")
    out = subprocess.run([python, SCRIPT, "burst", bodies_file], env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(kind, args, bodies_file):
    stand_ins = [StandIn(args["stand_in"]) for _ in range(1 if kind == "one" else 2)]
    try:
        if kind.startswith("litellm-"):
            process, base, config, key = litellm(args["litellm"], stand_ins, kind[len("litellm-"):])
        else:
            process, base, config, key = tollgate(args["proxy"], stand_ins)
        try:
            outcome = burst(base, key, bodies_file)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                process.kill()
            os.unlink(config)
    finally:
        seen = [s.stop() for s in stand_ins]
    answered = sum(a for a, _ in seen)
    refused = sum(r for _, r in seen)
    return {
        "seconds": outcome["seconds"], "ok": outcome["ok"], "failures": outcome["failures"],
        "answered": answered, "answered_each": [a for a, _ in seen], "429s": refused,
    }


def main():
    argv = sys.argv[1:]
    if len(argv) < 2:
        sys.exit(__doc__)
    args = {"proxy": argv[0], "stand_in": argv[1], "runs": 3, "litellm": None}
    rest = argv[2:]
    while rest:
        flag, value, rest = rest[0], rest[1], rest[2:]
        args[flag.lstrip("-")] = int(value) if flag == "--runs" else value
    kinds = ["one", "pool"]
    if args["litellm"]:
        kinds += ["litellm-usage-based-routing-v2", "litellm-simple-shuffle", "litellm-least-busy"]
    only = os.environ.get("POOL_BENCH_ONLY")
    if only:
        kinds = [k for k in kinds if k in only.split(",")]
    bodies = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(chats(0, 80), bodies)
    bodies.close()
    results = {}
    for kind in kinds:
        for i in range(args["runs"]):
            result = run(kind, args, bodies.name)
            results.setdefault(kind, []).append(result)
            print(f"{kind} run {i + 1}: {result['ok']}/80 ok in {result['seconds']:.2f} s, "
                  f"{result['429s']} 429s at the mocks, answered {result['answered_each']}"
                  + (f", failures {result['failures'][:2]}" if result["failures"] else ""), flush=True)
    os.unlink(bodies.name)
    print()
    one = statistics.median(r["seconds"] for r in results["one"]) if "one" in results else None
    for kind, runs in results.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        ratio = f", {seconds / one:.2f}x one deployment" if one else ""
        print(f"{kind}: median {seconds:.2f} s{ratio}; ok {[r['ok'] for r in runs]}; "
              f"429s at the mocks {[r['429s'] for r in runs]}")


if __name__ == "__main__":
    main()
