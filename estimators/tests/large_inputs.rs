//! Large inputs: a 100 MB text is counted in a small multiple of its size, and a 10 MB string
//! without whitespace in far less than quadratic time. One test per file, so that the
//! allocation figures are this test's alone.

#[path = "estimators/common.rs"]
#[allow(dead_code)] // the other tests use the rest
mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tollgate_estimators::{Estimator, estimator};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = CURRENT.fetch_add(by, Ordering::SeqCst) + by;
    PEAK.fetch_max(now, Ordering::SeqCst);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::SeqCst);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            grew(new_size - layout.size());
        } else {
            CURRENT.fetch_sub(layout.size() - new_size, Ordering::SeqCst);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` on another thread and fails if it takes longer than `limit`.
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what} took longer than {limit:?}"))
}

fn names() -> Vec<String> {
    let mut names: Vec<String> = ["openai", "voyageai", "words"].map(String::from).to_vec();
    if cfg!(feature = "huggingface")
        && let Some(path) = common::fixture("gpt-4o")
    {
        names.push(format!("hf:{}", path.display()));
    }
    names
}

#[test]
fn large_inputs_stay_linear_in_memory_and_time() {
    // Load every vocabulary first, so their tables don't count as the text's cost.
    let estimators: Vec<_> = names().iter().map(|n| estimator(n).unwrap()).collect();
    for est in &estimators {
        est.count("warm up");
    }

    let paragraph = common::sample("english.txt");
    let size = 100 << 20;
    let text: String = paragraph.repeat(size / paragraph.len() + 1);
    for est in &estimators {
        let base = CURRENT.load(Ordering::SeqCst);
        PEAK.store(base, Ordering::SeqCst);
        let started = Instant::now();
        let tokens = est.count(&text);
        let extra = PEAK.load(Ordering::SeqCst) - base;
        eprintln!(
            "{}: {} tokens in {:?}, peak extra memory {} MB for {} MB of text",
            est.name(),
            tokens,
            started.elapsed(),
            extra >> 20,
            text.len() >> 20
        );
        assert!(tokens > text.len() / 10, "{}: {tokens}", est.name());
        assert!(
            extra <= 3 * text.len(),
            "{}: {} MB extra for {} MB",
            est.name(),
            extra >> 20,
            text.len() >> 20
        );
    }
    drop(text);

    // 50 MB of one character: one pre-tokenized piece. Quadratic work on it would take hours,
    // and encoding it whole takes gigabytes; the time limit is generous for a slow debug build
    // but far below that, and the memory stays a small multiple of the text.
    let text = "a".repeat(50 << 20);
    let text = std::sync::Arc::new(text);
    for est in estimators {
        let name = est.name().to_owned();
        let text = std::sync::Arc::clone(&text);
        let base = CURRENT.load(Ordering::SeqCst);
        PEAK.store(base, Ordering::SeqCst);
        let tokens = within(Duration::from_secs(240), &name, move || {
            let started = Instant::now();
            let tokens = est.count(&text);
            (tokens, started.elapsed())
        });
        let extra = PEAK.load(Ordering::SeqCst) - base;
        eprintln!(
            "{name}: 50 MB without whitespace: {} tokens in {:?}, peak extra memory {} MB",
            tokens.0,
            tokens.1,
            extra >> 20
        );
        assert!(tokens.0 > 0);
        assert!(extra <= 500 << 20, "{name}: {} MB extra", extra >> 20);
    }
}
