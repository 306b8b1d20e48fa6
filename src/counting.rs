//! Counting a long prompt takes a while (1 MB of text is about 25 ms of a CPU), and an async
//! worker that counts runs nothing else meanwhile. Past [`OFF_WORKER_ABOVE`] bytes of text, a
//! count on a multi-threaded tokio runtime runs in `block_in_place`, which hands the worker's
//! other tasks to another thread first; shorter texts, and counts on a current-thread runtime
//! (which has no other thread to hand them to), are counted where they are.

/// Texts of at least this many bytes (256 KB, about 60,000 tokens) are counted off the async
/// worker.
pub const OFF_WORKER_ABOVE: usize = 256 << 10;

/// Runs `count` off the async worker when `text_len` says it is long, and the runtime can.
pub(crate) fn count<T>(text_len: usize, count: impl FnOnce() -> T) -> T {
    let multi_threaded = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if text_len >= OFF_WORKER_ABOVE && multi_threaded {
        tokio::task::block_in_place(count)
    } else {
        count()
    }
}
