//! What a call pays, and what it turned out to use.

use std::fmt;

use crate::rate::{Currency, MICROS_PER_DOLLAR, PerCurrency};

/// Writes micro-dollars as dollars: `$50`, `$0.0042`.
pub(crate) fn write_dollars(f: &mut fmt::Formatter<'_>, micros: u64) -> fmt::Result {
    let whole = micros / MICROS_PER_DOLLAR;
    let fraction = micros % MICROS_PER_DOLLAR;
    if fraction == 0 {
        write!(f, "${whole}")
    } else {
        let digits = format!("{fraction:06}");
        write!(f, "${whole}.{}", digits.trim_end_matches('0'))
    }
}

/// Micro-dollars written as dollars (`$0.0042`), for messages.
#[derive(Debug, Clone, Copy)]
pub struct Dollars(pub u64);

impl fmt::Display for Dollars {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_dollars(f, self.0)
    }
}

/// How much is added to an estimated input count before it is charged: a provider's own count
/// strays from any estimator's (its formatting of messages, its tokenizer's version, what it
/// adds around tools and images), and calls still in flight carry that error, unseen, until they
/// settle. Charged with the call and given back when it settles with its usage, the margin keeps
/// the key's windows at or below the provider's while they are out, so that a call admitted at
/// the very edge of a window is not refused for its neighbours' errors. Counted in basis points
/// (hundredths of a percent), rounded up to whole tokens.
///
/// ```
/// use tollgate::Margin;
///
/// let margin = Margin::percent(3.0);
/// assert_eq!(margin.on(1_000), 1_030);
/// assert_eq!(margin.on(10), 11); // rounded up
/// assert_eq!(Margin::NONE.on(1_000), 1_000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Margin(u32);

impl Margin {
    /// No margin: estimates are charged as they are.
    pub const NONE: Margin = Margin(0);

    /// The default for providers' chat and embedding counts: 3%.
    pub const DEFAULT: Margin = Margin(300);

    /// A margin of `percent` (0 to 100; anything else, or not a number, is read as the nearest
    /// of those, NaN as none).
    pub fn percent(percent: f64) -> Margin {
        let bp = if percent.is_nan() {
            0.0
        } else {
            (percent * 100.0).round().clamp(0.0, 10_000.0)
        };
        Margin(bp as u32)
    }

    /// The margin in percent.
    pub fn as_percent(self) -> f64 {
        f64::from(self.0) / 100.0
    }

    /// `tokens` with the margin added, rounded up (saturating).
    pub fn on(self, tokens: u64) -> u64 {
        let extra = u128::from(tokens) * u128::from(self.0);
        let extra = u64::try_from(extra.div_ceil(10_000)).unwrap_or(u64::MAX);
        tokens.saturating_add(extra)
    }
}

/// What one call pays: requests (normally 1), tokens (the estimate of its input, plus the output
/// it reserves where the provider meters both together), output tokens (the output it
/// reserves, where the provider limits output apart) and spend (its price in micro-dollars, for
/// budgets).
///
/// A cost may be zero in some currencies (an empty prompt pays its request and nothing else),
/// but not in all of them.
///
/// ```
/// use tollgate::Cost;
///
/// let call = Cost::call(1_200);
/// assert_eq!((call.requests, call.tokens, call.output_tokens), (1, 1_200, 0));
/// let anthropic = Cost::call(1_200).with_output_tokens(1_024);
/// assert_eq!(anthropic.to_string(), "1 requests + 1200 tokens + 1024 output tokens");
/// // $0.0042 of a budget, in micro-dollars.
/// let priced = Cost::call(1_200).with_spend(4_200);
/// assert_eq!(priced.to_string(), "1 requests + 1200 tokens + $0.0042");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub struct Cost {
    /// Charged to every request window.
    pub requests: u64,
    /// Charged to every token window.
    pub tokens: u64,
    /// Charged to every output-token window.
    pub output_tokens: u64,
    /// Charged to every spend window, in micro-dollars.
    pub spend: u64,
}

