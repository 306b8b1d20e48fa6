//! What a hostile client or a broken setup can send the Redis store: extreme and random
//! arguments that must never make the script loop (other clients would get BUSY), limits that
//! fail-open must not wave through, URLs whose passwords must never be printed, and prefixes
//! that must never share a key.

use std::time::Duration;

use crate::support::{at, snapshot_at, try_at};
use proptest::prelude::*;
use tollgate::store::redis::{RedisConfig, RedisStore};
use tollgate::store::{Op, Refusal};
use tollgate::{Cost, Error, Limiter, Limits, PerCurrency};
use tollgate_testkit::Lcg;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::stores::Decision;

use tollgate_testkit::local_runtime as runtime;

/// A server on which any script running longer than 50 ms makes every other client's command
/// answer BUSY: a script that loops is then seen at once.
fn strict_server() -> Option<RedisServer> {
    RedisServer::start_with(&["--busy-reply-threshold", "50"])
}

/// True when the server answers another client's PING with PONG (not BUSY).
fn responsive(server: &RedisServer) -> bool {
    server.command(&["PING"]).contains("PONG")
}

#[test]
fn repeated_huge_underestimates_leave_the_server_responsive_and_stop_at_the_debt_floor() {
    let Some(server) = strict_server() else {
        return;
    };
    runtime().block_on(async {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let limits = Limits::parse("", "3000/s").unwrap();
        let take = Op::Adjust {
            delta: tollgate::PerCurrency::from([0, -70_000_000_000_000, 0, 0]),
        };
        for i in 0..400 {
            at(&store, "debt", &limits, take.clone(), Some(1_000 + i))
                .await
                .unwrap();
            assert!(responsive(&server), "BUSY after adjustment {i}");
        }
        // Debt stops at 64 bursts, as in memory.
        let left = snapshot_at(&store, "debt", &limits, Some(1_399))
            .await
            .unwrap();
        assert!(left[0].tokens.is(-64 * 3000, 1), "{:?}", left[0].tokens);
        // Waiting for a token is answered, and exactly: 192,001 tokens at 3 a millisecond.
        let (decision, _) = try_at(&store, "debt", &limits, Cost::new(0, 1), Some(1_399))
            .await
            .unwrap();
        assert_eq!(decision, Decision::NotYet(Duration::from_millis(64_001)));
        assert!(responsive(&server));
    });
}

/// Whether `outcome` is one an operation like `op` can get.
fn answers(op: &Op, outcome: &tollgate::store::Outcome) -> bool {
    use tollgate::store::Outcome as O;
    match op {
        Op::Adjust { .. } | Op::Cancel { .. } => matches!(outcome, O::Done),
        Op::Penalize { .. } => matches!(outcome, O::Emptied(_)),
        // A wait of zero never queues; any other may.
        Op::Acquire {
            max_wait: Some(Duration::ZERO),
            ..
        } => matches!(outcome, O::Admitted | O::NotYet(_)),
        Op::Acquire { .. } => matches!(outcome, O::Admitted | O::Queued { .. } | O::NotYet(_)),
        Op::Lower { .. } => matches!(outcome, O::Lowered(_)),
        // A ticket nobody was given.
        Op::Admit { .. } => matches!(outcome, O::Lost),
        _ => false,
    }
}

