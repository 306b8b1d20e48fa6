"""The official SDKs through tollgate's transports, against the provider stand-in: the Rust
gate estimates each request, waits for its toll, syncs from the rate-limit headers, applies
the profile's 429 rules and settles from the usage, streams included.

The SDKs (openai, anthropic) now ride on httpx2, httpx's fork: `tollgate.httpx2` serves them;
`tollgate.httpx` serves httpx's own clients.
"""

import asyncio
import json
import time

import pytest

import tollgate
from conftest import missing

PROMPT = "Say hello to the proxy"


def sdk(name: str):
    try:
        return __import__(name)
    except ImportError:
        missing("CLIENTS", f"the {name} SDK is not installed (pip install {name})")


def written(prompt: int, reserved: int) -> int:
    """What the stand-in's model writes for a prompt, given the output reserved."""
    return min(reserved, 10 + prompt % 40)


def openai_client(url: str, transport, asynchronous: bool = False, retries: int = 0):
    openai, httpx2 = sdk("openai"), sdk("httpx2")
    if asynchronous:
        return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-tollgate-test", max_retries=retries,
                                  http_client=httpx2.AsyncClient(transport=transport))
    return openai.OpenAI(base_url=f"{url}/v1", api_key="sk-tollgate-test", max_retries=retries,
                         http_client=httpx2.Client(transport=transport))


def anthropic_client(url: str, transport, asynchronous: bool = False, retries: int = 0):
    anthropic, httpx2 = sdk("anthropic"), sdk("httpx2")
    if asynchronous:
        return anthropic.AsyncAnthropic(base_url=url, api_key="sk-ant-tollgate-test", max_retries=retries,
                                        http_client=httpx2.AsyncClient(transport=transport))
    return anthropic.Anthropic(base_url=url, api_key="sk-ant-tollgate-test", max_retries=retries,
                               http_client=httpx2.Client(transport=transport))


def transports():
    sdk("httpx2")
    import tollgate.httpx2
    return tollgate.httpx2


def test_the_openai_sdk_pays_its_estimate_and_settles_with_the_usage(stand_in):
    server = stand_in("openai", "60", "20000", "86400", "exact")
    transport = transports().Transport("openai", requests="60/d", tokens="20000/d", key="the_openai_sdk_pays_its_estimate_and_set")
    client = openai_client(server.url, transport)
    completion = client.chat.completions.create(
        model="gpt-4o", max_tokens=20, messages=[{"role": "user", "content": PROMPT}])
    prompt = tollgate.estimate({"messages": [{"role": "user", "content": PROMPT}]})[0]
    assert completion.choices[0].message.content == "ok"
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (prompt, written(prompt, 20))
    # Charged its prompt and 20 reserved; settled at what the provider billed.
    assert transport.gate.levels("the_openai_sdk_pays_its_estimate_and_set") == {"requests": 59, "tokens": 20000 - prompt - written(prompt, 20)}
    assert server.stats()["ok"] == 1


def test_a_stream_that_did_not_ask_for_its_usage_is_settled_and_the_sdk_never_sees_it(stand_in):
    server = stand_in("openai", "60", "20000", "86400", "exact")
    transport = transports().Transport("openai", requests="60/d", tokens="20000/d", key="a_stream_that_did_not_ask_for_its_usage_")
    client = openai_client(server.url, transport)
    chunks = list(client.chat.completions.create(
        model="gpt-4o", max_tokens=50, stream=True, messages=[{"role": "user", "content": PROMPT}]))
    assert chunks and all(chunk.usage is None for chunk in chunks)
    content = "".join(c.delta.content or "" for chunk in chunks for c in chunk.choices)
    assert content
    prompt = tollgate.estimate({"messages": [{"role": "user", "content": PROMPT}]})[0]
    assert transport.gate.levels("a_stream_that_did_not_ask_for_its_usage_") == {"requests": 59, "tokens": 20000 - prompt - written(prompt, 50)}


