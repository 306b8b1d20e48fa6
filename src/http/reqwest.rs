//! What the reqwest-based adapters (async-openai, reqwest-middleware) share: a request's head
//! as `http` types, and what to do with a `reqwest::Response`.

use std::time::Duration;

use reqwest::ResponseBuilderExt as _;

use super::attempt::{Attempts, Next};
use super::call::Call;
use super::verdict::PermanentRefusal;

/// Why an adapter's call failed, before it is told in the client's own error type.
#[derive(Debug)]
pub(crate) enum Failure {
    /// tollgate refused or could not wait (timeout, store down, ...).
    Gate(crate::error::Error),
    /// A 429 no retry can fix.
    Permanent(PermanentRefusal),
    /// The body of a 429 could not be read.
    Read(reqwest::Error),
}

impl From<crate::error::Error> for Failure {
    fn from(err: crate::error::Error) -> Failure {
        Failure::Gate(err)
    }
}

/// What to do after a response.
pub(crate) enum Then {
    /// Hand this response to the caller.
    Done(reqwest::Response),
    /// Send the request again after this long.
    Retry(Duration),
}

/// The request's head as `http` types, for the gate's key function.
pub(crate) fn head_of(request: &reqwest::Request) -> http::request::Parts {
    let built = http::Request::builder()
        .method(request.method().clone())
        .uri(request.url().as_str())
        .body(());
    let (mut parts, ()) = built
        .unwrap_or_else(|_| http::Request::new(()))
        .into_parts();
    parts.headers = request.headers().clone();
    parts
}

/// The request body's bytes (empty for a streaming body, which is sent with the cost of an
/// empty one).
pub(crate) fn bytes_of(request: &reqwest::Request) -> Vec<u8> {
    request
        .body()
        .and_then(reqwest::Body::as_bytes)
        .map(<[u8]>::to_vec)
        .unwrap_or_default()
}

/// Rebuilds `response` (keeping its URL, headers and extensions) around another body.
fn rebuild(
    url: reqwest::Url,
    parts: http::response::Parts,
    body: reqwest::Body,
) -> reqwest::Response {
    let mut builder = http::Response::builder()
        .status(parts.status)
        .version(parts.version)
        .url(url);
    if let Some(headers) = builder.headers_mut() {
        *headers = parts.headers;
    }
    if let Some(extensions) = builder.extensions_mut() {
        extensions.extend(parts.extensions);
    }
    reqwest::Response::from(builder.body(body).expect("the parts of a valid response"))
}

/// The request to send for `call`: the caller's, or with the body the gate rewrote.
#[cfg_attr(not(feature = "reqwest-middleware"), allow(dead_code))]
pub(crate) fn rewritten(call: &Call, mut request: reqwest::Request) -> reqwest::Request {
    if let Some(body) = call.body() {
        call.rewrite_headers(request.headers_mut());
        *request.body_mut() = Some(reqwest::Body::from(body.clone()));
    }
    request
}

/// Reads the response into `call` through `attempts` (header sync; a 429's verdict), and
/// answers what the adapter does next: hand over the response, its body metered so that the
/// call settles when it ends, or retry (within the deadline shared by every attempt).
pub(crate) async fn after(
    attempts: &mut Attempts,
    call: Call,
    response: reqwest::Response,
) -> Result<Then, Failure> {
    let url = response.url().clone();
    let (parts, body) = http::Response::<reqwest::Body>::from(response).into_parts();
    let next = attempts
        .answered(call, parts.status, &parts.headers, body)
        .await
        .map_err(Failure::Read)?;
    match next {
        Next::Deliver(metered) => Ok(Then::Done(rebuild(
            url,
            parts,
            reqwest::Body::wrap(*metered),
        ))),
        Next::Retry(delay) => Ok(Then::Retry(delay)),
        Next::HandOn {
            past_deadline: Some(err),
            ..
        } => Err(Failure::Gate(err)),
        Next::HandOn { body, .. } => Ok(Then::Done(rebuild(url, parts, reqwest::Body::from(body)))),
        Next::Refused { refusal, .. } => Err(Failure::Permanent(refusal)),
    }
}
