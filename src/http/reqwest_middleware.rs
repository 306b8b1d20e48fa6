//! A `reqwest-middleware` `Middleware` (feature `reqwest-middleware`).
//!
//! Where it goes: between any retry middleware and the network, that is *after* it in the
//! builder (`.with(retry).with(gate)`: middleware added later runs closer to the network), so
//! that every attempt the retry middleware makes passes through the gate and pays its toll.
//! Or let the gate retry ([`GateBuilder::retries`](super::GateBuilder::retries)) and use no
//! retry middleware for 429s.
//!
//! ```
//! use reqwest_middleware::ClientBuilder;
//! use tollgate::Limits;
//! use tollgate::http::reqwest_middleware::GateMiddleware;
//! use tollgate::http::{Gate, Profile};
//!
//! # fn main() -> Result<(), tollgate::Error> {
//! let gate = Gate::builder(Profile::anthropic())
//!     .limits(Limits::parse("50/m", "40000/m")?)
//!     .build()?;
//! let client = ClientBuilder::new(reqwest::Client::new())
//!     .with(GateMiddleware::new(gate))
//!     .build();
//! # let _ = client;
//! # Ok(())
//! # }
//! ```

use http::Extensions;
use reqwest_middleware::{Middleware, Next};

use super::attempt::Attempts;
use super::gate::Gate;
use super::reqwest::{Failure, Then, after, bytes_of, head_of, rewritten};

/// The middleware: every request pays its toll first, is retried after a transient 429 (up to
/// the gate's retries, when its body can be sent again), fails at once on a permanent one
/// (`reqwest_middleware::Error::Middleware` holding a
/// [`PermanentRefusal`](super::PermanentRefusal)), and its response body settles the call when
/// it ends.
#[derive(Debug, Clone)]
pub struct GateMiddleware {
    gate: Gate,
}

impl GateMiddleware {
    /// A middleware that sends every request through `gate`.
    pub fn new(gate: Gate) -> GateMiddleware {
        GateMiddleware { gate }
    }
}

fn told(failure: Failure) -> reqwest_middleware::Error {
    match failure {
        Failure::Gate(err) => reqwest_middleware::Error::middleware(err),
        Failure::Permanent(refusal) => reqwest_middleware::Error::middleware(refusal),
        Failure::Read(err) => reqwest_middleware::Error::Reqwest(err),
    }
}

#[async_trait::async_trait]
impl Middleware for GateMiddleware {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let (head, bytes) = (head_of(&request), bytes_of(&request));
        let mut pending = Some(request);
        // Every attempt shares the deadline of the first admission.
        let mut attempts = Attempts::new(&self.gate, &head, &bytes).map_err(|e| told(e.into()))?;
        loop {
            let request = pending
                .take()
                .expect("a retry is only answered for a request that could be cloned");
            // A body that can't be sent again (a stream) is sent once.
            let again = request.try_clone();
            attempts.can_retry(again.is_some());
            let mut call = attempts.admit().await.map_err(|e| told(e.into()))?;
            let request = rewritten(&call, request);
            call.sending();
            let response = next.clone().run(request, extensions).await?;
            match after(&mut attempts, call, response).await.map_err(told)? {
                Then::Done(response) => return Ok(response),
                Then::Retry(delay) => {
                    // `answered` retries only a request that could be cloned.
                    tokio::time::sleep(delay).await;
                    pending = again;
                }
            }
        }
    }
}
