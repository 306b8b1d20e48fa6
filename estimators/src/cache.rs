//! A bounded cache of counts, for texts that come back: an agent re-sends its whole
//! conversation with every call, so without one, counting grows with the square of the
//! session.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::{Mutex, PoisonError};

use crate::{Estimator, ImageRule, ToolOverheads};

/// Texts shorter than this are counted every time. It is low: a byte-pair count of even a
/// one-line system prompt costs several times a lookup (its encoder is set up per text), so
/// short texts that come back with every call are worth keeping too. Texts shorter than
/// [`LONG_FROM`] are kept apart, so that a stream of one-off short prompts never pushes a
/// conversation's long messages out.
pub const CACHE_ABOVE: usize = 16;
/// Texts from this long are remembered apart from shorter ones.
pub const LONG_FROM: usize = 256;
/// How many counts are kept, at most, per estimator.
const CAPACITY: usize = 16_384;
const SHARDS: usize = 8;

/// A text's fingerprint: its length, and a keyed hash of its bytes (keyed per process, so that
/// nobody can make two texts meet on purpose).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Fingerprint {
    len: usize,
    hash: u64,
}

/// The last counts, in two generations: a full generation becomes the old one, and the old one
/// is dropped. What is looked up in the old generation comes back into the new one, so the
/// counts in use stay and the rest go, in bounded memory and O(1) per operation.
#[derive(Default)]
struct Generations {
    new: HashMap<Fingerprint, usize>,
    old: HashMap<Fingerprint, usize>,
}

impl Generations {
    fn get(&mut self, key: Fingerprint) -> Option<usize> {
        if let Some(count) = self.new.get(&key) {
            return Some(*count);
        }
        let count = self.old.remove(&key)?;
        self.put(key, count);
        Some(count)
    }

    fn put(&mut self, key: Fingerprint, count: usize) {
        if self.new.len() >= CAPACITY / SHARDS / 2 {
            self.old = std::mem::take(&mut self.new);
        }
        self.new.insert(key, count);
    }
}

/// An estimator whose counts of long texts are remembered.
///
/// The same text is counted once; looking it up again costs a hash of it, far less than
/// counting. Memory is bounded (about 16,000 counts of long texts and as many of short ones), and no lock is held while counting, so
/// concurrent counts of different texts don't wait for each other. The estimators that
/// [`estimator`](crate::estimator) gives are cached this way.
///
/// ```
/// use tollgate_estimators::{Cached, Estimator, Words};
///
/// let cached = Cached::new(Words);
/// let long = "words ".repeat(100);
/// assert_eq!(cached.count(&long), Words.count(&long));
/// assert_eq!(cached.count(&long), Words.count(&long)); // a lookup this time
/// ```
pub struct Cached<E> {
    inner: E,
    keys: RandomState,
    /// Texts from [`LONG_FROM`] bytes.
    shards: [Mutex<Generations>; SHARDS],
    /// Shorter texts, in a cache of their own.
    short: [Mutex<Generations>; SHARDS],
}

impl<E: Estimator> Cached<E> {
    /// `inner`, with a cache of its counts.
    pub fn new(inner: E) -> Cached<E> {
        Cached {
            inner,
            keys: RandomState::new(),
            shards: Default::default(),
            short: Default::default(),
        }
    }

    /// The estimator underneath.
    pub fn inner(&self) -> &E {
        &self.inner
    }

    fn fingerprint(&self, text: &str) -> Fingerprint {
        let mut hasher = self.keys.build_hasher();
        hasher.write(text.as_bytes());
        Fingerprint {
            len: text.len(),
            hash: hasher.finish(),
        }
    }
}

impl<E: std::fmt::Debug> std::fmt::Debug for Cached<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Cached").field(&self.inner).finish()
    }
}

impl<E: Estimator> Estimator for Cached<E> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn count(&self, text: &str) -> usize {
        if text.len() < CACHE_ABOVE {
            return self.inner.count(text);
        }
        let key = self.fingerprint(text);
        let shards = if text.len() < LONG_FROM {
            &self.short
        } else {
            &self.shards
        };
        let shard = &shards[(key.hash as usize) % SHARDS];
        if let Some(count) = shard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
        {
            return count;
        }
        // Counted without the lock: a long text takes a while, and others needn't wait.
        let count = self.inner.count(text);
        shard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .put(key, count);
        count
    }

    fn tool_overheads(&self) -> Option<ToolOverheads> {
        self.inner.tool_overheads()
    }

    fn image_rule(&self) -> ImageRule {
        self.inner.image_rule()
    }

    fn errs_high(&self) -> bool {
        self.inner.errs_high()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Counts words, and how many times it was asked.
    #[derive(Debug, Default)]
    struct Asked(AtomicUsize);

    impl Estimator for Asked {
        fn name(&self) -> &str {
            "asked"
        }

        fn count(&self, text: &str) -> usize {
            self.0.fetch_add(1, Ordering::Relaxed);
            text.split_whitespace().count()
        }
    }

    #[test]
    fn one_off_short_prompts_never_push_long_messages_out() {
        let cached = Cached::new(Asked::default());
        let conversation: Vec<String> = (0..40)
            .map(|i| format!("message {i} ").repeat(100))
            .collect();
        for message in &conversation {
            cached.count(message);
        }
        // Far more one-off short prompts than the cache holds.
        for i in 0..(2 * CAPACITY) {
            cached.count(&format!("a short prompt, number {i}"));
        }
        let before = cached.inner().0.load(Ordering::Relaxed);
        for message in &conversation {
            cached.count(message);
        }
        assert_eq!(cached.inner().0.load(Ordering::Relaxed), before);
        // A short text that comes back is found too.
        let prompt = "Answer in one line.";
        cached.count(prompt);
        cached.count(prompt);
        assert_eq!(cached.inner().0.load(Ordering::Relaxed), before + 1);
    }
}
