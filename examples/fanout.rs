//! The agent fan-out, in real time: calls fired at once at one key, 60 on `5/s burst 10` by
//! default.
//!
//! The first calls pass at once (the burst), the rest are paced at the rate, so with the
//! defaults the last passes at 10 s. Prints every admission (up to 100), writes `pacing.csv`
//! and `pacing.svg` (cumulative admissions against time, beside the ideal curve), and ends with
//! one summary line.
//!
//! ```text
//! cargo run --release --example fanout
//! cargo run --release --example fanout -- --limits "100/s burst 1" --calls 301
//! cargo run --release --features testing --example fanout -- --redis redis://127.0.0.1:6379
//! ```
//!
//! With `--redis URL` the key lives in Redis (a fresh key per run) instead of in memory.

use std::fmt::Write as _;

use tokio::time::Instant;
use tollgate::{Cost, Limiter, Limits, Rate, Registry};

/// Admission times are taken when `acquire` returns, a little after the store decided; the
/// window check allows this much for that lag.
const TIMING_SLACK: f64 = 0.001;
/// Redis's times are whole milliseconds, the same the script decided on: only floating-point
/// rounding is allowed for.
const SERVER_SLACK: f64 = 1e-9;

/// The run: how many calls, on what window.
struct Shape {
    calls: usize,
    rate: Rate,
    redis: Option<String>,
}

impl Shape {
    fn burst(&self) -> f64 {
        self.rate.burst() as f64
    }

    fn per_sec(&self) -> f64 {
        self.rate.amount() as f64 / self.rate.period().as_secs_f64()
    }

    /// The burst at once, then one call per `1 / rate`.
    fn ideal(&self) -> f64 {
        (self.calls as f64 - self.burst()).max(0.0) / self.per_sec()
    }
}

fn shape() -> Result<Shape, Box<dyn std::error::Error>> {
    let mut limits = "5/s burst 10".to_owned();
    let mut calls = 60;
    let mut redis = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--limits" => {
                limits = args
                    .next()
                    .ok_or("--limits needs a rate, like \"5/s burst 10\"")?
            }
            "--calls" => calls = args.next().ok_or("--calls needs a count")?.parse()?,
            "--redis" => redis = Some(args.next().ok_or("--redis needs a URL")?),
            other => {
                return Err(format!(
                    "unknown argument `{other}`; expected --limits, --calls or --redis"
                )
                .into());
            }
        }
    }
    let rate: Rate = limits.parse()?;
    Ok(Shape { calls, rate, redis })
}

/// Where Redis's own times of the admissions are kept, when the key lives there.
type ServerTimes = Option<std::sync::Arc<std::sync::Mutex<Vec<u64>>>>;

/// The limiter: in this process's registry, or on a fresh key in Redis (then with the log of
/// the server's times of the admissions).
async fn limiter(
    shape: &Shape,
    limits: &Limits,
) -> Result<(Limiter, ServerTimes), Box<dyn std::error::Error>> {
    let Some(url) = &shape.redis else {
        return Ok((Registry::global().limiter("fanout", limits)?, None));
    };
    #[cfg(feature = "testing")]
    {
        let store = tollgate::testing::Recording::new(
            tollgate::store::redis::RedisStore::connect(url).await?,
        );
        let log = store.log();
        let key = format!("fanout-{}", std::process::id());
        let limiter = Limiter::builder(key, limits.clone())
            .store(tollgate::store::AnyStore::custom(store))
            .build()?;
        Ok((limiter, Some(log)))
    }
    #[cfg(not(feature = "testing"))]
    {
        Err(format!("--redis {url}: build with --features testing (it brings redis)").into())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let shape = shape()?;
    let limits = Limits::requests_only(shape.rate);
    let (limiter, server_times) = limiter(&shape, &limits).await?;
    let start = Instant::now();
    let tasks: Vec<_> = (0..shape.calls)
        .map(|call| {
            let limiter = limiter.clone();
            let print = shape.calls <= 100;
            tokio::spawn(async move {
                limiter.acquire_timeout(Cost::call(0), None).await?;
                let at = start.elapsed().as_secs_f64();
                if print {
                    println!("call {call:>2} admitted at {at:6.3} s");
                }
                Ok::<f64, tollgate::Error>(at)
            })
        })
        .collect();
    let mut times = Vec::with_capacity(shape.calls);
    for task in tasks {
        times.push(task.await??);
    }
    times.sort_by(f64::total_cmp);
    // Through Redis, a ticket charged at its due time is charged by the key's next operation
    // (its holder only reads its record): take one, so that the server's work for the run,
    // read from `INFO commandstats` afterwards, includes those charges.
    if server_times.is_some() {
        limiter.snapshot().await?;
    }

    let ideal = shape.ideal();
    let total = times.last().copied().unwrap_or(0.0);
    std::fs::write("pacing.csv", csv(&times))?;
    std::fs::write("pacing.svg", svg(&times, &shape))?;

    // Through Redis, the bound is checked on the server's clock, where the script decided.
    let (checked, slack) = match &server_times {
        None => (times.clone(), TIMING_SLACK),
        Some(log) => {
            let mut ms = log
                .lock()
                .map_err(|_| "the log of server times is poisoned")?
                .clone();
            ms.sort_unstable();
            let first = ms.first().copied().unwrap_or(0);
            let secs = ms.iter().map(|t| (t - first) as f64 / 1000.0).collect();
            (secs, SERVER_SLACK)
        }
    };
    let verdict = match worst_window(&checked, &shape, slack) {
        None => "window bound held".to_owned(),
        Some((from, to, count, bound)) => format!(
            "window bound BROKEN: {count} calls in [{from:.3} s, {to:.3} s], bound {bound:.2}"
        ),
    };
    println!(
        "fanout: {} calls in {total:.2} s, ideal {ideal:.2} s, efficiency {:.1}%, {verdict}",
        shape.calls,
        100.0 * ideal / total.max(f64::EPSILON)
    );
    Ok(())
}

/// The interval where admissions most exceed `B + r·dt`, if any does: for each first
/// admission, the furthest later one still within one refill of a call (a later one can only
/// be further under the bound), so the check stays fast for thousands of calls.
fn worst_window(times: &[f64], shape: &Shape, slack: f64) -> Option<(f64, f64, usize, f64)> {
    let mut worst: Option<(f64, f64, usize, f64)> = None;
    for i in 0..times.len() {
        for j in i..times.len() {
            let count = j - i + 1;
            let bound = shape.burst() + shape.per_sec() * (times[j] - times[i] + slack);
            let excess = count as f64 - bound;
            if excess > 0.0 && worst.is_none_or(|(_, _, c, b)| excess > c as f64 - b) {
                worst = Some((times[i], times[j], count, bound));
            }
            // Past a burst's worth of slack, no later window from `i` can exceed the bound.
            if bound - count as f64 > shape.burst() + 1.0 {
                break;
            }
        }
    }
    worst
}

/// A round tick spacing giving about five to ten ticks up to `t_max`.
fn nice_step(t_max: f64) -> f64 {
    let raw = (t_max / 6.0).max(1e-3);
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude)
}

