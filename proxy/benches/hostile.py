#!/usr/bin/env python3
"""The hostile-client and hostile-upstream trials of issue 23, against a tollgate-proxy binary.

    python3 proxy/benches/hostile.py PROXY_BINARY [CASE ...]

Starts an upstream that enforces nothing and bills input the way a Python server does after
`json.loads` (a gzip body decoded first, as a GZip middleware would), counting tokens as words
and punctuation; starts the proxy in front of it with a configuration per case; drives the
case; and prints one line per case: what reached the upstream (calls, billed tokens), and what
the case measures. Run it against two binaries (before and after) to compare. Needs only the
standard library. The numbers are real-time measurements on this machine.
"""

import gzip
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORD = re.compile(r"\w+|[^\w\s]")


def tokens(value):
    """Billed input: the words and punctuation of every string, as a crude tokenizer would."""
    if isinstance(value, str):
        return len(WORD.findall(value))
    if isinstance(value, list):
        return sum(tokens(v) for v in value)
    if isinstance(value, dict):
        return sum(tokens(v) for k, v in value.items() if k not in ("model", "stream", "stream_options"))
    return 0


class Upstream:
    def __init__(self, output=1500, kind="content"):
        self.lock = threading.Lock()
        self.calls = 0
        self.billed = 0
        self.events = 0
        self.output = output
        self.kind = kind
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                if self.headers.get("content-encoding") == "gzip":
                    raw = gzip.decompress(raw)
                try:
                    body = json.loads(raw)
                except ValueError:
                    self.send_response(400)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                billed = tokens(body.get("messages", [])) + tokens(body.get("instructions", "")) + tokens(body.get("input", ""))
                with upstream.lock:
                    upstream.calls += 1
                    upstream.billed += billed
                if body.get("stream"):
                    self.stream(body, billed)
                else:
                    out = json.dumps({"choices": [{"message": {"role": "assistant", "content": "ok"}}],
                                      "usage": {"prompt_tokens": billed, "completion_tokens": upstream.output}}).encode()
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)

            def stream(self, body, billed):
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                try:
                    for _ in range(upstream.output):
                        if upstream.kind == "tools":
                            delta = {"tool_calls": [{"index": 0, "function": {"arguments": "word "}}]}
                        elif upstream.kind == "reasoning":
                            delta = {"reasoning_content": "word "}
                        else:
                            delta = {"content": "word "}
                        self.wfile.write(b"data: " + json.dumps({"choices": [{"delta": delta}]}).encode() + b"\n\n")
                        with upstream.lock:
                            upstream.events += 1
                    if (body.get("stream_options") or {}).get("include_usage"):
                        usage = {"prompt_tokens": billed, "completion_tokens": upstream.output}
                        self.wfile.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except OSError:
                    pass
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


METRICS_TOKEN = "hostile-bench-metrics-token"
METRICS_HEADERS = {"Authorization": f"Bearer {METRICS_TOKEN}"}


