"""Calls through tollgate-proxy with the official Python SDKs, driven by proxy/tests/proxy/clients.rs.

    python sdk_calls.py CASE [ARG]

The SDKs find the proxy through OPENAI_BASE_URL and ANTHROPIC_BASE_URL. Each case prints one
JSON object on its last line: what the SDK handed back, for the test to check exactly.
"""

import asyncio
import json
import sys
import time

import anthropic
import openai

PROMPT = "Say hello to the proxy"


def out(value):
    print(json.dumps(value), flush=True)


def error(err):
    """What an SDK error says, as the tests compare it."""
    body = getattr(err, "body", None)
    return {
        "error": type(err).__name__,
        "status": getattr(err, "status_code", None),
        "body": body if isinstance(body, (dict, list, str)) else None,
    }


def chat():
    client = openai.OpenAI(max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", max_tokens=20, messages=[{"role": "user", "content": PROMPT}]
    )
    completion = raw.parse()
    out({
        "content": completion.choices[0].message.content,
        "prompt_tokens": completion.usage.prompt_tokens,
        "completion_tokens": completion.usage.completion_tokens,
        "remaining_requests": raw.headers.get("x-ratelimit-remaining-requests"),
    })


def stream():
    client = openai.OpenAI(max_retries=0)
    chunks = client.chat.completions.create(
        model="gpt-4o",
        max_tokens=50,
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": PROMPT}],
    )
    content, usage, events = "", None, 0
    for chunk in chunks:
        events += 1
        for choice in chunk.choices:
            content += choice.delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
    out({
        "content": content,
        "events": events,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
    })


def embeddings():
    client = openai.OpenAI(max_retries=0)
    answer = client.embeddings.create(
        model="text-embedding-3-small", input=["rate limits keep agents polite", "calls cheap"]
    )
    out({
        "vectors": [item.embedding for item in answer.data],
        "prompt_tokens": answer.usage.prompt_tokens,
    })


def permanent():
    # Two retries allowed: the SDK must not use them on a spent quota.
    client = openai.OpenAI(max_retries=2)
    try:
        client.chat.completions.create(
            model="gpt-4o", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
        out({"error": None})
    except openai.APIStatusError as err:
        out(error(err))


def retries(allowed):
    client = openai.OpenAI(max_retries=int(allowed))
    try:
        completion = client.chat.completions.create(
            model="gpt-4o", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
        out({"error": None, "content": completion.choices[0].message.content})
    except openai.APIStatusError as err:
        out(error(err))


def messages():
    client = anthropic.Anthropic(max_retries=0)
    message = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=30, messages=[{"role": "user", "content": PROMPT}]
    )
    out({
        "content": message.content[0].text,
        "input_tokens": message.usage.input_tokens,
        "output_tokens": message.usage.output_tokens,
    })


def messages_stream():
    client = anthropic.Anthropic(max_retries=0)
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=30, messages=[{"role": "user", "content": PROMPT}]
    ) as events:
        text = "".join(events.text_stream)
        message = events.get_final_message()
    out({
        "content": text,
        "input_tokens": message.usage.input_tokens,
        "output_tokens": message.usage.output_tokens,
    })


def messages_permanent():
    client = anthropic.Anthropic(max_retries=2)
    try:
        client.messages.create(
            model="claude-sonnet-4-5", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
        out({"error": None})
    except anthropic.APIStatusError as err:
        out(error(err))


def until_refused(count, create, sdk):
    """Up to COUNT calls, two retries allowed each, stopping at the first error: each call's
    usage, then the error as the SDK raised it."""
    calls = []
    for _ in range(int(count)):
        try:
            calls.append(create())
        except sdk.APIStatusError as err:
            refused = error(err)
            refused["rate_limit"] = isinstance(err, sdk.RateLimitError)
            refused["should_retry"] = err.response.headers.get("x-should-retry")
            calls.append(refused)
            break
    out(calls)


def budget(count):
    client = openai.OpenAI(max_retries=2)

    def create():
        completion = client.chat.completions.create(
            model="gpt-4o", max_tokens=30, messages=[{"role": "user", "content": PROMPT}]
        )
        return {"input": completion.usage.prompt_tokens, "output": completion.usage.completion_tokens}

    until_refused(count, create, openai)


def messages_budget(count):
    client = anthropic.Anthropic(max_retries=2)

    def create():
        message = client.messages.create(
            model="claude-sonnet-4-5", max_tokens=30, messages=[{"role": "user", "content": PROMPT}]
        )
        return {"input": message.usage.input_tokens, "output": message.usage.output_tokens}

    until_refused(count, create, anthropic)


async def burst_async(path):
    with open(path) as f:
        bodies = json.load(f)
    client = openai.AsyncOpenAI()

    async def one(body):
        try:
            await client.chat.completions.create(**body)
            return None
        except openai.APIError as err:
            return repr(err)

    started = time.monotonic()
    outcomes = await asyncio.gather(*(one(body) for body in bodies))
    seconds = time.monotonic() - started
    failures = [o for o in outcomes if o is not None]
    out({"ok": len(outcomes) - len(failures), "failures": failures[:5], "seconds": seconds})


CASES = {
    "chat": chat,
    "stream": stream,
    "embeddings": embeddings,
    "permanent": permanent,
    "retries": retries,
    "messages": messages,
    "messages-stream": messages_stream,
    "messages-permanent": messages_permanent,
    "budget": budget,
    "messages-budget": messages_budget,
    "burst": lambda path: asyncio.run(burst_async(path)),
}

if __name__ == "__main__":
    CASES[sys.argv[1]](*sys.argv[2:])
