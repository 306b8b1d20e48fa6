//! A long prompt is counted off the async worker: while a 32 MB prompt is estimated and
//! acquired, a task ticking every millisecond on the same runtime keeps its time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use tollgate::{Limiter, Limits};

#[derive(Serialize)]
struct Message {
    role: &'static str,
    content: String,
}

#[derive(Debug)]
struct AppError;

impl From<tollgate::Error> for AppError {
    fn from(_: tollgate::Error) -> AppError {
        AppError
    }
}

#[tollgate::limit(
    key = "long-prompt",
    tokens = "10000000/m",
    estimator = "openai",
    timeout = "none"
)]
async fn send(messages: &[Message]) -> Result<(), AppError> {
    let _ = messages;
    Ok(())
}

/// How late a 1 ms tick may be. Measured here: about 5 ms at worst (tests build the estimators
/// optimised; 2 cores), against 105 ms when a [`PROMPT_BYTES`] prompt is counted on the worker;
/// the bound leaves room for a loaded CI machine's scheduling and still tells the two apart.
const LATE: Duration = Duration::from_millis(25);

/// How long the prompts are: long enough that counting one on the worker would stall it well
/// past [`LATE`] however the estimator is optimised.
const PROMPT_BYTES: usize = 32 << 20;

/// Runs `work` while a ticker on the same single worker sleeps 1 ms at a time; answers the
/// longest it ever overslept.
fn worst_tick_while(work: impl std::future::Future<Output = ()> + Send + 'static) -> Duration {
    // One measurement at a time: two counting at once would share the cores.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // One worker: without `block_in_place`, the ticker could only run after the count.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let done = Arc::new(AtomicBool::new(false));
        let ticker = {
            let done = Arc::clone(&done);
            tokio::spawn(async move {
                let mut worst = Duration::ZERO;
                while !done.load(Ordering::Acquire) {
                    let before = Instant::now();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    worst = worst.max(before.elapsed().saturating_sub(Duration::from_millis(1)));
                }
                worst
            })
        };
        // Let the ticker start on the worker first.
        tokio::time::sleep(Duration::from_millis(20)).await;
        tokio::spawn(work).await.unwrap();
        done.store(true, Ordering::Release);
        ticker.await.unwrap()
    })
}

/// About [`PROMPT_BYTES`] of `paragraph`: each measurement counts a text of its own, since the
/// estimator remembers what it counted (a cached count would take no time on any thread).
fn long_prompt(paragraph: &str) -> Vec<Message> {
    let content = paragraph.repeat(PROMPT_BYTES / paragraph.len());
    vec![Message {
        role: "user",
        content,
    }]
}

#[test]
fn a_ticker_keeps_its_time_while_a_32_mb_prompt_is_counted() {
    // Loading the vocabulary is a one-time cost, measured apart below.
    tollgate::estimators::estimator("openai")
        .unwrap()
        .count("warm up");
    let messages =
        long_prompt("The quick brown fox jumps over the lazy dog, and counts its tokens. ");
    let worst = worst_tick_while(async move {
        send(&messages).await.unwrap();
    });
    println!("macro: the ticker overslept by at most {worst:?}");
    assert!(worst <= LATE, "overslept by {worst:?}");

    let messages = long_prompt("A limiter counts this one itself, through acquire_for, uncached. ");
    let worst = worst_tick_while(async move {
        let limiter = Limiter::builder("long", Limits::parse("", "10000000/m").unwrap())
            .build()
            .unwrap();
        limiter.acquire_for(&messages).await.unwrap();
    });
    println!("acquire_for: the ticker overslept by at most {worst:?}");
    assert!(worst <= LATE, "overslept by {worst:?}");
}

#[test]
fn loading_a_vocabulary_happens_off_the_worker_too() {
    // The first use of an estimator reads its vocabulary (tens of milliseconds).
    let worst = worst_tick_while(async move {
        let limiter = Limiter::builder("first-use", Limits::parse("", "100/m").unwrap())
            .estimator_named("tiktoken:cl100k_base")
            .unwrap()
            .build()
            .unwrap();
        limiter.acquire_for("hello").await.unwrap();
    });
    println!("first use: the ticker overslept by at most {worst:?}");
    assert!(worst <= LATE, "overslept by {worst:?}");
}

#[test]
fn the_threshold_is_the_builders() {
    // Told to count everything where it is, the limiter stalls the worker for the whole count:
    // the setting is what moves the count, not a constant.
    tollgate::estimators::estimator("openai")
        .unwrap()
        .count("warm up");
    // Another text than the other test's: the estimator remembers what it counted.
    let messages = vec![Message {
        role: "user",
        content: "A slow count on the worker holds every task behind it. "
            .repeat(PROMPT_BYTES / 56),
    }];
    let worst = worst_tick_while(async move {
        let limiter = Limiter::builder("on-worker", Limits::parse("", "10000000/m").unwrap())
            .count_off_worker_above(usize::MAX)
            .build()
            .unwrap();
        limiter.acquire_for(&messages).await.unwrap();
    });
    println!("on the worker: the ticker overslept by {worst:?}");
    assert!(worst > LATE, "overslept by only {worst:?}");
}

#[test]
fn a_named_estimator_is_strict_everywhere() {
    // A vocabulary that can't be loaded is an error wherever a user names it, never a quiet
    // fallback to another count.
    let missing = "hf:/nonexistent/tokenizer.json";
    let builder = Limiter::builder("strict", Limits::parse("", "100/m").unwrap());
    let error = builder.estimator_named(missing).unwrap_err();
    assert!(
        matches!(error, tollgate::Error::Estimator { .. }),
        "{error:?}"
    );
    // Without the feature, the name is refused for what it lacks; with it, the file.
    let expected = if cfg!(feature = "huggingface") {
        "could not load"
    } else {
        "needs the cargo feature `huggingface`"
    };
    assert!(error.to_string().contains(expected), "{error}");
    let config = tollgate::Config::from_toml(&format!(
        "[keys.strict]\ntokens = \"100/m\"\nestimator = \"{missing}\"\n"
    ))
    .unwrap();
    let error = config.key("strict").unwrap().estimator().unwrap_err();
    assert!(error.to_string().contains(expected), "{error}");
}
