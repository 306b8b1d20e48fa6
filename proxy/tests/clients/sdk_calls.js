// Calls through tollgate-proxy with the official Node SDK (`openai` on npm), driven by
// proxy/tests/proxy/clients.rs:  node sdk_calls.js CASE [ARG]
// The SDK finds the proxy through OPENAI_BASE_URL. Each case prints one JSON object on its
// last line: what the SDK handed back, for the test to check exactly.
'use strict';

const OpenAI = require('openai');

const PROMPT = 'Say hello to the proxy';

function out(value) {
  process.stdout.write(JSON.stringify(value) + '\n');
}

function error(err) {
  return {
    error: err.constructor.name,
    rateLimit: err instanceof OpenAI.RateLimitError,
    status: err.status ?? null,
    code: err.code ?? null,
  };
}

const cases = {
  async chat() {
    const client = new OpenAI({ maxRetries: 0 });
    const { data, response } = await client.chat.completions
      .create({ model: 'gpt-4o', max_tokens: 20, messages: [{ role: 'user', content: PROMPT }] })
      .withResponse();
    out({
      content: data.choices[0].message.content,
      prompt_tokens: data.usage.prompt_tokens,
      completion_tokens: data.usage.completion_tokens,
      remaining_requests: response.headers.get('x-ratelimit-remaining-requests'),
    });
  },

  async stream() {
    const client = new OpenAI({ maxRetries: 0 });
    const chunks = await client.chat.completions.create({
      model: 'gpt-4o',
      max_tokens: 50,
      stream: true,
      stream_options: { include_usage: true },
      messages: [{ role: 'user', content: PROMPT }],
    });
    let content = '';
    let usage = null;
    let events = 0;
    for await (const chunk of chunks) {
      events += 1;
      for (const choice of chunk.choices) content += choice.delta.content ?? '';
      if (chunk.usage) usage = chunk.usage;
    }
    out({
      content,
      events,
      prompt_tokens: usage.prompt_tokens,
      completion_tokens: usage.completion_tokens,
    });
  },

  async embeddings() {
    const client = new OpenAI({ maxRetries: 0 });
    const answer = await client.embeddings.create({
      model: 'text-embedding-3-small',
      input: ['rate limits keep agents polite', 'calls cheap'],
      encoding_format: 'float',
    });
    out({
      vectors: answer.data.map((item) => item.embedding),
      prompt_tokens: answer.usage.prompt_tokens,
    });
  },

  async permanent() {
    const client = new OpenAI({ maxRetries: 2 });
    try {
      await client.chat.completions.create({
        model: 'gpt-4o',
        max_tokens: 5,
        messages: [{ role: 'user', content: 'hi' }],
      });
      out({ error: null });
    } catch (err) {
      out(error(err));
    }
  },

  async retries(allowed) {
    const client = new OpenAI({ maxRetries: Number(allowed) });
    try {
      const data = await client.chat.completions.create({
        model: 'gpt-4o',
        max_tokens: 5,
        messages: [{ role: 'user', content: 'hi' }],
      });
      out({ error: null, content: data.choices[0].message.content });
    } catch (err) {
      out(error(err));
    }
  },
};

cases[process.argv[2]](...process.argv.slice(3)).catch((err) => {
  console.error(err);
  process.exit(1);
});