def test_the_async_openai_sdk_streams_with_its_usage(stand_in):
    server = stand_in("openai", "60", "20000", "86400", "exact")
    transport = transports().AsyncTransport("openai", requests="60/d", tokens="20000/d", key="the_async_openai_sdk_streams_with_its_us")

    async def main():
        client = openai_client(server.url, transport, asynchronous=True)
        stream = await client.chat.completions.create(
            model="gpt-4o", max_tokens=50, stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": PROMPT}])
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
        return usage

    usage = asyncio.run(main())
    prompt = tollgate.estimate({"messages": [{"role": "user", "content": PROMPT}]})[0]
    assert (usage.prompt_tokens, usage.completion_tokens) == (prompt, written(prompt, 50))
    assert transport.gate.levels("the_async_openai_sdk_streams_with_its_us") == {"requests": 59, "tokens": 20000 - prompt - written(prompt, 50)}


def test_the_anthropic_sdk_settles_input_and_output_apart(stand_in):
    server = stand_in("anthropic", "50", "40000", "8000", "86400", "exact")
    transport = transports().Transport("anthropic", requests="50/d", tokens="40000/d", output_tokens="8000/d", key="the_anthropic_sdk_settles_input_and_outp")
    client = anthropic_client(server.url, transport)
    message = client.messages.create(model="claude-sonnet-4-5", max_tokens=30,
                                      messages=[{"role": "user", "content": PROMPT}])
    assert message.content[0].text == "ok"
    used_in, used_out = message.usage.input_tokens, message.usage.output_tokens
    assert used_out == written(used_in, 30)
    assert transport.gate.levels("the_anthropic_sdk_settles_input_and_outp") == {
        "requests": 49, "tokens": 40000 - used_in, "output_tokens": 8000 - used_out}


def test_an_anthropic_stream_settles_at_its_end(stand_in):
    server = stand_in("anthropic", "50", "40000", "8000", "86400", "exact")
    transport = transports().AsyncTransport("anthropic", requests="50/d", tokens="40000/d", output_tokens="8000/d", key="an_anthropic_stream_settles_at_its_end")

    async def main():
        client = anthropic_client(server.url, transport, asynchronous=True)
        async with client.messages.stream(model="claude-sonnet-4-5", max_tokens=30,
                                          messages=[{"role": "user", "content": PROMPT}]) as events:
            text = "".join([piece async for piece in events.text_stream])
            return text, await events.get_final_message()

    text, message = asyncio.run(main())
    assert text
    assert transport.gate.levels("an_anthropic_stream_settles_at_its_end") == {
        "requests": 49, "tokens": 40000 - message.usage.input_tokens,
        "output_tokens": 8000 - message.usage.output_tokens}


def test_a_spent_quota_is_refused_for_good_and_the_sdk_does_not_retry(stand_in):
    openai = sdk("openai")
    server = stand_in("openai", "60", "20000", "86400", "exact", "permanent")
    transport = transports().Transport("openai", requests="60/d", tokens="20000/d", key="a_spent_quota_is_refused_for_good_and_th")
    client = openai_client(server.url, transport, retries=2)
    with pytest.raises(openai.RateLimitError) as raised:
        client.chat.completions.create(model="gpt-4o", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert raised.value.response.headers["x-should-retry"] == "false"
    assert server.stats()["permanent"] == 1


def test_a_call_that_cant_pass_in_time_gets_a_local_429_the_sdk_reads(stand_in):
    openai = sdk("openai")
    server = stand_in("openai", "60", "20000", "86400", "exact")
    transport = transports().Transport("openai", requests="1/h", tokens="20000/d", timeout=0, key="a_call_that_cant_pass_in_time_gets_a_loc")
    client = openai_client(server.url, transport)
    client.chat.completions.create(model="gpt-4o", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.RateLimitError) as raised:
        client.chat.completions.create(model="gpt-4o", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    headers = raised.value.response.headers
    assert headers["x-tollgate"] == "local"
    assert int(headers["retry-after"]) == 3600
    assert server.stats()["ok"] == 1


def test_httpxs_own_clients_go_through_tollgate_httpx(stand_in):
    httpx = sdk("httpx")
    import tollgate.httpx

    server = stand_in("openai", "60", "20000", "86400", "exact")
    transport = tollgate.httpx.Transport("openai", requests="60/d", tokens="20000/d", key="httpxs_own_clients_go_through_tollgate_h")
    with httpx.Client(transport=transport) as client:
        response = client.post(f"{server.url}/v1/chat/completions", json={
            "model": "gpt-4o", "max_tokens": 20, "messages": [{"role": "user", "content": PROMPT}]})
    usage = response.json()["usage"]
    assert response.status_code == 200
    assert transport.gate.levels("httpxs_own_clients_go_through_tollgate_h") == {
        "requests": 59, "tokens": 20000 - usage["prompt_tokens"] - usage["completion_tokens"]}


def burst(openai_style: bool, stand_in) -> dict:
    """80 calls at once from the async SDK, on 60 requests and 20,000 (input) tokens per 10 s.

    Both stand-ins count input up to 3% away from tiktoken's count, as a provider's own count
    strays: the gate's estimate margin (3%) covers the calls in flight until their answers
    settle them."""
    if openai_style:
        server = stand_in("openai", "60", "20000", "10")
        transport = transports().AsyncTransport("openai", requests="60/10s", tokens="20000/10s", key="burst-openai")
    else:
        server = stand_in("anthropic", "60", "20000", "4000", "10")
        transport = transports().AsyncTransport("anthropic", requests="60/10s", tokens="20000/10s",
                                                output_tokens="4000/10s", key="burst-anthropic")
    plan = server.ask("burst 80")

    async def main() -> float:
        if openai_style:
            client = openai_client(server.url, transport, asynchronous=True, retries=2)
            create = client.chat.completions.create
        else:
            client = anthropic_client(server.url, transport, asynchronous=True, retries=2)
            create = client.messages.create
        started = time.monotonic()
        await asyncio.gather(*(create(**body) for body in plan["bodies"]))
        return time.monotonic() - started

    seconds = asyncio.run(main())
    stats = server.stats()
    outcome = {"seconds": round(seconds, 3), "ideal": round(plan["ideal"], 3),
               **{k: stats[k] for k in ("ok", "refused", "permanent")}}
    print(f"80 calls ({'openai' if openai_style else 'anthropic'}): {json.dumps(outcome)}")
    return outcome


@pytest.mark.burst
def test_eighty_calls_at_once_from_the_openai_sdk_stay_inside_the_quota(stand_in):
    outcome = burst(True, stand_in)
    assert outcome["ok"] == 80
    assert outcome["refused"] <= 2, outcome
    assert outcome["seconds"] <= 1.15 * outcome["ideal"], outcome


@pytest.mark.burst
def test_eighty_calls_at_once_from_the_anthropic_sdk_stay_inside_the_quota(stand_in):
    outcome = burst(False, stand_in)
    assert outcome["ok"] == 80
    assert outcome["refused"] <= 2, outcome
    assert outcome["seconds"] <= 1.15 * outcome["ideal"], outcome


@pytest.mark.parametrize("arguments, message", [
    ({"profile": "nope", "requests": "1/s"}, "unknown profile `nope`"),
    ({"profile": "openai"}, "no limits given"),
    ({"profile": "openai", "requests": "1/s", "from_headers": True}, "limits given and from_headers"),
    ({"profile": "openai", "requests": "1/s", "retries": -1}, "retries: -1"),
    ({"profile": "openai", "requests": "500/q"}, "unknown unit `q`"),
    ({"profile": "openai", "requests": "1/s", "timeout": "soon"}, "soon"),
])
def test_a_gate_made_wrong_is_a_value_error_that_says_what(arguments, message):
    with pytest.raises(ValueError, match=message):
        tollgate.Gate(**arguments)


def test_a_request_the_gate_cant_read_is_a_value_error_and_charges_nothing():
    gate = tollgate.Gate("openai", requests="10/m", tokens="1000/m", key="unreadable")
    with pytest.raises(ValueError, match="content-encoding `snappy`"):
        gate.attempts("POST", "http://x/v1/chat/completions", [(b"content-encoding", b"snappy")], b"{}")
    with pytest.raises(ValueError, match="not valid gzip"):
        gate.attempts("POST", "http://x/v1/chat/completions", [(b"content-encoding", b"gzip")], b"junk")
    assert gate.levels("unreadable") is None
