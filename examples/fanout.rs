//! The agent fan-out, in real time: 60 calls fired at once at a key limited to `5/s burst 10`.
//!
//! The first 10 pass at once (the burst), the rest are paced at 5 a second, so the last passes
//! at 10 s. Prints every admission, writes `pacing.csv` and `pacing.svg` (cumulative admissions
//! against time, beside the ideal curve), and ends with one summary line.
//!
//! ```text
//! cargo run --release --example fanout
//! ```

use std::fmt::Write as _;

use tokio::time::Instant;
use tollgate::{Cost, Limits, Registry};

const CALLS: usize = 60;
const BURST: f64 = 10.0;
const PER_SEC: f64 = 5.0;
/// Admission times are taken when `acquire` returns, a little after the store decided; the
/// window check allows this much for that lag.
const TIMING_SLACK: f64 = 0.001;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limits = Limits::parse("5/s burst 10", "")?;
    let limiter = Registry::global().limiter("fanout", &limits)?;
    let start = Instant::now();
    let tasks: Vec<_> = (0..CALLS)
        .map(|call| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                limiter.acquire_timeout(Cost::call(0), None).await?;
                let at = start.elapsed().as_secs_f64();
                println!("call {call:>2} admitted at {at:6.3} s");
                Ok::<f64, tollgate::Error>(at)
            })
        })
        .collect();
    let mut times = Vec::with_capacity(CALLS);
    for task in tasks {
        times.push(task.await??);
    }
    times.sort_by(f64::total_cmp);

    let ideal = (CALLS as f64 - BURST) / PER_SEC;
    let total = times.last().copied().unwrap_or(0.0);
    std::fs::write("pacing.csv", csv(&times))?;
    std::fs::write("pacing.svg", svg(&times, ideal))?;

    let verdict = match worst_window(&times) {
        None => "window bound held".to_owned(),
        Some((from, to, count, bound)) => format!(
            "window bound BROKEN: {count} calls in [{from:.3} s, {to:.3} s], bound {bound:.2}"
        ),
    };
    println!(
        "fanout: {CALLS} calls in {total:.2} s, ideal {ideal:.2} s, efficiency {:.1}%, {verdict}",
        100.0 * ideal / total.max(f64::EPSILON)
    );
    Ok(())
}

/// The interval where admissions most exceed `B + r·dt`, if any does.
fn worst_window(times: &[f64]) -> Option<(f64, f64, usize, f64)> {
    let mut worst: Option<(f64, f64, usize, f64)> = None;
    for i in 0..times.len() {
        for j in i..times.len() {
            let count = j - i + 1;
            let bound = BURST + PER_SEC * (times[j] - times[i] + TIMING_SLACK);
            let excess = count as f64 - bound;
            if excess > 0.0 && worst.is_none_or(|(_, _, c, b)| excess > c as f64 - b) {
                worst = Some((times[i], times[j], count, bound));
            }
        }
    }
    worst
}

fn csv(times: &[f64]) -> String {
    let mut out = String::from("call,seconds,admitted_so_far\n");
    for (i, t) in times.iter().enumerate() {
        let _ = writeln!(out, "{i},{t:.6},{}", i + 1);
    }
    out
}

/// Cumulative admissions against time (blue) beside the ideal curve (grey, dashed): a vertical
/// step to the burst, then a line of slope `PER_SEC`.
fn svg(times: &[f64], ideal: f64) -> String {
    let (w, h, pad) = (720.0, 420.0, 50.0);
    let t_max = times.last().copied().unwrap_or(0.0).max(ideal) * 1.05 + 0.1;
    let n_max = CALLS as f64 * 1.05;
    let x = |t: f64| pad + t / t_max * (w - 2.0 * pad);
    let y = |n: f64| h - pad - n / n_max * (h - 2.0 * pad);

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{CALLS} calls at once on 5/s burst 10</text>"#,
        w / 2.0
    );
    // Axes with ticks.
    let _ = writeln!(
        out,
        r#"<path d="M{pad},{top} V{bottom} H{right}" stroke="black" fill="none"/>"#,
        top = pad,
        bottom = h - pad,
        right = w - pad
    );
    let mut t = 0.0;
    while t <= t_max {
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle">{t}</text>"#,
            x(t),
            h - pad + 16.0
        );
        t += 2.0;
    }
    for n in (0..=CALLS).step_by(10) {
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
        y(BURST),
        x(ideal),
        y(CALLS as f64)
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
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" fill="royalblue">measured</text><text x="{}" y="{}" fill="grey">ideal</text>"#,
        pad + 12.0,
        pad + 10.0,
        pad + 12.0,
        pad + 26.0
    );
    out.push_str("</svg>\n");
    out
}
