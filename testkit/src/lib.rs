//! What tollgate's tests, benches and examples share (not published).
//!
//! - [`provider`]: a stand-in for an LLM provider on loopback, with its own bucket arithmetic,
//!   OpenAI- and Anthropic-style headers, streams, latency, and a neighbour that spends from
//!   its quota.
//! - [`hostile`]: an upstream that answers by a script of raw bytes and pauses (or never),
//!   and a client that writes raw bytes at its own pace: the next hostile finding in a few
//!   lines.
//! - [`redis`]: a real `redis-server`, a Redis Cluster (3 masters, 3 replicas) or a master
//!   watched by a sentinel, on free loopback ports, stopped when dropped.
//! - [`stores`]: one operation at a time on a store, in the words the tests speak.
//! - [`runtime`], [`Lcg`], [`ready`]: the small helpers every test file used to copy.
//!
//! # How a test here is written
//!
//! - **Named for the promise it keeps**: `refusal_keeps_partial_credit`, not `test_refusal`.
//!   Read the name, break the behaviour on purpose, and the test must fail.
//! - **Exact values where the arithmetic is exact.** Levels are compared with
//!   [`Amount::is`](tollgate::Amount::is) or whole tokens, hints to the nanosecond (memory) or
//!   millisecond (Redis). An expected value is computed independently of the code under test
//!   (by hand, by a reference implementation such as tiktoken-rs, or by exact rational
//!   arithmetic in the test), never by calling the function being checked.
//! - **Time is controlled**: a [`ManualClock`](tollgate::ManualClock) or
//!   `tokio::time::pause()` (`#[tokio::test(start_paused = true)]`), never a real sleep. Real
//!   time belongs to the Redis tests (the server's `TIME`) and to benches and examples; a test
//!   on real time asserts what correctness implies (an order, a bound), not how fast it was.
//! - **Real parts, not mocks**: Redis tests start a real server with
//!   [`redis::RedisServer::start`]; HTTP tests send real requests to [`provider::Provider`]
//!   through the real client crates. A missing `redis-server` or tokenizer fixture skips the
//!   test with a `SKIPPED:` line, and fails it when `TOLLGATE_REQUIRE_REDIS` or
//!   `TOLLGATE_REQUIRE_FIXTURES` is set (as `.ci/run` sets them).
//! - **Property tests reach their edges**: a strategy that names an edge (the longest period,
//!   the largest burst) generates it often enough to be seen; filters keep most cases.
//!   Check with a counter when unsure.
//! - **One binary per theme** (`tests/core`, `tests/redis`, `tests/http`, `tests/macro`), each
//!   file a module of it: a test binary links the whole dependency tree, so a new file is a
//!   module, not a new binary.

mod captured;
pub mod hostile;
pub mod provider;
pub mod redis;
pub mod stores;

pub use captured::{Captured, Capturing};

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// A multi-threaded runtime with two workers (this project's machines have two cores), with
/// timers and I/O: for tests that need real concurrency.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A single-threaded runtime with timers and I/O.
pub fn local_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Polls a future that must be ready at once (the memory store never waits), without a
/// runtime; panics if it is not.
pub fn ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("expected a ready future"),
    }
}

/// A small deterministic generator (Knuth's MMIX constants) for traces that must be the same
/// on every run.
#[derive(Debug, Clone)]
pub struct Lcg(pub u64);

impl Lcg {
    /// The next 53 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 11
    }

    /// A number in `0..below` (`below` > 0).
    pub fn below(&mut self, below: u64) -> u64 {
        self.next_u64() % below.max(1)
    }
}
