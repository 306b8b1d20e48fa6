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
//! 1. **Before**: the key (by default the profile's name and the body's `model`, or a function
//!    of the request's head and body) and the cost: 1 request, the input tokens of the body's
//!    messages, input, tools and images as the estimators read them, and the output it reserves
//!    (`max_tokens` × `n`) where the [`Profile`] charges it. Then it waits for the toll. With
//!    sync on, a key's first call goes alone, and the others wait (up to
//!    [`GateBuilder::first_answer_wait`], 1 s) for its answer, so that they are admitted
//!    against what the provider says is left rather than a full bucket.
//! 2. **After the head**: the `remaining` headers lower the key's windows, never raise them
//!    (calls in flight are charged here and not yet counted there); a call's own count and the
//!    calls admitted after it, still in flight, are taken out of `remaining` first, so that none
//!    is lost. Spending the gate can't see (another program on the same quota) is modelled
//!    from what each sync finds missing and charged between syncs, and while it is seen the
//!    windows are kept 4% of their capacity below the provider's count (see
//!    [`GateBuilder::model_foreign_spending`]). `limit` headers that disagree with the
//!    configured limits get one warning. A 429
//!    is [`Verdict::Permanent`] (OpenAI's `insufficient_quota`, Anthropic's spend limit, which
//!    has no `retry-after`) or [`Verdict::Transient`], which pauses the key for the provider's
//!    pause.
//! 3. **After the body**: the permit is settled with the usage the body (or the stream's last
//!    events) reported. A call the provider had already counted when its windows were brought
//!    in line (by a header sync or a 429) is refunded an overestimate but not charged its
//!    shortfall: that is in the provider's count already.
//!
//! # Limits from the headers
//!
//! [`GateBuilder::limits_from_headers`] lets each key take its limits from its first response
//! (read per minute, as OpenAI and Anthropic state them); until then its calls go one at a time.
//!
//! # Across processes
//!
//! Lowering works on any store, so on Redis every process sees the correction. The calls in
//! flight that a sync leaves out of `remaining` are this process's only: calls in flight in
//! other processes are not subtracted, so each process may let through what its neighbours have
//! in flight until their own responses correct it.

mod body;
mod call;
mod foreign;
mod gate;
mod keys;
mod profile;
mod usage;
mod verdict;

use crate::bucket::index;

#[doc(no_inline)]
pub use crate::headers::{RateHeader, go_duration, rate_headers, retry_pause};
pub use body::Metered;
pub use call::Call;
pub use gate::{Gate, GateBuilder, KeyFn};
pub use profile::{HeaderNames, OutputTo, Profile, ResetForm};
pub use usage::{Reported, UsageScanner};
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
