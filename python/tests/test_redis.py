"""One quota on Redis for every process that names the key: Python processes, a Rust process
(`examples/python_peers.rs`) and tollgate-proxy, on a real `redis-server` started on a free
loopback port. Rates per day: nothing refills during a test, so the levels are exact."""

import json
import subprocess
import threading
import time

import pytest

import tollgate
from conftest import program, run_python, wait_port, free_port
from tollgate import Limiter


def rust_calls(url: str, key: str, requests: str, tokens: str, calls: int, each: int) -> dict:
    done = subprocess.run([str(program("python_peers")), "redis-calls", url, key, requests, tokens,
                           str(calls), str(each)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_python_processes_share_a_key(redis):
    other = run_python(
        "import sys, tollgate\n"
        "limiter = tollgate.Limiter('py-py', requests='6/d', redis=sys.argv[1])\n"
        "print(sum(1 for _ in range(4) if limiter.try_acquire()))\n", redis.url)
    assert other.strip() == "4"
    limiter = Limiter("py-py", requests="6/d", redis=redis.url)
    assert [bool(limiter.try_acquire()) for _ in range(3)] == [True, True, False]
    # One request every 4 hours.
    assert 14390 < limiter.try_acquire().ready_in <= 14400


def test_a_python_and_a_rust_process_share_a_key(redis):
    rust = rust_calls(redis.url, "py-rust", "6/d", "600/d", 4, 100)
    assert rust == {"admitted": 4, "ready_in": None, "levels": {"requests": 2, "tokens": 200}}
    limiter = Limiter("py-rust", requests="6/d", tokens="600/d", redis=redis.url)
    permits = [limiter.try_acquire(tokens=100) for _ in range(3)]
    assert [bool(p) for p in permits] == [True, True, False]
    assert 14390 < permits[2].ready_in <= 14400
    # What Python gives back, Rust sees.
    assert permits[0].settle(input_tokens=0) == {"tokens": 100, "output_tokens": 0}
    rust = rust_calls(redis.url, "py-rust", "6/d", "600/d", 1, 100)
    assert rust["admitted"] == 0 and 14390 < rust["ready_in"] <= 14400
    assert rust["levels"] == {"requests": 0, "tokens": 100}
    assert limiter.levels() == {"requests": 0, "tokens": 100}


def test_a_python_process_and_tollgate_proxy_share_a_key(redis, stand_in, tmp_path):
    httpx = pytest.importorskip("httpx")
    server = stand_in("openai", "60", "20000", "86400", "exact")
    port = free_port()
    config = tmp_path / "proxy.toml"
    config.write_text(f"""
listen = "127.0.0.1:{port}"
redis = "{redis.url}"

[[upstream]]
name = "py-proxy"
url = "{server.url}"
profile = "openai"
requests = "3/d"
tokens = "20000/d"
timeout_seconds = 1
retries = 0
""")
    proxy = subprocess.Popen([str(program("tollgate-proxy")), "--config", str(config), "--log", "text"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_port(port)
        # The proxy's key of a model with a key of its own: "<upstream>:<model>".
        limiter = Limiter("py-proxy:gpt-4o", requests="3/d", tokens="20000/d", redis=redis.url)
        assert limiter.try_acquire(tokens=100) and limiter.try_acquire(tokens=100)
        body = {"model": "gpt-4o", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        passed = httpx.post(url, json=body, headers={"authorization": "Bearer sk-test"}, timeout=30)
        assert passed.status_code == 200, passed.text
        # Python took two of the three requests, the proxy the third: its next call waits
        # past its deadline and is answered locally.
        refused = httpx.post(url, json=body, headers={"authorization": "Bearer sk-test"}, timeout=30)
        assert refused.status_code == 429 and refused.headers["x-tollgate"] == "local"
        assert not limiter.try_acquire()
        assert limiter.levels()["requests"] == 0
        assert server.stats()["ok"] == 1
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)


def test_a_redis_that_dies_raises_store_error_and_one_that_returns_is_used_again(redis):
    limiter = Limiter("py-killed", requests="10/d", redis=redis.url)
    assert limiter.try_acquire()
    redis.kill()
    started = time.monotonic()
    with pytest.raises(tollgate.StoreError):
        limiter.try_acquire()
    assert time.monotonic() - started < 10
    redis.start()
    deadline = time.monotonic() + 20
    while True:
        try:
            assert limiter.try_acquire()
            break
        except tollgate.StoreError:
            assert time.monotonic() < deadline, "the limiter never reconnected"
            time.sleep(0.1)
    # The new server kept nothing (no persistence): the windows start full.
    assert limiter.levels() == {"requests": 9}


def test_a_wait_on_a_redis_killed_mid_call_ends_with_store_error(redis):
    limiter = Limiter("py-mid-call", requests="1/d", redis=redis.url)
    assert limiter.try_acquire()
    raised = []

    def wait() -> None:
        try:
            limiter.acquire_blocking(timeout="none")
        except Exception as err:  # noqa: BLE001 - the test looks at what it was
            raised.append(err)

    waiter = threading.Thread(target=wait)
    waiter.start()
    deadline = time.monotonic() + 5
    while limiter.waiting != 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    redis.kill()
    started = time.monotonic()
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], tollgate.StoreError), raised
    # Within one and a half liveness periods (5 s each) and a store timeout.
    assert time.monotonic() - started < 15


def test_an_unreachable_redis_fails_at_first_use_not_at_import():
    port = free_port()
    limiter = Limiter("py-nobody", requests="1/s", redis=f"redis://127.0.0.1:{port}")
    with pytest.raises(tollgate.StoreError):
        limiter.try_acquire()


def test_a_malformed_redis_url_is_an_error_at_first_use():
    limiter = Limiter("py-url", requests="1/s", redis="not a url")
    with pytest.raises((ValueError, tollgate.StoreError)):
        limiter.try_acquire()
