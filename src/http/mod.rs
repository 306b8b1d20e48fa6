//! Listening to the provider: a limiter in front of an LLM provider's HTTP API that estimates
//! from the request, settles from the response, follows the rate-limit headers, and tells a
//! 429 worth retrying from one that is final (feature `http`).
//!
//! The core is sans-IO: a [`Gate`] works on a request's head and body bytes and on a
//! response's status, headers and body (or stream), and any HTTP client can drive it. Adapters
//! for the clients people use sit on top: a `tower` layer (feature `tower`), async-openai's
//! middleware (feature `async-openai`) and a reqwest-middleware `Middleware` (feature
//! `reqwest-middleware`).
//!
//! # What a gate does with each call
//!
//! 1. **Before**: the request is read as its upstream will read it: a `content-encoding`
//!    (gzip, deflate, br, zstd) undone within [`GateBuilder::max_body`], a byte-order mark,
//!    UTF-16 and UTF-32 decoded, and JSON that Python's and JavaScript's parsers take (`NaN`,
//!    `1e400`, lone surrogates, deep nesting) read as they read it; a body no server reads pays
//!    one token a byte. Then the key (by default the profile's name and the body's `model`, or a
//!    function of the request's head and body) and the cost: 1 request, the input tokens of
//!    every field the provider bills (messages, `system`, `instructions`, `input`, `prompt`,
//!    `suffix`, a prediction, tools, images; an unknown field counts too), and the output it
//!    reserves where the [`Profile`] charges it: the largest of its output limits (an upstream
//!    may read any of them) times the copies `n` or `best_of` ask for, or, when it names none
//!    (or 0), its model's most output ([`models`]) as far as the windows hold beside its input.
//!    A stream that did not ask for its usage is asked for it (`stream_options.include_usage`,
//!    [`Profile::stream_usage`]): [`Call::body`] is the body to send. The estimated input
//!    carries a margin while the call is out ([`GateBuilder::estimate_margin`], 3% by
//!    default: a tokenizer's count and the provider's differ by that much), given back when
//!    the answer's usage settles it. Then it waits for the toll. The admission is remembered in the store as a call *in flight*, with what the key's
//!    windows held when it went out. With sync on, a key's first call goes alone, and the others
//!    wait (up to [`GateBuilder::first_answer_wait`], 1 s) for its answer, so that they are
//!    admitted against what the provider says is left rather than a full bucket.
//! 2. **After the head**: a *sync*, one store operation. The provider's `remaining` was counted
//!    when the call arrived there; the gate compares it with what the windows held when the
//!    call went out, less what was already corrected since. Refill since then, calls sent
//!    after it (by any process), refunds, and the order answers come back in all cancel out,
//!    so what is left is spending the gate did not see, and that much is taken off every
//!    window of the currency. Calls sent within 250 ms of it on either side may reach the
//!    provider in either order; what is taken off leaves them out (the least the provider can
//!    have seen spent elsewhere), so an honest provider is never double counted. Refill is
//!    credited from when the provider counted the call (its `openai-processing-ms` stamp
//!    taken off the round trip, else half the round trip), and a call that found a window full
//!    gives back, once, the refill the key's window had alone until then.
//!    `remaining` never raises a window. A 429 is [`Verdict::Permanent`] (OpenAI's
//!    `insufficient_quota`, Anthropic's spend limit, which has no `retry-after`) or
//!    [`Verdict::Transient`], which pauses the key and brings the windows of the currencies
//!    the 429 says are spent (all, when it doesn't say) to where the provider's are: with the
//!    provider's pause (from its headers, or Gemini's body), the tightest window holds exactly
//!    what the refused call needed when the pause ends, less what went out after it; without
//!    one, they are emptied. A 429 never raises a window: the refused call keeps its whole
//!    charge (OpenAI and Gemini count refused requests), and a retry pays its own toll. The
//!    first 429 pauses the key for the provider's pause; each further one before an answer
//!    that is not a 429 doubles it, with jitter (0.8 to 1.2), up to a minute. Calls refused
//!    together (admitted before the last such doubling) count once: they are one mistake,
//!    which the first refusal corrected.
//!
//!    An answer that is not a stream is read whole at once ([`Call::whole_answer`]): its sync
//!    waits for its settlement, and both take one step of the store (one round trip to Redis).
//! 3. **After the body**: the permit settles with the usage the body (or the stream's events)
//!    reported: an overestimate is refunded, a shortfall charged. A shortfall the provider had
//!    already counted when a sync or a 429 took it off is drawn from what they took off (the
//!    *cover*), never charged twice, and only up to what the cover held. An answer that reports no output
//!    count keeps its reservation, or is charged the output counted from the text it generated
//!    (content, tool-call arguments, reasoning, refusals, transcripts) if that is more: it is
//!    never read as "nothing was written". Usage no request could have produced (output past
//!    what its model can write; input past twice its body and 8,192 tokens, or a window) is
//!    cut to that bound. A body cut short (the caller left, the upstream broke off) keeps its charge,
//!    or what was generated if more: never less than was generated.
//!
//! [`Attempts`] is the step every adapter drives: read the request once, admit each attempt
//! under one deadline, and after each answer deliver it metered, retry after the provider's
//! pause, hand a 429 on, or refuse for good.
//!
//! # The bound
//!
//! Whatever the provider's headers say (missing, late, lying high or low, unreadable), the
//! tokens a key lets through in any interval `[t, t + dt]` are at most `B + r·dt` of its
//! configured windows, plus the shortfalls its own settlements charged (debt, bounded at 64
//! bursts): headers only ever lower a window, and a settlement charges what the provider
//! billed (cut, for usage no request could have produced, to that bound). So a budget set below
//! the provider's limit holds however the provider answers (`tests/http/bound.rs` drives an
//! adversarial provider through thousands of random runs, OpenAI- and Anthropic-shaped, on the
//! memory store and on Redis, and checks every interval of each against a ledger of its own).
//!
//! # Spending elsewhere
//!
//! Each sync also tells how much had been spent elsewhere, in all, by the time its call went
//! out. [`GateBuilder::model_spending_elsewhere`] (on by default) fits a rate to those totals
//! (the median slope over the last 5 s) and charges the key at that rate between syncs, so
//! that a call waiting for its turn waits as long as the provider would make it; each sync
//! takes off only what the model missed, and gives back what it charged too much. While such
//! spending is seen, the windows are kept 4% of their capacity below the provider's count.
//!
//! # Across processes
//!
//! On a Redis store everything above is shared: the windows, the calls in flight (a sync in
//! one process subtracts the calls every process sent after its call), what was corrected,
//! and the totals of spending elsewhere. Each process fits its own model to the same shared
//! totals, and what one charges the others count as corrected. A fleet behind one key holds
//! one quota.
//!
//! # Limits from the headers
//!
//! [`GateBuilder::limits_from_headers`] lets each key take its limits from its first response
//! (read per minute, as OpenAI and Anthropic state them); until then its calls go one at a time,
//! each holding the key's turn until its answer comes or [`GateBuilder::first_answer_wait`]
//! passes (so that a call that hangs can't hold the key). A `limit` header that disagrees with
//! configured limits gets one warning.
//!
//! # Adapters
//!
//! Every attempt a client sends must pass through the gate, so the adapter goes between the
//! client's retry logic and the network, or replaces it: `tower::GateLayer` for any
//! `Service<http::Request<B>>` (hyper-util's client), `async_openai::GateLayer` inside
//! async-openai's own retry layer, and `reqwest_middleware::GateMiddleware` after any retry
//! middleware. Each module shows its client wired up.

mod admission;
mod attempt;
mod body;
mod call;
mod elsewhere;
mod gate;
mod headers;
mod json;
mod keys;
pub mod models;
mod profile;
mod request;
mod retry_info;
mod usage;
mod verdict;

pub use attempt::{Attempts, Next};
pub use body::{MeteredBody, is_event_stream};
pub use call::{Call, SettledFn, Settlement};
pub use gate::{Estimated, Gate, GateBuilder, KeyFn};
pub use profile::{HeaderNames, OutputTo, Profile, ResetForm};
pub use request::BodyError;
pub use usage::Reported;
pub use verdict::{PermanentRefusal, Verdict};

#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;

#[cfg(any(feature = "async-openai", feature = "reqwest-middleware"))]
mod reqwest;

#[cfg(feature = "async-openai")]
#[cfg_attr(docsrs, doc(cfg(feature = "async-openai")))]
pub mod async_openai;

#[cfg(feature = "reqwest-middleware")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest-middleware")))]
pub mod reqwest_middleware;
