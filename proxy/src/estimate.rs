//! A metered request read as its upstream will read it: the gate's estimate of what it costs
//! (its tokens, its model), and, once its model is known, the pool that model goes to at its
//! upstream.

use tollgate::http::Estimated;

use crate::answer::Reject;
use crate::exchange::{CallPool, Exchange};
use crate::state::{ReadyUpstream, Shared};

/// A metered request read: its head at its upstream (without `accept-encoding`), the gate's
/// estimate, and its pool.
pub(crate) struct Estimate {
    pub(crate) head: http::request::Parts,
    pub(crate) estimated: Estimated,
    pub(crate) pool: CallPool,
}

/// The estimate phase: the request, with its `head` upstream, read by its upstream's gate.
pub(crate) fn phase(
    exchange: &Exchange<'_>,
    mut head: http::request::Parts,
) -> Result<Estimate, Reject> {
    let (shared, upstream) = (exchange.shared, &exchange.upstream);
    // The usage can only be read from bytes as they were written.
    head.headers.remove(http::header::ACCEPT_ENCODING);
    let estimated = upstream
        .gate
        .read(&head, &exchange.body)
        .map_err(|err| crate::refusal::refusal(shared, upstream, &err, None))?;
    let pool = pool_of(shared, upstream, estimated.model());
    Ok(Estimate {
        head,
        estimated,
        pool,
    })
}

/// The pool of `upstream` for a call of `model`.
fn pool_of(shared: &Shared, upstream: &ReadyUpstream, model: Option<&str>) -> CallPool {
    let pool = shared.config.pool_of(&upstream.name, model);
    CallPool {
        members: pool
            .iter()
            .flat_map(|p| p.members.iter())
            .filter_map(|name| shared.upstream_named(name).cloned())
            .collect(),
        ejection: pool.map(|p| p.ejection).unwrap_or_default(),
        attempt_timeout: pool.and_then(|p| p.attempt_timeout),
    }
}
