//! One key's state in a gate: its limiter (fixed, or learned from the provider's headers), the
//! turn its first call takes alone, the model of spending elsewhere, and the warnings already
//! given.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use tokio::sync::Semaphore;

use super::elsewhere::Elsewhere;
use super::headers::RateHeader;
use crate::error::Error;
use crate::limiter::Limiter;
use crate::rate::{Currency, Limits, PerCurrency, Rate, Rates};
use crate::registry::Registry;

/// The largest limit a gate learns from a header: no provider states a quota of a trillion a
/// period; a larger number is garbage, and learning it would leave the key unlimited.
pub(super) const MOST_LEARNED: u64 = 1_000_000_000_000;

/// One key's state.
pub(super) struct GateKey {
    pub(super) key: String,
    /// Set at once for fixed limits; learned (and learned again) from the headers otherwise.
    limiter: RwLock<Option<Limiter>>,
    /// What the headers taught, per currency, in the order of [`Currency::ALL`].
    learned: Mutex<PerCurrency<Option<u64>>>,
    /// Until a key's limits are known (from its first response), one call at a time; with
    /// sync on, until its first response, whatever its limits.
    pub(super) learning: Arc<Semaphore>,
    /// Whether the provider has answered a call on this key.
    pub(super) heard: AtomicBool,
    /// One warning each: a `limit` header that disagrees with the configured limits, and a
    /// rate-limit header that can't be read.
    pub(super) warned_limit: AtomicBool,
    pub(super) warned_malformed: AtomicBool,
    /// A usage no request could have produced was reported once (and warned of).
    pub(super) warned_clamped: AtomicBool,
    pub(super) elsewhere: Arc<Elsewhere>,
}

impl GateKey {
    pub(super) fn new(key: String, limiter: Option<Limiter>) -> GateKey {
        GateKey {
            key,
            limiter: RwLock::new(limiter),
            learned: Mutex::new(PerCurrency::splat(None)),
            learning: Arc::new(Semaphore::new(1)),
            heard: AtomicBool::new(false),
            warned_limit: AtomicBool::new(false),
            warned_malformed: AtomicBool::new(false),
            warned_clamped: AtomicBool::new(false),
            elsewhere: Arc::new(Elsewhere::default()),
        }
    }

    /// Whether every currency the profile's headers count has its limit learned: until then,
    /// calls go one at a time (a currency whose limit is unknown has no window to hold it).
    pub(super) fn knows_every(&self, profile: &super::Profile) -> bool {
        let learned = self.learned.lock().unwrap_or_else(PoisonError::into_inner);
        profile
            .headers
            .iter()
            .all(|names| learned[names.currency].is_some())
    }

    /// The key's limiter, once its limits are known.
    pub(super) fn limiter(&self) -> Option<Limiter> {
        self.limiter
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Learns the limits the headers state, per currency, as so many per `period`: each
    /// currency when its headers first come, again when the provider's limit changes. A limit
    /// of zero or above [`MOST_LEARNED`] is not learned (and is warned of once). Answers
    /// whether the limits changed.
    ///
    /// A key whose limits change gets a new limiter, on a store key of its own (the old one
    /// keeps serving the calls already admitted on it); its windows start full, and the next
    /// answer's sync brings them down to the provider's count.
    pub(super) fn learn(
        &self,
        registry: &Registry,
        period: Duration,
        read: &[RateHeader],
        spend: &Rates,
    ) -> Result<bool, Error> {
        let mut learned = self.learned.lock().unwrap_or_else(PoisonError::into_inner);
        let mut next = *learned;
        for header in read {
            let Some(limit) = header.limit else {
                continue;
            };
            if limit == 0 || limit > MOST_LEARNED {
                if !self.warned_malformed.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        key = %self.key,
                        currency = %header.currency,
                        limit,
                        "the provider's limit header is not a limit; not learned",
                    );
                }
                continue;
            }
            next[header.currency] = Some(limit);
        }
        if next == *learned || next.iter().all(|(_, l)| l.is_none()) {
            return Ok(false);
        }
        let rates = |currency: Currency| -> Result<Rates, Error> {
            Ok(match next[currency] {
                Some(limit) => Rates::from(Rate::new(limit, period)?),
                None => Rates::none(),
            })
        };
        let limits = Limits::new(rates(Currency::Requests)?, rates(Currency::Tokens)?)
            .with_output_tokens(rates(Currency::OutputTokens)?)
            .with_spend(spend.clone());
        let first = learned.iter().all(|(_, l)| l.is_none());
        let store_key = if first {
            self.key.clone()
        } else {
            format!("{}@{limits}", self.key)
        };
        let limiter = registry.limiter(&store_key, &limits)?;
        if first {
            tracing::info!(key = %self.key, %limits, "limits taken from the provider's headers");
        } else {
            tracing::warn!(
                key = %self.key,
                %limits,
                "the provider's limits changed (or a currency's came later); following them",
            );
        }
        *self.limiter.write().unwrap_or_else(PoisonError::into_inner) = Some(limiter);
        *learned = next;
        Ok(true)
    }
}