impl Cost {
    /// One request carrying `tokens` tokens: the cost of an ordinary call.
    pub const fn call(tokens: u64) -> Cost {
        Cost::new(1, tokens)
    }

    /// Explicit amounts of requests and tokens.
    pub const fn new(requests: u64, tokens: u64) -> Cost {
        Cost {
            requests,
            tokens,
            output_tokens: 0,
            spend: 0,
        }
    }

    /// The same cost with this many output tokens reserved.
    pub const fn with_output_tokens(self, output_tokens: u64) -> Cost {
        Cost {
            output_tokens,
            ..self
        }
    }

    /// The same cost with this price, in micro-dollars, charged to the spend windows.
    pub const fn with_spend(self, spend: u64) -> Cost {
        Cost { spend, ..self }
    }

    /// The amount of one currency.
    pub fn of(&self, currency: Currency) -> u64 {
        match currency {
            Currency::Requests => self.requests,
            Currency::Tokens => self.tokens,
            Currency::OutputTokens => self.output_tokens,
            Currency::Spend => self.spend,
        }
    }

    /// The cost as an amount per currency.
    pub fn per_currency(&self) -> PerCurrency<u64> {
        PerCurrency::from_fn(|c| self.of(c))
    }

    /// A cost from an amount per currency.
    pub fn from_per_currency(amounts: PerCurrency<u64>) -> Cost {
        Cost {
            requests: amounts[Currency::Requests],
            tokens: amounts[Currency::Tokens],
            output_tokens: amounts[Currency::OutputTokens],
            spend: amounts[Currency::Spend],
        }
    }

    /// True when every currency is zero: such a cost pays for nothing, and is refused.
    pub fn is_zero(&self) -> bool {
        Currency::ALL.iter().all(|c| self.of(*c) == 0)
    }
}

impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} requests + {} tokens", self.requests, self.tokens)?;
        if self.output_tokens > 0 {
            write!(f, " + {} output tokens", self.output_tokens)?;
        }
        if self.spend > 0 {
            f.write_str(" + ")?;
            write_dollars(f, self.spend)?;
        }
        Ok(())
    }
}

/// What a call really used, as the provider reports it: for [`Permit::settle_usage`].
///
/// [`Permit::settle_usage`]: crate::Permit::settle_usage
///
/// ```
/// use tollgate::Usage;
///
/// let usage = Usage::tokens(420).with_output_tokens(96);
/// assert_eq!((usage.tokens, usage.output_tokens), (Some(420), Some(96)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub struct Usage {
    /// The tokens the token windows should have been charged; `None` leaves them as charged.
    pub tokens: Option<u64>,
    /// The output tokens the output-token windows should have been charged; `None` leaves them.
    pub output_tokens: Option<u64>,
    /// What the call cost, in micro-dollars, for the spend windows; `None` leaves them.
    pub spend: Option<u64>,
}

impl Usage {
    /// The token windows' real usage, and nothing said of output.
    pub const fn tokens(tokens: u64) -> Usage {
        Usage {
            tokens: Some(tokens),
            output_tokens: None,
            spend: None,
        }
    }

    /// The same usage with the output tokens reported.
    pub const fn with_output_tokens(self, output_tokens: u64) -> Usage {
        Usage {
            output_tokens: Some(output_tokens),
            ..self
        }
    }
}

impl Usage {
    /// The token windows' usage if known, and nothing said of the rest.
    pub const fn tokens_only(tokens: Option<u64>) -> Usage {
        Usage {
            tokens,
            output_tokens: None,
            spend: None,
        }
    }

    /// The same usage with its cost in micro-dollars.
    pub const fn with_spend(self, spend: u64) -> Usage {
        Usage {
            spend: Some(spend),
            ..self
        }
    }

    /// What the usage says, per currency (requests: never said).
    pub fn per_currency(&self) -> PerCurrency<Option<u64>> {
        PerCurrency::from([None, self.tokens, self.output_tokens, self.spend])
    }
}
