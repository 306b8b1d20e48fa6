"""The transports of :mod:`tollgate.httpx` for ``httpx2``, the fork of httpx that the OpenAI
and Anthropic SDKs use from their 2026 releases on (they refuse httpx's own objects):

    import httpx2, openai, tollgate.httpx2

    client = openai.AsyncOpenAI(http_client=httpx2.AsyncClient(
        transport=tollgate.httpx2.AsyncTransport("openai", requests="500/m", tokens="30000/m")))

Same arguments, same behaviour.
"""

import httpx2

from ._transports import transports

__all__ = ["Transport", "AsyncTransport"]

Transport, AsyncTransport = transports(httpx2, __name__)
