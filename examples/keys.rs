//! A million distinct keys, one call each, through `#[tollgate::limit]` with a key per tenant:
//! what the process remembers, and its peak memory.
//!
//! ```text
//! cargo run --release --example keys -- --limits 500/m     # refilled in 120 ms: forgotten fast
//! cargo run --release --example keys -- --limits 1000/d    # remembered for a day: all of them
//! ```
//!
//! Ends with one line: `keys: 1000000 keys on 500/m in X s, peak RSS Y MB (Z MB before the
//! first call), the store remembers N keys, the registry M`.

use std::time::Instant;

#[tollgate::limit(key = format!("minute:{tenant}"), requests = "500/m", timeout = "none")]
async fn per_minute(tenant: u32) -> Result<(), tollgate::Error> {
    let _ = tenant;
    Ok(())
}

#[tollgate::limit(key = format!("day:{tenant}"), requests = "1000/d", timeout = "none")]
async fn per_day(tenant: u32) -> Result<(), tollgate::Error> {
    let _ = tenant;
    Ok(())
}

/// The peak and the current resident memory of this process, in MB.
fn memory() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<f64>().ok())
            .map_or(f64::NAN, |kb| kb / 1024.0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut limits = "500/m".to_owned();
    let mut keys: u32 = 1_000_000;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--limits" => limits = args.next().ok_or("--limits needs 500/m or 1000/d")?,
            "--keys" => keys = args.next().ok_or("--keys needs a count")?.parse()?,
            other => return Err(format!("unknown argument `{other}`").into()),
        }
    }
    let (_, before) = memory();
    let start = Instant::now();
    for tenant in 0..keys {
        match limits.as_str() {
            "500/m" => per_minute(tenant).await?,
            "1000/d" => per_day(tenant).await?,
            other => return Err(format!("--limits is 500/m or 1000/d, not {other}").into()),
        }
    }
    let took = start.elapsed().as_secs_f64();
    let (peak, _) = memory();
    let registry = tollgate::Registry::global();
    let remembered = registry.store().as_memory().map_or(0, |store| store.len());
    println!(
        "keys: {keys} keys on {limits} in {took:.2} s, peak RSS {peak:.0} MB ({before:.0} MB before the first call), the store remembers {remembered} keys, the registry {}",
        registry.len()
    );
    Ok(())
}