class Proxy:
    def __init__(self, binary, config):
        self.port = free_port()
        self.file = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
        # /metrics answers on the clients' listener only with a token (issue 31).
        self.file.write(f'listen = "127.0.0.1:{self.port}"\nmetrics_token_env = "HOSTILE_METRICS_TOKEN"\n' + config)
        self.file.close()
        self.process = subprocess.Popen([binary, "--config", self.file.name, "--log", "json"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        env={**os.environ, "RUST_LOG": "warn",
                                             "HOSTILE_METRICS_TOKEN": METRICS_TOKEN})
        for _ in range(200):
            if self.process.poll() is not None:
                os.unlink(self.file.name)
                raise RuntimeError("the proxy exited at start")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the proxy did not start")

    def rss_mb(self):
        with open(f"/proc/{self.process.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) / 1024
        return 0

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
        os.unlink(self.file.name)


def request(port, path, body, headers=None, timeout=30, read=True):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    all_headers = {"content-type": "application/json", "authorization": "Bearer sk-test"}
    all_headers.update(headers or {})
    try:
        connection.request("POST", path, body=body, headers=all_headers)
        response = connection.getresponse()
        data = response.read() if read else response.read(200)
        return response.status, data
    except (OSError, http.client.HTTPException):
        return 0, b""
    finally:
        connection.close()


def upstream_config(upstream, limits, extra=""):
    return f"""
[[upstream]]
name = "up"
url = "http://127.0.0.1:{upstream.port}"
profile = "openai"
{limits}
timeout_seconds = 0.5
{extra}
"""


def hammer(port, make, seconds=10, workers=8):
    """`workers` clients sending back to back for `seconds`; how many got 200."""
    ok = [0]
    lock = threading.Lock()
    end = time.time() + seconds

    def work(i):
        n = 0
        while time.time() < end:
            path, body, headers = make(i, n)
            status, _ = request(port, path, body, headers, timeout=15)
            n += 1
            if status == 200:
                with lock:
                    ok[0] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ok[0]


PROMPT = "the river carries water to the sea " * 250  # about 2,000 words


def chat(prompt=PROMPT, stream=True, extra=""):
    return ('{"model":"gpt-4o","stream":%s,"max_tokens":10,%s"messages":[{"role":"user","content":%s}]}'
            % ("true" if stream else "false", extra, json.dumps(prompt))).encode()


def case_body(binary, name, body, headers=None):
    upstream = Upstream(output=5)
    proxy = Proxy(binary, upstream_config(upstream, 'requests = "1000/10s"\ntokens = "3000/10s"'))
    try:
        hammer(proxy.port, lambda i, n: ("/v1/chat/completions", body, headers or {}), seconds=10)
        return {"case": name, "calls": upstream.calls, "billed_tokens": upstream.billed}
    finally:
        proxy.stop()
        upstream.stop()


def case_generated(binary, kind):
    upstream = Upstream(output=1500, kind=kind)
    proxy = Proxy(binary, upstream_config(upstream, 'requests = "1000/10s"\ntokens = "3000/10s"'))
    try:
        body = chat(prompt="hi")
        hammer(proxy.port, lambda i, n: ("/v1/chat/completions", body, {}), seconds=10)
        return {"case": f"stream of {kind}", "calls": upstream.calls, "output_tokens": upstream.events}
    finally:
        proxy.stop()
        upstream.stop()


def case_paths(binary):
    upstream = Upstream(output=5)
    proxy = Proxy(binary, upstream_config(upstream, 'requests = "5/10s"'))
    try:
        paths = ["/v1/chat/%63ompletions", "/v1/chat/completion%73", "/v1/%63hat/completions", "/%761/chat/completions"]
        statuses = []
        for i in range(40):
            statuses.append(request(proxy.port, paths[i % 4], chat(prompt="hi", stream=False))[0])
        return {"case": "percent-encoded paths, 40 calls, limit 5", "calls": upstream.calls,
                "ok": statuses.count(200)}
    finally:
        proxy.stop()
        upstream.stop()


def case_models(binary):
    upstream = Upstream(output=5)
    config = upstream_config(upstream, 'requests = "5/10s"').replace('profile = "openai"', 'profile = "generic"')
    proxy = Proxy(binary, config)
    try:
        done = []

        def one(i):
            body = chat(prompt="hi", stream=False).replace(b'"gpt-4o"', b'"made-up-%d"' % i)
            done.append(request(proxy.port, "/v1/chat/completions", body)[0])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {"case": "40 invented model names, limit 5", "calls": upstream.calls, "ok": done.count(200)}
    finally:
        proxy.stop()
        upstream.stop()


def case_fields(binary, what):
    upstream = Upstream(output=5)
    proxy = Proxy(binary, upstream_config(upstream, 'requests = "1000/10s"\ntokens = "3000/10s"'))
    try:
        headers = {}
        path = "/v1/chat/completions"
        if what == "gzip":
            body = gzip.compress(chat(stream=False))
            headers = {"content-encoding": "gzip"}
        elif what == "instructions":
            path = "/v1/responses"
            body = json.dumps({"model": "gpt-4o", "max_output_tokens": 10, "instructions": PROMPT, "input": "hi"}).encode()
        else:
            body = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode()
            upstream.output = 2000
        done = []

        def one():
            done.append(request(proxy.port, path, body, headers)[0])

        threads = [threading.Thread(target=one) for _ in range(15)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {"case": f"15 calls at once, {what}", "calls": upstream.calls, "billed_tokens": upstream.billed}
    finally:
        proxy.stop()
        upstream.stop()


def case_tenants(binary):
    upstream = Upstream(output=5)
    results = {}
    for name, tenants, attempts in [
        ("header, no header", 'from = "header:x-team"\ntrusted_network = true', [{}] * 10),
        ("key, no key", 'from = "key"', [{"authorization": ""}] * 10),
        ("key, Basic", 'from = "key"', [{"authorization": "Basic dXNlcjpwYXNz"}] * 10),
        ("key, Bearer<TAB>", 'from = "key"', [{"authorization": "Bearer\tsk-x"}] * 10),
        ("key, junk bearer + x-api-key", 'from = "key"', [{"authorization": "Bearer junk%d" % i, "x-api-key": "sk-real"} for i in range(10)]),
    ]:
        before = upstream.calls
        config = f"[tenants]\n{tenants}\nrequests = \"3/10s\"\n" + upstream_config(upstream, 'requests = "1000/10s"')
        try:
            proxy = Proxy(binary, config)
        except RuntimeError:
            # A proxy from before `trusted_network` existed refuses the field.
            proxy = Proxy(binary, config.replace("trusted_network = true\n", ""))
        try:
            for headers in attempts:
                request(proxy.port, "/v1/chat/completions", chat(prompt="hi", stream=False), headers)
            results[name] = upstream.calls - before
        finally:
            proxy.stop()
    upstream.stop()
    return {"case": "tenant escapes, 10 calls each, tenant limit 3", **results}


def case_leave(binary):
    upstream = Upstream(output=200000)
    proxy = Proxy(binary, upstream_config(upstream, 'requests = "1000/m"\ntokens = "1000000/d"'))
    try:
        body = json.dumps({"model": "gpt-4o", "stream": True, "max_tokens": 200000,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
        connection.request("POST", "/v1/chat/completions", body=body, headers={"content-type": "application/json"})
        response = connection.getresponse()
        response.read(300_000)
        connection.close()
        time.sleep(1)
        written = upstream.events
        metrics = http.client.HTTPConnection("127.0.0.1", proxy.port)
        metrics.request("GET", "/metrics", headers=METRICS_HEADERS)
        text = metrics.getresponse().read().decode()
        level = re.search(r'tollgate_proxy_level\{key="up:gpt-4o",currency="tokens"\} (\S+)', text)
        charged = 1_000_000 - float(level.group(1)) if level else None
        return {"case": "client leaves a 200,000-token stream", "events_written": written, "tokens_charged": charged}
    finally:
        proxy.stop()
        upstream.stop()


def case_keys(binary, count=100_000):
    upstream = Upstream(output=5)
    proxy = Proxy(binary, '[tenants]\nfrom = "key"\nrequests = "100/m"\n' + upstream_config(upstream, 'requests = "10000000/m"'))
    try:
        start_rss = proxy.rss_mb()
        body = chat(prompt="hi", stream=False)
        started = time.time()
        lock = threading.Lock()
        next_key = [0]

        def work():
            connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
            while True:
                with lock:
                    i = next_key[0]
                    next_key[0] += 1
                if i >= count:
                    break
                try:
                    connection.request("POST", "/v1/chat/completions", body=body,
                                       headers={"content-type": "application/json", "authorization": f"Bearer sk-{i:09d}-random"})
                    connection.getresponse().read()
                except (OSError, http.client.HTTPException):
                    connection.close()
                    connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
            connection.close()

        threads = [threading.Thread(target=work) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.time() - started
        rss = proxy.rss_mb()
        metrics = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=60)
        scraped = time.time()
        metrics.request("GET", "/metrics", headers=METRICS_HEADERS)
        text = metrics.getresponse().read()
        scrape_s = time.time() - scraped
        return {"case": f"{count} random API keys", "seconds": round(took, 1), "rss_before_mb": round(start_rss, 1),
                "rss_after_mb": round(rss, 1), "rss_after_scrape_mb": round(proxy.rss_mb(), 1),
                "metrics_bytes": len(text), "scrape_s": round(scrape_s, 2)}
    finally:
        proxy.stop()
        upstream.stop()


def closed_after(port, send, limit=120):
    s = socket.create_connection(("127.0.0.1", port))
    if send:
        s.sendall(send)
    s.settimeout(limit)
    started = time.time()
    try:
        while s.recv(4096):
            pass
        return round(time.time() - started, 1)
    except OSError:
        return None
    finally:
        s.close()


def case_timeouts(binary):
    upstream = Upstream(output=5)
    proxy = Proxy(binary, upstream_config(upstream, 'requests = "1000/m"'))
    out = {"case": "timeouts (seconds until the proxy closes or answers; None: open after 120 s)"}
    try:
        out["silent"] = closed_after(proxy.port, b"")
        out["lone byte"] = closed_after(proxy.port, b"P")
        out["h2 preface"] = closed_after(proxy.port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        body = chat(prompt="hi", stream=False)
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
        s = socket.create_connection(("127.0.0.1", proxy.port))
        s.sendall(head)
        started = time.time()
        s.settimeout(0.1)
        answered = None
        for byte in body:
            try:
                if s.recv(4096):
                    answered = round(time.time() - started, 1)
                    break
            except socket.timeout:
                pass
            except OSError:
                answered = round(time.time() - started, 1)
                break
            if time.time() - started > 120:
                break
            s.sendall(bytes([byte]))
            time.sleep(4.9)
        s.close()
        out["body trickled 1 byte / 5 s"] = answered
    finally:
        proxy.stop()
        upstream.stop()
    # A hung upstream with timeout_seconds = 3.
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(100)
    config = f"""
[[upstream]]
name = "hung"
url = "http://127.0.0.1:{hung.getsockname()[1]}"
profile = "openai"
requests = "1000/m"
timeout_seconds = 3
"""
    proxy = Proxy(binary, config)
    try:
        started = time.time()
        status, _ = request(proxy.port, "/v1/chat/completions", chat(prompt="hi", stream=False), timeout=60)
        out["hung upstream, timeout 3"] = (status, round(time.time() - started, 1))
    finally:
        proxy.stop()
        hung.close()
    return out


CASES = {
    "valid": lambda b: case_body(b, "valid streamed body", chat()),
    "bom": lambda b: case_body(b, "BOM", b"\xef\xbb\xbf" + chat()),
    "nan": lambda b: case_body(b, "NaN", chat(extra='"temperature":NaN,')),
    "huge-number": lambda b: case_body(b, "1e400", chat(extra='"temperature":1e400,')),
    "nesting": lambda b: case_body(b, "130 levels", chat(extra='"x":' + "[" * 130 + "1" + "]" * 130 + ",")),
    "surrogate": lambda b: case_body(b, "lone surrogate", chat(prompt=PROMPT).replace(b'"}]}', b'\\ud800"}]}')),
    "tools": lambda b: case_generated(b, "tools"),
    "reasoning": lambda b: case_generated(b, "reasoning"),
    "content": lambda b: case_generated(b, "content"),
    "paths": case_paths,
    "models": case_models,
    "gzip": lambda b: case_fields(b, "gzip"),
    "instructions": lambda b: case_fields(b, "instructions"),
    "no-max-tokens": lambda b: case_fields(b, "no max_tokens"),
    "tenants": case_tenants,
    "leave": case_leave,
    "keys": case_keys,
    "timeouts": case_timeouts,
}

if __name__ == "__main__":
    binary = sys.argv[1]
    for name in sys.argv[2:] or list(CASES):
        print(json.dumps(CASES[name](binary)), flush=True)
