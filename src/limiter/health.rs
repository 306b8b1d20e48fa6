//! How the waiters of a key on a store that can fail learn of a failure together.
//!
//! Every answer from the store is a sign of life; every "unavailable" is published to every
//! call sleeping on the limiter, which then fails at once instead of learning it one by one at
//! its own turn. While calls sleep and nothing else talks to the store, a watchdog asks it
//! once nothing has answered for two [`Store::health_interval`]s and no waiter is about to ask,
//! so that a server that died or stopped is noticed within about three intervals and a store
//! timeout even when nobody is due (for Redis, the interval is half of
//! `RedisConfig::with_liveness`: a limiter that is busy, or whose waiters ask often enough,
//! never pings).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{Inner, Limiter};
use crate::error::Error;
use crate::store::{Op, Store};

pub(super) struct Health {
    failures: watch::Sender<Option<Arc<Error>>>,
    origin: Instant,
    /// Nanoseconds from `origin` to the last answer from the store.
    last_contact: AtomicU64,
    watchdog: AtomicBool,
    interval: Duration,
}

impl Health {
    fn new(interval: Duration) -> Health {
        Health {
            failures: watch::Sender::new(None),
            origin: Instant::now(),
            last_contact: AtomicU64::new(0),
            watchdog: AtomicBool::new(false),
            interval,
        }
    }

    fn since_origin(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn touch(&self) {
        self.last_contact
            .store(self.since_origin(), Ordering::Relaxed);
    }

    fn heard_within(&self, interval: Duration) -> bool {
        let last = self.last_contact.load(Ordering::Relaxed);
        Duration::from_nanos(self.since_origin().saturating_sub(last)) < interval
    }

    fn fail(&self, err: &Error) {
        self.failures.send_replace(Some(Arc::new(err.duplicate())));
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<Option<Arc<Error>>> {
        self.failures.subscribe()
    }
}

impl<S: Store> Inner<S> {
    pub(super) fn health(&self) -> Option<&Health> {
        let interval = self.store.health_interval()?;
        Some(self.health.get_or_init(|| Health::new(interval)))
    }

    /// Takes note of what the store answered.
    pub(super) fn note<T>(&self, result: &Result<T, Error>) {
        if let Some(health) = self.health() {
            match result {
                Ok(_) => health.touch(),
                Err(err @ Error::Unavailable { .. }) => health.fail(err),
                Err(_) => {}
            }
        }
    }
}

impl<S: Store> Limiter<S> {
    /// Starts the watchdog if the store can fail and none runs yet; it ends by itself when no
    /// call waits any more.
    pub(super) fn ensure_watchdog(&self) {
        let Some(health) = self.inner.health() else {
            return;
        };
        if health.watchdog.swap(true, Ordering::AcqRel)
            || tokio::runtime::Handle::try_current().is_err()
        {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let interval = health.interval;
        // A runtime that shuts down drops this task while it sleeps: the flag must not stay
        // set then, or no later waiter (on another runtime) would start a watchdog.
        let rearm = Rearm(Some(weak.clone()));
        let watch = async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(inner) = weak.upgrade() else { return };
                let Some(health) = inner.health() else { return };
                if inner.waiters.load(Ordering::Acquire) == 0 {
                    health.watchdog.store(false, Ordering::Release);
                    // A call that started waiting just now may have seen the flag still set.
                    if inner.waiters.load(Ordering::Acquire) == 0
                        || health.watchdog.swap(true, Ordering::AcqRel)
                    {
                        return;
                    }
                }
                // Quiet for two ticks, and no waiter about to ask: ask. A server that died or
                // stopped is then noticed within three ticks and one store timeout.
                if health.heard_within(2 * interval)
                    || inner.line.asks_within(Instant::now(), 2 * interval)
                {
                    continue;
                }
                let result = inner.store.apply(&inner.bound, Op::Ping).await;
                inner.note(&result);
            }
        };
        tokio::spawn(async move {
            watch.await;
            // Ended by itself: the flag is as the loop left it.
            rearm.disarm();
        });
    }
}

/// Clears the watchdog flag of a limiter whose watchdog was dropped before it ended.
struct Rearm<S: Store>(Option<std::sync::Weak<Inner<S>>>);

impl<S: Store> Rearm<S> {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl<S: Store> Drop for Rearm<S> {
    fn drop(&mut self) {
        if let Some(inner) = self.0.take().and_then(|weak| weak.upgrade())
            && let Some(health) = inner.health()
        {
            health.watchdog.store(false, Ordering::Release);
        }
    }
}
