//! Limits: the windows of one key, in each currency a call pays.
//!
//! A [`Rate`] is a capacity (the burst) refilled at `amount` per `period`; [`Rates`] are the
//! windows of one currency (a call must fit every one of them); [`Limits`] hold the windows of
//! every currency of one key. Every way in goes through one parser, the `tollgate-grammar`
//! crate's: [`str::parse`], serde (a rate is serialized as its canonical string) and the
//! `#[tollgate::limit]` macro, which runs the same parser when the code compiles.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
pub use tollgate_grammar::{MICROS_PER_DOLLAR, Money, Rate, RateError, RateErrorKind, Rates};

/// What a window counts. A [`Cost`](crate::Cost) has a part in each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Currency {
    /// One per call.
    Requests,
    /// The (input) text tokens of the call, and for providers that meter input and output
    /// together, the output it reserves.
    Tokens,
    /// The output tokens a call reserves, for providers that limit output apart (Anthropic's
    /// output tokens per minute).
    OutputTokens,
    /// Money, in micro-dollars ([`MICROS_PER_DOLLAR`] to a dollar): what a call is priced at
    /// (its input and reserved output at the model's prices), for budgets like `"$50/d"`.
    Spend,
}

impl Currency {
    /// Every currency, in the order limits list them.
    pub const ALL: [Currency; 4] = [
        Currency::Requests,
        Currency::Tokens,
        Currency::OutputTokens,
        Currency::Spend,
    ];

    /// The currency's place in [`Currency::ALL`] (and in a [`PerCurrency`]).
    pub const fn index(self) -> usize {
        match self {
            Currency::Requests => 0,
            Currency::Tokens => 1,
            Currency::OutputTokens => 2,
            Currency::Spend => 3,
        }
    }

    /// The currency's name in snake case, as serde and the Redis script's logs write it.
    pub const fn name(self) -> &'static str {
        match self {
            Currency::Requests => "requests",
            Currency::Tokens => "tokens",
            Currency::OutputTokens => "output_tokens",
            Currency::Spend => "spend",
        }
    }
}

/// One value per [`Currency`], indexed by currency: what a call is charged, what a window
/// holds above a count, what a sync took off.
///
/// ```
/// use tollgate::{Currency, PerCurrency};
///
/// let mut charged = PerCurrency::splat(0u64);
/// charged[Currency::Tokens] = 1_200;
/// charged[Currency::Requests] += 1;
/// assert_eq!(charged[Currency::Tokens], 1_200);
/// assert_eq!(charged.iter().filter(|(_, v)| **v > 0).count(), 2);
/// let doubled = charged.map(|v| v * 2);
/// assert_eq!(doubled[Currency::Requests], 2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PerCurrency<T>([T; 4]);

impl<T> PerCurrency<T> {
    /// A value per currency, from a function of the currency.
    pub fn from_fn(mut f: impl FnMut(Currency) -> T) -> PerCurrency<T> {
        PerCurrency(std::array::from_fn(|i| f(Currency::ALL[i])))
    }

    /// The values, each changed by `f`.
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> PerCurrency<U> {
        PerCurrency(self.0.map(f))
    }

    /// Every currency with its value, in the order of [`Currency::ALL`].
    pub fn iter(&self) -> impl Iterator<Item = (Currency, &T)> {
        Currency::ALL.into_iter().zip(self.0.iter())
    }

    /// The values, in the order of [`Currency::ALL`].
    pub fn values(&self) -> &[T; 4] {
        &self.0
    }
}

impl<T: Copy> PerCurrency<T> {
    /// The same value in every currency.
    pub const fn splat(value: T) -> PerCurrency<T> {
        PerCurrency([value; 4])
    }
}

impl<T> std::ops::Index<Currency> for PerCurrency<T> {
    type Output = T;

    fn index(&self, currency: Currency) -> &T {
        &self.0[currency.index()]
    }
}

impl<T> std::ops::IndexMut<Currency> for PerCurrency<T> {
    fn index_mut(&mut self, currency: Currency) -> &mut T {
        &mut self.0[currency.index()]
    }
}

impl<T> From<[T; 4]> for PerCurrency<T> {
    fn from(values: [T; 4]) -> PerCurrency<T> {
        PerCurrency(values)
    }
}

/// A set of currencies: which windows a provider's 429 says are spent.
///
/// ```
/// use tollgate::{Currencies, Currency};
///
/// let spent = Currencies::NONE.with(Currency::Tokens);
/// assert!(spent.contains(Currency::Tokens));
/// assert!(!spent.contains(Currency::Requests));
/// assert!(Currencies::ALL.contains(Currency::OutputTokens));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Currencies(u8);

