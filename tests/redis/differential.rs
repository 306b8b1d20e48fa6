//! The Redis script against the rule book it ports (`bucket/`, run by `testing::RuleBook`):
//! thousands of random sequences of every operation, on many tickets and calls in flight, with
//! leases that lapse, penalties, debt, lowering and syncs, driven through both at the same
//! explicit millisecond times. Every answer must be the same: admissions, tickets and their due
//! times, hints, lost tickets, what a penalty emptied, what a sync found and did, what a
//! settlement changed, and every window's level.
//!
//! Where the two must differ, and how the test deals with it:
//! - Time: the script counts milliseconds, the rule book nanoseconds. The test steps on whole
//!   milliseconds, with rates that refill one token every whole number of milliseconds, so that
//!   every wait is a whole number of milliseconds in both and the schedules agree exactly.
//! - Ticket numbers: the script's are the time in ms times 1000 plus a counter, the rule
//!   book's 1, 2, 3: the test maps each to the call that holds it.
//! - Amounts: the script caps an amount at 66 bursts where the cap already decides, and
//!   refuses arguments outside its exact range: the test stays inside it.
//!
//! Acquires come from the key's own calls and from three tenants of weights 1 to 3, so that
//! tickets wait in fair order (a tenant's ticket placed ahead of others'), with ties broken by
//! the order of issue in both (the script's queue entries are zero-padded ids).
//!
//! A ticket not to fly, issued behind promised tickets only, is promised: charged at its due
//! time by whichever operation runs first after it, in both. Its holder says when it was due
//! on half the admissions, and then the Redis store reads its record (`TIME` and one hash
//! read, no script) and answers where that settles it: that answer must be the rule book's
//! too. Penalties, lowered counts, syncs and charges fall between tickets' issue and due times
//! throughout the traces, and each breaks the promises of every ticket waiting, in both.
//!
//! The script answers an acquire that passes at once on a quiet key (nobody waiting, no pause,
//! no calls in flight remembered, not a call to fly) by a fast path of its own, and everything
//! else by the full script. The traces go through both, and through keys that turn quiet and
//! busy again; the test checks that the fast path answers only where the rule book was quiet
//! and admitted the call, and that each path answered often enough to have been tested. Likewise
//! the holder of the ticket first in line asking (not to fly, on a key without a pause or calls
//! in flight): its fast path admits it or says when it can pass, and the full path answers the
//! rest.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::StreamExt;

use tollgate::store::redis::{RedisConfig, RedisStore};
use tollgate::store::{Op, Outcome, Refusal, Share, SyncArgs, Ticket};
use tollgate::testing::{RuleBook, ScriptPath, redis_apply_at, redis_apply_traced};
use tollgate::{Cost, Currencies, Currency, Error, Limits, PerCurrency, Store};
use tollgate_testkit::Lcg;
use tollgate_testkit::redis::RedisServer;

const LEASE: Duration = Duration::from_secs(1);

