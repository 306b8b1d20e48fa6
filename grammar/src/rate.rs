//! Rates: the grammar of `"100000/m"`, `"5/s burst 10"` and `"60/m; 1000/d"`.

use std::fmt;
use std::num::NonZeroU64;
use std::str::FromStr;
use std::time::Duration;

use crate::units::{CANONICAL, NANOS_PER_MS, split_count, unit_nanos};

/// The longest period, 2^63 - 1 ns (about 292 years).
const MAX_PERIOD_NS: u64 = i64::MAX as u64;

/// `burst × period` (in token-nanoseconds) stays below this, so that the exact bucket
/// arithmetic (in units of 1/period of a token, with room for a debt of 64 bursts) never
/// leaves an `i128`. Any burst fits a period up to 2^56 ns (about 2.3 years); a burst of 10^18
/// fits one up to 42 years.
pub const MAX_CAPACITY_UNITS: u128 = 1 << 120;

/// One window: `amount` units refilled per `period`, holding at most `burst`.
///
/// Written `N/unit`, `N/Kunit`, `N per unit`, with an optional `burst B`:
///
/// ```
/// use std::time::Duration;
/// use tollgate_grammar::Rate;
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
/// # Ok::<(), tollgate_grammar::RateError>(())
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
    /// not a whole number of milliseconds (the finest unit the grammar can write back), and
    /// when `amount × period` passes [`MAX_CAPACITY_UNITS`].
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
        Rate::checked(amount, period_ns, amount).map_err(|kind| RateError::new(input(), kind))
    }

    fn checked(
        amount: NonZeroU64,
        period_ns: NonZeroU64,
        burst: NonZeroU64,
    ) -> Result<Rate, RateErrorKind> {
        if u128::from(burst.get()) * u128::from(period_ns.get()) >= MAX_CAPACITY_UNITS {
            return Err(RateErrorKind::CapacityTooLarge);
        }
        Ok(Rate {
            amount,
            period_ns,
            burst,
        })
    }

    /// The same refill with a different capacity: `5/s` with a burst of 10 holds up to 10 and
    /// refills 5 a second.
    pub fn with_burst(self, burst: u64) -> Result<Rate, RateError> {
        let input = || {
            format!(
                "{} burst {burst}",
                Rate {
                    burst: self.amount,
                    ..self
                }
            )
        };
        let burst = NonZeroU64::new(burst)
            .ok_or_else(|| RateError::new(input(), RateErrorKind::ZeroBurst))?;
        Rate::checked(self.amount, self.period_ns, burst)
            .map_err(|kind| RateError::new(input(), kind))
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

    /// How long an empty bucket of this rate takes to fill up to its burst (saturating at
    /// `u64::MAX` nanoseconds).
    pub fn time_to_fill(&self) -> Duration {
        let nanos = (u128::from(self.burst()) * u128::from(self.period_nanos()))
            .div_ceil(u128::from(self.amount()));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let period = self.period_ns.get();
        // Periods are whole milliseconds, so the last unit always divides.
        let (unit, size) = CANONICAL
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
/// let err = "100/q".parse::<tollgate_grammar::Rate>().unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "rate `100/q`: unknown unit `q`; expected s, m, h or d (or ms), optionally with a count like `5m`"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
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

impl fmt::Display for RateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rate `{}`: {}", self.input, self.kind)
    }
}

impl std::error::Error for RateError {}

