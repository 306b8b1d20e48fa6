//! The Lua script's side of the bargain: windows in the script's integers, the arguments of
//! each operation, and its replies.

use redis::Value;

use std::sync::LazyLock;

use crate::bucket::{self, Amount, Available};
use crate::rate::{Currency, Limits, PerCurrency, Rate};
use crate::store::{Op, Ticket};

/// The script as written: constants in double braces are filled in from Rust's.
const TEMPLATE: &str = include_str!("script.lua");

/// The script the server runs: [`TEMPLATE`] with every constant it shares with the rule book
/// taken from the Rust constants, so that the two can't drift apart by hand.
pub(super) static LUA: LazyLock<String> = LazyLock::new(|| {
    let constants = [
        ("MAX_CAPACITY", MAX_CAPACITY.to_string()),
        ("DEBT_BURSTS", bucket::DEBT_BURSTS.to_string()),
        ("MAX_QUEUE", bucket::MAX_QUEUE.to_string()),
        ("SCAN_AHEAD", bucket::SCAN_AHEAD.to_string()),
        ("MAX_FLIGHTS", bucket::MAX_FLIGHTS.to_string()),
        (
            "FLIGHT_LEASE_MS",
            bucket::FLIGHT_LEASE.as_millis().to_string(),
        ),
        ("SEND_SKEW_MS", bucket::SEND_SKEW.as_millis().to_string()),
    ];
    let mut script = TEMPLATE.to_owned();
    for (name, value) in constants {
        script = script.replace(&format!("{{{{{name}}}}}"), &value);
    }
    script
});

/// The script's capacities stay below 2^46, so that a debt of 64 bursts, any refill and any
/// wait stay exact in its doubles (below 2^53).
pub(super) const MAX_CAPACITY: u128 = 1 << 46;
/// The largest integer the script's doubles hold exactly.
const MAX_EXACT: i64 = (1 << 53) - 1;
/// The longest pause sent to the script, in milliseconds (about 35 years).
const MAX_PAUSE_MS: u128 = 1 << 40;

/// One window as the script takes it: units of `1/scale` token, `refill` units a millisecond.
#[derive(Debug, Clone)]
pub(super) struct Scaled {
    currency: Currency,
    rate: Rate,
    scale: u64,
    refill: u64,
    capacity: u64,
}

fn gcd(a: u128, b: u128) -> u128 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The currency's number in the script (Lua counts from 1).
fn number(currency: Currency) -> u8 {
    currency.index() as u8 + 1
}

/// A window in the script's terms, or why the script can't keep it exactly.
pub(super) fn scale(currency: Currency, rate: &Rate) -> Result<Scaled, String> {
    // Periods are whole milliseconds.
    let period_ms = u128::from(rate.period_nanos() / 1_000_000);
    let amount = u128::from(rate.amount());
    let g = gcd(amount, period_ms);
    let scale = period_ms / g;
    let refill = amount / g;
    let capacity = u128::from(rate.burst()) * scale;
    if capacity >= MAX_CAPACITY || refill >= MAX_CAPACITY {
        return Err(format!(
            "the {currency} window `{rate}` is outside the range the Redis script decides exactly (burst × period in ms / gcd(amount, period) must stay below 2^46 ≈ 7·10^13); use a shorter period or a smaller burst"
        ));
    }
    Ok(Scaled {
        currency,
        rate: *rate,
        scale: scale as u64,
        refill: refill as u64,
        capacity: capacity as u64,
    })
}

/// Every window of `limits`, in the order of [`Limits::windows`].
pub(super) fn prepare(limits: &Limits) -> Result<Vec<Scaled>, String> {
    limits
        .windows()
        .map(|(currency, rate)| scale(currency, rate))
        .collect()
}

fn exact(value: i64) -> i64 {
    value.clamp(-MAX_EXACT, MAX_EXACT)
}

/// A ticket's due time in milliseconds on the server's clock, or -1 when not known.
fn due_arg(ticket: Ticket) -> i64 {
    ticket.due().map_or(-1, |due| {
        i64::try_from(due).unwrap_or(i64::MAX).min(MAX_EXACT)
    })
}

/// The name of ticket `id`'s record in the key's hash, as the script writes it (16 digits,
/// zero-padded).
pub(super) fn ticket_record(id: u64) -> String {
    format!("q{id:016}")
}

