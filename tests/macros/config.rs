//! `#[tollgate::limit]` reading its limits from the configuration, and retrying calls the
//! provider refused. A file of its own: the configuration is process-wide.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tollgate::{Config, Limits, Registry};

#[derive(Debug)]
enum ApiError {
    TooMany {
        retry_after: Option<Duration>,
    },
    // Read through `Debug` when an assertion fails.
    #[allow(dead_code)]
    Limited(tollgate::Error),
}

impl From<tollgate::Error> for ApiError {
    fn from(err: tollgate::Error) -> ApiError {
        ApiError::Limited(err)
    }
}

impl tollgate::RateLimited for ApiError {
    fn is_rate_limited(&self) -> bool {
        matches!(self, ApiError::TooMany { .. })
    }
    fn retry_after(&self) -> Option<Duration> {
        match self {
            ApiError::TooMany { retry_after } => *retry_after,
            ApiError::Limited(_) => None,
        }
    }
}

const CONFIG: &str = r#"
[default]
requests = "100/m"
timeout = "5s"

[keys.configured]
tokens = "1000/d"
estimator = "words"

[keys.quick]
requests = "1/h"
timeout = "none"
"#;

fn install() {
    // Every test in this file installs the same configuration; the first one wins.
    let _ = tollgate::install_config(Config::from_toml(CONFIG).unwrap());
}

#[tollgate::limit(key = "configured")]
async fn configured(text: &str) -> Result<usize, ApiError> {
    Ok(text.len())
}

#[tollgate::limit(key = format!("tenant-{tenant}"))]
async fn per_tenant(tenant: u32) -> Result<u32, ApiError> {
    Ok(tenant)
}

#[tokio::test(start_paused = true)]
async fn limits_estimator_and_timeout_come_from_the_configuration() {
    install();
    configured("three more words").await.unwrap();
    // [keys.configured] merged over [default]: 100/m requests, 1000/d tokens, words.
    let limits = Limits::parse("100/m", "1000/d").unwrap();
    let limiter = Registry::global().limiter("configured", &limits).unwrap();
    let left: Vec<i128> = limiter
        .snapshot()
        .await
        .unwrap()
        .windows()
        .iter()
        .map(|a| a.tokens.whole())
        .collect();
    assert_eq!(left, vec![99, 997]);

    // A key with no section of its own takes [default], each resulting key apart.
    per_tenant(1).await.unwrap();
    per_tenant(2).await.unwrap();
    let default = Limits::parse("100/m", "").unwrap();
    for tenant in ["tenant-1", "tenant-2"] {
        let limiter = Registry::global().limiter(tenant, &default).unwrap();
        assert_eq!(
            limiter.snapshot().await.unwrap().windows()[0]
                .tokens
                .whole(),
            99
        );
    }
}

#[tollgate::limit(key = "quick")]
async fn quick() -> Result<(), ApiError> {
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn the_configured_timeout_applies() {
    install();
    quick().await.unwrap();
    // timeout = "none" in [keys.quick]: the second call waits the hour out.
    let start = Instant::now();
    quick().await.unwrap();
    assert!(start.elapsed() >= Duration::from_secs(3600));
}

static REFUSALS: AtomicU32 = AtomicU32::new(0);

#[tollgate::limit(key = "flaky", requests = "100/s", retries = 3)]
async fn flaky(refuse: u32) -> Result<u32, ApiError> {
    let n = REFUSALS.fetch_add(1, Ordering::SeqCst);
    if n < refuse {
        return Err(ApiError::TooMany {
            retry_after: Some(Duration::from_secs(2)),
        });
    }
    Ok(n)
}

#[tokio::test(start_paused = true)]
async fn refused_calls_pause_the_key_and_are_retried() {
    REFUSALS.store(0, Ordering::SeqCst);
    let start = Instant::now();
    // Refused twice with Retry-After 2 s: the third attempt passes, after both pauses, the
    // second twice as long as the first give or take a fifth (429s in a row back off).
    assert_eq!(flaky(2).await.unwrap(), 2);
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(2_000 + 3_200), "{waited:?}");
    assert!(
        waited <= Duration::from_millis(2_000 + 4_800 + 10),
        "{waited:?}"
    );

    // Refused more often than the retries allow: the provider's error comes back.
    REFUSALS.store(0, Ordering::SeqCst);
    assert!(matches!(flaky(10).await, Err(ApiError::TooMany { .. })));
    assert_eq!(REFUSALS.load(Ordering::SeqCst), 4, "1 call + 3 retries");
}

#[tollgate::limit(key = "not-in-config-and-no-default-would-use-default")]
async fn uses_default() -> Result<(), ApiError> {
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_bad_file_lists_every_bad_entry() {
    install();
    uses_default().await.unwrap();
    let err = Config::from_toml(
        r#"
        [default]
        tokens = "5/x"
        [keys.a]
        requests = "0/s"
        colour = "blue"
        [keys.b]
        timeout = "later"
        requests = "1/s"
        [extra]
        "#,
    )
    .unwrap_err();
    let text = err.to_string();
    for expected in [
        "default.tokens: rate `5/x`: unknown unit `x`",
        "keys.a.requests: rate `0/s`: the count is 0",
        "keys.a.colour: unknown field `colour`",
        "keys.b.timeout: timeout `later`",
        "extra: unknown section",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}