/// The ways a rate string can be wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RateErrorKind {
    /// Nothing but whitespace.
    Empty,
    /// `/s`: no number before the slash.
    MissingCount,
    /// `100` or `100/`: no unit.
    MissingUnit,
    /// A negative number.
    Negative(String),
    /// `1.5/s` or `ten/s`.
    NotAnInteger(String),
    /// A count of zero, which would never admit anything.
    Zero,
    /// A period of zero length.
    ZeroPeriod,
    /// `5/s burst 0`.
    ZeroBurst,
    /// A number that does not fit in a `u64`.
    Overflow(String),
    /// A period longer than about 292 years.
    PeriodTooLong,
    /// A period finer than a millisecond (from [`Rate::new`]).
    SubMillisecondPeriod,
    /// `burst × period` at or above [`MAX_CAPACITY_UNITS`].
    CapacityTooLarge,
    /// `100/q`.
    UnknownUnit(String),
    /// Something after the rate that isn't `burst N`.
    Trailing(String),
    /// No rate at all in a list of windows: `";"`.
    EmptyWindow,
    /// A money window's amount without its `$`: `50/d` where `$50/d` was meant.
    NotMoney(String),
    /// A dollar amount finer than a micro-dollar: `$0.0000001`.
    TooPrecise(String),
}

impl fmt::Display for RateErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RateErrorKind::Empty => {
                f.write_str("empty; expected a rate like `100/m` or `5/s burst 10`")
            }
            RateErrorKind::MissingCount => {
                f.write_str("missing the count before `/`; expected a rate like `100/m`")
            }
            RateErrorKind::MissingUnit => f.write_str(
                "missing the unit; expected `N/unit` such as `100/m`, with unit s, m, h or d",
            ),
            RateErrorKind::Negative(n) => write!(
                f,
                "`{n}` is negative; rates count whole calls or tokens, from 1 up"
            ),
            RateErrorKind::NotAnInteger(n) => write!(f, "`{n}` is not a whole number"),
            RateErrorKind::Zero => {
                f.write_str("the count is 0; a rate must admit at least 1 per period")
            }
            RateErrorKind::ZeroPeriod => {
                f.write_str("the period is 0; expected a positive length like `5m`")
            }
            RateErrorKind::ZeroBurst => {
                f.write_str("the burst is 0; the burst is the capacity and must be at least 1")
            }
            RateErrorKind::Overflow(n) => write!(
                f,
                "`{n}` is too large; the largest count is 18446744073709551615"
            ),
            RateErrorKind::PeriodTooLong => f.write_str(
                "the period is too long; the longest is 2^63 - 1 nanoseconds (about 292 years)",
            ),
            RateErrorKind::SubMillisecondPeriod => {
                f.write_str("the period is not a whole number of milliseconds")
            }
            RateErrorKind::CapacityTooLarge => f.write_str(
                "the burst times the period is too large; burst × period in nanoseconds must stay below 2^120 (any burst fits a period up to 2.3 years, a burst of 10^18 one up to 42 years)",
            ),
            RateErrorKind::UnknownUnit(u) => write!(
                f,
                "unknown unit `{u}`; expected s, m, h or d (or ms), optionally with a count like `5m`"
            ),
            RateErrorKind::Trailing(t) => write!(
                f,
                "unexpected `{t}` after the rate; expected nothing or `burst N`"
            ),
            RateErrorKind::EmptyWindow => f.write_str(
                "empty window in a list; separate windows with `;` or `,` like `60/m; 1000/d`",
            ),
            RateErrorKind::NotMoney(n) => write!(
                f,
                "`{n}` is not a dollar amount; a budget is written like `$50/d` or `$0.50/h burst $5`"
            ),
            RateErrorKind::TooPrecise(n) => write!(
                f,
                "`{n}` is finer than a micro-dollar; at most six decimals"
            ),
        }
    }
}

