//! Admission: a request's wait for its toll at its key (or, while the key's limits are
//! unknown, for its turn to go alone), answered with the [`Call`] it goes out as.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;

use super::call::Call;
use super::gate::{Estimated, Gate, LimitsSource};
use super::keys::GateKey;
use crate::error::Error;

impl Gate {
    /// Finds the request's key and cost, and waits for its toll (or, on a key whose limits are
    /// still unknown, for its turn to go alone), within the gate's
    /// [`timeout`](super::GateBuilder::timeout).
    pub async fn admit(&self, parts: &http::request::Parts, body: &[u8]) -> Result<Call, Error> {
        self.admit_until(parts, body, self.deadline()).await
    }

    /// Like [`admit`](Gate::admit), with an explicit deadline (an adapter's retries share the
    /// deadline of the call's first admission).
    pub async fn admit_until(
        &self,
        parts: &http::request::Parts,
        body: &[u8],
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Call, Error> {
        let estimated = self.read(parts, body)?;
        self.admit_estimated(&estimated, deadline).await
    }

    /// Waits for the toll of a request already [`read`](Gate::read) (each retry of one
    /// request admits it again, without reading it again).
    pub async fn admit_estimated(
        &self,
        estimated: &Estimated,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Call, Error> {
        self.admit_with(estimated, Wait::Until(deadline)).await
    }

    /// Admits a request already read only if its key can pay for it now, without waiting in
    /// line: otherwise [`Error::Timeout`] says how long it would wait (`needed`), and nothing is
    /// charged. The store's answer takes what it takes (within the store's own timeout): "now"
    /// bounds the wait in line, not the answer's way back. For choosing among gates.
    pub async fn admit_estimated_now(&self, estimated: &Estimated) -> Result<Call, Error> {
        self.admit_with(estimated, Wait::Not).await
    }

    async fn admit_with(&self, estimated: &Estimated, wait: Wait) -> Result<Call, Error> {
        let deadline = match wait {
            Wait::Until(deadline) => deadline,
            Wait::Not => Some(tokio::time::Instant::now()),
        };
        let state = self.state(estimated.key.clone())?;
        let left = || deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
        let learning = matches!(self.limits_of(&estimated.key), LimitsSource::Headers(_));
        loop {
            // Limits from the headers, with a currency still unknown: its calls go one at a
            // time (the limiter holds only the currencies learned so far, and nothing would
            // hold the others).
            if learning && !state.knows_every(&self.inner.profile) {
                let turn = self.turn(&state, left()).await?;
                let Some(limiter) = state.limiter() else {
                    return Ok(Call::new(self.clone(), state, None, Some(turn), estimated));
                };
                if state.knows_every(&self.inner.profile) {
                    drop(turn);
                    continue;
                }
                let cost = self.cost_of(estimated, Some(limiter.limits()))?;
                let permit = wait
                    .acquire(&limiter, cost, left(), estimated.share())
                    .await?;
                return Ok(Call::new(
                    self.clone(),
                    state,
                    Some(permit),
                    Some(turn),
                    estimated,
                ));
            }
            if let Some(limiter) = state.limiter() {
                // With sync on, a key's first call goes alone: the windows can't know what
                // others spent from the quota until the provider has said so once, and calls
                // sent meanwhile would be admitted against a level nobody has.
                let alone = match self.inner.first_answer {
                    Some(wait) if self.inner.sync && !state.heard.load(Ordering::Acquire) => {
                        let turn = Arc::clone(&state.learning).acquire_owned();
                        let wait = left().map_or(wait, |left| wait.min(left));
                        match tokio::time::timeout(wait, turn).await {
                            Ok(turn) => {
                                let turn = turn.expect("the semaphore is never closed");
                                (!state.heard.load(Ordering::Acquire)).then_some(turn)
                            }
                            // The first answer is slow in coming: go without it, keeping the
                            // margin back until it comes.
                            Err(_) => {
                                if self.inner.model_elsewhere {
                                    state.elsewhere.blind(&limiter).await?;
                                }
                                None
                            }
                        }
                    }
                    _ => None,
                };
                let cost = self.cost_of(estimated, Some(limiter.limits()))?;
                let permit = wait
                    .acquire(&limiter, cost, left(), estimated.share())
                    .await?;
                trace_admitted(&limiter, cost).await;
                return Ok(Call::new(
                    self.clone(),
                    state,
                    Some(permit),
                    alone,
                    estimated,
                ));
            }
            let turn = self.turn(&state, left()).await?;
            if state.limiter().is_some() {
                continue;
            }
            return Ok(Call::new(self.clone(), state, None, Some(turn), estimated));
        }
    }

    /// The key's turn to go alone, within `left`.
    async fn turn(
        &self,
        state: &GateKey,
        left: Option<Duration>,
    ) -> Result<OwnedSemaphorePermit, Error> {
        let turn = Arc::clone(&state.learning).acquire_owned();
        let turn = match left {
            Some(timeout) => {
                tokio::time::timeout(timeout, turn)
                    .await
                    .map_err(|_| Error::Timeout {
                        key: state.key.clone(),
                        waited: timeout,
                        needed: None,
                    })?
            }
            None => turn.await,
        };
        Ok(turn.expect("the semaphore is never closed"))
    }
}

/// What the key's windows hold right after an admission, at `trace` level: beside a provider's
/// own record of the same call, where the two first part is found.
async fn trace_admitted(limiter: &crate::limiter::Limiter, cost: crate::cost::Cost) {
    if !tracing::enabled!(tracing::Level::TRACE) {
        return;
    }
    if let Ok(snapshot) = limiter.snapshot().await {
        let level = |c: crate::rate::Currency| snapshot.least(c).map(|a| a.as_f64());
        tracing::trace!(
            key = %limiter.key(),
            tokens = cost.tokens,
            requests_left = ?level(crate::rate::Currency::Requests),
            tokens_left = ?level(crate::rate::Currency::Tokens),
            "admitted",
        );
    }
}

/// How long an admission may wait in line.
#[derive(Debug, Clone, Copy)]
enum Wait {
    /// Until the deadline (`None`: for ever).
    Until(Option<tokio::time::Instant>),
    /// Not at all: admitted now, or told how long it would wait.
    Not,
}

impl Wait {
    async fn acquire(
        self,
        limiter: &crate::limiter::Limiter,
        cost: crate::cost::Cost,
        left: Option<Duration>,
        share: Option<&crate::store::Share>,
    ) -> Result<crate::limiter::Permit, Error> {
        match self {
            Wait::Until(_) => limiter.acquire_flight(cost, left, share).await,
            Wait::Not => limiter.acquire_flight_now(cost).await,
        }
    }
}