impl Currencies {
    /// No currency.
    pub const NONE: Currencies = Currencies(0);
    /// Every currency.
    pub const ALL: Currencies = Currencies(0b1111);
    /// What a provider counts: requests, tokens and output tokens (money is counted here
    /// alone).
    pub const PROVIDER: Currencies = Currencies(0b0111);

    const fn bit(currency: Currency) -> u8 {
        1 << currency.index()
    }

    /// The same set with `currency` in it.
    pub const fn with(self, currency: Currency) -> Currencies {
        Currencies(self.0 | Currencies::bit(currency))
    }

    /// The same set without `currency`.
    pub const fn without(self, currency: Currency) -> Currencies {
        Currencies(self.0 & !Currencies::bit(currency))
    }

    /// Whether `currency` is in the set.
    pub fn contains(self, currency: Currency) -> bool {
        self.0 & Currencies::bit(currency) != 0
    }

    /// True when no currency is in the set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The set as a bit mask (requests 1, tokens 2, output tokens 4, spend 8): how the Redis
    /// script takes it.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn bits(self) -> u8 {
        self.0
    }
}

impl FromIterator<Currency> for Currencies {
    fn from_iter<I: IntoIterator<Item = Currency>>(iter: I) -> Currencies {
        iter.into_iter().fold(Currencies::NONE, Currencies::with)
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Currency::Requests => "requests",
            Currency::Tokens => "tokens",
            Currency::OutputTokens => "output tokens",
            Currency::Spend => "spend",
        })
    }
}

/// The limits of one key: request windows (each call costs 1), token windows (each call costs
/// its estimate) and, for providers that meter output apart, output-token windows.
///
/// Cloning is cheap: clones share one allocation.
///
/// ```
/// use tollgate::Limits;
///
/// let limits = Limits::parse("500/m", "200000/m; 2000000/d")?;
/// assert_eq!(limits.tokens().len(), 2);
/// assert_eq!(limits.to_string(), "requests 500/m, tokens 200000/m; 2000000/d");
///
/// // Anthropic-style: input and output tokens limited apart.
/// let anthropic = Limits::parse("50/m", "40000/m")?.with_output_tokens("8000/m".parse::<tollgate::Rates>()?);
/// assert_eq!(anthropic.to_string(), "requests 50/m, tokens 40000/m, output tokens 8000/m");
/// # Ok::<(), tollgate::Error>(())
/// ```
///
/// With serde, limits are a map of rate strings; a currency without windows is left out, and an
/// unknown field is an error rather than a limit silently dropped:
///
/// ```
/// use tollgate::Limits;
///
/// let limits: Limits = serde_json::from_str(r#"{"requests": "5/s"}"#)?;
/// assert_eq!(serde_json::to_string(&limits)?, r#"{"requests":"5/s"}"#);
/// let typo = serde_json::from_str::<Limits>(r#"{"request": "5/s", "tokns": "100/m"}"#);
/// assert!(typo.unwrap_err().to_string().contains("unknown field `request`"));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Limits(Arc<Inner>);

/// The windows as written, and the same flattened once for the arithmetic.
#[derive(Clone, Default)]
struct Inner {
    windows: Windows,
    flat: Box<[(Currency, Rate)]>,
}

impl PartialEq for Inner {
    fn eq(&self, other: &Inner) -> bool {
        self.windows == other.windows
    }
}

impl Eq for Inner {}

impl std::hash::Hash for Inner {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.windows.hash(state);
    }
}

impl From<Windows> for Limits {
    fn from(windows: Windows) -> Limits {
        let flat = Currency::ALL
            .into_iter()
            .flat_map(|c| windows.of(c).as_slice().iter().map(move |r| (c, *r)))
            .collect();
        Limits(Arc::new(Inner { windows, flat }))
    }
}

#[derive(Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Windows {
    #[serde(default, skip_serializing_if = "Rates::is_empty")]
    requests: Rates,
    #[serde(default, skip_serializing_if = "Rates::is_empty")]
    tokens: Rates,
    #[serde(default, skip_serializing_if = "Rates::is_empty")]
    output_tokens: Rates,
    #[serde(default, skip_serializing_if = "Rates::is_empty", with = "money")]
    spend: Rates,
}

/// Money windows in serde: `"$50/d; $2000/30d"`.
mod money {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    use super::Rates;

    pub(super) fn serialize<S: Serializer>(
        rates: &Rates,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&rates.money())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Rates, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Rates::parse_money(&text).map_err(D::Error::custom)
    }
}

impl Windows {
    fn of(&self, currency: Currency) -> &Rates {
        match currency {
            Currency::Requests => &self.requests,
            Currency::Tokens => &self.tokens,
            Currency::OutputTokens => &self.output_tokens,
            Currency::Spend => &self.spend,
        }
    }

