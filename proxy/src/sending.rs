//! A metered call on its way: its attempts, the pool it may move in, the head the toll read,
//! and what its log line and metrics will say. The sending (`send.rs`) carries it from attempt
//! to attempt; each attempt (`attempt.rs`) and what becomes of its answer (`deliver.rs`)
//! read and fill it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tollgate::http::Attempts;

use crate::admit::TenantView;
use crate::exchange::Exchange;
use crate::pool::Members;
use crate::relay::Unread;
use crate::settle::CallLog;
use crate::state::ReadyUpstream;

/// A metered call on its way (see the module's docs).
pub(crate) struct Sending<'e, 's> {
    pub(crate) exchange: &'e Exchange<'s>,
    pub(crate) members: Members<'e>,
    pub(crate) attempts: Attempts,
    /// The request's head at its own upstream, as the toll read it.
    pub(crate) head: http::request::Parts,
    /// The upstream (or pool member) of the latest attempt.
    pub(crate) upstream: Arc<ReadyUpstream>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) log: Arc<Mutex<CallLog>>,
    pub(crate) tenant_view: Option<TenantView>,
    /// Whether the answer is read to its end if the client leaves it.
    pub(crate) drain: bool,
    pub(crate) started: Instant,
    /// The time the upstreams took to answer, over every attempt.
    pub(crate) upstream_time: Duration,
    /// How long the client may leave the answer unread.
    pub(crate) unread: Unread,
}

impl Sending<'_, '_> {
    /// Whether the call's deadline is still ahead.
    pub(crate) fn in_time(&self) -> bool {
        self.deadline.is_none_or(|d| Instant::now() < d)
    }
}
