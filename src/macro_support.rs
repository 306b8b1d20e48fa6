//! What `#[tollgate::limit]` expands to calls into. Not a public API: it may change in any
//! release.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::Serialize;
use tollgate_estimators::{Estimate, Estimator};

use crate::config::KeyConfig;
use crate::cost::{Cost, Usage};
use crate::error::Error;
use crate::limiter::{Limiter, Permit};
use crate::rate::{Limits, Rates};
use crate::registry::Registry;

/// The timeout a call site asked for.
#[derive(Debug, Clone, Copy)]
pub enum Timeout {
    /// The limiter's policy (60 s unless the registry was made otherwise).
    Default,
    /// No deadline.
    Never,
    /// This long.
    After(Duration),
}

/// One `#[tollgate::limit]` function: its literals, and what it has resolved so far.
#[derive(Debug)]
pub struct Site {
    function: &'static str,
    key: Option<&'static str>,
    requests: &'static str,
    tokens: &'static str,
    output_tokens: &'static str,
    estimator_name: Option<&'static str>,
    timeout: Timeout,
    /// The estimate margin in basis points (`None`: [`Margin::DEFAULT`]).
    margin: Option<u32>,
    limits: OnceLock<Limits>,
    limiter: OnceLock<Limiter>,
    estimator: OnceLock<Arc<dyn Estimator>>,
}

/// What one call resolved: its limiter, and where its estimator and timeout come from.
#[derive(Debug)]
pub struct Resolved<'a> {
    site: &'a Site,
    limiter: Limiter,
    config: Option<&'static KeyConfig>,
}

impl Site {
    /// A call site; `key` is `Some` when it is a literal (then the limiter is cached here).
    /// Empty rates mean the limits come from the configuration.
    #[allow(clippy::too_many_arguments)]
    pub const fn new(
        function: &'static str,
        key: Option<&'static str>,
        requests: &'static str,
        tokens: &'static str,
        output_tokens: &'static str,
        estimator_name: Option<&'static str>,
        timeout: Timeout,
        margin: Option<u32>,
    ) -> Site {
        Site {
            function,
            key,
            requests,
            tokens,
            output_tokens,
            estimator_name,
            timeout,
            margin,
            limits: OnceLock::new(),
            limiter: OnceLock::new(),
            estimator: OnceLock::new(),
        }
    }

    fn reads_config(&self) -> bool {
        self.requests.is_empty() && self.tokens.is_empty() && self.output_tokens.is_empty()
    }

    fn literal_limits(&self) -> Result<&Limits, Error> {
        if let Some(limits) = self.limits.get() {
            return Ok(limits);
        }
        // The macro parsed these strings when the code compiled; this parse can't fail unless
        // the macro and the library disagree, and then it says so rather than panicking.
        let limits = Limits::new(
            Rates::parse_or_none(self.requests)?,
            Rates::parse_or_none(self.tokens)?,
        )
        .with_output_tokens(Rates::parse_or_none(self.output_tokens)?);
        Ok(self.limits.get_or_init(|| limits))
    }

    fn key_config(&self, key: &str) -> Result<&'static KeyConfig, Error> {
        crate::config::global_config()?
            .and_then(|config| config.key(key))
            .ok_or_else(|| Error::NotConfigured {
                key: key.to_owned(),
                function: self.function.to_owned(),
            })
    }

    /// Resolves this call: its key's limiter (cached for a literal key), and its config entry
    /// when the limits come from the configuration.
    pub fn resolve(&self, key: Option<&str>) -> Result<Resolved<'_>, Error> {
        if let Some(limiter) = self.limiter.get() {
            let config = match self.reads_config() {
                true => Some(self.key_config(limiter.key())?),
                false => None,
            };
            return Ok(Resolved {
                site: self,
                limiter: limiter.clone(),
                config,
            });
        }
        let name = match (self.key, key) {
            (Some(literal), _) => literal,
            (None, Some(key)) => key,
            (None, None) => {
                return Err(Error::NoLimits {
                    key: format!("(no key given to {})", self.function),
                });
            }
        };
        let (limits, config) = if self.reads_config() {
            let config = self.key_config(name)?;
            (&config.limits, Some(config))
        } else {
            (self.literal_limits()?, None)
        };
        let limiter = Registry::global().limiter(name, limits)?;
        let limiter = match self.key {
            Some(_) => self.limiter.get_or_init(|| limiter).clone(),
            None => limiter,
        };
        Ok(Resolved {
            site: self,
            limiter,
            config,
        })
    }
}

