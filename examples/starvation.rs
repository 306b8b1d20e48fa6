//! A large call among streams of small ones, in three processes sharing one key through Redis.
//!
//! ```text
//! cargo run --release --features testing --example starvation                 # starts its own redis-server
//! cargo run --release --features testing --example starvation -- --redis redis://127.0.0.1:6379
//! ```
//!
//! Two processes stream 100-token calls (8 at a time each, faster than `10000/m` refills); at
//! t = 5 s a third sends one 8,000-token call. Arrival order across processes means the big
//! call waits only for its own refill and for the calls that reached Redis before it: the
//! summary line compares its wait with that allowance (+1%), and checks that no call was
//! admitted before one that reached the store earlier. Every time is Redis's own.
//!
//! It takes about a minute: 8,000 tokens of `10000/m` are 48 s of refill.

use std::collections::HashMap;
use std::io::Write as _;
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

use tollgate::store::redis::{RedisKey, RedisStore};
use tollgate::store::{Op, Outcome};
use tollgate::{Cost, Error, Limiter, Limits, Store, testing};

const TOKENS: &str = "10000/m";
const PER_MIN: u64 = 10_000;
const BIG: u64 = 8_000;
const SMALL: u64 = 100;
const STREAMS_PER_PROCESS: usize = 8;
const BIG_AT: Duration = Duration::from_secs(5);

/// A Redis store that prints, for every call, when it reached the store and when it was
/// admitted (server milliseconds), with its ticket: `CALL <ticket|-> <arrived> <admitted>
/// <tokens>`.
struct Logged {
    store: RedisStore,
    arrived: std::sync::Mutex<HashMap<u64, (u64, u64)>>,
}

impl Logged {
    fn print(ticket: Option<u64>, arrived: u64, admitted: u64, tokens: u64) {
        let ticket = ticket.map_or_else(|| "-".to_owned(), |t| t.to_string());
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "CALL {ticket} {arrived} {admitted} {tokens}");
        let _ = out.flush();
    }
}

impl Store for Logged {
    type Key = RedisKey;

    fn bind(&self, key: &str, limits: &Limits) -> Result<RedisKey, Error> {
        self.store.bind(key, limits)
    }

    async fn apply(&self, key: &RedisKey, op: Op) -> Result<Outcome, Error> {
        let (outcome, now) = testing::redis_apply_at(&self.store, key, op.clone(), None).await?;
        let mut arrived = self.arrived.lock().unwrap_or_else(|e| e.into_inner());
        match (op, &outcome) {
            (Op::Acquire { cost, .. }, Outcome::Admitted) => {
                Logged::print(None, now, now, cost.tokens);
            }
            (Op::Acquire { cost, .. }, Outcome::Queued { ticket, .. }) => {
                arrived.insert(ticket.id(), (now, cost.tokens));
            }
            (Op::Admit { ticket, .. }, Outcome::Admitted) => {
                if let Some((at, tokens)) = arrived.remove(&ticket.id()) {
                    Logged::print(Some(ticket.id()), at, now, tokens);
                }
            }
            _ => {}
        }
        Ok(outcome)
    }

    fn health_interval(&self) -> Option<Duration> {
        self.store.health_interval()
    }
}

async fn limiter(url: &str, key: &str) -> Result<Limiter<Logged>, Box<dyn std::error::Error>> {
    let store = Logged {
        store: RedisStore::connect(url).await?,
        arrived: std::sync::Mutex::new(HashMap::new()),
    };
    Ok(Limiter::new(key, Limits::parse("", TOKENS)?, store)?)
}

