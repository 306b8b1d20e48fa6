from typing import Optional, Union

import httpx2

from ._native import Gate

class Transport(httpx2.BaseTransport):
    """A sync httpx2 transport with tollgate's gate in front of ``transport``."""

    gate: Gate
    def __init__(
        self,
        profile: str = "openai",
        requests: Optional[str] = None,
        tokens: Optional[str] = None,
        output_tokens: Optional[str] = None,
        *,
        limits: Optional[str] = None,
        key: Optional[str] = None,
        redis: Optional[str] = None,
        timeout: Union[None, float, str] = None,
        retries: int = 3,
        sync: bool = True,
        transport: Optional[httpx2.BaseTransport] = None,
    ) -> None: ...
    def handle_request(self, request: httpx2.Request) -> httpx2.Response: ...
    def close(self) -> None: ...

class AsyncTransport(httpx2.AsyncBaseTransport):
    """The async httpx2 transport: every wait on the running loop."""

    gate: Gate
    def __init__(
        self,
        profile: str = "openai",
        requests: Optional[str] = None,
        tokens: Optional[str] = None,
        output_tokens: Optional[str] = None,
        *,
        limits: Optional[str] = None,
        key: Optional[str] = None,
        redis: Optional[str] = None,
        timeout: Union[None, float, str] = None,
        retries: int = 3,
        sync: bool = True,
        transport: Optional[httpx2.AsyncBaseTransport] = None,
    ) -> None: ...
    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response: ...
    async def aclose(self) -> None: ...