pub(crate) fn parse_count(text: &str) -> Result<u64, RateErrorKind> {
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

/// Parses the period part: `m`, `5m`, `5 min`, `minute`.
fn parse_period(text: &str) -> Result<u64, RateErrorKind> {
    let text = text.trim();
    if text.is_empty() {
        return Err(RateErrorKind::MissingUnit);
    }
    let (count, unit) = split_count(text);
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

/// Finds `burst` as a word, in any case, without copying the input.
fn find_burst(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    (0..bytes.len().saturating_sub(4)).find(|&i| bytes[i..i + 5].eq_ignore_ascii_case(b"burst"))
}

fn parse_rate(input: &str) -> Result<Rate, RateErrorKind> {
    parse_rate_with(input, parse_count)
}

/// Micro-dollars in a dollar: money windows count micro-dollars, so that a budget is kept in
/// the same exact integer arithmetic as tokens.
pub const MICROS_PER_DOLLAR: u64 = 1_000_000;

/// Reads a dollar amount, `$12.345` (or `$12`, `$1_000`), as micro-dollars: a `$`, then a
/// whole number of dollars with at most six decimals.
///
/// ```
/// assert_eq!(tollgate_grammar::parse_dollars("$0.25").unwrap(), 250_000);
/// assert!(tollgate_grammar::parse_dollars("0.25").is_err());
/// ```
pub fn parse_dollars(text: &str) -> Result<u64, RateError> {
    dollars(text).map_err(|kind| RateError::new(text.to_owned(), kind))
}

fn dollars(text: &str) -> Result<u64, RateErrorKind> {
    let trimmed = text.trim();
    let Some(amount) = trimmed.strip_prefix('$') else {
        return Err(RateErrorKind::NotMoney(trimmed.to_owned()));
    };
    let amount = amount.trim_start();
    let (whole, fraction) = match amount.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (amount, ""),
    };
    let fraction: String = fraction.chars().filter(|c| *c != '_').collect();
    if !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return Err(RateErrorKind::NotAnInteger(trimmed.to_owned()));
    }
    if fraction.len() > 6 {
        return Err(RateErrorKind::TooPrecise(trimmed.to_owned()));
    }
    let dollars = if whole.is_empty() && !fraction.is_empty() {
        0
    } else {
        parse_count(whole).map_err(|kind| match kind {
            RateErrorKind::NotAnInteger(_) => RateErrorKind::NotAnInteger(trimmed.to_owned()),
            other => other,
        })?
    };
    let micros = format!("{fraction:0<6}").parse::<u64>().unwrap_or(0);
    dollars
        .checked_mul(MICROS_PER_DOLLAR)
        .and_then(|d| d.checked_add(micros))
        .ok_or_else(|| RateErrorKind::Overflow(trimmed.to_owned()))
}

/// Writes micro-dollars as dollars: `$50`, `$0.5`, `$0.000001`.
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