/// A small deterministic generator, so that a failing sequence can be replayed.
#[test]
fn random_and_extreme_operations_always_answer_quickly() {
    let Some(server) = strict_server() else {
        return;
    };
    let extremes = [
        0,
        1,
        i64::MAX,
        i64::MIN,
        -1,
        1 << 53,
        -(1 << 53),
        70_000_000_000_000,
    ];
    runtime().block_on(async {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let mut rng = Lcg(42);
        let limit_sets = [
            Limits::parse("3000/s", "100000/m").unwrap(),
            Limits::parse("1/d burst 800000", "7/s burst 20").unwrap(),
            Limits::parse("", "1000000000/m").unwrap(),
        ];
        let (mut answered, mut conflicts, mut refused, mut too_large) = (0, 0, 0, 0);
        for step in 0..3_000u64 {
            // Each key has its limits, but one call in ten comes with another key's.
            let key_number = rng.next_u64() % 3;
            let set = if rng.next_u64().is_multiple_of(10) {
                rng.next_u64() % 3
            } else {
                key_number
            };
            let limits = &limit_sets[set as usize];
            let pick = |r: &mut Lcg| extremes[(r.next_u64() % extremes.len() as u64) as usize];
            let op = match rng.next_u64() % 6 {
                0 => Op::Adjust {
                    delta: tollgate::PerCurrency::from([
                        pick(&mut rng),
                        pick(&mut rng),
                        pick(&mut rng),
                        pick(&mut rng),
                    ]),
                },
                1 => Op::Penalize {
                    spent: tollgate::Currencies::ALL,
                    pause: Duration::from_millis(rng.next_u64() % 5_000),
                    refusal: rng.next_u64().is_multiple_of(2).then(|| {
                        Refusal::new(
                            Duration::from_millis(rng.next_u64() % 100_000),
                            Cost::call(rng.next_u64() % 30),
                            PerCurrency::splat(rng.next_u64() % 1_000),
                        )
                        .of_flight(rng.next_u64() % 5)
                    }),
                },
                2 => Op::Acquire {
                    cost: Cost::call(rng.next_u64() % 30),
                    max_wait: [None, Some(Duration::ZERO), Some(Duration::MAX)]
                        [(rng.next_u64() % 3) as usize],
                    fly: false,
                    share: None,
                },
                3 => Op::Lower {
                    currency: tollgate::Currency::Tokens,
                    remaining: rng.next_u64(),
                },
                4 => Op::Admit {
                    ticket: tollgate::store::Ticket::new(rng.next_u64()),
                    fly: false,
                },
                _ => Op::Cancel {
                    ticket: tollgate::store::Ticket::new(rng.next_u64()),
                },
            };
            let now =
                [None, Some(step * 37), Some(u64::MAX / 4), Some(0)][(rng.next_u64() % 4) as usize];
            let key = format!("random-{key_number}");
            // An answer of the operation's own kind, or the refusal of a key held with other
            // limits; and the server stays free for everyone else after every step.
            match at(&store, &key, limits, op.clone(), now).await {
                Ok((outcome, _)) => {
                    assert!(
                        answers(&op, &outcome),
                        "step {step}: {op:?} answered {outcome:?}"
                    );
                    answered += 1;
                }
                Err(Error::ConflictingLimits { .. }) => conflicts += 1,
                // 7/s burst 20 can't ever pay for up to 29 tokens: answered at once.
                Err(Error::CostExceedsCapacity { .. }) => too_large += 1,
                // A time beyond what Lua's doubles hold exactly is refused, never computed.
                Err(e) if now == Some(u64::MAX / 4) && e.to_string().contains("bad time") => {
                    refused += 1
                }
                Err(e) => panic!("step {step}: {op:?} at {now:?} failed: {e}"),
            }
            assert!(responsive(&server), "BUSY at step {step}");
        }
        // Every kind of answer was seen, so no check above was idle. (A key touched at an
        // explicit time is kept, so it conflicts with other limits until a step on the server's
        // clock gives it an expiry: about 1,400 answers and 1,100 conflicts.)
        assert!(
            answered > 1_200 && conflicts > 50 && refused > 100 && too_large > 10,
            "{answered} answers, {conflicts} conflicts, {refused} refusals, {too_large} too large"
        );
    });
}

