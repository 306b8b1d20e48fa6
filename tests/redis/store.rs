//! The Redis store against a real `redis-server`: the core promises, agreement with the
//! in-memory store, three processes on one key, faults, passwords and expiry.

use std::time::{Duration, Instant};

use crate::support::{adjust_at, penalize_at, snapshot_at, try_at};
use tollgate::store::redis::{RedisConfig, RedisStore};
use tollgate::testing::Recording;
use tollgate::{Available, Cost, Error, Limiter, Limits, ManualClock, MemoryStore, Store, testing};
use tollgate_testkit::Lcg;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::stores::{Decision, snapshot_now, try_now};

use tollgate_testkit::local_runtime as runtime;

async fn connect(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&server.url()).await.unwrap()
}

fn tokens(snapshot: &[Available]) -> Vec<(i128, u64)> {
    snapshot
        .iter()
        .map(|a| (a.tokens.units(), a.tokens.scale()))
        .collect()
}

#[test]
fn core_promises_on_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let store = connect(&server).await;
        let at = |ms| Some(ms);

        // The worked example: B = 3, r = 2/s.
        let seed = Limits::parse("2/s burst 3", "").unwrap();
        let unit = Cost::call(0);
        for _ in 0..3 {
            let (d, _) = try_at(&store, "seed", &seed, unit, at(1_000))
                .await
                .unwrap();
            assert_eq!(d, Decision::Admitted);
        }
        let (d, _) = try_at(&store, "seed", &seed, unit, at(1_000))
            .await
            .unwrap();
        assert_eq!(d, Decision::NotYet(Duration::from_millis(500)));
        // Refusal keeps partial credit: half a token at 0.25 s.
        let (d, _) = try_at(&store, "seed", &seed, unit, at(1_250))
            .await
            .unwrap();
        assert_eq!(d, Decision::NotYet(Duration::from_millis(250)));
        let half = snapshot_at(&store, "seed", &seed, at(1_250)).await.unwrap();
        assert!(half[0].tokens.is(1, 2), "{:?}", half[0].tokens);
        let (d, _) = try_at(&store, "seed", &seed, unit, at(1_500))
            .await
            .unwrap();
        assert_eq!(d, Decision::Admitted);
        // Saturation: at 10 s, 3 and not 20.
        let full = snapshot_at(&store, "seed", &seed, at(11_000))
            .await
            .unwrap();
        assert!(full[0].tokens.is(3, 1));
        let (d, _) = try_at(&store, "seed", &seed, Cost::new(3, 0), at(11_000))
            .await
            .unwrap();
        assert_eq!(d, Decision::Admitted);
        let (d, _) = try_at(&store, "seed", &seed, unit, at(11_000))
            .await
            .unwrap();
        assert_eq!(d, Decision::NotYet(Duration::from_millis(500)));

        // Both or none.
        let dual = Limits::parse("10/s", "1000/m").unwrap();
        let (d, _) = try_at(&store, "dual", &dual, Cost::call(900), at(0))
            .await
            .unwrap();
        assert_eq!(d, Decision::Admitted);
        let (d, _) = try_at(&store, "dual", &dual, Cost::call(150), at(0))
            .await
            .unwrap();
        assert_eq!(d, Decision::NotYet(Duration::from_secs(3)));
        let left = snapshot_at(&store, "dual", &dual, at(0)).await.unwrap();
        assert!(
            left[0].tokens.is(9, 1) && left[1].tokens.is(100, 1),
            "{left:?}"
        );

        // Cost above capacity, at once.
        let err = try_at(&store, "dual", &dual, Cost::call(1001), at(0))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::CostExceedsCapacity {
                    cost: 1001,
                    capacity: 1000,
                    ..
                }
            ),
            "{err:?}"
        );

        // Conflicting limits, naming both.
        let other = Limits::parse("20/s", "1000/m").unwrap();
        let err = try_at(&store, "dual", &other, Cost::call(1), at(0))
            .await
            .unwrap_err();
        match &err {
            Error::ConflictingLimits {
                existing,
                requested,
                ..
            } => {
                assert_eq!((existing, requested), (&dual, &other));
            }
            other => panic!("expected ConflictingLimits, got {other:?}"),
        }
        // Nothing was charged by the refusals.
        let left = snapshot_at(&store, "dual", &dual, at(0)).await.unwrap();
        assert!(
            left[0].tokens.is(9, 1) && left[1].tokens.is(100, 1),
            "{left:?}"
        );
    });
}