/// The script's name for `op`, and its own arguments (an acquire's last, its tenant, is text:
/// see [`tenant_arg`]).
pub(super) fn op_args(op: &Op, limits: &crate::rate::Limits) -> (&'static str, Vec<i64>) {
    let ms_floor = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(MAX_EXACT);
    let amount = |n: u64| i64::try_from(n).unwrap_or(MAX_EXACT).min(MAX_EXACT);
    let maybe = |n: Option<u64>| n.map_or(-1, amount);
    let flag = |b: bool| i64::from(b);
    match *op {
        Op::Acquire {
            cost,
            max_wait,
            fly,
            ref share,
        } => ("acquire", {
            let mut args: Vec<i64> = cost
                .per_currency()
                .values()
                .iter()
                .map(|n| amount(*n))
                .collect();
            args.push(max_wait.map_or(-1, |d| ms_floor(d).min(MAX_EXACT)));
            args.push(flag(fly));
            let weight = share.as_ref().map_or(1, |s| s.weight());
            let step = crate::bucket::queue::fair_step(limits, cost, weight);
            args.push(i64::try_from(step).unwrap_or(MAX_EXACT).min(MAX_EXACT));
            args
        }),
        Op::Admit { ticket, fly } => (
            "admit",
            vec![amount(ticket.id()), flag(fly), due_arg(ticket)],
        ),
        Op::Cancel { ticket } => ("cancel", vec![amount(ticket.id()), due_arg(ticket)]),
        Op::Adjust { delta } => ("adjust", delta.values().iter().map(|d| exact(*d)).collect()),
        Op::Penalize {
            pause,
            spent,
            refusal,
        } => {
            // Whole milliseconds, rounded up: never shorter than the provider asked.
            let ms =
                |d: std::time::Duration| d.as_nanos().div_ceil(1_000_000).min(MAX_PAUSE_MS) as i64;
            let mut args = vec![ms(pause), i64::from(spent.bits())];
            match refusal {
                Some(refusal) => {
                    args.push(ms(refusal.hint));
                    args.push(amount(refusal.flight));
                    args.extend(refusal.need.map(amount).values());
                    args.extend(refusal.later.map(amount).values());
                }
                None => args.push(-1),
            }
            ("penalize", args)
        }
        Op::Lower {
            currency,
            remaining,
        } => (
            "lower",
            vec![i64::from(number(currency)), amount(remaining)],
        ),
        Op::Sync(ref sync) => {
            let mut args = vec![amount(sync.flight)];
            args.extend(sync.charged.per_currency().map(amount).values());
            args.extend(sync.remaining.map(maybe).values());
            args.extend(sync.elsewhere.map(amount).values());
            args.extend(sync.returnable.map(amount).values());
            args.extend(sync.margin.map(amount).values());
            args.extend(sync.margin_if_above.map(flag).values());
            // 16 says "refused"; the bits below it, the currencies given back.
            args.push(sync.refused.map_or(0, |back| 16 + i64::from(back.bits())));
            args.push(ms_floor(sync.counted_after).min(MAX_EXACT));
            if let Some(used) = sync.settle {
                args.push(1);
                args.extend(used.map(maybe).values());
            }
            ("sync", args)
        }
        Op::Settle {
            flight,
            charged,
            used,
            last,
            counted_after,
        } => {
            let mut args = vec![amount(flight)];
            args.extend(charged.per_currency().map(amount).values());
            args.extend(used.map(maybe).values());
            args.push(flag(last));
            args.push(ms_floor(counted_after).min(MAX_EXACT));
            ("settle", args)
        }
        Op::Snapshot => ("snapshot", Vec::new()),
        Op::Ping => ("ping", Vec::new()),
    }
}

/// An acquire's tenant, the script's last argument for it: its id ([`Share`]'s digest) in 16
/// hexadecimal digits (`0000000000000000`: the key's own calls, without a share).
///
/// [`Share`]: crate::store::Share
pub(super) fn tenant_arg(op: &Op) -> Option<std::borrow::Cow<'static, str>> {
    match op {
        Op::Acquire { share: None, .. } => Some("0000000000000000".into()),
        Op::Acquire {
            share: Some(share), ..
        } => Some(format!("{:016x}", share.id()).into()),
        _ => None,
    }
}

/// Adds every window's parameters to a script call.
pub(super) fn window_args(command: &mut redis::Cmd, windows: &[Scaled]) {
    for w in windows {
        command
            .arg(number(w.currency))
            .arg(w.scale)
            .arg(w.refill)
            .arg(w.capacity);
    }
}

