//! The one table of time units, shared by rates (`100/5m`) and durations (`30s`).

pub(crate) const NANOS_PER_MS: u64 = 1_000_000;
pub(crate) const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Every spelling of every unit, with its length in nanoseconds. Case does not matter.
const SPELLINGS: [(&[&str], u64); 5] = [
    (
        &["ms", "msec", "msecs", "millisecond", "milliseconds"],
        NANOS_PER_MS,
    ),
    (&["s", "sec", "secs", "second", "seconds"], NANOS_PER_SEC),
    (
        &["m", "min", "mins", "minute", "minutes"],
        60 * NANOS_PER_SEC,
    ),
    (&["h", "hr", "hrs", "hour", "hours"], 3_600 * NANOS_PER_SEC),
    (&["d", "day", "days"], 86_400 * NANOS_PER_SEC),
];

/// The canonical units, largest first: a rate's `Display` picks the largest that divides its
/// period, so that the canonical form is the shortest.
pub(crate) const CANONICAL: [(&str, u64); 5] = [
    ("d", 86_400 * NANOS_PER_SEC),
    ("h", 3_600 * NANOS_PER_SEC),
    ("m", 60 * NANOS_PER_SEC),
    ("s", NANOS_PER_SEC),
    ("ms", NANOS_PER_MS),
];

/// The length of `unit` in nanoseconds, in any spelling and case.
pub(crate) fn unit_nanos(unit: &str) -> Option<u64> {
    SPELLINGS
        .iter()
        .find(|(names, _)| names.iter().any(|n| n.eq_ignore_ascii_case(unit)))
        .map(|(_, nanos)| *nanos)
}

/// Splits `5m`, `5 min` or `minute` into the count (1 when absent) and the unit's text.
pub(crate) fn split_count(text: &str) -> (&str, &str) {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '_' || c == '.' || c == '-' || c == '+'))
        .unwrap_or(text.len());
    let (count, unit) = text.split_at(split);
    (count.trim(), unit.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_is_found_in_any_case() {
        for (names, nanos) in SPELLINGS {
            for name in names {
                assert_eq!(unit_nanos(name), Some(nanos));
                assert_eq!(unit_nanos(&name.to_ascii_uppercase()), Some(nanos));
            }
        }
        assert_eq!(unit_nanos("q"), None);
        assert_eq!(unit_nanos(""), None);
    }
}