/// A small deterministic generator, so that a failing trace can be replayed.
#[test]
fn script_decides_like_the_memory_store_on_the_same_trace() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // (requests, tokens, output tokens)
    let configs = [
        ("5/s burst 10", "1000/m", ""),
        ("3/7s", "100/s burst 250; 2000/h", ""),
        ("60/m; 1000/d", "7/s burst 20", ""),
        ("1/s", "", ""),
        ("", "100000/m", ""),
        ("5/s burst 10", "1000/m", "200/s burst 400; 9000/h"),
        ("", "30000/m", "8000/m"),
    ];
    runtime().block_on(async {
        let redis = connect(&server).await;
        let mut rng = Lcg(7);
        for (n, (requests, token_rates, output_rates)) in configs.iter().enumerate() {
            let output: tollgate::Rates = if output_rates.is_empty() {
                tollgate::Rates::default()
            } else {
                output_rates.parse().unwrap()
            };
            let limits = Limits::parse(requests, token_rates)
                .unwrap()
                .with_output_tokens(output);
            let clock = ManualClock::new();
            let memory = MemoryStore::with_clock(clock.clone());
            let key = format!("trace-{n}");
            let mut now_ms = 0u64;
            let max_tokens = limits.tokens().capacity().unwrap_or(0);
            let max_requests = limits.requests().capacity().unwrap_or(1).min(3);
            let max_output = limits.output_tokens().capacity().unwrap_or(0);
            for step in 0..300 {
                if rng.below(2) == 0 {
                    now_ms += rng.below(1500);
                }
                let cost = Cost::new(
                    1 + rng.below(max_requests),
                    if max_tokens > 0 {
                        1 + rng.below(max_tokens)
                    } else {
                        0
                    },
                )
                .with_output_tokens(if max_output > 0 {
                    rng.below(max_output + 1)
                } else {
                    0
                });
                clock.set(Duration::from_millis(now_ms)).unwrap();
                let expected = try_now(&memory, &key, &limits, cost).unwrap();
                let (got, _) = try_at(&redis, &key, &limits, cost, Some(now_ms))
                    .await
                    .unwrap();
                // Hints agree once the memory store's nanoseconds are rounded up to the ms.
                let expected = match expected {
                    Decision::NotYet(d) => Decision::NotYet(Duration::from_millis(
                        d.as_nanos().div_ceil(1_000_000) as u64,
                    )),
                    admitted => admitted,
                };
                assert_eq!(
                    got, expected,
                    "{key} step {step} at {now_ms} ms, cost {cost}"
                );
                let (a, b) = (
                    snapshot_now(&memory, &key, &limits).unwrap(),
                    snapshot_at(&redis, &key, &limits, Some(now_ms))
                        .await
                        .unwrap(),
                );
                for (x, y) in a.iter().zip(&b) {
                    assert_eq!(
                        x.tokens,
                        y.tokens,
                        "{key} step {step}: {:?} vs {:?}",
                        tokens(&a),
                        tokens(&b)
                    );
                }
            }
        }
    });
}

#[test]
fn keys_expire_when_their_buckets_are_full_again() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let store = connect(&server).await;
        let limits = Limits::parse("10/m", "").unwrap();
        let (d, _) = try_at(&store, "expiring", &limits, Cost::new(4, 0), None)
            .await
            .unwrap();
        assert_eq!(d, Decision::Admitted);
        // 4 requests at 10/m take 24 s to come back: the key lives that long, and at most a
        // second more (the fast path renews an expiry with a second to spare, so that the
        // calls of the next second need not renew it).
        let (hash, _) = testing::redis_names(&store, "expiring");
        // (On a cluster every master answers; only the key's own has it.)
        let ttl: i64 = server
            .command(&["PTTL", &hash])
            .split("\r\n")
            .filter_map(|reply| reply.trim_start_matches(':').parse().ok())
            .max()
            .unwrap();
        assert!((24_000..=25_001).contains(&ttl), "PTTL {ttl}");
        assert_eq!(hash, "{8:tollgate:expiring}");
    });
}

