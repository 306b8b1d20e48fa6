"""What the tests share: the workspace's Rust programs (the provider stand-in and a Rust peer
on Redis, `examples/python_peers.rs`; tollgate-proxy), real `redis-server`s on free loopback
ports, and the vocabulary files.

A missing program, server or SDK skips its tests, saying why, unless the matching
`TOLLGATE_REQUIRE_*` variable is 1 (as in `.ci/run`), where it fails them.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

import local_tiktoken

ROOT = Path(__file__).resolve().parents[2]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))


def required(what: str) -> bool:
    return os.environ.get(f"TOLLGATE_REQUIRE_{what}") == "1"


def missing(what: str, why: str) -> None:
    """Skips the test, or fails it where `TOLLGATE_REQUIRE_<what>=1`."""
    if required(what):
        pytest.fail(f"{why} (TOLLGATE_REQUIRE_{what}=1)")
    pytest.skip(why)


def program(name: str) -> Path:
    """A program of the workspace, as `cargo test --workspace --no-run` (or `cargo build
    --examples`) leaves it."""
    for path in (TARGET / "debug" / name, TARGET / "debug" / "examples" / name):
        if path.exists():
            return path
    missing("PROGRAMS", f"{name} is not built: run `cargo build --example python_peers && cargo build -p tollgate-proxy` first")
    raise AssertionError("unreachable")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {seconds} s")


class Redis:
    """A real redis-server on a free loopback port, saving nothing."""

    def __init__(self) -> None:
        server = shutil.which("redis-server")
        if server is None:
            missing("REDIS", "redis-server is not installed (apt-get install redis-server)")
        self.server = server
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.process: Optional[subprocess.Popen] = None
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


@pytest.fixture
def redis() -> Iterator[Redis]:
    server = Redis()
    try:
        yield server
    finally:
        server.kill()


class StandIn:
    """The provider stand-in of the test kit (`testkit/src/provider.rs`), as unfriendly as a
    real provider: it enforces its windows, answers 429 beyond them, and reports usage."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [str(program("python_peers")), "stand-in", *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        first = self.process.stdout.readline()  # type: ignore[union-attr]
        self.addr = json.loads(first)["addr"]
        self.url = f"http://{self.addr}"

    def ask(self, line: str) -> dict:
        self.process.stdin.write(line + "\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        return json.loads(self.process.stdout.readline())  # type: ignore[union-attr]

    def stats(self) -> dict:
        return self.ask("stats")

    def close(self) -> None:
        self.process.stdin.close()  # type: ignore[union-attr]
        self.process.wait(timeout=10)


@pytest.fixture
def stand_in() -> Iterator["type[StandIn]"]:
    made: List[StandIn] = []

    def start(*args: str) -> StandIn:
        server = StandIn(*args)
        made.append(server)
        return server

    try:
        yield start  # type: ignore[misc]
    finally:
        for server in made:
            server.close()


def vocabulary(name: str) -> Path:
    """A tiktoken vocabulary file (`o200k_base.tiktoken`), from the tiktoken-rs crate the Rust
    estimators embed it from: these machines can't download tiktoken's own."""
    path = local_tiktoken.vocabulary_file(name)
    if path is None:
        missing("FIXTURES", f"{name}.tiktoken not found in the cargo registry (tiktoken-rs)")
    return path  # type: ignore[return-value]


def tokenizers() -> Path:
    path = Path(os.environ.get("TOLLGATE_TOKENIZERS", ROOT.parent / "shared" / "fixtures" / "tokenizers"))
    if not (path / "gpt-4o" / "tokenizer.json").exists():
        missing("FIXTURES", f"no tokenizer files in {path} (set TOLLGATE_TOKENIZERS)")
    return path


def run_python(code: str, *args: str, timeout: float = 60) -> str:
    """Runs `code` in another Python process (this interpreter, this tollgate); its stdout."""
    # Not from python/, where the sources (without the compiled module) would shadow the wheel.
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=tempfile.gettempdir())
    assert done.returncode == 0, done.stderr
    return done.stdout
