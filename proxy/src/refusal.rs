//! A refusal of the gate (or of a tenant's window) as the client is told it: a call that would
//! wait past its deadline is a 429 naming the window that could not pay, in the provider's
//! words, with when to retry; a full line, a cost no window can ever pay, a body the gate
//! can't read, a store that can't be reached: each its own kind of answer.

use std::time::Duration;

use tollgate::http::BodyError;
use tollgate::{Cost, Currency, Error, Limiter};

use crate::answer::{ErrorKind, Reject};
use crate::state::{ReadyUpstream, Shared};

/// The currency whose windows can't pay `cost` now, the one that would keep the call waiting
/// longest: what a refusal for want of time names (`None` when every window can pay: a pause
/// or the line held the call, or the levels can't be read). Asked only when a call is refused.
pub(crate) async fn short_of(limiter: &Limiter, cost: Cost) -> Option<Currency> {
    let snapshot = limiter.snapshot().await.ok()?;
    let mut longest: Option<(f64, Currency)> = None;
    for window in snapshot.windows() {
        let needed = cost.of(window.currency) as f64 - window.tokens.as_f64();
        if needed <= 0.0 {
            continue;
        }
        let rate = window.rate;
        let wait = needed * rate.period().as_secs_f64() / rate.amount() as f64;
        if longest.is_none_or(|(most, _)| wait > most) {
            longest = Some((wait, window.currency));
        }
    }
    longest.map(|(_, currency)| currency)
}

/// What a refusal of the gate (or a tenant's window) is answered with; `short` is the currency
/// that could not pay (see [`short_of`]), named in a 429 as the provider would name it.
pub(crate) fn refusal(
    shared: &Shared,
    upstream: &ReadyUpstream,
    err: &Error,
    short: Option<Currency>,
) -> Reject {
    match err {
        Error::Timeout { key, needed, .. } => {
            upstream.metrics.local_429s.increment(1);
            shared.live.local_429(key);
            let wait = needed.unwrap_or(Duration::from_secs(1));
            let window = short.map_or_else(String::new, |currency| {
                format!(
                    " on {}",
                    crate::answer::window_words(upstream.family, currency)
                )
            });
            Reject::new(
                ErrorKind::RateLimited(short),
                format!(
                    "tollgate-proxy: this call would wait past its deadline for its share of the rate limit{window}; retry after {:.1} s ({err})",
                    wait.as_secs_f64()
                ),
            )
            .retry_after(wait)
        }
        Error::QueueFull { key, .. } => {
            upstream.metrics.local_429s.increment(1);
            shared.live.local_429(key);
            Reject::new(
                ErrorKind::RateLimited(None),
                format!("tollgate-proxy: {err}"),
            )
            .retry_after(Duration::from_secs(1))
        }
        Error::Unpriced { .. } => Reject::new(ErrorKind::Invalid, format!("tollgate-proxy: {err}")),
        Error::CostExceedsCapacity { .. } | Error::InvalidCost { .. } => Reject::new(
            ErrorKind::Invalid,
            format!("tollgate-proxy: this call can never pass: {err}"),
        ),
        Error::Body(BodyError::UnsupportedEncoding(_)) => Reject::new(
            ErrorKind::UnsupportedEncoding,
            format!("tollgate-proxy: {err}"),
        ),
        Error::Body(BodyError::TooLarge { .. }) => {
            upstream.metrics.too_large.increment(1);
            Reject::new(ErrorKind::TooLarge, format!("tollgate-proxy: {err}"))
        }
        Error::Body(_) => Reject::new(ErrorKind::Invalid, format!("tollgate-proxy: {err}")),
        Error::Unavailable { .. } | Error::Store { .. } => {
            shared.proxy_metrics.store_errors.increment(1);
            tracing::warn!(upstream = %upstream.name, error = %err, "the store could not serve a call");
            Reject::new(
                ErrorKind::Unavailable,
                "tollgate-proxy: the rate-limit store can't be reached; nothing was sent",
            )
        }
        _ => Reject::new(ErrorKind::Unavailable, format!("tollgate-proxy: {err}")),
    }
}