/// The hash's time to live, in ms (on a cluster, the key's own master's).
fn pttl(server: &RedisServer, hash: &str) -> i64 {
    server
        .command(&["PTTL", hash])
        .split("\r\n")
        .filter_map(|reply| reply.trim_start_matches(':').parse().ok())
        .max()
        .unwrap()
}

#[test]
fn a_key_lives_until_the_charges_of_the_tickets_waiting_have_refilled() {
    // A promised ticket's holder passes by reading its record, and its charge waits for the
    // key's next operation: the key must still be there then, with its levels. While tickets
    // wait it lives a burst's refill past the last ticket's lease: once the last has paid, every
    // window is at 0 or more, and full again a burst's refill later at most.
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let store = connect(&server).await;
        let acquire = || tollgate::store::Op::Acquire {
            cost: Cost::call(0),
            max_wait: None,
            fly: false,
            share: None,
        };
        let queued = |outcome: &Result<(tollgate::store::Outcome, u64), Error>| {
            matches!(outcome, Ok((tollgate::store::Outcome::Queued { .. }, _)))
        };
        // 1 request per 2 s, burst 1: one call takes the burst, the next is promised for 2 s
        // from now (its lease ends at 3 s), and the key lives 2 s more: 5 s.
        let limits = Limits::parse("1/2s burst 1", "").unwrap();
        let key = store.bind("pending", &limits).unwrap();
        testing::redis_apply_at(&store, &key, acquire(), None)
            .await
            .unwrap();
        let second = testing::redis_apply_at(&store, &key, acquire(), None).await;
        assert!(queued(&second), "{second:?}");
        let ttl = pttl(&server, &testing::redis_names(&store, "pending").0);
        assert!((4_900..=5_001).contains(&ttl), "PTTL {ttl}");
        // A pause of 3 s on `10/2s`: ten calls are promised for when it ends (a window full
        // before a ticket is due stops refilling, so the time to refill from now would come
        // short). Their leases end at 4 s; the key lives to 6 s.
        let limits = Limits::parse("10/2s", "").unwrap();
        let key = store.bind("paused", &limits).unwrap();
        let pause = tollgate::store::Op::Penalize {
            pause: Duration::from_secs(3),
            spent: tollgate::Currencies::ALL,
            refusal: None,
        };
        testing::redis_apply_at(&store, &key, pause, None)
            .await
            .unwrap();
        for _ in 0..10 {
            let waiting = testing::redis_apply_at(&store, &key, acquire(), None).await;
            assert!(queued(&waiting), "{waiting:?}");
        }
        let ttl = pttl(&server, &testing::redis_names(&store, "paused").0);
        assert!((5_900..=6_001).contains(&ttl), "PTTL {ttl}");
    });
}

const WORKER_CALLS: usize = 20;

/// Run by `three_processes_share_one_key` in child processes: 20 calls on the shared key,
/// printing the server time of each admission.
#[test]
#[ignore = "a worker process for three_processes_share_one_key"]
fn worker_process() {
    let url = std::env::var("TOLLGATE_WORKER_REDIS").expect("started by the parent test");
    runtime().block_on(async {
        let store = Recording::new(RedisStore::connect(&url).await.unwrap());
        let limiter =
            Limiter::new("shared", Limits::parse("50/s burst 10", "").unwrap(), store).unwrap();
        for _ in 0..WORKER_CALLS {
            limiter.acquire(Cost::call(0)).await.unwrap();
        }
        let times = limiter.store().admitted_at();
        assert_eq!(times.len(), WORKER_CALLS);
        for t in times {
            println!("ADMIT {t}");
        }
    });
}