fn parse_rate_with(
    input: &str,
    parse_count: fn(&str) -> Result<u64, RateErrorKind>,
) -> Result<Rate, RateErrorKind> {
    let text = input.trim();
    if text.is_empty() {
        return Err(RateErrorKind::Empty);
    }
    let (rate_part, burst_part) = match find_burst(text) {
        Some(at) => (&text[..at], Some(&text[at + "burst".len()..])),
        None => (text, None),
    };
    let per = rate_part
        .as_bytes()
        .windows(5)
        .position(|w| w.eq_ignore_ascii_case(b" per "));
    let (count, period) = if let Some(slash) = rate_part.find('/') {
        (&rate_part[..slash], &rate_part[slash + 1..])
    } else if let Some(per) = per {
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
    let amount = NonZeroU64::new(parse_count(count)?).ok_or(RateErrorKind::Zero)?;
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
    Rate::checked(amount, period_ns, burst)
}

/// The windows of one currency: a call must fit every one of them.
///
/// Written as rates separated by `;` or `,`:
///
/// ```
/// use tollgate_grammar::Rates;
///
/// let rates: Rates = "60/m; 1000/d".parse()?;
/// assert_eq!(rates.len(), 2);
/// assert_eq!(rates.to_string(), "60/m; 1000/d");
/// # Ok::<(), tollgate_grammar::RateError>(())
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

    /// Parses `text`, reading an empty (or all-blank) string as no windows.
    ///
    /// ```
    /// use tollgate_grammar::Rates;
    ///
    /// assert!(Rates::parse_or_none("  ")?.is_empty());
    /// assert_eq!(Rates::parse_or_none("5/s")?.len(), 1);
    /// # Ok::<(), tollgate_grammar::RateError>(())
    /// ```
    pub fn parse_or_none(text: &str) -> Result<Rates, RateError> {
        if text.trim().is_empty() {
            Ok(Rates::none())
        } else {
            text.parse()
        }
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

impl Rates {
    /// Parses money windows, amounts in dollars with at most six decimals: `"$50/d"`,
    /// `"$2000/30d"`, `"$0.50/h burst $5"`, `"$50/d; $1000/30d"`. The windows count
    /// micro-dollars ([`MICROS_PER_DOLLAR`] to a dollar), so that a budget is kept in the same
    /// exact integer arithmetic as tokens. An empty string is no windows.
    ///
    /// ```
    /// use tollgate_grammar::Rates;
    ///
    /// let budget = Rates::parse_money("$50/d; $2000/30d")?;
    /// assert_eq!(budget.as_slice()[0].amount(), 50_000_000);
    /// assert_eq!(budget.money().to_string(), "$50/d; $2000/30d");
    /// assert_eq!(Rates::parse_money("$0.25/h burst $1.5")?.money().to_string(), "$0.25/h burst $1.5");
    /// assert!(Rates::parse_money("50/d").unwrap_err().to_string().contains("dollar"));
    /// # Ok::<(), tollgate_grammar::RateError>(())
    /// ```
    pub fn parse_money(text: &str) -> Result<Rates, RateError> {
        if text.trim().is_empty() {
            return Ok(Rates::none());
        }
        let mut rates = Vec::new();
        for part in text.split([';', ',']) {
            if part.trim().is_empty() {
                return Err(RateError::new(text.to_owned(), RateErrorKind::EmptyWindow));
            }
            rates.push(
                parse_rate_with(part, dollars)
                    .map_err(|kind| RateError::new(part.trim().to_owned(), kind))?,
            );
        }
        Ok(Rates(rates))
    }

    /// The windows written as money (their amounts read as micro-dollars): what
    /// [`parse_money`](Rates::parse_money) reads back.
    pub fn money(&self) -> Money<'_> {
        Money(self)
    }
}

/// Money windows written in dollars; see [`Rates::money`].
#[derive(Debug, Clone, Copy)]
pub struct Money<'a>(&'a Rates);

impl fmt::Display for Money<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, rate) in self.0.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write_dollars(f, rate.amount.get())?;
            f.write_str("/")?;
            let period = rate.period_ns.get();
            let (unit, size) = CANONICAL
                .iter()
                .copied()
                .find(|(_, size)| period.is_multiple_of(*size))
                .unwrap_or(("ms", NANOS_PER_MS));
            let count = period / size;
            if count != 1 {
                write!(f, "{count}")?;
            }
            f.write_str(unit)?;
            if rate.burst != rate.amount {
                f.write_str(" burst ")?;
                write_dollars(f, rate.burst.get())?;
            }
        }
        Ok(())
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

#[cfg(feature = "serde")]
mod serde_impls {
    use serde::de::{Deserializer, Error as _};
    use serde::{Deserialize, Serialize, Serializer};

    use super::{Rate, Rates};

    /// A rate is its canonical string.
    impl Serialize for Rate {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.collect_str(self)
        }
    }

    impl<'de> Deserialize<'de> for Rate {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Rate, D::Error> {
            let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
            text.parse().map_err(D::Error::custom)
        }
    }

    /// Windows are their canonical string; no windows is `""`, which reads back as none.
    impl Serialize for Rates {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.collect_str(self)
        }
    }

    impl<'de> Deserialize<'de> for Rates {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Rates, D::Error> {
            let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
            Rates::parse_or_none(&text).map_err(D::Error::custom)
        }
    }
}