/// How many sequences, and how many operations each: 2,000 × 40 in CI; more with
/// `TOLLGATE_DIFFERENTIAL_SEQUENCES`.
fn sequences() -> u64 {
    std::env::var("TOLLGATE_DIFFERENTIAL_SEQUENCES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}
const STEPS: u64 = 40;

/// Limits whose every rate refills one token every whole number of milliseconds.
fn limit_sets() -> Vec<Limits> {
    let output = |text: &str| text.parse::<tollgate::Rates>().unwrap();
    vec![
        Limits::parse("10/s", "1000/s burst 200").unwrap(),
        Limits::parse("50/s burst 5", "200/s")
            .unwrap()
            .with_output_tokens(output("100/s")),
        Limits::parse("60/m", "500/s; 20000/m").unwrap(),
        Limits::parse("", "100/s burst 30").unwrap(),
        // A budget beside the tokens: a micro-dollar a millisecond, up to 300.
        Limits::parse("20/s", "500/s")
            .unwrap()
            .with_spend(tollgate::Rates::parse_money("$0.001/s burst $0.0003").unwrap()),
    ]
}

/// What a call holds on both sides: its ticket in each (while it waits), its flight number
/// (once it went out), and what it was charged.
#[derive(Debug, Clone, Copy)]
struct Held {
    ticket: Option<(Ticket, Ticket)>,
    flight: Option<u64>,
    cost: Cost,
}

/// An outcome with ticket numbers replaced by the number of the call that holds the ticket
/// (levels compare as exact fractions, whatever their scale).
fn normalized(outcome: Outcome, mapping: &HashMap<u64, usize>) -> Outcome {
    match outcome {
        Outcome::Queued { ticket, due_in } => Outcome::Queued {
            ticket: Ticket::new(mapping.get(&ticket.id()).map_or(u64::MAX, |&c| c as u64)),
            due_in,
        },
        other => other,
    }
}

fn kind(err: &Error) -> String {
    let text = format!("{err:?}");
    text.split([' ', '{', '(']).next().unwrap_or("").to_owned()
}

/// The smallest burst of `currency`'s windows (0 without any): the most one call can cost in it.
pub(crate) fn smallest_burst(limits: &Limits, currency: Currency) -> u64 {
    limits
        .of(currency)
        .as_slice()
        .iter()
        .map(|r| r.burst())
        .min()
        .unwrap_or(0)
}

/// A cost that fits every window.
fn cost(rng: &mut Lcg, limits: &Limits) -> Cost {
    let most = |currency: Currency| smallest_burst(limits, currency);
    let pick = |rng: &mut Lcg, most: u64| {
        if most == 0 || rng.below(4) == 0 {
            0
        } else {
            rng.below(most + 1)
        }
    };
    let requests = u64::from(!limits.requests().is_empty() && rng.below(5) != 0);
    let tokens = pick(rng, most(Currency::Tokens));
    let output = pick(rng, most(Currency::OutputTokens));
    let spend = pick(rng, most(Currency::Spend));
    let cost = Cost::new(requests, tokens)
        .with_output_tokens(output)
        .with_spend(spend);
    if cost.is_zero() {
        Cost::new(1, 0)
    } else {
        cost
    }
}

fn maybe(rng: &mut Lcg, most: u64) -> Option<u64> {
    (rng.below(3) != 0).then(|| rng.below(most + 1))
}

/// One random operation, and which call it concerns (a new one for an acquisition).
fn operation(rng: &mut Lcg, limits: &Limits, calls: &[Held]) -> (Op, Option<usize>) {
    let pick_call = |rng: &mut Lcg, wanted: fn(&Held) -> bool| {
        let matching: Vec<usize> = (0..calls.len()).filter(|&i| wanted(&calls[i])).collect();
        (!matching.is_empty()).then(|| matching[rng.below(matching.len() as u64) as usize])
    };
    let waiting = pick_call(rng, |h| h.ticket.is_some());
    let flying = pick_call(rng, |h| h.flight.is_some());
    match rng.below(100) {
        0..=34 => {
            let max_wait = match rng.below(3) {
                0 => Some(Duration::ZERO),
                1 => None,
                _ => Some(Duration::from_millis(rng.below(5_000))),
            };
            let op = Op::Acquire {
                cost: cost(rng, limits),
                max_wait,
                fly: rng.below(2) == 0,
                // The key's own calls and three tenants of weights 1 to 3: the fair order.
                share: match rng.below(4) {
                    0 => None,
                    n => Some(Share::new(["a", "b", "c"][n as usize - 1], n as u32)),
                },
            };
            (op, None)
        }
        35..=54 => match waiting {
            Some(call) => {
                let (_, redis) = calls[call].ticket.unwrap();
                let op = Op::Admit {
                    ticket: with_due_or_not(rng, redis),
                    fly: rng.below(2) == 0,
                };
                (op, Some(call))
            }
            None => (Op::Snapshot, None),
        },
        55..=59 => match waiting {
            Some(call) => {
                let (_, redis) = calls[call].ticket.unwrap();
                (
                    Op::Cancel {
                        ticket: with_due_or_not(rng, redis),
                    },
                    Some(call),
                )
            }
            None => (Op::Snapshot, None),
        },
        60..=64 => {
            let delta = |rng: &mut Lcg| rng.below(601) as i64 - 300;
            let op = Op::Adjust {
                delta: PerCurrency::from([delta(rng) / 100, delta(rng), delta(rng), delta(rng)]),
            };
            (op, None)
        }
        65..=68 => {
            let spent: Currencies = Currency::ALL
                .into_iter()
                .filter(|_| rng.below(2) == 0)
                .collect();
            // Half of them name the refused call (a call in flight, or one the key does not
            // remember) with the provider's own pause, in whole milliseconds as the script
            // counts it.
            let refusal = (rng.below(2) == 0).then(|| {
                let flight = match flying {
                    Some(call) if rng.below(4) != 0 => calls[call].flight.unwrap(),
                    _ => rng.below(40),
                };
                let later = PerCurrency::from([
                    rng.below(3),
                    rng.below(300),
                    rng.below(300),
                    rng.below(300),
                ]);
                Refusal::new(
                    Duration::from_micros(rng.below(3_000_000)),
                    cost(rng, limits),
                    later,
                )
                .of_flight(flight)
            });
            let op = Op::Penalize {
                pause: Duration::from_micros(rng.below(3_000_000)),
                spent,
                refusal,
            };
            (op, None)
        }
        69..=72 => {
            let currency = Currency::ALL[rng.below(4) as usize];
            let op = Op::Lower {
                currency,
                remaining: rng.below(250),
            };
            (op, None)
        }
        73..=82 => {
            let (flight, call) = match flying {
                Some(call) if rng.below(8) != 0 => (calls[call].flight.unwrap(), Some(call)),
                _ => (rng.below(40), None),
            };
            let charged = call.map_or(Cost::call(10), |c| calls[c].cost);
            let mut args = SyncArgs::new(flight, charged, PerCurrency::splat(None));
            for i in Currency::ALL {
                args.remaining[i] = maybe(rng, 600);
                args.elsewhere[i] = if rng.below(3) == 0 { rng.below(50) } else { 0 };
                args.returnable[i] = rng.below(100);
                args.margin[i] = if rng.below(2) == 0 { rng.below(40) } else { 0 };
                args.margin_if_above[i] = rng.below(2) == 0;
            }
            // Counted up to 3 s after the call went out, to the microsecond: both round it down
            // to the millisecond.
            args.counted_after = Duration::from_micros(rng.below(3_000_000));
            args.refused = (rng.below(6) == 0).then(|| {
                let mut back = tollgate::Currencies::NONE;
                for currency in tollgate::Currency::ALL {
                    if rng.below(2) == 0 {
                        back = back.with(currency);
                    }
                }
                back
            });
            // A whole answer's sync settles its call in the same step.
            if args.refused.is_none() && rng.below(3) == 0 {
                args.settle = Some(PerCurrency::from([
                    maybe(rng, 5),
                    maybe(rng, 400),
                    maybe(rng, 400),
                    maybe(rng, 400),
                ]));
            }
            (Op::Sync(Box::new(args)), call)
        }
        83..=92 => match flying {
            Some(call) => {
                let op = Op::Settle {
                    flight: calls[call].flight.unwrap(),
                    charged: calls[call].cost,
                    used: PerCurrency::from([
                        maybe(rng, 5),
                        maybe(rng, 400),
                        maybe(rng, 400),
                        maybe(rng, 400),
                    ]),
                    last: rng.below(3) != 0,
                    // Counted up to 3 s after it went out, to the microsecond.
                    counted_after: Duration::from_micros(rng.below(3_000_000)),
                };
                (op, Some(call))
            }
            None => (Op::Snapshot, None),
        },
        _ => (Op::Snapshot, None),
    }
}

/// The rule book's ticket number for Redis's, for an admission: the same call.
/// The ticket as issued, saying when it is due (its holder at its due time: a promised one
/// is claimed without the script), or only its number (a holder that does not say: the
/// script decides).
fn with_due_or_not(rng: &mut Lcg, ticket: Ticket) -> Ticket {
    if rng.below(2) == 0 {
        ticket
    } else {
        Ticket::new(ticket.id())
    }
}

/// The rule book's side of `op`: its own ticket, saying when it is due where the script's does.
fn to_rule_book(op: Op, calls: &[Held], call: Option<usize>) -> Op {
    let mine = |c: usize, theirs: Ticket| {
        let mine = calls[c].ticket.unwrap().0;
        if theirs.due().is_some() {
            mine
        } else {
            Ticket::new(mine.id())
        }
    };
    match (op, call) {
        (Op::Admit { fly, ticket }, Some(c)) => Op::Admit {
            ticket: mine(c, ticket),
            fly,
        },
        (Op::Cancel { ticket }, Some(c)) => Op::Cancel {
            ticket: mine(c, ticket),
        },
        (other, _) => other,
    }
}

/// One sequence of [`STEPS`] operations on a key of its own, through the script and the rule
/// book side by side; answers how many answers it compared and of which kinds.
async fn sequence(
    store: &RedisStore,
    seed: u64,
    trace: Option<u64>,
) -> (u64, HashMap<&'static str, u64>) {
    let mut compared = 0u64;
    let mut seen: HashMap<&'static str, u64> = HashMap::new();
    let mut rng = Lcg(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5);
    let sets = limit_sets();
    let limits = &sets[(seed % sets.len() as u64) as usize];
    let key = store.bind(&format!("differential-{seed}"), limits).unwrap();
    // Both start at a time far from zero, so that nothing rests on a clock's origin.
    let mut now_ms = 1_000_000 + rng.below(1_000_000);
    let mut book = RuleBook::new(limits, Duration::from_millis(now_ms), LEASE);
    let mut calls: Vec<Held> = Vec::new();
    let mut tickets: HashMap<u64, usize> = HashMap::new();
    let mut book_tickets: HashMap<u64, usize> = HashMap::new();
    for step in 0..STEPS {
        now_ms += [0, 0, 1, 3, 20, 250, 1_000, 3_000][rng.below(8) as usize];
        let (op, call) = operation(&mut rng, limits, &calls);
        let book_op = to_rule_book(op.clone(), &calls, call);
        let quiet = book.is_quiet(Duration::from_millis(now_ms));
        let expected = book.apply(book_op, Duration::from_millis(now_ms));
        let traced = redis_apply_traced(store, &key, op.clone(), Some(now_ms)).await;
        let path = traced
            .as_ref()
            .map_or(ScriptPath::Full, |(_, _, path)| *path);
        let got = traced.map(|(outcome, _, _)| outcome);
        let context = || format!("seed {seed}, step {step}, at {now_ms} ms ({path:?}): {op:?}");
        if trace == Some(seed) {
            eprintln!(
                "{}\n  rule book {expected:?}\n  script    {got:?}",
                context()
            );
        }
        // The fast paths answer only a call that passes at once on a quiet key, or the
        // first in line (admitted, or told when it can pass: never behind anyone), and
        // never a call to fly.
        if path == ScriptPath::Fast {
            let fits = match op {
                Op::Acquire { fly: false, .. } => {
                    quiet && matches!(expected, Ok(Outcome::Admitted))
                }
                Op::Admit { fly: false, .. } => {
                    matches!(expected, Ok(Outcome::Admitted | Outcome::NotYet(_)))
                }
                _ => false,
            };
            assert!(
                fits,
                "{}: the fast path answered, the rule book {expected:?} (quiet: {quiet})",
                context()
            );
        }
        if let Op::Admit { ticket, .. } = op {
            let which = match (path, &expected) {
                // Read from its record at its due time, without the script: a promise kept.
                (ScriptPath::Fast, Ok(Outcome::Admitted)) if ticket.due().is_some() => {
                    "admit claimed, no script"
                }
                (ScriptPath::Fast, Ok(Outcome::Admitted)) => "admit passed, fast path",
                (ScriptPath::Fast, _) => "admit not yet, fast path",
                (ScriptPath::Full, _) => "admit, full path",
            };
            *seen.entry(which).or_default() += 1;
        }
        if let Op::Acquire { .. } = op {
            let which = match (path, &expected) {
                (ScriptPath::Fast, _) => "acquire, fast path",
                (ScriptPath::Full, Ok(Outcome::Admitted | Outcome::Flying(_))) => {
                    "acquire admitted, full path"
                }
                (ScriptPath::Full, _) => "acquire not admitted, full path",
            };
            *seen.entry(which).or_default() += 1;
            if quiet && path == ScriptPath::Full {
                *seen.entry("acquire on a quiet key, full path").or_default() += 1;
            }
        }
        let (expected, got) = match (expected, got) {
            (Err(a), Err(b)) => {
                assert_eq!(kind(&a), kind(&b), "{}: {a} / {b}", context());
                continue;
            }
            (Ok(a), Ok(b)) => (a, b),
            (a, b) => panic!("{}: the rule book {a:?}, the script {b:?}", context()),
        };
        // Remember what each call now holds, on both sides.
        let index = call.unwrap_or(calls.len());
        if call.is_none() {
            let cost = match op {
                Op::Acquire { cost, .. } => cost,
                _ => Cost::default(),
            };
            calls.push(Held {
                ticket: None,
                flight: None,
                cost,
            });
        }
        match (&expected, &got) {
            (Outcome::Queued { ticket: mine, .. }, Outcome::Queued { ticket: theirs, .. }) => {
                if book.behind(*mine).is_some_and(|n| n > 0) {
                    *seen
                        .entry("queued ahead of others (fair order)")
                        .or_default() += 1;
                }
                calls[index].ticket = Some((*mine, *theirs));
                tickets.insert(theirs.id(), index);
                book_tickets.insert(mine.id(), index);
            }
            (Outcome::Flying(flight), _) => {
                calls[index].ticket = None;
                calls[index].flight = Some(*flight);
            }
            (Outcome::Admitted | Outcome::Lost, _)
                if matches!(op, Op::Admit { .. } | Op::Cancel { .. }) =>
            {
                calls[index].ticket = None;
            }
            _ => {}
        }
        if let Op::Cancel { .. } = op {
            calls[index].ticket = None;
            if expected == Outcome::Admitted {
                *seen
                    .entry("cancel of a ticket charged at its due time")
                    .or_default() += 1;
            }
        }
        let what = match &got {
            Outcome::Admitted => "admitted",
            Outcome::Flying(_) => "flying",
            Outcome::Queued { .. } => "queued",
            Outcome::NotYet(_) => "not yet",
            Outcome::Behind(_) => "behind",
            Outcome::Lost => "lost",
            Outcome::Emptied(e) if e.values().iter().any(|t| *t > 0) => "emptied",
            Outcome::Lowered(t) if *t > 0 => "lowered",
            Outcome::Synced(s)
                if s.settled
                    .is_some_and(|d| d.values().iter().any(|t| *t != 0)) =>
            {
                "synced and settled"
            }
            Outcome::Synced(s) if s.lowered.values().iter().any(|t| *t > 0) => "synced, took off",
            Outcome::Synced(s) if s.returned.values().iter().any(|t| *t > 0) => "synced, gave back",
            Outcome::Synced(s) if s.spent.values().iter().all(Option::is_none) => "synced, unknown",
            Outcome::Settled(d) if d.values().iter().any(|t| *t < 0) => "settled, charged",
            Outcome::Settled(d) if d.values().iter().any(|t| *t > 0) => "settled, refunded",
            _ => "other",
        };
        *seen.entry(what).or_default() += 1;
        assert_eq!(
            normalized(expected, &book_tickets),
            normalized(got, &tickets),
            "{}",
            context()
        );
        // The levels after every step, to the unit.
        let levels = book
            .apply(Op::Snapshot, Duration::from_millis(now_ms))
            .unwrap();
        let (theirs, _) = redis_apply_at(store, &key, Op::Snapshot, Some(now_ms))
            .await
            .unwrap();
        assert_eq!(levels, theirs, "{}: levels after", context());
        compared += 1;
    }
    (compared, seen)
}

#[test]
fn the_script_answers_every_operation_exactly_as_the_rule_book() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let runtime = tollgate_testkit::local_runtime();
    runtime.block_on(async {
        let config = RedisConfig::default().with_lease(LEASE);
        let store = RedisStore::connect_with(&server.url(), config)
            .await
            .unwrap();
        let mut compared = 0u64;
        // How often each kind of answer came, to show the sequences reach every path.
        let mut seen: HashMap<&'static str, u64> = HashMap::new();
        // `TOLLGATE_DIFFERENTIAL_TRACE=<seed>` prints that sequence's steps.
        let trace: Option<u64> = std::env::var("TOLLGATE_DIFFERENTIAL_TRACE")
            .ok()
            .and_then(|v| v.parse().ok());
        // Sequences run eight at a time over the one connection (each on a key of its own, so
        // they cannot meet): the round trips overlap instead of adding up.
        let mut lanes = futures_util::stream::iter(0..sequences())
            .map(|seed| sequence(&store, seed, trace))
            .buffer_unordered(8);
        while let Some((count, kinds)) = lanes.next().await {
            compared += count;
            for (kind, n) in kinds {
                *seen.entry(kind).or_default() += n;
            }
        }
        assert!(
            compared >= sequences() * STEPS / 2,
            "{compared} answers compared"
        );
        eprintln!("differential: {compared} answers compared: {seen:?}");
        if sequences() >= 1_000 {
            for kind in [
                "acquire, fast path",
                "acquire admitted, full path",
                "acquire not admitted, full path",
                "acquire on a quiet key, full path",
                "admit passed, fast path",
                "admit claimed, no script",
                "cancel of a ticket charged at its due time",
                "queued ahead of others (fair order)",
                "admit not yet, fast path",
                "admit, full path",
                "admitted",
                "flying",
                "queued",
                "not yet",
                "behind",
                "lost",
                "emptied",
                "lowered",
                "synced, took off",
                "synced, gave back",
                "synced, unknown",
                "synced and settled",
                "settled, charged",
                "settled, refunded",
            ] {
                let count = seen.get(kind).copied().unwrap_or(0);
                assert!(count >= 20, "only {count} answers were `{kind}`: {seen:?}");
            }
        }
    });
}

/// The traces step an explicit clock that runs far ahead of, or behind, the server's. A key
/// charged at an explicit time must keep what it holds however much real time passes before
/// the next step: were it expired on the server's clock (its expiry is the few milliseconds
/// its windows take to refill), the next step would find it full where the rule book does not.
/// Real time is the point here, so this test sleeps (50 ms).
#[test]
fn a_key_on_an_explicit_clock_outlives_the_servers() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    tollgate_testkit::local_runtime().block_on(async {
        let config = RedisConfig::default().with_lease(LEASE);
        let store = RedisStore::connect_with(&server.url(), config)
            .await
            .unwrap();
        let limits = Limits::parse("1000/s", "1000/s burst 200").unwrap();
        let now_ms = 1_000_000;
        // Both the fast path (a call that passes at once) and the full one (a call to fly).
        for (name, fly) in [("explicit-fast", false), ("explicit-full", true)] {
            let key = store.bind(name, &limits).unwrap();
            let op = Op::Acquire {
                cost: Cost::new(1, 3),
                max_wait: None,
                fly,
                share: None,
            };
            redis_apply_at(&store, &key, op.clone(), Some(now_ms))
                .await
                .unwrap();
            // The call refills in 3 ms of the caller's clock (its expiry: 4 ms); 50 ms of the
            // server's go by.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let (levels, _) = redis_apply_at(&store, &key, Op::Snapshot, Some(now_ms))
                .await
                .unwrap();
            let mut fresh = RuleBook::new(&limits, Duration::from_millis(now_ms), LEASE);
            fresh.apply(op, Duration::from_millis(now_ms)).unwrap();
            let expected = fresh
                .apply(Op::Snapshot, Duration::from_millis(now_ms))
                .unwrap();
            assert_eq!(levels, expected, "{name}");
        }
    });
}
