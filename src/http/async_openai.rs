//! async-openai's middleware (feature `async-openai`): a tower layer over its
//! `Service<HttpRequestFactory>`, installed with `Client::with_http_service`.
//!
//! Every attempt the client sends passes through the gate: put this layer inside any retry
//! layer (`OpenAIRetryLayer`), or let the gate retry and use none. A retry layer outside this
//! one sends each of its attempts through tollgate, which pays its toll again; a retry layer
//! inside it would send attempts tollgate never sees.
//!
//! ```no_run
//! use async_openai::Client;
//! use async_openai::config::OpenAIConfig;
//! use async_openai::middleware::ReqwestService;
//! use tollgate::Limits;
//! use tollgate::http::async_openai::GateLayer;
//! use tollgate::http::{Gate, Profile};
//!
//! # fn main() -> Result<(), tollgate::Error> {
//! let gate = Gate::builder(Profile::openai())
//!     .limits(Limits::parse("500/m", "30000/m")?)
//!     .retries(3)
//!     .build()?;
//! let service = tower::ServiceBuilder::new()
//!     .layer(GateLayer::new(gate))
//!     .service(ReqwestService::new(reqwest::Client::new()));
//! let client = Client::with_config(OpenAIConfig::default()).with_http_service(service);
//! # let _ = client;
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use async_openai::error::OpenAIError;
use async_openai::middleware::HttpRequestFactory;

use super::attempt::Attempts;
use super::reqwest::{Failure, Then, after, bytes_of, head_of};

// One layer and one service for every tower stack: `GateService` also speaks async-openai's
// request type, below.
pub use super::tower::{GateLayer, GateService};

fn told(failure: Failure) -> OpenAIError {
    match failure {
        Failure::Gate(err) => OpenAIError::Boxed(Box::new(err)),
        Failure::Permanent(refusal) => OpenAIError::Boxed(Box::new(refusal)),
        Failure::Read(err) => OpenAIError::Reqwest(err),
    }
}

/// async-openai's requests: each pays its toll first, is retried after a transient 429 (up
/// to the gate's retries), fails at once on a permanent one (`OpenAIError::Boxed` holding a
/// [`PermanentRefusal`](super::PermanentRefusal)), and its response body settles the call when
/// it ends, streams included.
impl<S> tower_service::Service<HttpRequestFactory> for GateService<S>
where
    S: tower_service::Service<HttpRequestFactory, Response = reqwest::Response>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<OpenAIError>,
{
    type Response = reqwest::Response;
    type Error = OpenAIError;
    type Future = Pin<Box<dyn Future<Output = Result<reqwest::Response, OpenAIError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), OpenAIError>> {
        self.inner_mut().poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, factory: HttpRequestFactory) -> Self::Future {
        let (mut inner, gate) = self.take();
        Box::pin(async move {
            // Built once to read it; the inner service builds its own for each attempt.
            let (head, bytes) = {
                let request = factory.build().await?;
                (head_of(&request), bytes_of(&request))
            };
            // Every attempt shares the deadline of the first admission.
            let mut attempts = Attempts::new(&gate, &head, &bytes).map_err(|e| told(e.into()))?;
            loop {
                let mut call = attempts.admit().await.map_err(|e| told(e.into()))?;
                if attempts.retried() > 0 {
                    std::future::poll_fn(|cx| inner.poll_ready(cx))
                        .await
                        .map_err(Into::into)?;
                }
                // The body the gate rewrote goes out in each request the factory builds.
                let factory = match call.body().cloned() {
                    Some(body) => {
                        let original = factory.clone();
                        let call_headers = {
                            let mut headers = http::HeaderMap::new();
                            call.rewrite_headers(&mut headers);
                            headers
                        };
                        HttpRequestFactory::new(move || {
                            let (original, body, headers) =
                                (original.clone(), body.clone(), call_headers.clone());
                            async move {
                                let mut request = original.build().await?;
                                request.headers_mut().remove(http::header::CONTENT_ENCODING);
                                request.headers_mut().extend(headers);
                                *request.body_mut() = Some(reqwest::Body::from(body));
                                Ok(request)
                            }
                        })
                    }
                    None => factory.clone(),
                };
                call.sending();
                let response = inner.call(factory).await.map_err(Into::into)?;
                match after(&mut attempts, call, response).await.map_err(told)? {
                    Then::Done(response) => return Ok(response),
                    Then::Retry(delay) => tokio::time::sleep(delay).await,
                }
            }
        })
    }
}