#[test]
fn three_processes_share_one_key() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let exe = std::env::current_exe().unwrap();
    let workers: Vec<_> = (0..3)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([
                    "store::worker_process",
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("TOLLGATE_WORKER_REDIS", server.url())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut times = Vec::new();
    for worker in workers {
        let output = worker.wait_with_output().unwrap();
        assert!(output.status.success(), "a worker failed");
        times.extend(
            String::from_utf8_lossy(&output.stdout)
                .lines()
                // The harness prints "test worker_process ... " without a newline first.
                .filter_map(|l| l.split_once("ADMIT ").map(|(_, t)| t))
                .map(|t| t.trim().parse::<u64>().unwrap()),
        );
    }
    assert_eq!(times.len(), 3 * WORKER_CALLS);
    times.sort_unstable();
    // Over every interval between admissions, on Redis's own clock: count ≤ 10 + 50·dt.
    for i in 0..times.len() {
        for j in i..times.len() {
            let count = (j - i + 1) as u64;
            let dt_ms = times[j] - times[i];
            assert!(
                count * 1000 <= 10 * 1000 + 50 * dt_ms,
                "{count} admissions in {dt_ms} ms"
            );
        }
    }
    // The bound forces at least 1 s: 50 past the burst at 50/s. (How close to 1 s it comes is
    // efficiency, measured by the workers example, not asserted under a loaded test run.)
    let span = times[times.len() - 1] - times[0];
    assert!(span >= 1000, "60 admissions in {span} ms");
}

#[test]
fn faults_are_errors_within_the_timeout_and_recovery_is_silent() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let config = RedisConfig::default()
            .with_timeout(Duration::from_millis(300))
            // Waiters learn of a failure within their timeouts: asked after half of one.
            .with_liveness(Duration::from_millis(300) / 2);
        let store = RedisStore::connect_with(&server.url(), config)
            .await
            .unwrap();
        let limits = Limits::parse("100/s", "").unwrap();
        let call = Cost::call(0);
        assert!(
            try_at(&store, "k", &limits, call, None)
                .await
                .map(|(d, _)| d)
                .unwrap()
                .is_admitted()
        );

        // SCRIPT FLUSH mid-run: the next call reloads the script without an error.
        assert!(server.command(&["SCRIPT", "FLUSH"]).contains("OK"));
        assert!(
            try_at(&store, "k", &limits, call, None)
                .await
                .map(|(d, _)| d)
                .unwrap()
                .is_admitted()
        );

        // The server dies: errors, within the timeout, and never an admission.
        server.kill();
        for _ in 0..3 {
            let started = Instant::now();
            let result = try_at(&store, "k", &limits, call, None)
                .await
                .map(|(d, _)| d);
            let took = started.elapsed();
            assert!(
                matches!(result, Err(Error::Unavailable { .. })),
                "{result:?}"
            );
            // The 300 ms timeout bounds the call; the generous slack is for a loaded CI
            // machine's scheduling, and still tells a bounded call from a hang.
            assert!(
                took < Duration::from_millis(300) + Duration::from_secs(2),
                "took {took:?}"
            );
        }

        // It comes back: the next calls pass.
        server.restart();
        assert!(
            try_at(&store, "k", &limits, call, None)
                .await
                .map(|(d, _)| d)
                .unwrap()
                .is_admitted()
        );
        assert!(
            try_at(&store, "k", &limits, call, None)
                .await
                .map(|(d, _)| d)
                .unwrap()
                .is_admitted()
        );
    });
}

#[test]
fn fail_open_admits_with_a_warning_when_redis_is_down() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let captured = tollgate_testkit::Captured::default();
    let _logging = captured.capture();
    tollgate_testkit::local_runtime().block_on(async {
        let config = RedisConfig::default()
            .with_timeout(Duration::from_millis(200))
            .with_fail_open(true);
        let store = RedisStore::connect_with(&server.url(), config)
            .await
            .unwrap();
        let limits = Limits::parse("1/m", "").unwrap();
        let decide = || async {
            try_at(&store, "k", &limits, Cost::call(0), None)
                .await
                .map(|(d, _)| d)
                .unwrap()
        };
        assert!(decide().await.is_admitted());
        // Up, the limit holds even in fail-open mode, and nothing is said.
        assert!(!decide().await.is_admitted());
        assert_eq!(captured.count("fail_open"), 0, "{}", captured.text());
        // Stopped (it takes the connection but never answers): admitted after the timeout,
        // with a warning.
        server.pause();
        assert!(decide().await.is_admitted());
        assert_eq!(
            captured.count("admitting because fail_open is set"),
            1,
            "{}",
            captured.text()
        );
        server.resume();
        // Killed: admitted, with a warning again.
        server.kill();
        assert!(decide().await.is_admitted());
        assert_eq!(
            captured.count("admitting because fail_open is set"),
            2,
            "{}",
            captured.text()
        );
    });
}

