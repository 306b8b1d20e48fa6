//! One request's attempts through a gate, the step every adapter drives: read and estimate the
//! request once, admit each attempt under one deadline, and after each answer say what comes
//! next (deliver it metered, retry after a pause, hand a 429 on, or refuse for good).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body::Body;
use tokio::time::Instant;

use super::body::{MeteredBody, is_event_stream, read_short};
use super::call::{Call, SettledFn};
use super::gate::{Estimated, Gate};
use super::verdict::{PermanentRefusal, Verdict};
use crate::error::Error;
use crate::limiter::Permit;

/// What an adapter does after an answer.
#[derive(Debug)]
#[non_exhaustive]
pub enum Next<B> {
    /// Hand the answer on, its body metered: the call settles when the body ends.
    Deliver(Box<MeteredBody<B>>),
    /// A transient 429: send the request again after this long (the call was counted; the
    /// key is paused for the provider's pause).
    Retry(Duration),
    /// A transient 429 that is not retried: no retries are left (`past_deadline` is `None`),
    /// or its pause would end past the call's deadline (the [`Error::Timeout`] carrying the
    /// pause). Its body, read.
    HandOn {
        /// The 429's body.
        body: Bytes,
        /// Why it was not retried, when the deadline is why.
        past_deadline: Option<Error>,
    },
    /// A 429 no retry can fix: a spent quota or a spend limit.
    Refused {
        /// What the provider said.
        refusal: PermanentRefusal,
        /// The 429's body.
        body: Bytes,
    },
}

/// One request's attempts through a [`Gate`].
///
/// ```
/// use tollgate::Limits;
/// use tollgate::http::{Attempts, Gate, Next, Profile};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let gate = Gate::builder(Profile::openai())
///     .limits(Limits::parse("500/m", "30000/m")?)
///     .build()?;
/// let body = br#"{"model":"gpt-4o","max_tokens":50,"messages":[{"role":"user","content":"Hi"}]}"#;
/// let (parts, ()) = http::Request::post("https://api.openai.com/v1/chat/completions")
///     .body(())?
///     .into_parts();
/// let mut attempts = Attempts::new(&gate, &parts, body)?;
/// loop {
///     let mut call = attempts.admit().await?;
///     call.sending();
///     // ... send `call.body()` (or the caller's body); then, with the answer's head and body:
///     let answer = http_body_util::Full::new(bytes::Bytes::from_static(br#"{"usage":{"prompt_tokens":9,"completion_tokens":2}}"#));
///     match attempts.answered(call, http::StatusCode::OK, &http::HeaderMap::new(), answer).await? {
///         Next::Deliver(metered) => { let _ = metered; break; }
///         Next::Retry(delay) => tokio::time::sleep(delay).await,
///         _ => break,
///     }
/// }
/// # Ok(())
/// # }
/// ```
pub struct Attempts {
    gate: Gate,
    estimated: Estimated,
    deadline: Option<Instant>,
    started: Instant,
    attempt: u32,
    /// Other windows the request was charged in (a tenant's): carried from attempt to attempt,
    /// attached to the call that is delivered, given back if none is.
    extras: Vec<Permit>,
    /// An attempt was admitted (and so, most likely, sent).
    admitted: bool,
    /// Whether this attempt's request can be sent again.
    can_retry: bool,
    /// Told how the delivered call settled.
    on_settled: Option<SettledFn>,
}

impl std::fmt::Debug for Attempts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attempts")
            .field("estimated", &self.estimated)
            .field("attempt", &self.attempt)
            .field("extras", &self.extras.len())
            .finish_non_exhaustive()
    }
}

impl Drop for Attempts {
    fn drop(&mut self) {
        // No attempt went out: the other windows' charges come back. One that went out and
        // was never delivered (the caller went away waiting for it) keeps them, as the call
        // keeps its own.
        if !self.admitted {
            self.give_back();
        }
    }
}

impl Attempts {
    /// Reads and estimates the request ([`Gate::read`]); its deadline (the gate's
    /// [`timeout`](super::GateBuilder::timeout)) starts now.
    pub fn new(gate: &Gate, parts: &http::request::Parts, body: &[u8]) -> Result<Attempts, Error> {
        let estimated = gate.read(parts, body)?;
        Ok(Attempts::of(gate, estimated))
    }