impl Resolved<'_> {
    /// True when the limits have token or output-token windows, so the arguments need
    /// counting.
    pub fn counts_tokens(&self) -> bool {
        let limits = self.limiter.limits();
        !limits.tokens().is_empty() || !limits.output_tokens().is_empty()
    }

    /// The estimator: the attribute's, else the configuration's, else the default; loaded once.
    pub fn estimator(&self) -> Result<&Arc<dyn Estimator>, Error> {
        let site = self.site;
        if let Some(name) = site.estimator_name {
            if let Some(estimator) = site.estimator.get() {
                return Ok(estimator);
            }
            // The first use reads the vocabulary: off the async worker, as a long count is.
            let estimator = crate::counting::estimator_named(name)?;
            return Ok(site.estimator.get_or_init(|| estimator));
        }
        match self.config {
            Some(config) => config.estimator(),
            None => Ok(site
                .estimator
                .get_or_init(crate::limiter::default_estimator)),
        }
    }

    fn timeout(&self) -> Timeout {
        match (self.site.timeout, self.config.and_then(|c| c.timeout)) {
            (Timeout::Default, Some(None)) => Timeout::Never,
            (Timeout::Default, Some(Some(d))) => Timeout::After(d),
            (timeout, _) => timeout,
        }
    }

    /// Pays one request plus `input` tokens and the `reserve`d output, waiting up to the
    /// call's timeout. The reservation goes to the output-token windows where the limits have
    /// them (providers that meter output apart), else to the token windows.
    ///
    /// A call that will settle from its answer's usage (`settles`) goes out as a call in flight:
    /// its settlement then also gives back the refill its windows had alone while it was on its
    /// way, if it found them full (see [`Op::Settle`](crate::store::Op::Settle)).
    pub async fn acquire(&self, input: u64, reserve: u64, settles: bool) -> Result<Permit, Error> {
        let limits = self.limiter.limits();
        // The estimate and its margin (given back when the call settles with its usage), never
        // past a token window the estimate alone fits in. An estimator that errs high by design
        // gets none by default.
        let margin = match self.site.margin {
            Some(bp) => crate::cost::Margin::percent(f64::from(bp) / 100.0),
            None if input == 0 || self.estimator().is_ok_and(|e| e.errs_high()) => {
                crate::cost::Margin::NONE
            }
            None => crate::cost::Margin::DEFAULT,
        };
        let estimate = input;
        let mut input = margin.on(estimate);
        if let Some(cap) = limits.tokens().as_slice().iter().map(|r| r.burst()).min() {
            // What the token window pays besides the input (the reservation, where output is
            // not metered apart).
            let beside = if limits.output_tokens().is_empty() {
                reserve
            } else {
                0
            };
            if input.saturating_add(beside) > cap {
                input = cap.saturating_sub(beside).max(estimate);
            }
        }
        let cost = if !limits.output_tokens().is_empty() {
            let input = if limits.tokens().is_empty() { 0 } else { input };
            Cost::call(input).with_output_tokens(reserve)
        } else if !limits.tokens().is_empty() {
            Cost::call(input.saturating_add(reserve))
        } else {
            Cost::call(0)
        };
        let timeout = match self.timeout() {
            Timeout::Default => self.limiter.policy().timeout(),
            Timeout::Never => None,
            Timeout::After(d) => Some(d),
        };
        if settles {
            self.limiter.acquire_flight(cost, timeout, None).await
        } else {
            self.limiter.acquire_timeout(cost, timeout).await
        }
    }

    /// After the provider refused the call `permit` paid for: pauses the key for the
    /// provider's Retry-After (a second when it gave none; longer for each 429 in a row) and
    /// brings its windows to where the provider's are ([`Permit::rate_limited`]). The next
    /// acquire waits out the pause, and pays again.
    pub async fn rate_limited(
        &self,
        permit: Permit,
        retry_after: Option<Duration>,
    ) -> Result<(), Error> {
        permit.rate_limited(retry_after).await.map(|_| ())
    }

    /// The call succeeded: the next 429 on the key pauses it for the provider's own pause
    /// again, not a longer one.
    pub fn answered(&self) {
        self.limiter.answered();
    }
}

impl Resolved<'_> {
    /// Runs `tally` (the counting of the arguments, `text_len` bytes of text in all) off the
    /// async worker when it is long.
    pub fn count(
        &self,
        text_len: usize,
        tally: impl FnOnce() -> Result<Estimate, Error>,
    ) -> Result<Estimate, Error> {
        crate::counting::count(self.limiter.off_worker_above(), text_len, tally)
    }

    /// Settles `permit` with the usage the body's answer reported; a store that fails here is
    /// a warning, not the call's failure (the call itself succeeded).
    pub async fn settle(&self, permit: Permit, usage: Usage) {
        if let Err(err) = permit.settle_usage(usage).await {
            tracing::warn!(key = %self.limiter.key(), error = %err, "could not settle a call with its usage");
        }
    }
}

