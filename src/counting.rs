//! Counting a long prompt takes a while (1 MB of text is about 25 ms of a CPU), and an async
//! worker that counts runs nothing else meanwhile. Past a threshold of text (256 KB by default,
//! set with [`LimiterBuilder::count_off_worker_above`](crate::LimiterBuilder::count_off_worker_above)
//! and the HTTP gate's `GateBuilder::count_off_worker_above`),
//! a count on a multi-threaded tokio runtime runs in `block_in_place`, which hands the worker's
//! other tasks to another thread first; shorter texts, and counts on a current-thread runtime
//! (which has no other thread to hand them to), are counted where they are.

use std::sync::Arc;

use tollgate_estimators::Estimator;

use crate::error::Error;

/// Texts of at least this many bytes (256 KB, about 60,000 tokens) are counted off the async
/// worker unless a builder says otherwise.
pub(crate) const DEFAULT_OFF_WORKER_ABOVE: usize = 256 << 10;

/// Runs `count` off the async worker when `text_len` is at least `above`, and the runtime can.
pub(crate) fn count<T>(above: usize, text_len: usize, count: impl FnOnce() -> T) -> T {
    let multi_threaded = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if text_len >= above && multi_threaded {
        tokio::task::block_in_place(count)
    } else {
        count()
    }
}

/// The estimator a user named (in the macro, a configuration file, a builder or a profile):
/// loaded once per process, off the async worker (reading a vocabulary takes a while), and
/// strict: a vocabulary that can't be loaded is an error, never a quiet fallback to another
/// count. This is the one place a name from a user becomes an estimator.
pub(crate) fn estimator_named(name: &str) -> Result<Arc<dyn Estimator>, Error> {
    Ok(count(0, usize::MAX, || {
        tollgate_estimators::estimator_strict(name)
    })?)
}
