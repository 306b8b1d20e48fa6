//! What `#[tollgate::limit]` expands to calls into. Not a public API: it may change in any
//! release.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::Serialize;
use tollgate_estimators::{Estimate, Estimator};

use crate::bucket::Cost;
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
    estimator_name: Option<&'static str>,
    timeout: Timeout,
    limits: OnceLock<Limits>,
    limiter: OnceLock<Limiter>,
    estimator: OnceLock<Arc<dyn Estimator>>,
}

impl Site {
    /// A call site; `key` is `Some` when it is a literal (then the limiter is cached here).
    pub const fn new(
        function: &'static str,
        key: Option<&'static str>,
        requests: &'static str,
        tokens: &'static str,
        estimator_name: Option<&'static str>,
        timeout: Timeout,
    ) -> Site {
        Site {
            function,
            key,
            requests,
            tokens,
            estimator_name,
            timeout,
            limits: OnceLock::new(),
            limiter: OnceLock::new(),
            estimator: OnceLock::new(),
        }
    }

    fn limits(&self) -> Result<&Limits, Error> {
        if let Some(limits) = self.limits.get() {
            return Ok(limits);
        }
        // The macro parsed these strings when the code compiled; this parse can't fail unless
        // the macro and the library disagree, and then it says so rather than panicking.
        let parse = |text: &str| -> Result<Rates, Error> {
            if text.is_empty() {
                Ok(Rates::none())
            } else {
                Ok(text.parse()?)
            }
        };
        let limits = Limits::new(parse(self.requests)?, parse(self.tokens)?);
        Ok(self.limits.get_or_init(|| limits))
    }

    /// True when the limits have token windows, so the arguments need counting.
    pub fn counts_tokens(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// The limiter for this call: the cached one for a literal key, else the registry's.
    pub fn limiter(&self, key: Option<&str>) -> Result<Limiter, Error> {
        if let Some(limiter) = self.limiter.get() {
            return Ok(limiter.clone());
        }
        let limits = self.limits()?;
        match (self.key, key) {
            (Some(literal), _) => {
                let limiter = Registry::global().limiter(literal, limits)?;
                Ok(self.limiter.get_or_init(|| limiter).clone())
            }
            (None, Some(key)) => Registry::global().limiter(key, limits),
            (None, None) => Err(Error::NoLimits {
                key: format!("(no key given to {})", self.function),
            }),
        }
    }

    /// The estimator named at the site, or the default, loaded once.
    pub fn estimator(&self) -> Result<&Arc<dyn Estimator>, Error> {
        if let Some(estimator) = self.estimator.get() {
            return Ok(estimator);
        }
        let estimator = match self.estimator_name {
            Some(name) => tollgate_estimators::estimator(name)?,
            None => crate::limiter::default_estimator(),
        };
        Ok(self.estimator.get_or_init(|| estimator))
    }

    /// Pays one request plus `tokens` (at least 1 when tokens are limited), waiting up to the
    /// site's timeout.
    pub async fn acquire(&self, limiter: &Limiter, tokens: u64) -> Result<Permit, Error> {
        let tokens = if self.counts_tokens() {
            tokens.max(1)
        } else {
            0
        };
        let cost = Cost::call(tokens);
        match self.timeout {
            Timeout::Default => limiter.acquire(cost).await,
            Timeout::Never => limiter.acquire_timeout(cost, None).await,
            Timeout::After(d) => limiter.acquire_timeout(cost, Some(d)).await,
        }
    }
}

/// An argument, wrapped so that method resolution picks [`CountSerialize`] when its type
/// implements `Serialize` and [`CountSkip`] otherwise.
pub struct Arg<'a, T: ?Sized>(pub &'a T);

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
