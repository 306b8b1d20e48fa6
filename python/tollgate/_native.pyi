"""Types of the Rust extension, ``tollgate._native``."""

from typing import Any, Awaitable, Dict, Generator, List, Optional, Tuple, Union

__version__: str

Seconds = Union[None, float, str]

class ManualClock:
    """A clock that moves only when told to, for tests: limiters made with ``clock=`` keep
    their windows on a store of their own that reads it."""

    def __init__(self) -> None: ...
    def advance(self, seconds: float) -> None:
        """Moves the clock forward by ``seconds``."""
    @property
    def now(self) -> float:
        """Seconds since the clock's origin."""

class NotYet:
    """``try_acquire``'s "not yet": false, with the seconds until the call could pass."""

    ready_in: float
    def __bool__(self) -> bool: ...

class Permit:
    """Proof that a call paid its toll."""

    @property
    def key(self) -> str: ...
    @property
    def requests(self) -> int: ...
    @property
    def tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def waited(self) -> float:
        """Seconds the call waited for its turn."""
    def settle(
        self,
        input_tokens: Optional[int] = None,
        output_tokens: Optional[int] = None,
        tokens: Optional[int] = None,
    ) -> Dict[str, int]:
        """Corrects the charge to what the provider billed (blocking: one store call).
        Returns what moved per currency, positive when given back."""
    def asettle(
        self,
        input_tokens: Optional[int] = None,
        output_tokens: Optional[int] = None,
        tokens: Optional[int] = None,
    ) -> Awaitable[Dict[str, int]]:
        """``settle`` on the running loop."""
    def _settle_reported(self, usage: Dict[str, Any]) -> Dict[str, int]: ...
    def _asettle_reported(self, usage: Dict[str, Any]) -> Awaitable[Dict[str, int]]: ...
    def __bool__(self) -> bool: ...
    def __enter__(self) -> "Permit": ...
    def __exit__(self, *exc: Any) -> bool: ...

class Acquire:
    """One wait for a toll: ``await`` it, or ``async with`` it."""

    def __await__(self) -> Generator[Any, None, Permit]: ...
    def __aenter__(self) -> Awaitable[Permit]: ...
    def __aexit__(self, *exc: Any) -> Awaitable[None]: ...

class Limiter:
    """A key's windows, shared by every limiter of the process that names the key (and, on
    Redis, by every process, Rust service and tollgate-proxy on it)."""

    def __init__(
        self,
        key: str,
        requests: Optional[str] = None,
        tokens: Optional[str] = None,
        output_tokens: Optional[str] = None,
        redis: Optional[str] = None,
        *,
        estimator: str = "openai",
        timeout: Seconds = None,
        clock: Optional[ManualClock] = None,
    ) -> None: ...
    @property
    def key(self) -> str: ...
    @property
    def limits(self) -> Dict[str, str]: ...
    @property
    def redis(self) -> Optional[str]: ...
    @property
    def estimator(self) -> str: ...
    @property
    def counts_tokens(self) -> bool: ...
    @property
    def waiting(self) -> int:
        """Calls of this process waiting their turn on the key now."""
    def try_acquire(
        self, tokens: Optional[int] = None, output_tokens: Optional[int] = None
    ) -> Union[Permit, NotYet]:
        """Admits a call now, or answers ``NotYet`` (falsy) with ``ready_in``; never waits."""
    def acquire_blocking(
        self,
        tokens: Optional[int] = None,
        output_tokens: Optional[int] = None,
        timeout: Seconds = None,
        *,
        tenant: Optional[str] = None,
        weight: int = 1,
    ) -> Permit:
        """Waits on this thread, without the GIL, until every window can pay."""
    def acquire(
        self,
        tokens: Optional[int] = None,
        output_tokens: Optional[int] = None,
        timeout: Seconds = None,
        *,
        tenant: Optional[str] = None,
        weight: int = 1,
    ) -> Acquire:
        """``await limiter.acquire()`` or ``async with limiter.acquire() as permit``."""
    def cost_of(self, arguments: Any) -> Tuple[int, int]:
        """What a call with these arguments pays: ``(tokens, output_tokens)``."""
    def levels(self) -> Dict[str, int]:
        """The lowest level of each currency's windows now, in whole tokens."""
    def _admit_blocking(self, arguments: Any, timeout: Seconds = None) -> Permit: ...
    def _admit(self, arguments: Any, timeout: Seconds = None) -> Awaitable[Permit]: ...

class Call:
    @property
    def body(self) -> Optional[bytes]: ...
    @property
    def key(self) -> str: ...
    @property
    def tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    def sending(self) -> None: ...

class Metered:
    def push(self, chunk: bytes) -> None: ...
    def end(self) -> None: ...
    def pull(self) -> Optional[List[bytes]]: ...
    def pull_blocking(self) -> List[bytes]: ...
    def pull_async(self) -> Awaitable[List[bytes]]: ...
    @property
    def done(self) -> bool: ...
    def close(self) -> None: ...

class Next:
    kind: str
    delay: Optional[float]
    body: Optional[bytes]
    message: Optional[str]
    metered: Optional[Metered]
    length_changes: bool

class Attempts:
    @property
    def key(self) -> str: ...
    @property
    def input_tokens(self) -> int: ...
    @property
    def most_output(self) -> int: ...
    @property
    def stream(self) -> bool: ...
    def admit_blocking(self) -> Call: ...
    def admit(self) -> Awaitable[Call]: ...
    def answered_blocking(
        self, call: Call, status: int, headers: List[Tuple[bytes, bytes]], body: Optional[bytes] = None
    ) -> Next: ...
    def answered(
        self, call: Call, status: int, headers: List[Tuple[bytes, bytes]], body: Optional[bytes] = None
    ) -> Awaitable[Next]: ...

class Gate:
    """Rust's HTTP gate, for a client that sends each attempt itself (``tollgate.httpx``)."""

    def __init__(
        self,
        profile: str,
        requests: Optional[str] = None,
        tokens: Optional[str] = None,
        output_tokens: Optional[str] = None,
        *,
        from_headers: bool = False,
        key: Optional[str] = None,
        redis: Optional[str] = None,
        timeout: Seconds = None,
        retries: int = 3,
        sync: bool = True,
    ) -> None: ...
    @property
    def profile(self) -> str: ...
    def ready(self) -> None: ...
    def aready(self) -> Awaitable[None]: ...
    def attempts(
        self, method: str, url: str, headers: List[Tuple[bytes, bytes]], body: bytes
    ) -> Attempts: ...
    def attempts_async(
        self, method: str, url: str, headers: List[Tuple[bytes, bytes]], body: bytes
    ) -> Awaitable[Attempts]: ...
    def levels(self, key: str) -> Optional[Dict[str, int]]: ...

def count_tokens(text: str, estimator: str = "openai") -> int:
    """The number of tokens of ``text`` by ``estimator``: ``openai`` (o200k_base),
    ``openai:<model>``, ``tiktoken:<encoding>``, ``voyageai``, ``hf:<path to tokenizer.json>``
    or ``words``."""

def estimate(value: Any, estimator: str = "openai") -> Tuple[int, int]:
    """``(input_tokens, reserved_output)`` of a request body or any value, as the gate and the
    decorator count it."""

def _after_fork() -> None: ...