#[test]
fn passwords_work_and_are_never_shown() {
    let secret = "correct-horse-battery-staple";
    let Some(server) = RedisServer::start_with(&["--requirepass", secret]) else {
        return;
    };
    // On a cluster, the same URLs name it through one of its nodes.
    let scheme = if tollgate_testkit::redis::cluster_mode() {
        "redis+cluster"
    } else {
        "redis"
    };
    runtime().block_on(async {
        let good = format!("{scheme}://:{secret}@127.0.0.1:{}", server.port);
        let store = RedisStore::connect(&good).await.unwrap();
        let limits = Limits::parse("5/s", "").unwrap();
        assert!(
            try_at(&store, "k", &limits, Cost::call(0), None)
                .await
                .map(|(d, _)| d)
                .unwrap()
                .is_admitted()
        );
        let shown = format!("{store:?}");
        assert!(
            !shown.contains(secret) && shown.contains(":***@"),
            "{shown}"
        );

        let wrong = "wrong-password-12345";
        let bad = format!("{scheme}://:{wrong}@127.0.0.1:{}", server.port);
        let err = RedisStore::connect(&bad).await.unwrap_err();
        let message = format!("{err} {err:?}");
        assert!(!message.contains(wrong), "{message}");
        assert!(message.contains(":***@127.0.0.1"), "{message}");

        let none = format!("{scheme}://127.0.0.1:{}", server.port);
        let store = RedisStore::connect_with(&none, RedisConfig::default()).await;
        assert!(store.is_err(), "no password: NOAUTH");
    });
}

/// A CA and a server certificate for 127.0.0.1, made with the `openssl` command.
#[cfg(feature = "redis-tls")]
fn certificates(dir: &std::path::Path) -> Option<()> {
    let run = |args: &[&str]| {
        std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .ok()?;
    let made = run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=tollgate test CA",
    ]) && run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]) && run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
    if made {
        return Some(());
    }
    if std::env::var_os("TOLLGATE_REQUIRE_REDIS").is_some() {
        panic!("the openssl command is needed to make test certificates (apt-get install openssl)");
    }
    eprintln!("SKIPPED: the openssl command could not make test certificates");
    None
}