/// Runs the script as a hostile client would, with arguments no tollgate client sends.
#[test]
fn the_script_refuses_arguments_out_of_range() {
    if tollgate_testkit::redis::single_server_only(
        "the script is called through a single-node client",
    ) {
        return;
    }
    let Some(server) = strict_server() else {
        return;
    };
    let script = redis::Script::new(tollgate::testing::redis_script());
    runtime().block_on(async {
        let client = redis::Client::open(server.url()).unwrap();
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        let window = ["2", "1", "1", "1000"];
        let cases: Vec<Vec<&str>> = vec![
            // Capacity past 2^46.
            vec![
                "acquire",
                "sig",
                "",
                "1",
                "1000",
                "2",
                "1",
                "1",
                "99999999999999999",
                "0",
                "1",
                "0",
                "-1",
            ],
            // A count of windows that is not a count.
            vec!["ping", "sig", "", "nan", "1000"],
            vec!["ping", "sig", "", "1e308", "1000"],
            // A time past 2^53.
            vec![
                "ping", "sig", "1e300", "1", "1000", window[0], window[1], window[2], window[3],
            ],
            // A cost above the burst, and a fractional one.
            vec![
                "acquire", "sig", "", "1", "1000", window[0], window[1], window[2], window[3], "0",
                "1001", "0", "-1",
            ],
            vec![
                "acquire", "sig", "", "1", "1000", window[0], window[1], window[2], window[3], "0",
                "1.5", "0", "-1",
            ],
            // An adjustment past 2^53, and a pause past it.
            vec![
                "adjust", "sig", "", "1", "1000", window[0], window[1], window[2], window[3], "0",
                "1e30", "0",
            ],
            vec![
                "penalize", "sig", "", "1", "1000", window[0], window[1], window[2], window[3],
                "inf",
            ],
            // An unknown operation.
            vec![
                "explode", "sig", "", "1", "1000", window[0], window[1], window[2], window[3],
            ],
        ];
        for args in cases {
            let mut invocation = script.prepare_invoke();
            invocation.key("{hostile}").key("{hostile}:q");
            for arg in &args {
                invocation.arg(*arg);
            }
            let result: redis::RedisResult<redis::Value> =
                invocation.invoke_async(&mut connection).await;
            let err = result.expect_err(&format!("accepted {args:?}"));
            assert!(err.to_string().contains("tollgate:"), "{args:?}: {err}");
            assert!(responsive(&server));
        }
        // A stored field someone else wrote out of range is an error too, never a loop.
        server.command(&["HSET", "{hostile}", "sig", "sig", "l1", "-1e300"]);
        let mut invocation = script.prepare_invoke();
        invocation.key("{hostile}").key("{hostile}:q");
        for arg in [
            "acquire", "sig", "", "1", "1000", window[0], window[1], window[2], window[3], "0",
            "1", "0", "-1",
        ] {
            invocation.arg(arg);
        }
        let err = invocation
            .invoke_async::<redis::Value>(&mut connection)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("out of range"), "{err}");
    });
}

#[test]
fn limits_outside_the_scripts_range_are_refused_when_the_limiter_is_built() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let store =
            RedisStore::connect_with(&server.url(), RedisConfig::default().with_fail_open(true))
                .await
                .unwrap();
        let limits = Limits::parse("7/d burst 1000000000", "").unwrap();
        let err = Limiter::new("wide", limits, store.clone()).unwrap_err();
        match &err {
            Error::UnsupportedLimits { key, reason, .. } => {
                assert_eq!(key, "wide");
                assert!(reason.contains("`7/d burst 1000000000`"), "{reason}");
            }
            other => panic!("expected UnsupportedLimits, got {other:?}"),
        }
        // The process-wide registry refuses it the same way.
        let registry = tollgate::Registry::new(store.clone());
        assert!(matches!(
            registry.limiter("wide", &Limits::parse("7/d burst 1000000000", "").unwrap()),
            Err(Error::UnsupportedLimits { .. })
        ));
    });
}

