"""tollgate.limit on `def` and `async def`: each call pays one request and its arguments'
tokens before the body runs, as the Rust macro counts them; `max_tokens` reserves output; a
returned `usage` settles the call."""

import asyncio
import dataclasses
import types

import pytest

import tollgate
from tollgate import ManualClock, limit

HELLO = [{"role": "user", "content": "Hello there"}]
# 3 tokens of framing + "user" (1) + "Hello there" (2) + 3 for the reply's priming.
HELLO_TOKENS = 9


class Client:
    """Not something that can be counted: skipped, as the macro skips a client."""


def test_a_sync_call_pays_before_its_body_runs():
    clock = ManualClock()
    seen = []

    @limit("deco-sync", requests="10/m", tokens="10000/m", clock=clock)
    def chat(client, messages, max_tokens=100):
        seen.append(chat.limiter.levels())
        return "ok"

    assert chat(Client(), HELLO) == "ok"
    assert seen == [{"requests": 9, "tokens": 10000 - HELLO_TOKENS - 100}]


def test_an_async_call_pays_before_its_body_runs():
    clock = ManualClock()
    seen = []

    @limit("deco-async", requests="10/m", tokens="10000/m", clock=clock)
    async def chat(client, messages, max_tokens=256):
        seen.append(chat.limiter.levels())
        return "ok"

    assert asyncio.run(chat(Client(), messages=HELLO)) == "ok"
    assert seen == [{"requests": 9, "tokens": 10000 - HELLO_TOKENS - 256}]


def test_max_tokens_reserves_output_in_the_output_windows_where_there_are_any():
    clock = ManualClock()

    @limit("deco-anthropic", requests="50/m", tokens="40000/m", output_tokens="8000/m", clock=clock)
    def messages(messages, max_tokens):
        return None

    messages(HELLO, max_tokens=1024)
    assert messages.limiter.levels() == {"requests": 49, "tokens": 40000 - HELLO_TOKENS,
                                         "output_tokens": 8000 - 1024}


def test_keyword_arguments_count_as_the_request_body_they_are():
    clock = ManualClock()

    @limit("deco-kwargs", tokens="10000/m", clock=clock)
    def create(**body):
        return None

    create(model="gpt-4o", messages=HELLO, max_tokens=50, temperature=0.2)
    assert create.limiter.levels() == {"tokens": 10000 - HELLO_TOKENS - 50}
    assert tollgate.estimate({"model": "gpt-4o", "messages": HELLO, "max_tokens": 50}) == (HELLO_TOKENS, 50)


def test_plain_text_arguments_count_their_tokens():
    clock = ManualClock()

    @limit("deco-text", tokens="1000/m", estimator="openai", clock=clock)
    def summarise(text):
        return None

    summarise("Hello, world!")
    assert summarise.limiter.levels() == {"tokens": 1000 - tollgate.count_tokens("Hello, world!")}


def test_dataclasses_and_pydantic_models_are_counted_and_self_is_not():
    pydantic = pytest.importorskip("pydantic")
    clock = ManualClock()

    class Message(pydantic.BaseModel):
        role: str
        content: str

    @dataclasses.dataclass
    class Prompt:
        text: str

    class Agent:
        instructions = "ignored: self is not counted"

        @limit("deco-method", tokens="1000/m", clock=clock)
        def ask(self, prompt, history):
            return None

    Agent().ask(Prompt("Hello, world!"), [Message(role="user", content="Hello there")])
    expected = tollgate.estimate({"prompt": {"text": "Hello, world!"},
                                  "history": [{"role": "user", "content": "Hello there"}]})[0]
    assert Agent.ask.limiter.levels() == {"tokens": 1000 - expected}


def test_a_returned_usage_dict_settles_the_call():
    clock = ManualClock()

    @limit("deco-usage-dict", tokens="10000/m", clock=clock)
    def chat(messages, max_tokens=100):
        return {"usage": {"prompt_tokens": 9, "completion_tokens": 20, "total_tokens": 29}}

    chat(HELLO)
    assert chat.limiter.levels() == {"tokens": 10000 - 29}


def test_the_openai_sdks_usage_object_settles_an_async_call():
    openai_types = pytest.importorskip("openai.types")
    clock = ManualClock()

    @limit("deco-usage-openai", tokens="10000/m", clock=clock)
    async def chat(messages, max_tokens=100):
        usage = openai_types.CompletionUsage(prompt_tokens=9, completion_tokens=41, total_tokens=50)
        return types.SimpleNamespace(usage=usage)

    asyncio.run(chat(HELLO))
    assert chat.limiter.levels() == {"tokens": 10000 - 50}


def test_the_anthropic_sdks_usage_object_settles_input_and_output_apart():
    anthropic_types = pytest.importorskip("anthropic.types")
    clock = ManualClock()

    @limit("deco-usage-anthropic", requests="50/m", tokens="40000/m", output_tokens="8000/m", clock=clock)
    def messages(messages, max_tokens):
        usage = anthropic_types.Usage(input_tokens=12, output_tokens=30, cache_read_input_tokens=100)
        return types.SimpleNamespace(usage=usage)

    messages(HELLO, max_tokens=1024)
    # Anthropic's cache reads don't count toward its input limit.
    assert messages.limiter.levels() == {"requests": 49, "tokens": 40000 - 12, "output_tokens": 8000 - 30}


def test_a_call_that_would_wait_past_its_timeout_raises_before_its_body_runs():
    clock = ManualClock()
    ran = []

    @limit("deco-timeout", requests="2/m", timeout=0, clock=clock)
    def call():
        ran.append(1)

    call()
    call()
    with pytest.raises(tollgate.Timeout) as raised:
        call()
    assert raised.value.needed == 30.0
    assert ran == [1, 1]
    clock.advance(30)
    call()
    assert ran == [1, 1, 1]


def test_an_async_timeout_raises_too():
    clock = ManualClock()

    @limit("deco-async-timeout", requests="1/m", timeout="0s", clock=clock)
    async def call():
        return 1

    async def main():
        await call()
        with pytest.raises(tollgate.Timeout):
            await call()

    asyncio.run(main())


def test_a_key_can_be_a_function_of_the_arguments():
    clock = ManualClock()

    @limit(lambda tenant, prompt: f"tenant:{tenant}", requests="1/m", timeout=0, clock=clock)
    def ask(tenant, prompt):
        return tenant

    assert ask("a", "hi") == "a" and ask("b", "hi") == "b"
    with pytest.raises(tollgate.Timeout):
        ask("a", "again")


def test_a_bad_rate_fails_where_the_function_is_decorated():
    with pytest.raises(ValueError, match="unknown unit `q`"):
        @limit("deco-bad", requests="500/q")
        def never():
            pass


def test_an_async_limited_call_waits_without_blocking_the_loop():
    @limit("deco-loop", requests="10/s burst 1")
    async def call():
        return True

    async def main():
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        await call()
        await call()  # waits about 0.1 s, on the loop
        ticker.cancel()
        return ticks

    assert asyncio.run(main()) >= 3


def test_the_wrapper_keeps_the_functions_name_and_docs():
    @limit("deco-wraps", requests="1/s")
    async def documented():
        """Says what it does."""

    assert documented.__name__ == "documented" and documented.__doc__ == "Says what it does."
    assert asyncio.iscoroutinefunction(documented)
