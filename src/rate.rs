//! Rates and limits: the grammar of `"100000/m"`, `"5/s burst 10"` and `"60/m; 1000/d"`.
//!
//! A [`Rate`] is a capacity (the burst) refilled at `amount` per `period`. [`Rates`] are the
//! windows of one currency (a call must fit every one of them), and [`Limits`] pair the request
//! windows with the token windows of one key.
//!
//! Every way in goes through one parser: [`str::parse`], [`Rate::from_str`], serde (a rate is
//! serialized as its canonical string) and the `#[tollgate::limit]` macro, which runs the same
//! parser when the code compiles.

use std::fmt;
use std::num::NonZeroU64;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

const NANOS_PER_MS: u64 = 1_000_000;
const NANOS_PER_SEC: u64 = 1_000_000_000;
/// The longest period, 2^63 - 1 ns (about 292 years): it keeps `burst × period` inside an
/// `i128`, which is what lets the bucket arithmetic be exact without ever overflowing.
const MAX_PERIOD_NS: u64 = i64::MAX as u64;

/// The units of the grammar, largest first: [`Rate`]'s `Display` picks the largest that divides
/// the period, so the canonical form is the shortest.
const UNITS: [(&str, u64); 5] = [
    ("d", 86_400 * NANOS_PER_SEC),
    ("h", 3_600 * NANOS_PER_SEC),
    ("m", 60 * NANOS_PER_SEC),
    ("s", NANOS_PER_SEC),
    ("ms", NANOS_PER_MS),
];

/// One window: `amount` units refilled per `period`, holding at most `burst`.
///
/// Written `N/unit`, `N/Kunit`, `N per unit`, with an optional `burst B`:
///
/// ```
/// use std::time::Duration;
/// use tollgate::Rate;
///
/// let rate: Rate = "5/s burst 10".parse()?;
/// assert_eq!(rate.amount(), 5);
/// assert_eq!(rate.burst(), 10);
/// assert_eq!(rate.period(), Duration::from_secs(1));
/// assert_eq!(rate.to_string(), "5/s burst 10");
///
/// let same: Rate = "100 per minute".parse()?;
/// assert_eq!(same, "100/m".parse()?);
/// assert_eq!("10 / 5 min".parse::<Rate>()?.to_string(), "10/5m");
/// # Ok::<(), tollgate::RateError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    amount: NonZeroU64,
    period_ns: NonZeroU64,
    burst: NonZeroU64,
}

impl Rate {
    /// `amount` per `period`, with a burst of `amount`.
    ///
    /// Fails when `amount` is zero, or `period` is zero, longer than 2^63 - 1 nanoseconds, or
    /// not a whole number of milliseconds (the finest unit the grammar can write back).
    pub fn new(amount: u64, period: Duration) -> Result<Rate, RateError> {
        let input = || format!("{amount} per {period:?}");
        let amount =
            NonZeroU64::new(amount).ok_or_else(|| RateError::new(input(), RateErrorKind::Zero))?;
        let nanos = u64::try_from(period.as_nanos())
            .ok()
            .filter(|n| *n <= MAX_PERIOD_NS)
            .ok_or_else(|| RateError::new(input(), RateErrorKind::PeriodTooLong))?;
        if !nanos.is_multiple_of(NANOS_PER_MS) {
            return Err(RateError::new(input(), RateErrorKind::SubMillisecondPeriod));
        }
        let period_ns = NonZeroU64::new(nanos)
            .ok_or_else(|| RateError::new(input(), RateErrorKind::ZeroPeriod))?;
        Ok(Rate {
            amount,
            period_ns,
            burst: amount,
        })
    }

    /// The same refill with a different capacity: `5/s` with a burst of 10 holds up to 10 and
    /// refills 5 a second.
    pub fn with_burst(self, burst: u64) -> Result<Rate, RateError> {
        let burst = NonZeroU64::new(burst)
            .ok_or_else(|| RateError::new(format!("{self} burst 0"), RateErrorKind::ZeroBurst))?;
        Ok(Rate { burst, ..self })
    }

    /// How much is refilled per period.
    pub fn amount(&self) -> u64 {
        self.amount.get()
    }

    /// The period over which [`amount`](Rate::amount) is refilled.
    pub fn period(&self) -> Duration {
        Duration::from_nanos(self.period_ns.get())
    }