    /// Attempts of a request already read.
    pub fn of(gate: &Gate, estimated: Estimated) -> Attempts {
        Attempts {
            gate: gate.clone(),
            estimated,
            deadline: gate.deadline(),
            started: Instant::now(),
            attempt: 0,
            extras: Vec::new(),
            admitted: false,
            can_retry: true,
            on_settled: None,
        }
    }

    /// The request as the gate read it.
    pub fn estimated(&self) -> &Estimated {
        &self.estimated
    }

    /// The deadline every attempt shares (`None`: none).
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// How many attempts were refused and retried so far.
    pub fn retried(&self) -> u32 {
        self.attempt
    }

    /// Charges the request in other windows too (a tenant's): `permit` goes with the call
    /// that is delivered (settled with its usage), and comes back if none is.
    pub fn attach(&mut self, permit: Permit) {
        self.extras.push(permit);
    }

    /// Calls `told` once the delivered call settles (see [`Call::on_settled`]).
    pub fn on_settled(&mut self, told: SettledFn) {
        self.on_settled = Some(told);
    }

    /// Whether the request can be sent again (a streaming body can't): when it can't, a
    /// transient 429 is handed on instead of retried.
    pub fn can_retry(&mut self, can: bool) {
        self.can_retry = can;
    }

    /// Moves the next attempts to another gate, under the key `key` there: a deployment of a
    /// pool that serves the same model. The request is not read again: its estimate (and the
    /// body the gate will send) stays, so the gates should share one profile.
    pub fn switch(&mut self, gate: &Gate, key: String) {
        self.gate = gate.clone();
        self.estimated.key = key;
    }

    /// The gate the next attempt goes through.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// Admits the next attempt only if it can pay now: otherwise [`Error::Timeout`] says how
    /// long it would wait (`needed`), and nothing is charged. For choosing among gates.
    pub async fn admit_now(&mut self) -> Result<Call, Error> {
        let call = self.gate.admit_estimated_now(&self.estimated).await?;
        self.admitted = true;
        Ok(call)
    }

    /// Waits for the next attempt's toll.
    pub async fn admit(&mut self) -> Result<Call, Error> {
        let call = self
            .gate
            .admit_estimated(&self.estimated, self.deadline)
            .await?;
        self.admitted = true;
        Ok(call)
    }

    /// Reads an answer into `call` (header sync, a 429's verdict and pause, read from its
    /// headers or, for Gemini, its body) and says what comes next. Fails only when a 429's
    /// body can't be read.
    pub async fn answered<B>(
        &mut self,
        mut call: Call,
        status: StatusCode,
        headers: &HeaderMap,
        body: B,
    ) -> Result<Next<B>, B::Error>
    where
        B: Body,
        B::Data: Into<Bytes>,
    {
        if status != StatusCode::TOO_MANY_REQUESTS {
            let stream = is_event_stream(headers) || call.is_stream();
            if !stream {
                call.whole_answer();
            }
            call.respond(status, headers, None).await;
            for permit in self.extras.drain(..) {
                call.attach(permit);
            }
            if let Some(told) = self.on_settled.take() {
                call.on_settled(told);
            }
            return Ok(Next::Deliver(Box::new(MeteredBody::new(
                body, call, stream,
            ))));
        }
        let error = read_short(body, self.deadline).await?;
        let verdict = call.respond(status, headers, Some(&error)).await;
        let key = call.key().to_owned();
        drop(call);
        match verdict {
            Verdict::Permanent { code, message } => {
                self.give_back();
                Ok(Next::Refused {
                    refusal: PermanentRefusal {
                        profile: self.gate.profile().name().to_owned(),
                        code,
                        message,
                    },
                    body: error,
                })
            }
            Verdict::Transient { pause }
                if self.can_retry && self.attempt < self.gate.retries() =>
            {
                match self
                    .gate
                    .retry_within(&key, self.attempt, pause, self.deadline, self.started)
                {
                    Ok(delay) => {
                        self.attempt += 1;
                        Ok(Next::Retry(delay))
                    }
                    Err(err) => {
                        self.give_back();
                        Ok(Next::HandOn {
                            body: error,
                            past_deadline: Some(err),
                        })
                    }
                }
            }
            _ => {
                self.give_back();
                Ok(Next::HandOn {
                    body: error,
                    past_deadline: None,
                })
            }
        }
    }

    /// The other windows' charges come back: no call of this request is delivered.
    fn give_back(&mut self) {
        for permit in self.extras.drain(..) {
            permit.give_back();
        }
    }
}