/// What the script answered.
#[derive(Debug)]
pub(super) enum Reply {
    Ok {
        now_ms: u64,
        /// Answered by the script's fast path (an acquire that passed at once on a quiet key).
        fast: bool,
    },
    Flying {
        id: u64,
        now_ms: u64,
    },
    Full {
        now_ms: u64,
    },
    Emptied {
        emptied: PerCurrency<u64>,
        now_ms: u64,
    },
    Synced {
        /// Boxed, as in [`Outcome::Synced`](crate::store::Outcome::Synced): the rare large
        /// answer would otherwise make every reply as large.
        synced: Box<crate::store::Synced>,
        now_ms: u64,
    },
    Settled {
        delta: PerCurrency<i64>,
        now_ms: u64,
    },
    Queued {
        id: u64,
        due_in_ms: u64,
        now_ms: u64,
    },
    Wait {
        millis: u64,
        now_ms: u64,
        /// Answered by the script's fast path (the first in line, asking too early).
        fast: bool,
    },
    Behind {
        millis: u64,
        now_ms: u64,
    },
    Lost {
        now_ms: u64,
    },
    Done {
        now_ms: u64,
    },
    Lowered {
        above: i64,
        now_ms: u64,
    },
    Conflict {
        stored: String,
    },
    Levels {
        now_ms: u64,
        levels: Vec<i64>,
    },
}

impl Reply {
    pub(super) fn now_ms(&self) -> u64 {
        match self {
            Reply::Ok { now_ms, .. }
            | Reply::Full { now_ms }
            | Reply::Flying { now_ms, .. }
            | Reply::Emptied { now_ms, .. }
            | Reply::Synced { now_ms, .. }
            | Reply::Settled { now_ms, .. }
            | Reply::Queued { now_ms, .. }
            | Reply::Wait { now_ms, .. }
            | Reply::Behind { now_ms, .. }
            | Reply::Lost { now_ms }
            | Reply::Done { now_ms }
            | Reply::Lowered { now_ms, .. }
            | Reply::Levels { now_ms, .. } => *now_ms,
            Reply::Conflict { .. } => 0,
        }
    }
}

fn as_int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(text) => text.parse().ok(),
        _ => None,
    }
}

fn as_text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

/// The reply, or `None` for anything this version of the script can't have sent.
pub(super) fn parse_reply(value: Value) -> Option<Reply> {
    let Value::Array(items) = value else {
        return None;
    };
    let tag = as_text(items.first()?)?;
    let int = |i: usize| items.get(i).and_then(as_int);
    let uint = |i: usize| int(i).and_then(|n| u64::try_from(n).ok());
    Some(match tag.as_str() {
        "ok" => Reply::Ok {
            now_ms: uint(1)?,
            fast: items.get(2).and_then(as_text).is_some_and(|t| t == "fast"),
        },
        "flying" => Reply::Flying {
            id: uint(1)?,
            now_ms: uint(2)?,
        },
        "full" => Reply::Full { now_ms: uint(1)? },
        "emptied" => Reply::Emptied {
            emptied: PerCurrency::from([uint(1)?, uint(2)?, uint(3)?, uint(4)?]),
            now_ms: uint(5)?,
        },
        "synced" => {
            let maybe = |i: usize| match items.get(i) {
                Some(Value::BulkString(bytes)) if bytes.is_empty() => Some(None),
                Some(value) => as_int(value).map(Some),
                None => None,
            };
            let synced = crate::store::Synced {
                above: PerCurrency::from([maybe(1)?, maybe(2)?, maybe(3)?, maybe(4)?]),
                spent: PerCurrency::from([maybe(5)?, maybe(6)?, maybe(7)?, maybe(8)?]),
                ambiguous: uint(9)? == 1,
                since: std::time::Duration::from_millis(uint(10)?),
                lowered: PerCurrency::from([uint(11)?, uint(12)?, uint(13)?, uint(14)?]),
                returned: PerCurrency::from([uint(15)?, uint(16)?, uint(17)?, uint(18)?]),
                settled: match items.len() {
                    20 => None,
                    24 => Some(PerCurrency::from([int(20)?, int(21)?, int(22)?, int(23)?])),
                    _ => return None,
                },
            };
            Reply::Synced {
                synced: Box::new(synced),
                now_ms: uint(19)?,
            }
        }
        "settled" => Reply::Settled {
            delta: PerCurrency::from([int(1)?, int(2)?, int(3)?, int(4)?]),
            now_ms: uint(5)?,
        },
        "queued" => Reply::Queued {
            id: uint(1)?,
            due_in_ms: uint(2)?,
            now_ms: uint(3)?,
        },
        "wait" => Reply::Wait {
            millis: uint(1)?,
            now_ms: uint(2)?,
            fast: items.get(3).and_then(as_text).is_some_and(|t| t == "fast"),
        },
        "behind" => Reply::Behind {
            millis: uint(1)?,
            now_ms: uint(2)?,
        },
        "lost" => Reply::Lost { now_ms: uint(1)? },
        "done" => Reply::Done { now_ms: uint(1)? },
        "lowered" => Reply::Lowered {
            above: int(1)?,
            now_ms: uint(2)?,
        },
        "conflict" => Reply::Conflict {
            stored: as_text(items.get(1)?)?,
        },
        "levels" => Reply::Levels {
            now_ms: uint(1)?,
            levels: items.get(2..)?.iter().map(as_int).collect::<Option<_>>()?,
        },
        _ => return None,
    })
}

