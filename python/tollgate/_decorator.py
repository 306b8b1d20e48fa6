"""``tollgate.limit``: the decorator, for ``def`` and ``async def`` functions."""

import functools
import inspect
import warnings
from typing import Any, Callable, Dict, Optional, TypeVar, Union

from ._errors import StoreError
from ._native import Limiter, ManualClock

F = TypeVar("F", bound=Callable[..., Any])

_USAGE_FIELDS = (
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
    "prompt_tokens_details",
    "input_tokens_details",
)

# Keys computed per call: at most this many limiters are kept at once.
_KEPT = 1024


def _usage_of(result: Any) -> Optional[Dict[str, Any]]:
    """The usage a return value reports: its ``usage`` (the OpenAI and Anthropic SDKs'
    objects) or its ``"usage"`` (a dict), as a dict of the SDKs' field names."""
    usage = result.get("usage") if isinstance(result, dict) else getattr(result, "usage", None)
    if usage is None:
        return None
    if isinstance(usage, dict):
        return usage
    dump = getattr(usage, "model_dump", None)
    if callable(dump):
        dumped = dump()
        return dumped if isinstance(dumped, dict) else None
    fields = {name: getattr(usage, name, None) for name in _USAGE_FIELDS}
    return {name: value for name, value in fields.items() if value is not None} or None


def limit(
    key: Union[str, Callable[..., str]],
    requests: Optional[str] = None,
    tokens: Optional[str] = None,
    output_tokens: Optional[str] = None,
    estimator: str = "openai",
    timeout: Union[None, float, str] = None,
    redis: Optional[str] = None,
    *,
    clock: Optional[ManualClock] = None,
) -> Callable[[F], F]:
    """Rate-limits a function: each call pays one request and the estimated tokens of its
    arguments before the body runs, waiting its turn (on the running loop for ``async def``,
    on its thread otherwise).

    ``key`` names the windows the calls share (a function of the call's arguments gives a
    key per call). Rates are strings (``"500/m"``, ``"60/m; 1000/d"``, ``"5/s burst 10"``);
    a bad one raises ``ValueError`` here. The arguments are counted as the Rust macro counts
    them (messages, prompts, tools; other objects, like a client, are skipped), and a
    ``max_tokens`` argument reserves output. A return value with a ``usage`` settles the call.
    """
    static = None
    if isinstance(key, str):
        static = Limiter(key, requests, tokens, output_tokens, redis,
                         estimator=estimator, timeout=timeout, clock=clock)
    elif callable(key):
        # Check the rates and the estimator now, as for a fixed key.
        Limiter("tollgate:check", requests, tokens, output_tokens, None,
                estimator=estimator, timeout=timeout, clock=ManualClock())
    else:
        raise TypeError(f"key: expected a str or a function of the call's arguments, got {type(key).__name__}")
    keyed: Dict[str, Limiter] = {}

    def limiter_for(args: Any, kwargs: Any) -> Limiter:
        if static is not None:
            return static
        name = key(*args, **kwargs)  # type: ignore[operator]
        if not isinstance(name, str):
            raise TypeError(f"key function returned {type(name).__name__}, not str")
        found = keyed.get(name)
        if found is None:
            if len(keyed) >= _KEPT:
                keyed.clear()
            found = keyed[name] = Limiter(name, requests, tokens, output_tokens, redis,
                                          estimator=estimator, timeout=timeout, clock=clock)
        return found

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)
        params = list(signature.parameters.values())
        skipped = {params[0].name} if params and params[0].name in ("self", "cls") else set()

        def arguments(args: Any, kwargs: Any) -> Dict[str, Any]:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:
                return {}  # the call itself will raise
            bound.apply_defaults()
            counted: Dict[str, Any] = {}
            for name, value in bound.arguments.items():
                if name in skipped:
                    continue
                if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                    counted.update(value)
                else:
                    counted[name] = value
            return counted

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def limited_async(*args: Any, **kwargs: Any) -> Any:
                limiter = limiter_for(args, kwargs)
                counted = arguments(args, kwargs) if limiter.counts_tokens else None
                permit = await limiter._admit(counted)
                result = await fn(*args, **kwargs)
                usage = _usage_of(result)
                if usage is not None:
                    try:
                        await permit._asettle_reported(usage)
                    except StoreError as err:
                        # The call succeeded: a store that fails now is a warning, not its error.
                        warnings.warn(f"tollgate: could not settle a call with its usage: {err}")
                return result

            limited_async.limiter = static  # type: ignore[attr-defined]
            return limited_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def limited(*args: Any, **kwargs: Any) -> Any:
            limiter = limiter_for(args, kwargs)
            counted = arguments(args, kwargs) if limiter.counts_tokens else None
            permit = limiter._admit_blocking(counted)
            result = fn(*args, **kwargs)
            usage = _usage_of(result)
            if usage is not None:
                try:
                    permit._settle_reported(usage)
                except StoreError as err:
                    warnings.warn(f"tollgate: could not settle a call with its usage: {err}")
            return result

        limited.limiter = static  # type: ignore[attr-defined]
        return limited  # type: ignore[return-value]

    return decorate