    /// The period in nanoseconds: the scale of the exact bucket arithmetic.
    pub fn period_nanos(&self) -> u64 {
        self.period_ns.get()
    }

    /// The capacity: how much can pass at once after a long silence.
    pub fn burst(&self) -> u64 {
        self.burst.get()
    }

    /// How long an empty bucket of this rate takes to fill up to its burst.
    pub fn time_to_fill(&self) -> Duration {
        let nanos =
            u128::from(self.burst()) * u128::from(self.period_nanos()) / u128::from(self.amount());
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let period = self.period_ns.get();
        // `new` only admits whole milliseconds, so the last unit always divides.
        let (unit, size) = UNITS
            .iter()
            .copied()
            .find(|(_, size)| period.is_multiple_of(*size))
            .unwrap_or(("ms", NANOS_PER_MS));
        let count = period / size;
        write!(f, "{}/", self.amount)?;
        if count != 1 {
            write!(f, "{count}")?;
        }
        f.write_str(unit)?;
        if self.burst != self.amount {
            write!(f, " burst {}", self.burst)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Rate({self})")
    }
}

impl FromStr for Rate {
    type Err = RateError;

    fn from_str(input: &str) -> Result<Rate, RateError> {
        parse_rate(input).map_err(|kind| RateError::new(input.to_owned(), kind))
    }
}

/// Why a rate string was refused. The message names the input and what was expected:
///
/// ```
/// let err = "100/q".parse::<tollgate::Rate>().unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "rate `100/q`: unknown unit `q`; expected s, m, h or d (or ms), optionally with a count like `5m`"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rate `{input}`: {kind}")]
pub struct RateError {
    input: String,
    kind: RateErrorKind,
}

impl RateError {
    fn new(input: String, kind: RateErrorKind) -> RateError {
        RateError { input, kind }
    }

    /// The text that was refused.
    pub fn input(&self) -> &str {
        &self.input
    }

    /// What was wrong with it.
    pub fn kind(&self) -> &RateErrorKind {
        &self.kind
    }
}

/// The ways a rate string can be wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RateErrorKind {
    /// Nothing but whitespace.
    #[error("empty; expected a rate like `100/m` or `5/s burst 10`")]
    Empty,
    /// `/s`: no number before the slash.
    #[error("missing the count before `/`; expected a rate like `100/m`")]
    MissingCount,
    /// `100` or `100/`: no unit.
    #[error("missing the unit; expected `N/unit` such as `100/m`, with unit s, m, h or d")]
    MissingUnit,
    /// A negative number.
    #[error("`{0}` is negative; rates count whole calls or tokens, from 1 up")]
    Negative(String),
    /// `1.5/s` or `ten/s`.
    #[error("`{0}` is not a whole number")]
    NotAnInteger(String),
    /// A count of zero, which would never admit anything.
    #[error("the count is 0; a rate must admit at least 1 per period")]
    Zero,
    /// A period of zero length.
    #[error("the period is 0; expected a positive length like `5m`")]
    ZeroPeriod,
    /// `5/s burst 0`.
    #[error("the burst is 0; the burst is the capacity and must be at least 1")]
    ZeroBurst,
    /// A number that does not fit in a `u64`.
    #[error("`{0}` is too large; the largest count is 18446744073709551615")]
    Overflow(String),
    /// A period longer than about 292 years.
    #[error("the period is too long; the longest is 2^63 - 1 nanoseconds (about 292 years)")]
    PeriodTooLong,
    /// A period finer than a millisecond (from [`Rate::new`]).
    #[error("the period is not a whole number of milliseconds")]
    SubMillisecondPeriod,
    /// `100/q`.
    #[error("unknown unit `{0}`; expected s, m, h or d (or ms), optionally with a count like `5m`")]
    UnknownUnit(String),
    /// Something after the rate that isn't `burst N`.
    #[error("unexpected `{0}` after the rate; expected nothing or `burst N`")]
    Trailing(String),
    /// No rate at all in a list of windows: `";"`.
    #[error("empty window in a list; separate windows with `;` or `,` like `60/m; 1000/d`")]
    EmptyWindow,
}

fn parse_count(text: &str) -> Result<u64, RateErrorKind> {
    let digits: String = text.chars().filter(|c| *c != '_').collect();
    if digits.starts_with('-') {
        return Err(RateErrorKind::Negative(text.to_owned()));
    }
    let digits = digits.strip_prefix('+').unwrap_or(&digits);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(RateErrorKind::NotAnInteger(text.to_owned()));
    }
    digits
        .parse::<u64>()
        .map_err(|_| RateErrorKind::Overflow(text.to_owned()))
}