#[test]
fn fail_open_admits_only_when_the_server_cannot_be_reached() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let config = RedisConfig::default()
            .with_timeout(Duration::from_millis(200))
            .with_fail_open(true);
        let store = RedisStore::connect_with(&server.url(), config)
            .await
            .unwrap();
        let limits = Limits::parse("1/m", "").unwrap();
        let limiter = Limiter::new("open", limits, store.clone()).unwrap();
        assert!(
            limiter
                .try_acquire(Cost::call(0))
                .await
                .unwrap()
                .is_admitted()
        );
        // Up: the limit holds, even in fail-open mode.
        assert!(
            !limiter
                .try_acquire(Cost::call(0))
                .await
                .unwrap()
                .is_admitted()
        );
        // Up, and the key held with other limits by another process: an error, not a pass.
        let other = Limiter::new("open", Limits::parse("5/m", "").unwrap(), store.clone()).unwrap();
        let err = other.try_acquire(Cost::call(0)).await.unwrap_err();
        assert!(matches!(err, Error::ConflictingLimits { .. }), "{err:?}");
        // A cost no window can take: an error, not a pass.
        let err = limiter.try_acquire(Cost::new(5, 0)).await.unwrap_err();
        assert!(matches!(err, Error::CostExceedsCapacity { .. }), "{err:?}");
        // Down: admitted, with a warning.
        server.kill();
        assert!(
            limiter
                .try_acquire(Cost::call(0))
                .await
                .unwrap()
                .is_admitted()
        );
        assert!(limiter.acquire(Cost::call(0)).await.is_ok());
    });
}

#[test]
fn distinct_prefixes_and_keys_never_share_state() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let pairs = [
            ("app", "eu:openai"),
            ("app:eu", "openai"),
            ("app:", "eu:openai"),
            ("ap", "p:eu:openai"),
            ("app}", "x"),
            ("app", "}x"),
            ("{app", "x"),
            ("app", "x%7D"),
            ("app", "x}"),
            ("", "app:x"),
            ("app:x", ""),
        ];
        let limits = Limits::parse("1/h", "").unwrap();
        let mut names = std::collections::HashSet::new();
        for (prefix, key) in pairs {
            let store =
                RedisStore::connect_with(&server.url(), RedisConfig::default().with_prefix(prefix))
                    .await
                    .unwrap();
            let (hash, queue) = tollgate::testing::redis_names(&store, key);
            assert!(
                names.insert(hash.clone()),
                "{prefix:?}/{key:?} reuses {hash}"
            );
            // One Cluster slot: the hash tag is the whole braced part, and the queue shares it.
            assert!(hash.starts_with('{') && hash.ends_with('}'), "{hash}");
            assert_eq!(
                hash.matches('{').count() + hash.matches('}').count(),
                2,
                "{hash}"
            );
            assert_eq!(queue, format!("{hash}:q"));
            // Each pair's single token is its own: every one of them is admitted once.
            let (decision, _) = try_at(&store, key, &limits, Cost::call(0), None)
                .await
                .unwrap();
            assert_eq!(
                decision,
                Decision::Admitted,
                "{prefix:?}/{key:?} shared state"
            );
        }
    });
}

/// Records every event's fields as text: the tracing output a program would print.
/// Everything an error shows: its text, its debug form, and its whole chain of causes.
fn everything_shown(err: &Error) -> String {
    let mut shown = format!("{err} {err:?}");
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        shown.push_str(&format!(" {cause} {cause:?}"));
        source = cause.source();
    }
    shown
}

