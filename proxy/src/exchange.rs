//! One request's context, carried through every phase: the shared state, the upstream and
//! route it goes to, its tenant, its head and body; and, for a metered call, the pool it may
//! go to, as the toll found it.

use std::sync::Arc;

use bytes::Bytes;

use crate::health::Ejection;
use crate::route::Route;
use crate::state::{ReadyUpstream, Shared};
use crate::tenant::Tenant;

/// A request once it has a route, a tenant and a body.
pub(crate) struct Exchange<'s> {
    pub(crate) shared: &'s Arc<Shared>,
    pub(crate) upstream: Arc<ReadyUpstream>,
    pub(crate) route: Route,
    pub(crate) tenant: Option<Tenant>,
    /// The head as the client sent it.
    pub(crate) client: http::request::Parts,
    /// The body as the client sent it.
    pub(crate) body: Bytes,
}

/// The pool a metered call may go to: its members (none: the call has no pool) and the pool's
/// rules, found once, by the toll.
pub(crate) struct CallPool {
    pub(crate) members: Vec<Arc<ReadyUpstream>>,
    pub(crate) ejection: Ejection,
    /// How long one attempt may wait for its first byte.
    pub(crate) attempt_timeout: Option<std::time::Duration>,
}
