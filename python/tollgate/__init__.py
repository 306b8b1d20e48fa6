"""tollgate: keep calls to LLM APIs inside their rate limits.

Every call pays its toll before it goes out: one request, and the tokens its arguments will
cost, counted with the provider's own tokenizer. Calls that name the same key share its
windows: across the threads and tasks of a process, and through Redis across processes,
Rust services and tollgate-proxy alike. The Rust crate decides everything; this package is
its Python face.

    import tollgate

    @tollgate.limit("openai", requests="500/m", tokens="200000/m")
    async def chat(messages, max_tokens=256): ...

    limiter = tollgate.Limiter("search", requests="5/s burst 10")
    async with limiter.acquire() as permit: ...

See python/README.md for the whole API.
"""

import atexit as _atexit
import os as _os

from . import _native
from ._decorator import limit
from ._errors import QueueFull, StoreError, Timeout, TollgateError, TooLarge
from ._native import (
    Acquire,
    Gate,
    Limiter,
    ManualClock,
    NotYet,
    Permit,
    count_tokens,
    estimate,
)

__version__ = _native.__version__

__all__ = [
    "Acquire",
    "Gate",
    "Limiter",
    "ManualClock",
    "NotYet",
    "Permit",
    "QueueFull",
    "StoreError",
    "Timeout",
    "TollgateError",
    "TooLarge",
    "count_tokens",
    "estimate",
    "limit",
]

if hasattr(_os, "register_at_fork"):
    # A child (Celery's prefork, multiprocessing's fork) makes its own runtime and connections.
    _os.register_at_fork(after_in_child=_native._after_fork)

# No thread of the extension asks for the GIL once the interpreter is exiting.
_atexit.register(_native._at_exit)