/// The body of a function with `retries`: it runs again after a refusal, so it must be a
/// closure that can be called more than once. One that moves an argument out (a request passed
/// by value to a client) is refused here, at the line that moves it: clone the argument there.
pub fn body_runs_again_with_retries<F, T>(body: F) -> F
where
    F: AsyncFnMut() -> T,
{
    body
}

/// The usage `read` finds in a successful answer, for `#[tollgate::limit(settle = ...)]`.
pub fn usage_of<T: ?Sized, U: IntoUsage>(value: &T, read: impl FnOnce(&T) -> U) -> Usage {
    read(value).into_usage()
}

/// What `settle = ...` may answer: a token count, a [`Usage`], or an `Option` of either (no
/// usage reported: nothing settled).
pub trait IntoUsage {
    /// The usage.
    fn into_usage(self) -> Usage;
}

impl IntoUsage for Usage {
    fn into_usage(self) -> Usage {
        self
    }
}

macro_rules! usage_integers {
    ($($ty:ty),*) => {
        $(impl IntoUsage for $ty {
            fn into_usage(self) -> Usage {
                Usage::tokens(u64::try_from(self).unwrap_or(if self > 0 as $ty { u64::MAX } else { 0 }))
            }
        })*
    };
}

usage_integers!(u16, u32, u64, usize, i32, i64, isize);

impl<U: IntoUsage> IntoUsage for Option<U> {
    fn into_usage(self) -> Usage {
        self.map_or(Usage::default(), IntoUsage::into_usage)
    }
}

impl<U: IntoUsage + Copy> IntoUsage for &U {
    fn into_usage(self) -> Usage {
        (*self).into_usage()
    }
}

/// An argument, wrapped so that method resolution picks [`CountSerialize`] when its type
/// implements `Serialize` and [`CountSkip`] otherwise.
pub struct Arg<'a, T: ?Sized>(pub &'a T);

impl<T: ?Sized> std::fmt::Debug for Arg<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Arg(..)")
    }
}

/// Counts an argument whose type implements `Serialize`.
pub trait CountSerialize {
    /// Adds the argument's tokens to `tally`.
    fn tally_into(&self, estimator: &dyn Estimator, tally: &mut Estimate) -> Result<(), Error>;
}

impl<T: Serialize + ?Sized> CountSerialize for Arg<'_, T> {
    fn tally_into(&self, estimator: &dyn Estimator, tally: &mut Estimate) -> Result<(), Error> {
        *tally = tally.plus(tollgate_estimators::tally(estimator, self.0)?);
        Ok(())
    }
}

/// Skips an argument whose type doesn't implement `Serialize` (a client, a connection).
pub trait CountSkip {
    /// Adds nothing.
    fn tally_into(&self, _: &dyn Estimator, _: &mut Estimate) -> Result<(), Error> {
        Ok(())
    }

    /// Nothing to count.
    fn text_len(&self) -> usize {
        0
    }
}

/// The bytes of text an argument whose type implements `Serialize` holds.
pub trait SizeSerialize {
    /// How many bytes counting it would read.
    fn text_len(&self) -> usize;
}

impl<T: Serialize + ?Sized> SizeSerialize for Arg<'_, T> {
    fn text_len(&self) -> usize {
        tollgate_estimators::text_len(self.0)
    }
}

impl<T: ?Sized> CountSkip for &Arg<'_, T> {}

/// Turns an explicit output reservation (`reserve_output = expr`) into tokens.
pub trait ReserveTokens {
    /// The reservation, saturating at 0 and `u64::MAX`.
    fn reserve_tokens(&self) -> u64;
}

macro_rules! reserve_integers {
    ($($ty:ty),*) => {
        $(impl ReserveTokens for $ty {
            fn reserve_tokens(&self) -> u64 {
                u64::try_from(*self).unwrap_or(if *self > 0 as $ty { u64::MAX } else { 0 })
            }
        })*
    };
}

reserve_integers!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize
);

impl<T: ReserveTokens> ReserveTokens for Option<T> {
    fn reserve_tokens(&self) -> u64 {
        self.as_ref().map_or(0, ReserveTokens::reserve_tokens)
    }
}

impl<T: ReserveTokens + ?Sized> ReserveTokens for &T {
    fn reserve_tokens(&self) -> u64 {
        (**self).reserve_tokens()
    }
}
