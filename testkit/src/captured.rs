//! A `tracing` capture that keeps every field of every event and span as text, for tests
//! that check what was logged (a warning given once, a secret never printed).
//!
//! One subscriber is installed for the whole process, the first time a test captures, and it
//! hands each event to the capture of the thread it happens on. A subscriber set per thread
//! (`tracing::subscriber::set_default`) would race: a callsite first reached on another
//! thread, while no capture existed, can be cached as switched off for everyone.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, Once, PoisonError};

/// What was logged on this thread while [`capture`](Captured::capture)'s guard lived, one
/// event or span per line, each field as `name=value`.
#[derive(Debug, Clone, Default)]
pub struct Captured(Arc<Mutex<String>>);

thread_local! {
    static CURRENT: RefCell<Option<Captured>> = const { RefCell::new(None) };
}

/// Ends a capture when dropped, giving the thread back the one it had before.
#[must_use = "the capture ends when this is dropped"]
pub struct Capturing(Option<Captured>);

impl Drop for Capturing {
    fn drop(&mut self) {
        let before = self.0.take();
        CURRENT.with(|current| *current.borrow_mut() = before);
    }
}

impl Captured {
    /// Captures what this thread logs until the guard is dropped.
    pub fn capture(&self) -> Capturing {
        static INSTALL: Once = Once::new();
        INSTALL.call_once(|| {
            // A test binary that set its own global subscriber keeps it (and captures
            // nothing): every test here captures through this one.
            let _ = tracing::subscriber::set_global_default(Relay);
        });
        let before = CURRENT.with(|current| current.borrow_mut().replace(self.clone()));
        Capturing(before)
    }

    /// Everything logged so far.
    pub fn text(&self) -> String {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many logged lines contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.text().lines().filter(|l| l.contains(needle)).count()
    }

    fn push(&self, write: impl FnOnce(&mut String)) {
        let mut text = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        write(&mut text);
        text.push('\n');
    }
}

/// Runs `f` with this thread's capture, if any.
fn with_current(f: impl FnOnce(&Captured)) {
    // `try_with`: an event logged while the thread is being torn down is dropped.
    let _ = CURRENT.try_with(|current| {
        if let Some(captured) = current.borrow().as_ref() {
            f(captured);
        }
    });
}

struct Fields<'a>(&'a mut String);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={value:?} ", field.name()));
    }
}

/// The process's subscriber: everything is of interest, and goes to the thread's capture.
struct Relay;

impl tracing::Subscriber for Relay {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        with_current(|c| c.push(|text| span.record(&mut Fields(text))));
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        with_current(|c| c.push(|text| values.record(&mut Fields(text))));
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        with_current(|c| c.push(|text| event.record(&mut Fields(text))));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
