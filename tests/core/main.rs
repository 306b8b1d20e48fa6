//! The core, on the memory store: the arithmetic, waiting, keys, settling, metrics and memory.
//! One binary for all of it (each file a module): a test binary links the whole tree.

mod clock;
mod config;
// Its prompts are counted with the OpenAI vocabulary.
#[cfg(feature = "tiktoken")]
mod counting_off_worker;
mod dual_bucket;
mod extremes;
mod fair_share;
mod key_memory;
mod metrics;
mod no_alloc;
mod penalty_settle;
mod rate_grammar;
mod registry;
mod retry_after;
mod seed_ledger;
mod spend;
mod waiting;
mod window_bound;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Counts what each thread allocates, so that the memory tests (`no_alloc`, `key_memory`) can
/// measure their own thread while the rest of the binary runs beside them.
struct PerThread;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    static LIVE_BYTES: Cell<isize> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to the system allocator unchanged; the counters are
// const-initialised thread-locals without destructors, which never allocate.
unsafe impl GlobalAlloc for PerThread {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        let _ = LIVE_BYTES.try_with(|n| n.set(n.get() + layout.size() as isize));
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let _ = LIVE_BYTES.try_with(|n| n.set(n.get() - layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: PerThread = PerThread;

/// How many allocations this thread has made.
pub(crate) fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// The bytes this thread has allocated and not freed.
pub(crate) fn live_bytes() -> isize {
    LIVE_BYTES.with(Cell::get)
}