/// The levels of a snapshot reply, window by window.
pub(super) fn available(windows: &[Scaled], levels: &[i64]) -> Option<Vec<Available>> {
    (levels.len() == windows.len()).then(|| {
        windows
            .iter()
            .zip(levels)
            .map(|(w, level)| {
                Available::new(
                    w.currency,
                    w.rate,
                    Amount::from_units(i128::from(*level), w.scale),
                )
            })
            .collect()
    })
}

/// Reads back the canonical text `Limits` displays as, for a conflict message.
pub(super) fn parse_stored_limits(text: &str) -> Option<Limits> {
    let mut found = PerCurrency::splat("");
    for part in text.split(", ") {
        // "output tokens" before "tokens", which it ends with.
        for currency in Currency::ALL.iter().rev() {
            if let Some(rest) = part.strip_prefix(&format!("{currency} ")) {
                found[*currency] = rest;
                break;
            }
        }
    }
    let mut limits = Limits::default();
    for (currency, text) in found.iter() {
        let rates = if currency == Currency::Spend {
            crate::rate::Rates::parse_money(text).ok()?
        } else {
            crate::rate::Rates::parse_or_none(text).ok()?
        };
        limits = limits.with(currency, rates);
    }
    Some(limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_constant_of_the_script_comes_from_rust() {
        assert!(!LUA.contains("{{"), "a constant was left unfilled");
        for line in [
            format!("local SCAN_AHEAD = {}\n", crate::bucket::SCAN_AHEAD),
            format!("local DEBT = {}\n", crate::bucket::DEBT_BURSTS),
            format!("local MAX_QUEUE = {}\n", crate::bucket::MAX_QUEUE),
            format!("local MAX_CAP = {}\n", MAX_CAPACITY),
        ] {
            assert!(LUA.contains(&line), "the script must set {line:?}");
        }
    }

    #[test]
    fn scales_are_reduced_and_bounded() {
        let s = scale(Currency::Tokens, &"2000000/d".parse().unwrap()).unwrap();
        assert_eq!((s.scale, s.refill, s.capacity), (216, 5, 432_000_000));
        let s = scale(Currency::Tokens, &"5/s burst 10".parse().unwrap()).unwrap();
        assert_eq!((s.scale, s.refill, s.capacity), (200, 1, 2_000));
        let s = scale(Currency::Tokens, &"100000/m".parse().unwrap()).unwrap();
        assert_eq!((s.scale, s.refill, s.capacity), (3, 5, 300_000));
        // No common factor: a day and a burst of 800,000 is still exact.
        assert!(scale(Currency::Tokens, &"1001/d burst 800000".parse().unwrap()).is_ok());
        let err = scale(Currency::Tokens, &"7/d burst 1000000000".parse().unwrap()).unwrap_err();
        assert!(err.contains("outside the range"), "{err}");
    }

    #[test]
    fn stored_limits_read_back() {
        for limits in [
            Limits::parse("60/m; 1000/d", "5/s burst 10").unwrap(),
            Limits::parse("", "5/s").unwrap(),
            Limits::parse("50/m", "40000/m")
                .unwrap()
                .with_output_tokens("8000/m".parse::<Rate>().unwrap()),
            Limits::parse("", "5/s")
                .unwrap()
                .with_spend(crate::rate::Rates::parse_money("$50/d; $2000/30d").unwrap()),
        ] {
            assert_eq!(parse_stored_limits(&limits.to_string()), Some(limits));
        }
    }
}
