"""The httpx transports, made for one httpx-like module: `httpx`, or `httpx2` (the fork the
OpenAI and Anthropic SDKs moved to, with the same API): a transport must hand its client
the Request and Response classes of that client's own module."""

from __future__ import annotations

import asyncio
import json
import math
import time
from types import ModuleType
from typing import Any, AsyncIterator, Iterator, List, Optional, Tuple, Union

from ._errors import QueueFull, Timeout
from ._native import Attempts, Call, Gate, Metered, Next


def transports(hx: ModuleType, module: str) -> Tuple[type, type]:
    """``(Transport, AsyncTransport)`` for the httpx-like module ``hx``, named as members of
    ``module``."""

    # Headers that the request the gate sends must not carry: a compressed answer could not be
    # read for its usage (the proxy drops it too), and the length is httpx's to set.
    _DROPPED = {b"accept-encoding", b"content-length", b"transfer-encoding"}

    # Bodies shorter than this are estimated on the loop's thread (a few hundred microseconds
    # at most); longer ones on a thread of the runtime.
    _COUNT_HERE_BELOW = 64 << 10

    def _gate(profile: str, requests: Optional[str], tokens: Optional[str], output_tokens: Optional[str],
              limits: Optional[str], key: Optional[str], redis: Optional[str],
              timeout: Union[None, float, str], retries: int, sync: bool) -> Gate:
        if limits not in (None, "from-headers"):
            raise ValueError(f'limits: expected "from-headers" or None (then give requests, tokens, output_tokens), got {limits!r}')
        return Gate(profile, requests, tokens, output_tokens, from_headers=limits == "from-headers",
                    key=key, redis=redis, timeout=timeout, retries=retries, sync=sync)

    def _outgoing(request: hx.Request, body: bytes, call: Call) -> hx.Request:
        """The attempt to send: the gate's body when it rewrote it (then without its
        ``content-encoding``), and no ``accept-encoding``."""
        rewritten = call.body
        dropped = _DROPPED | ({b"content-encoding"} if rewritten is not None else set())
        headers = [(k, v) for k, v in request.headers.raw if k.lower() not in dropped]
        return hx.Request(request.method, request.url, headers=headers,
                             content=rewritten if rewritten is not None else body,
                             extensions=request.extensions)

    def _local_429(profile: str, err: Exception) -> hx.Response:
        """What the provider would answer a call that can't pass in time: a 429 in its shape, with
        ``retry-after`` (whole seconds, at least 1) and ``retry-after-ms``."""
        needed = getattr(err, "needed", None)
        wait = needed if isinstance(needed, (int, float)) and math.isfinite(needed) else 1.0
        message = f"tollgate: {err}"
        if profile == "anthropic":
            body = {"type": "error", "error": {"type": "rate_limit_error", "message": message}}
        else:
            body = {"error": {"message": message, "type": "rate_limit_exceeded", "param": None,
                              "code": "rate_limit_exceeded"}}
        headers = {
            "content-type": "application/json",
            "retry-after": str(max(1, math.ceil(wait))),
            "retry-after-ms": str(max(1, math.ceil(wait * 1000))),
            "x-should-retry": "true",
            "x-tollgate": "local",
        }
        return hx.Response(429, headers=headers, content=json.dumps(body).encode())

    def _raw(headers: hx.Headers) -> List[Tuple[bytes, bytes]]:
        return list(headers.raw)

    def _given_back(response: hx.Response, nxt: Next) -> hx.Response:
        """A 429 handed to the caller, its body as read; a refusal for good says so to the SDKs."""
        headers = [(k, v) for k, v in response.headers.raw
                   if k.lower() not in (b"content-length", b"content-encoding", b"transfer-encoding")]
        if nxt.kind == "refused":
            headers = [(k, v) for k, v in headers if k.lower() != b"x-should-retry"]
            headers.append((b"x-should-retry", b"false"))
        return hx.Response(429, headers=headers, content=bytes(nxt.body or b""),
                              extensions=response.extensions)

    def _delivered(response: hx.Response, nxt: Next, stream: Any) -> hx.Response:
        headers = _raw(response.headers)
        if nxt.length_changes:
            headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
        return hx.Response(response.status_code, headers=headers, stream=stream,
                              extensions=response.extensions)

    class _MeteredStream(hx.SyncByteStream):
        """The upstream's body, read for its usage on its way to the caller."""

        def __init__(self, upstream: Any, metered: Metered) -> None:
            self._upstream = upstream
            self._metered = metered

        def _pull(self) -> List[bytes]:
            out = self._metered.pull()
            return self._metered.pull_blocking() if out is None else out

        def __iter__(self) -> Iterator[bytes]:
            metered = self._metered
            for chunk in self._upstream:
                if chunk:
                    metered.push(chunk)
                    yield from self._pull()
            metered.end()
            while not metered.done:
                yield from self._pull()

        def close(self) -> None:
            try:
                close = getattr(self._upstream, "close", None)
                if close is not None:
                    close()
            finally:
                self._metered.close()

    class _AsyncMeteredStream(hx.AsyncByteStream):
        def __init__(self, upstream: Any, metered: Metered) -> None:
            self._upstream = upstream
            self._metered = metered

        async def _pull(self) -> List[bytes]:
            out = self._metered.pull()
            return await self._metered.pull_async() if out is None else out

        async def __aiter__(self) -> AsyncIterator[bytes]:
            metered = self._metered
            async for chunk in self._upstream:
                if chunk:
                    metered.push(chunk)
                    for piece in await self._pull():
                        yield piece
            metered.end()
            while not metered.done:
                for piece in await self._pull():
                    yield piece

        async def aclose(self) -> None:
            try:
                aclose = getattr(self._upstream, "aclose", None)
                if aclose is not None:
                    await aclose()
            finally:
                self._metered.close()

    class Transport(hx.BaseTransport):
        """A sync httpx transport with tollgate's gate in front of ``transport`` (default
        ``hx.HTTPTransport()``).

        ``profile``: ``"openai"``, ``"azure-openai"``, ``"anthropic"``, ``"voyage"``,
        ``"gemini"``, ``"groq"`` or ``"mistral"``. The limits: ``requests``, ``tokens`` and
        ``output_tokens`` as rate strings, or ``limits="from-headers"`` to take each key's limits
        from the provider's headers. ``key``: one key for every request (the default is the
        profile and the body's model, ``"openai:gpt-4o"``; name the proxy's upstream to share
        its quota). ``redis``: share the windows with every process on that Redis.
        ``timeout``: the longest a request waits for its toll, retries included (default 60 s).
        ``retries``: how often a transient 429 is sent again (default 3).
        """

        def __init__(self, profile: str = "openai", requests: Optional[str] = None,
                     tokens: Optional[str] = None, output_tokens: Optional[str] = None, *,
                     limits: Optional[str] = None, key: Optional[str] = None,
                     redis: Optional[str] = None, timeout: Union[None, float, str] = None,
                     retries: int = 3, sync: bool = True,
                     transport: Optional[hx.BaseTransport] = None) -> None:
            self.gate = _gate(profile, requests, tokens, output_tokens, limits, key, redis,
                              timeout, retries, sync)
            self._transport = transport if transport is not None else hx.HTTPTransport()

        def handle_request(self, request: hx.Request) -> hx.Response:
            gate = self.gate
            gate.ready()
            body = request.read()
            attempts: Attempts = gate.attempts(request.method, str(request.url), _raw(request.headers), body)
            while True:
                try:
                    call = attempts.admit_blocking()
                except (Timeout, QueueFull) as err:
                    return _local_429(gate.profile, err)
                outgoing = _outgoing(request, body, call)
                call.sending()
                response = self._transport.handle_request(outgoing)
                if response.status_code == 429:
                    try:
                        error = response.read()
                    finally:
                        response.close()
                    nxt = attempts.answered_blocking(call, 429, _raw(response.headers), error)
                    if nxt.kind == "retry":
                        time.sleep(nxt.delay or 0.0)
                        continue
                    return _given_back(response, nxt)
                nxt = attempts.answered_blocking(call, response.status_code, _raw(response.headers))
                return _delivered(response, nxt, _MeteredStream(response.stream, nxt.metered))

        def close(self) -> None:
            self._transport.close()

    class AsyncTransport(hx.AsyncBaseTransport):
        """The async httpx transport (every wait on the running loop); the same arguments as
        :class:`Transport`, wrapping ``hx.AsyncHTTPTransport()`` by default."""

        def __init__(self, profile: str = "openai", requests: Optional[str] = None,
                     tokens: Optional[str] = None, output_tokens: Optional[str] = None, *,
                     limits: Optional[str] = None, key: Optional[str] = None,
                     redis: Optional[str] = None, timeout: Union[None, float, str] = None,
                     retries: int = 3, sync: bool = True,
                     transport: Optional[hx.AsyncBaseTransport] = None) -> None:
            self.gate = _gate(profile, requests, tokens, output_tokens, limits, key, redis,
                              timeout, retries, sync)
            self._transport = transport if transport is not None else hx.AsyncHTTPTransport()

        async def handle_async_request(self, request: hx.Request) -> hx.Response:
            gate = self.gate
            await gate.aready()
            body = await request.aread()
            if len(body) < _COUNT_HERE_BELOW:
                # Counted here, without the GIL: a thread of the runtime for every request of a
                # burst would cost more than the count.
                attempts: Attempts = gate.attempts(request.method, str(request.url), _raw(request.headers), body)
            else:
                attempts = await gate.attempts_async(
                    request.method, str(request.url), _raw(request.headers), body)
            while True:
                try:
                    call = await attempts.admit()
                except (Timeout, QueueFull) as err:
                    return _local_429(gate.profile, err)
                outgoing = _outgoing(request, body, call)
                call.sending()
                response = await self._transport.handle_async_request(outgoing)
                if response.status_code == 429:
                    try:
                        error = await response.aread()
                    finally:
                        await response.aclose()
                    nxt = await attempts.answered(call, 429, _raw(response.headers), error)
                    if nxt.kind == "retry":
                        await asyncio.sleep(nxt.delay or 0.0)
                        continue
                    return _given_back(response, nxt)
                nxt = await attempts.answered(call, response.status_code, _raw(response.headers))
                return _delivered(response, nxt, _AsyncMeteredStream(response.stream, nxt.metered))

        async def aclose(self) -> None:
            await self._transport.aclose()

    for cls in (Transport, AsyncTransport, _MeteredStream, _AsyncMeteredStream):
        cls.__module__ = module
        cls.__qualname__ = cls.__name__
    return Transport, AsyncTransport