fn unit_nanos(unit: &str) -> Option<u64> {
    let unit = unit.to_ascii_lowercase();
    let nanos = match unit.as_str() {
        "ms" | "msec" | "msecs" | "millisecond" | "milliseconds" => NANOS_PER_MS,
        "s" | "sec" | "secs" | "second" | "seconds" => NANOS_PER_SEC,
        "m" | "min" | "mins" | "minute" | "minutes" => 60 * NANOS_PER_SEC,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600 * NANOS_PER_SEC,
        "d" | "day" | "days" => 86_400 * NANOS_PER_SEC,
        _ => return None,
    };
    Some(nanos)
}

/// Parses the period part: `m`, `5m`, `5 min`, `minute`.
fn parse_period(text: &str) -> Result<u64, RateErrorKind> {
    let text = text.trim();
    if text.is_empty() {
        return Err(RateErrorKind::MissingUnit);
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '_' || c == '.' || c == '-' || c == '+'))
        .unwrap_or(text.len());
    let (count, unit) = text.split_at(split);
    let unit = unit.trim();
    if unit.is_empty() {
        return Err(RateErrorKind::MissingUnit);
    }
    let size = unit_nanos(unit).ok_or_else(|| RateErrorKind::UnknownUnit(unit.to_owned()))?;
    let count = if count.is_empty() {
        1
    } else {
        parse_count(count)?
    };
    if count == 0 {
        return Err(RateErrorKind::ZeroPeriod);
    }
    count
        .checked_mul(size)
        .filter(|n| *n <= MAX_PERIOD_NS)
        .ok_or(RateErrorKind::PeriodTooLong)
}

fn parse_rate(input: &str) -> Result<Rate, RateErrorKind> {
    let text = input.trim();
    if text.is_empty() {
        return Err(RateErrorKind::Empty);
    }
    let lower = text.to_ascii_lowercase();
    let (rate_part, burst_part) = match lower.find("burst") {
        Some(at) => (&text[..at], Some(&text[at + "burst".len()..])),
        None => (text, None),
    };
    let (count, period) = if let Some(slash) = rate_part.find('/') {
        (&rate_part[..slash], &rate_part[slash + 1..])
    } else if let Some(per) = rate_part.to_ascii_lowercase().find(" per ") {
        (&rate_part[..per], &rate_part[per + " per ".len()..])
    } else {
        let trimmed = rate_part.trim();
        // `100` alone, or `ten` alone: say what is missing rather than that it is not a number.
        return match parse_count(trimmed) {
            Ok(_) | Err(RateErrorKind::Overflow(_)) | Err(RateErrorKind::Negative(_)) => {
                Err(RateErrorKind::MissingUnit)
            }
            Err(other) => Err(other),
        };
    };
    let count = count.trim();
    if count.is_empty() {
        return Err(RateErrorKind::MissingCount);
    }
    let amount = parse_count(count)?;
    let amount = NonZeroU64::new(amount).ok_or(RateErrorKind::Zero)?;
    let period_ns = NonZeroU64::new(parse_period(period)?).ok_or(RateErrorKind::ZeroPeriod)?;
    let burst = match burst_part {
        None => amount,
        Some(rest) => {
            let rest = rest.trim();
            if rest.is_empty() {
                return Err(RateErrorKind::Trailing("burst".to_owned()));
            }
            NonZeroU64::new(parse_count(rest)?).ok_or(RateErrorKind::ZeroBurst)?
        }
    };
    Ok(Rate {
        amount,
        period_ns,
        burst,
    })
}

impl Serialize for Rate {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Rate, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The windows of one currency: a call must fit every one of them.
///
/// Written as rates separated by `;` or `,`:
///
/// ```
/// use tollgate::Rates;
///
/// let rates: Rates = "60/m; 1000/d".parse()?;
/// assert_eq!(rates.len(), 2);
/// assert_eq!(rates.to_string(), "60/m; 1000/d");
/// # Ok::<(), tollgate::RateError>(())
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Rates(Vec<Rate>);

impl Rates {
    /// No windows: the currency is not limited.
    pub fn none() -> Rates {
        Rates(Vec::new())
    }