#[cfg(feature = "redis-tls")]
#[test]
fn rediss_with_a_private_ca_and_a_password() {
    if tollgate_testkit::redis::single_server_only("one TLS server with a private CA") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tollgate-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    if certificates(&dir).is_none() {
        return;
    }
    let path = |f: &str| dir.join(f).display().to_string();
    let secret = "tls-secret-password";
    let tls_port = tollgate_testkit::redis::free_port().to_string();
    let Some(_server) = RedisServer::start_with(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &path("server.crt"),
        "--tls-key-file",
        &path("server.key"),
        "--tls-ca-cert-file",
        &path("ca.crt"),
        "--tls-auth-clients",
        "no",
        "--requirepass",
        secret,
    ]) else {
        return;
    };
    runtime().block_on(async {
        let url = format!("rediss://:{secret}@127.0.0.1:{tls_port}");
        let config = RedisConfig::default().with_tls_ca_file(dir.join("ca.crt"));
        let store = RedisStore::connect_with(&url, config).await.unwrap();
        let limits = Limits::parse("5/s", "").unwrap();
        assert!(
            try_at(&store, "tls", &limits, Cost::call(0), None)
                .await
                .map(|(d, _)| d)
                .unwrap()
                .is_admitted()
        );

        // Without the private CA the certificate is not trusted: an error, without the password.
        let err = RedisStore::connect(&url).await.unwrap_err();
        let message = format!("{err} {err:?}");
        assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
        assert!(!message.contains(secret), "{message}");
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn penalties_and_settlements_on_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let store = connect(&server).await;
        let limits = Limits::parse("2/s", "1000/m").unwrap();
        let at = |ms| Some(ms);
        let (d, _) = try_at(&store, "p", &limits, Cost::call(100), at(1_000))
            .await
            .unwrap();
        assert_eq!(d, Decision::Admitted);

        // A 429 with Retry-After 2.5 s: drained, and nothing passes before 3.5 s.
        penalize_at(
            &store,
            "p",
            &limits,
            Duration::from_millis(2_500),
            at(1_000),
        )
        .await
        .unwrap();
        let (d, _) = try_at(&store, "p", &limits, Cost::call(1), at(1_000))
            .await
            .unwrap();
        assert_eq!(d, Decision::NotYet(Duration::from_millis(2_500)));
        // A shorter pause does not shorten it.
        penalize_at(&store, "p", &limits, Duration::from_millis(500), at(2_000))
            .await
            .unwrap();
        let (d, _) = try_at(&store, "p", &limits, Cost::call(1), at(3_499))
            .await
            .unwrap();
        assert_eq!(d, Decision::NotYet(Duration::from_millis(1)));
        // The buckets refilled during the pause (from the drain at 2 s).
        let (d, _) = try_at(&store, "p", &limits, Cost::call(1), at(3_500))
            .await
            .unwrap();
        assert_eq!(d, Decision::Admitted);

        // Settling: an underestimate of 300 goes into debt, a refund stops at capacity.
        let settle = Limits::parse("", "1000/m").unwrap();
        let (d, _) = try_at(&store, "s", &settle, Cost::call(900), at(0))
            .await
            .unwrap();
        assert_eq!(d, Decision::Admitted);
        adjust_at(&store, "s", &settle, -400, at(0)).await.unwrap();
        let left = snapshot_at(&store, "s", &settle, at(0)).await.unwrap();
        assert!(left[0].tokens.is(-300, 1), "{:?}", left[0].tokens);
        let (d, _) = try_at(&store, "s", &settle, Cost::call(100), at(0))
            .await
            .unwrap();
        assert_eq!(d, Decision::NotYet(Duration::from_secs(24)));
        adjust_at(&store, "s", &settle, 5_000, at(0)).await.unwrap();
        let left = snapshot_at(&store, "s", &settle, at(0)).await.unwrap();
        assert!(left[0].tokens.is(1000, 1), "{:?}", left[0].tokens);
    });
}

/// Lowering answers what it took, the same on both stores; it never raises a window.
async fn lowering_answers_what_it_took<S: tollgate::Store>(limiter: Limiter<S>) {
    limiter.acquire(Cost::call(100)).await.unwrap();
    // 1000/d and 50000/d: 900 and 49,900 left (a day refills under a token here). The answer
    // is the window closest to the count: 300 above 600 (and lowered to it), then 100 below
    // 700 (and left), then 600 above 0.
    assert_eq!(
        limiter
            .lower(tollgate::Currency::Tokens, 600)
            .await
            .unwrap(),
        300
    );
    assert_eq!(
        limiter
            .lower(tollgate::Currency::Tokens, 700)
            .await
            .unwrap(),
        -100
    );
    assert_eq!(
        limiter.lower(tollgate::Currency::Tokens, 0).await.unwrap(),
        600
    );
    let left = limiter.snapshot().await.unwrap().windows().to_vec();
    assert_eq!(left[1].tokens.whole(), 0);
    assert_eq!(left[2].tokens.whole(), 0);
    assert_eq!(left[0].tokens.whole(), 999);
}

#[test]
fn lowering_answers_what_it_took_on_both_stores() {
    let limits = Limits::parse("1000/d", "1000/d; 50000/d").unwrap();
    runtime().block_on(async {
        let memory = Limiter::builder("lower", limits.clone()).build().unwrap();
        lowering_answers_what_it_took(memory).await;
    });
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let store = connect(&server).await;
        let redis = Limiter::builder("lower", limits)
            .store(store)
            .build()
            .unwrap();
        lowering_answers_what_it_took(redis).await;
    });
}