    fn of_mut(&mut self, currency: Currency) -> &mut Rates {
        match currency {
            Currency::Requests => &mut self.requests,
            Currency::Tokens => &mut self.tokens,
            Currency::OutputTokens => &mut self.output_tokens,
            Currency::Spend => &mut self.spend,
        }
    }
}

impl Limits {
    /// Limits from request windows and token windows.
    pub fn new(requests: impl Into<Rates>, tokens: impl Into<Rates>) -> Limits {
        Limits::from(Windows {
            requests: requests.into(),
            tokens: tokens.into(),
            ..Windows::default()
        })
    }

    /// Limits from two rate strings; an empty string leaves that currency unlimited.
    ///
    /// A string that does not parse is a [`RateError`], naming the window that is wrong (it
    /// converts into [`Error::Rate`](crate::Error::Rate), so `?` works in either).
    pub fn parse(requests: &str, tokens: &str) -> Result<Limits, RateError> {
        Ok(Limits::new(
            Rates::parse_or_none(requests)?,
            Rates::parse_or_none(tokens)?,
        ))
    }

    /// Only request windows.
    pub fn requests_only(requests: impl Into<Rates>) -> Limits {
        Limits::new(requests, Rates::none())
    }

    /// Only token windows.
    pub fn tokens_only(tokens: impl Into<Rates>) -> Limits {
        Limits::new(Rates::none(), tokens)
    }

    /// The same limits with these output-token windows (for providers that limit output tokens
    /// apart from input tokens).
    pub fn with_output_tokens(self, output_tokens: impl Into<Rates>) -> Limits {
        self.with(Currency::OutputTokens, output_tokens)
    }

    /// The same limits with these spend windows: budgets in micro-dollars, written like
    /// `"$50/d"` ([`Rates::parse_money`]). A call pays its price in them
    /// ([`Cost::with_spend`](crate::Cost::with_spend)).
    ///
    /// ```
    /// use tollgate::{Limits, Rates};
    ///
    /// let limits = Limits::parse("500/m", "200000/m")?.with_spend(Rates::parse_money("$50/d")?);
    /// assert_eq!(limits.spend().as_slice()[0].amount(), 50_000_000);
    /// assert_eq!(limits.to_string(), "requests 500/m, tokens 200000/m, spend $50/d");
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn with_spend(self, spend: impl Into<Rates>) -> Limits {
        self.with(Currency::Spend, spend)
    }

    /// The same limits with the windows of `currency` replaced.
    pub fn with(self, currency: Currency, rates: impl Into<Rates>) -> Limits {
        let mut windows = Arc::unwrap_or_clone(self.0).windows;
        *windows.of_mut(currency) = rates.into();
        Limits::from(windows)
    }

    /// The request windows.
    pub fn requests(&self) -> &Rates {
        &self.0.windows.requests
    }

    /// The token windows.
    pub fn tokens(&self) -> &Rates {
        &self.0.windows.tokens
    }

    /// The output-token windows.
    pub fn output_tokens(&self) -> &Rates {
        &self.0.windows.output_tokens
    }

    /// The spend windows (micro-dollars).
    pub fn spend(&self) -> &Rates {
        &self.0.windows.spend
    }

    /// The windows of one currency.
    pub fn of(&self, currency: Currency) -> &Rates {
        self.0.windows.of(currency)
    }

    /// Every window with its currency, requests first, in the order they were written.
    pub fn windows(&self) -> impl Iterator<Item = (Currency, &Rate)> {
        self.0.flat.iter().map(|(c, r)| (*c, r))
    }

    /// The same windows, as a slice.
    pub(crate) fn flat(&self) -> &[(Currency, Rate)] {
        &self.0.flat
    }

    /// How many windows there are in all.
    pub fn len(&self) -> usize {
        self.0.flat.len()
    }

    /// True when no currency has a window.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How long the longest window takes to refill from empty: after this much silence every
    /// bucket of the key is full again.
    pub fn time_to_fill(&self) -> Duration {
        self.windows()
            .map(|(_, rate)| rate.time_to_fill())
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// True when both are the very same limits (one allocation): a cheap test before `==`.
    pub(crate) fn same(&self, other: &Limits) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self == other
    }
}

impl fmt::Display for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for currency in Currency::ALL {
            let rates = self.of(currency);
            if rates.is_empty() {
                continue;
            }
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            if currency == Currency::Spend {
                write!(f, "{currency} {}", rates.money())?;
            } else {
                write!(f, "{currency} {rates}")?;
            }
        }
        if first {
            f.write_str("no limits")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Limits({self})")
    }
}

impl Serialize for Limits {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.windows.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Limits {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Limits, D::Error> {
        Windows::deserialize(deserializer).map(Limits::from)
    }
}