    /// The windows, in the order they were written.
    pub fn as_slice(&self) -> &[Rate] {
        &self.0
    }

    /// How many windows there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when the currency is not limited.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The smallest burst: the largest cost a single call can have.
    pub fn capacity(&self) -> Option<u64> {
        self.0.iter().map(Rate::burst).min()
    }
}

impl From<Rate> for Rates {
    fn from(rate: Rate) -> Rates {
        Rates(vec![rate])
    }
}

impl From<Vec<Rate>> for Rates {
    fn from(rates: Vec<Rate>) -> Rates {
        Rates(rates)
    }
}

impl FromStr for Rates {
    type Err = RateError;

    fn from_str(input: &str) -> Result<Rates, RateError> {
        if input.trim().is_empty() {
            return Err(RateError::new(input.to_owned(), RateErrorKind::Empty));
        }
        let mut rates = Vec::new();
        for part in input.split([';', ',']) {
            if part.trim().is_empty() {
                return Err(RateError::new(input.to_owned(), RateErrorKind::EmptyWindow));
            }
            // Report the window that is wrong, not the whole list, when there are several.
            rates.push(part.parse::<Rate>()?);
        }
        Ok(Rates(rates))
    }
}

impl fmt::Display for Rates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, rate) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{rate}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Rates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Rates({self})")
    }
}

impl Serialize for Rates {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Rates {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Rates, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The two currencies a call pays in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Currency {
    /// One per call.
    Requests,
    /// The estimated text tokens of the call.
    Tokens,
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Currency::Requests => "requests",
            Currency::Tokens => "tokens",
        })
    }
}

/// The limits of one key: request windows (each call costs 1) and token windows (each call
/// costs its estimate).
///
/// ```
/// use tollgate::Limits;
///
/// let limits = Limits::parse("500/m", "200000/m; 2000000/d")?;
/// assert_eq!(limits.tokens().len(), 2);
/// assert_eq!(limits.to_string(), "requests 500/m, tokens 200000/m; 2000000/d");
/// # Ok::<(), tollgate::RateError>(())
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Limits {
    #[serde(default)]
    requests: Rates,
    #[serde(default)]
    tokens: Rates,
}

impl Limits {
    /// Limits from request windows and token windows.
    pub fn new(requests: impl Into<Rates>, tokens: impl Into<Rates>) -> Limits {
        Limits {
            requests: requests.into(),
            tokens: tokens.into(),
        }
    }

    /// Limits from two rate strings; an empty string leaves that currency unlimited.
    pub fn parse(requests: &str, tokens: &str) -> Result<Limits, RateError> {
        let parse = |text: &str| {
            if text.trim().is_empty() {
                Ok(Rates::none())
            } else {
                text.parse()
            }
        };
        Ok(Limits::new(parse(requests)?, parse(tokens)?))
    }

    /// Only request windows.
    pub fn requests_only(requests: impl Into<Rates>) -> Limits {
        Limits::new(requests, Rates::none())
    }

    /// Only token windows.
    pub fn tokens_only(tokens: impl Into<Rates>) -> Limits {
        Limits::new(Rates::none(), tokens)
    }

    /// The request windows.
    pub fn requests(&self) -> &Rates {
        &self.requests
    }

    /// The token windows.
    pub fn tokens(&self) -> &Rates {
        &self.tokens
    }

    /// The windows of one currency.
    pub fn of(&self, currency: Currency) -> &Rates {
        match currency {
            Currency::Requests => &self.requests,
            Currency::Tokens => &self.tokens,
        }
    }

    /// True when neither currency has a window.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty() && self.tokens.is_empty()
    }

    /// How long the longest window takes to refill from empty: after this much silence every
    /// bucket of the key is full again.
    pub fn time_to_fill(&self) -> Duration {
        self.requests
            .as_slice()
            .iter()
            .chain(self.tokens.as_slice())
            .map(Rate::time_to_fill)
            .max()
            .unwrap_or(Duration::ZERO)
    }
}

impl fmt::Display for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.requests.is_empty(), self.tokens.is_empty()) {
            (true, true) => f.write_str("no limits"),
            (false, true) => write!(f, "requests {}", self.requests),
            (true, false) => write!(f, "tokens {}", self.tokens),
            (false, false) => write!(f, "requests {}, tokens {}", self.requests, self.tokens),
        }
    }
}

impl fmt::Debug for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Limits({self})")
    }
}
