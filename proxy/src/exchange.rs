//! One request's context, carried through every phase: the shared state, the upstream and
//! route it goes to, its tenant, its head and body.

use std::sync::Arc;

use bytes::Bytes;

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