#[test]
fn passwords_in_every_url_form_are_never_shown() {
    let Some(server) = RedisServer::start_with(&["--requirepass", "Zq9-right-Xy"]) else {
        return;
    };
    let port = server.port;
    let secret = "Zq9-secret-Xy";
    let forms = [
        format!("redis://:{secret}@127.0.0.1:{port}"),
        format!("redis://alice:{secret}@127.0.0.1:{port}/0"),
        format!("redis://:{secret}%2Fx@127.0.0.1:{port}"),
        format!("redis://:{secret}/pw@127.0.0.1:{port}"),
        format!("redis://:{secret}@[::1]:{port}"),
        format!("redis://:{secret}@localhost:notaport"),
        format!("redis://:{secret}@"),
        format!("redis:/:{secret}@127.0.0.1:{port}"),
        format!("redis//:{secret}@127.0.0.1"),
        format!("redis+unix:///tmp/tollgate-none.sock?pass={secret}"),
        format!("redis+unix:///tmp/tollgate-none.sock?db=1&password={secret}"),
        format!("unix:///tmp/tollgate-none.sock?user=bob&pass={secret}"),
        format!("valkey://:{secret}@127.0.0.1:{port}"),
        format!("rediss://:{secret}@127.0.0.1:{port}"),
        format!("ftp://:{secret}@127.0.0.1:{port}"),
        format!(":{secret}@127.0.0.1:{port}"),
        // A fragment, or a second `@`, must not carry a piece of the password into view.
        format!("redis://default:1234#{secret}@127.0.0.1:{port}"),
        format!("unix:///tmp/tollgate-none.sock?pass=ab#{secret}"),
        format!("redis+sentinel://u:1234#{secret}@127.0.0.1:{port}/m"),
        format!("redis://:first@{secret}?last@127.0.0.1:{port}/0"),
    ];
    let captured = tollgate_testkit::Captured::default();
    let _guard = captured.capture();
    runtime().block_on(async {
        let config = RedisConfig::default()
            .with_timeout(Duration::from_millis(300))
            .with_fail_open(true);
        let limits = Limits::parse("5/s", "").unwrap();
        for url in &forms {
            let mut shown = String::new();
            match RedisStore::lazy(url, config.clone()) {
                Err(err) => shown.push_str(&everything_shown(&err)),
                Ok(store) => {
                    shown.push_str(&format!("{store:?}"));
                    if let Err(err) = store.ping().await {
                        shown.push_str(&everything_shown(&err));
                    }
                    // Fail-open warns with the error: that output must be clean too.
                    let limiter = Limiter::new("k", limits.clone(), store).unwrap();
                    let _ = limiter.try_acquire(Cost::call(0)).await;
                }
            }
            assert!(!shown.contains(secret), "{url}: {shown}");
            assert!(!shown.contains("secret"), "{url}: {shown}");
        }
    });
    let output = captured.text();
    // Fail-open said what it did, once for each admission it waved through.
    assert!(
        captured.count("admitting because fail_open is set") >= 3,
        "{output}"
    );
    assert!(!output.contains(secret), "{output}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    #[test]
    fn no_url_form_shows_its_password(
        password in "[A-Za-z0-9._~!$&'()*+,;=:@/%#?-]{6,24}",
        form in 0usize..10,
        port in 1u16..,
    ) {
        let url = match form {
            0 => format!("redis://:{password}@127.0.0.1:{port}"),
            1 => format!("redis://user:{password}@example.com:{port}/3"),
            2 => format!("rediss://u:{password}@[::1]:{port}"),
            3 => format!("redis+unix:///run/r.sock?pass={password}"),
            4 => format!("unix:///run/r.sock?db=2&password={password}"),
            5 => format!("valkey://:{password}@h"),
            6 => format!("redis://:{password}"),
            7 => format!("redis+sentinel://:{password}@127.0.0.1:{port}/mymaster"),
            8 => format!("redis+sentinel://user:{password}@h:1,h:2/mymaster/3"),
            _ => password.clone(),
        };
        let rt = runtime();
        let _entered = rt.enter();
        let shown = match RedisStore::lazy(&url, RedisConfig::default()) {
            Ok(store) => format!("{store:?}"),
            Err(err) => everything_shown(&err),
        };
        // `***` is the redaction itself: a password with `*` in it must not match across it.
        let shown = shown.replace("***", "\u{1}");
        prop_assert!(!shown.contains(&password), "{} shown as {}", url, shown);
    }
}
