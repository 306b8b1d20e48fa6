"""httpx transports that put tollgate's HTTP gate in front of a provider, for the official
SDKs and anything else built on httpx:

    import httpx, openai, tollgate.httpx

    client = openai.AsyncOpenAI(http_client=httpx.AsyncClient(
        transport=tollgate.httpx.AsyncTransport("openai", requests="500/m", tokens="30000/m")))

Each request is read and estimated once (messages, tools, images, the output ``max_tokens``
reserves), waits for its toll, and goes out through the wrapped transport; each answer syncs
the key with the provider's rate-limit headers, a 429 is retried after the provider's pause or
handed on (a spent quota is refused for good), and the body settles the call with its usage as
it passes, streams included. Those rules are the Rust ``Gate``'s and ``Attempts``', not a copy.

A call whose turn would come after its deadline is answered as the provider answers: a 429
with ``retry-after`` (and ``x-tollgate: local``), which the SDKs read.
"""

import httpx

from ._transports import transports

__all__ = ["Transport", "AsyncTransport"]

Transport, AsyncTransport = transports(httpx, __name__)