/// A streaming process: small calls, several at a time, until it is killed.
async fn stream(url: &str, key: &str) -> Result<(), Box<dyn std::error::Error>> {
    let limiter = limiter(url, key).await?;
    let tasks: Vec<_> = (0..STREAMS_PER_PROCESS)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                loop {
                    limiter.acquire_timeout(Cost::new(1, SMALL), None).await?;
                }
                #[allow(unreachable_code)]
                Ok::<(), Error>(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// The big call's process.
async fn big(url: &str, key: &str) -> Result<(), Box<dyn std::error::Error>> {
    let limiter = limiter(url, key).await?;
    limiter.acquire_timeout(Cost::new(1, BIG), None).await?;
    Ok(())
}

/// One call as a process printed it.
#[derive(Debug, Clone, Copy)]
struct Call {
    ticket: Option<u64>,
    arrived: u64,
    admitted: u64,
    tokens: u64,
}

fn calls(output: &[u8]) -> Vec<Call> {
    String::from_utf8_lossy(output)
        .lines()
        .filter_map(|line| {
            let mut parts = line.strip_prefix("CALL ")?.split(' ');
            let ticket = parts.next()?.parse().ok();
            Some(Call {
                ticket,
                arrived: parts.next()?.parse().ok()?,
                admitted: parts.next()?.parse().ok()?,
                tokens: parts.next()?.parse().ok()?,
            })
        })
        .collect()
}

async fn run(url: &str) -> Result<String, Box<dyn std::error::Error>> {
    let key = format!("starvation-{}", std::process::id());
    let exe = std::env::current_exe()?;
    let spawn = |role: &str| {
        Command::new(&exe)
            .args(["--role", role, "--key", &key, "--redis", url])
            .stdout(Stdio::piped())
            .spawn()
    };
    let streams = [spawn("stream")?, spawn("stream")?];
    tokio::time::sleep(BIG_AT).await;
    let big = spawn("big")?.wait_with_output()?;
    if !big.status.success() {
        return Err(format!("the big call's process failed: {}", big.status).into());
    }
    let mut all = calls(&big.stdout);
    let big_call = *all
        .first()
        .ok_or("the big call's process printed no admission")?;
    for mut child in streams {
        let _ = child.kill();
        let output = child.wait_with_output()?;
        all.extend(calls(&output.stdout));
    }
    // The calls that reached the store before the big one and were still waiting then.
    let ahead: u64 = all
        .iter()
        .filter(|c| {
            c.tokens == SMALL && c.arrived <= big_call.arrived && c.admitted >= big_call.arrived
        })
        .filter(|c| match (c.ticket, big_call.ticket) {
            (Some(t), Some(b)) => t < b,
            _ => false,
        })
        .map(|c| c.tokens)
        .sum();
    let waited = (big_call.admitted - big_call.arrived) as f64 / 1000.0;
    let allowed = (BIG + ahead) as f64 * 60.0 / PER_MIN as f64 * 1.01;
    // Arrival order: no queued call was admitted before one whose ticket is older.
    let mut queued: Vec<Call> = all.iter().copied().filter(|c| c.ticket.is_some()).collect();
    queued.sort_by_key(|c| c.ticket);
    let order_held = queued.windows(2).all(|w| w[0].admitted <= w[1].admitted);
    let verdict = if order_held && waited <= allowed {
        "arrival order held"
    } else {
        "arrival order BROKEN"
    };
    Ok(format!(
        "starvation: {BIG}-token call waited {waited:.2} s, allowed {allowed:.2} s, 3 processes, {verdict}"
    ))
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut role, mut key, mut url) = (None, None, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--role" => role = args.next(),
            "--key" => key = args.next(),
            "--redis" => url = args.next(),
            other => {
                eprintln!("starvation: unknown argument `{other}`; expected --redis URL");
                return ExitCode::from(2);
            }
        }
    }
    if let (Some(role), Some(key), Some(url)) = (&role, &key, &url) {
        let result = match role.as_str() {
            "stream" => stream(url, key).await,
            _ => big(url, key).await,
        };
        return match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("starvation {role}: {err}");
                ExitCode::FAILURE
            }
        };
    }
    let (url, own) = match tollgate_testkit::redis::given_or_own(url) {
        Ok(found) => found,
        Err(err) => {
            eprintln!("starvation: {err}");
            return ExitCode::FAILURE;
        }
    };

    let result = run(&url).await;
    drop(own);
    match result {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("starvation: {err}");
            ExitCode::FAILURE
        }
    }
}
