//! One request's context, carried through every phase: the shared state, the upstream and
//! route it goes to, its tenant, its head and body; and the labels its metrics and log line
//! are written under, filled as the phases learn them.

use std::sync::Arc;

use bytes::Bytes;

use crate::config::Family;
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

/// What a request is counted and logged under, and the shape a rejection is answered in.
pub(crate) struct Labels {
    /// The upstream's name, once the route chose one.
    pub(crate) upstream: Option<String>,
    /// The route's name: `service`, `refused` before a route is found, `chat`, ...
    pub(crate) route: &'static str,
    pub(crate) family: Family,
}

impl Default for Labels {
    fn default() -> Labels {
        Labels {
            upstream: None,
            route: "refused",
            family: Family::OpenAi,
        }
    }
}