fn csv(times: &[f64]) -> String {
    let mut out = String::from("call,seconds,admitted_so_far\n");
    for (i, t) in times.iter().enumerate() {
        let _ = writeln!(out, "{i},{t:.6},{}", i + 1);
    }
    out
}

/// Cumulative admissions against time (blue) beside the ideal curve (grey, dashed): a vertical
/// step to the burst, then a line of slope `per_sec`. The time axis starts a little before 0,
/// so that the step of the first burst stands clear of the axis.
fn svg(times: &[f64], shape: &Shape) -> String {
    let ideal = shape.ideal();
    let calls = shape.calls;
    let (w, h, pad) = (720.0, 420.0, 50.0);
    let t_max = times.last().copied().unwrap_or(0.0).max(ideal) * 1.05 + 0.1;
    let t_min = -0.03 * t_max;
    let n_max = calls as f64 * 1.05;
    let x = |t: f64| pad + (t - t_min) / (t_max - t_min) * (w - 2.0 * pad);
    let y = |n: f64| h - pad - n / n_max * (h - 2.0 * pad);

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{calls} calls at once on {}</text>"#,
        w / 2.0,
        shape.rate
    );
    // Axes with ticks.
    let _ = writeln!(
        out,
        r#"<path d="M{pad},{top} V{bottom} H{right}" stroke="black" fill="none"/>"#,
        top = pad,
        bottom = h - pad,
        right = w - pad
    );
    let step = nice_step(t_max);
    let mut t = 0.0;
    while t <= t_max {
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle">{t}</text>"#,
            x(t),
            h - pad + 16.0
        );
        t += step;
    }
    for n in (0..=calls).step_by((calls / 6).max(1)) {
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="end">{n}</text>"#,
            pad - 6.0,
            y(n as f64) + 4.0
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">seconds</text>"#,
        w / 2.0,
        h - 12.0
    );
    let _ = writeln!(
        out,
        r#"<text x="14" y="{}" transform="rotate(-90 14 {})" text-anchor="middle">calls admitted</text>"#,
        h / 2.0,
        h / 2.0
    );
    // The ideal: straight up to the burst at t = 0, then slope PER_SEC until every call passed.
    let _ = writeln!(
        out,
        r#"<path d="M{},{} V{} L{},{}" stroke="grey" stroke-width="2" stroke-dasharray="6 4" fill="none"/>"#,
        x(0.0),
        y(0.0),
        y(shape.burst().min(calls as f64)),
        x(ideal),
        y(calls as f64)
    );
    // The measured staircase.
    let mut path = format!("M{},{}", x(0.0), y(0.0));
    for (i, t) in times.iter().enumerate() {
        let _ = write!(path, " H{:.2} V{:.2}", x(*t), y(i as f64 + 1.0));
    }
    let _ = writeln!(
        out,
        r#"<path d="{path}" stroke="royalblue" stroke-width="2" fill="none"/>"#
    );
    // The legend: a sample of each line beside its name.
    let (lx, ly) = (pad + 16.0, pad + 10.0);
    let _ = writeln!(
        out,
        r#"<path d="M{lx},{ly} h24" stroke="royalblue" stroke-width="2"/><text x="{}" y="{}">measured</text>"#,
        lx + 30.0,
        ly + 4.0
    );
    let _ = writeln!(
        out,
        r#"<path d="M{lx},{} h24" stroke="grey" stroke-width="2" stroke-dasharray="6 4"/><text x="{}" y="{}">ideal</text>"#,
        ly + 18.0,
        lx + 30.0,
        ly + 22.0
    );
    out.push_str("</svg>\n");
    out
}
