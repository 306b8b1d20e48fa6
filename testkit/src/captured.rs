//! A `tracing` subscriber that keeps every field of every event and span as text, for tests
//! that check what was logged (a warning given once, a secret never printed).

use std::sync::{Arc, Mutex, PoisonError};

/// What was logged while it was the default subscriber (`tracing::subscriber::set_default`),
/// one event or span per line, each field as `name=value`.
#[derive(Debug, Clone, Default)]
pub struct Captured(Arc<Mutex<String>>);

impl Captured {
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
}

struct Fields<'a>(&'a mut String);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={value:?} ", field.name()));
    }
}

impl tracing::Subscriber for Captured {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut text = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        span.record(&mut Fields(&mut text));
        text.push('\n');
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        let mut text = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        values.record(&mut Fields(&mut text));
        text.push('\n');
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut text = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        event.record(&mut Fields(&mut text));
        text.push('\n');
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
