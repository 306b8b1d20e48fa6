//! What a provider sends and how it bills: its rate-limit headers, where usage sits in its
//! answers, where the output a request reserves is charged, and which 429s are final.

use std::borrow::Cow;
use std::fmt;

use super::models::{self, Model, Price};
use crate::rate::{Currencies, Currency};

/// What a 429 costs: the refused request. OpenAI: "unsuccessful requests contribute to your
/// per-minute limit, so continuously resending a request won't work"
/// (<https://platform.openai.com/docs/guides/rate-limits>, error mitigation). Gemini: a failed
/// request "will still count against your quota"
/// (<https://ai.google.dev/gemini-api/docs/rate-limits>). Anthropic's rate-limit page says
/// nothing either way, so its profile follows the other two until it does.
const REFUSAL_COSTS: Currencies = Currencies::NONE.with(Currency::Requests);

/// What a call that names no `max_tokens` reserves when its model is not in the profile's
/// table.
const DEFAULT_OUTPUT: u64 = 4_096;

/// How a provider writes the time until a limit is full again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResetForm {
    /// A Go-style duration: `6m0s`, `1s`, `20ms`, `1h2m3.5s` (OpenAI, Azure OpenAI, Groq).
    Duration,
    /// An RFC 3339 time: `2026-12-01T22:05:00Z` (Anthropic).
    Rfc3339,
    /// Seconds, whole or with a fraction.
    Seconds,
}

/// Where the output a request reserves (`max_tokens` × `n`) is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutputTo {
    /// Into the token windows, with the input: OpenAI counts input plus `max_tokens × n`
    /// against one tokens-per-minute limit.
    Tokens,
    /// Into the output-token windows (when the key has any; nowhere otherwise): Anthropic
    /// limits output tokens per minute apart from input.
    OutputTokens,
    /// Nowhere (embeddings reserve no output).
    Nowhere,
}

/// The three headers a provider sends for one currency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNames {
    /// The currency they count.
    pub currency: Currency,
    /// The configured limit (`x-ratelimit-limit-tokens`).
    pub limit: Cow<'static, str>,
    /// What is left now (`x-ratelimit-remaining-tokens`).
    pub remaining: Cow<'static, str>,
    /// When it is full again (`x-ratelimit-reset-tokens`).
    pub reset: Cow<'static, str>,
}

impl HeaderNames {
    /// The three header names for `currency`.
    pub fn new(
        currency: Currency,
        limit: impl Into<Cow<'static, str>>,
        remaining: impl Into<Cow<'static, str>>,
        reset: impl Into<Cow<'static, str>>,
    ) -> HeaderNames {
        HeaderNames {
            currency,
            limit: lower(limit.into()),
            remaining: lower(remaining.into()),
            reset: lower(reset.into()),
        }
    }
}

/// Header names are matched in lower case, as `http::HeaderMap` keeps them.
fn lower(name: Cow<'static, str>) -> Cow<'static, str> {
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(name.to_ascii_lowercase())
    } else {
        name
    }
}

/// A provider: its headers, its usage fields, where reserved output goes, and its final 429s.
///
/// Start from one of the presets (OpenAI, Azure OpenAI, Anthropic, Voyage, Gemini, Groq, Mistral,
/// generic) and change what differs:
///
/// ```
/// use tollgate::Currency;
/// use tollgate::http::{HeaderNames, Profile, ResetForm};
///
/// // A gateway that speaks OpenAI's bodies but sends its own headers.
/// let profile = Profile::generic("my-gateway")
///     .estimator("openai")
///     .headers(vec![HeaderNames::new(
///         Currency::Tokens,
///         "X-Quota-Limit",
///         "X-Quota-Remaining",
///         "X-Quota-Reset",
///     )])
///     .reset_form(ResetForm::Seconds);
/// assert_eq!(profile.name(), "my-gateway");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Profile {
    pub(crate) name: Cow<'static, str>,
    pub(crate) estimator: Cow<'static, str>,
    pub(crate) headers: Vec<HeaderNames>,
    pub(crate) reset: ResetForm,
    pub(crate) output: OutputTo,
    pub(crate) cache_reads_count: bool,
    pub(crate) permanent_codes: Vec<Cow<'static, str>>,
    pub(crate) permanent_without_retry_after: bool,
    pub(crate) rounding: u64,
    pub(crate) models: Vec<Model>,
    /// Server-side tools' fees per call.
    pub(crate) tool_fees: Vec<models::ToolFee>,
    pub(crate) default_output: u64,
    pub(crate) stream_usage: bool,
    pub(crate) refusal_costs: Currencies,
}

impl fmt::Debug for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Profile")
            .field("name", &self.name)
            .field("estimator", &self.estimator)
            .field("headers", &self.headers.len())
            .field("reset", &self.reset)
            .field("output", &self.output)
            .field("cache_reads_count", &self.cache_reads_count)
            .field("rounding", &self.rounding)
            .field("models", &self.models.len())
            .field("default_output", &self.default_output)
            .field("stream_usage", &self.stream_usage)
            .finish_non_exhaustive()
    }
}

fn openai_headers() -> Vec<HeaderNames> {
    [
        (Currency::Requests, "requests"),
        (Currency::Tokens, "tokens"),
    ]
    .into_iter()
    .map(|(currency, word)| {
        HeaderNames::new(
            currency,
            format!("x-ratelimit-limit-{word}"),
            format!("x-ratelimit-remaining-{word}"),
            format!("x-ratelimit-reset-{word}"),
        )
    })
    .collect()
}

impl Profile {
    /// OpenAI: chat completions, responses and embeddings. Headers
    /// `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` with resets like `6m0s`; usage
    /// `prompt_tokens` + `completion_tokens` (or the responses API's `input_tokens` +
    /// `output_tokens`), in a stream's last chunk when `stream_options.include_usage` is set;
    /// reserved output into the token windows; `insufficient_quota` is final.
    pub fn openai() -> Profile {
        Profile {
            name: Cow::Borrowed("openai"),
            estimator: Cow::Borrowed("openai"),
            headers: openai_headers(),
            reset: ResetForm::Duration,
            output: OutputTo::Tokens,
            cache_reads_count: true,
            permanent_codes: vec![Cow::Borrowed("insufficient_quota")],
            permanent_without_retry_after: false,
            rounding: 0,
            models: models::openai(),
            tool_fees: models::openai_tool_fees(),
            default_output: DEFAULT_OUTPUT,
            stream_usage: true,
            refusal_costs: REFUSAL_COSTS,
        }
    }

    /// Azure OpenAI: OpenAI's bodies and headers (`x-ratelimit-remaining-{requests,tokens}`).
    pub fn azure_openai() -> Profile {
        Profile {
            name: Cow::Borrowed("azure-openai"),
            ..Profile::openai()
        }
    }

    /// Anthropic messages. Headers
    /// `anthropic-ratelimit-{requests,input-tokens,output-tokens}-{limit,remaining,reset}`
    /// (remaining counts rounded to the thousand, read as the most they could be: see
    /// [`remaining_rounded_to`](Profile::remaining_rounded_to); resets as RFC 3339 times); usage
    /// `input_tokens` + `cache_creation_input_tokens` (cache reads left out of the input limit,
    /// as for most models; see [`cache_reads_count`](Profile::cache_reads_count)) and
    /// `output_tokens`, in a stream's `message_start` and `message_delta` events; reserved output
    /// into the output-token windows; a 429 without `retry-after` (a spend limit) is final.
    pub fn anthropic() -> Profile {
        let headers = [
            (Currency::Requests, "requests"),
            (Currency::Tokens, "input-tokens"),
            (Currency::OutputTokens, "output-tokens"),
        ]
        .into_iter()
        .map(|(currency, word)| {
            HeaderNames::new(
                currency,
                format!("anthropic-ratelimit-{word}-limit"),
                format!("anthropic-ratelimit-{word}-remaining"),
                format!("anthropic-ratelimit-{word}-reset"),
            )
        })
        .collect();
        Profile {
            name: Cow::Borrowed("anthropic"),
            estimator: Cow::Borrowed("openai"),
            headers,
            reset: ResetForm::Rfc3339,
            output: OutputTo::OutputTokens,
            cache_reads_count: false,
            permanent_codes: Vec::new(),
            permanent_without_retry_after: true,
            rounding: 1_000,
            models: models::anthropic(),
            tool_fees: models::anthropic_tool_fees(),
            default_output: DEFAULT_OUTPUT,
            stream_usage: false,
            refusal_costs: REFUSAL_COSTS,
        }
    }

    /// Voyage AI embeddings: the `voyageai` estimator, usage `total_tokens`, OpenAI-style
    /// headers if any are sent.
    pub fn voyage() -> Profile {
        Profile {
            name: Cow::Borrowed("voyage"),
            estimator: Cow::Borrowed("voyageai"),
            output: OutputTo::Nowhere,
            permanent_codes: Vec::new(),
            models: models::voyage(),
            default_output: 0,
            stream_usage: false,
            ..Profile::openai()
        }
    }

    /// Google Gemini through its OpenAI-compatible endpoint (`.../v1beta/openai`): OpenAI's
    /// bodies and usage fields, but no rate-limit headers at all, so nothing to sync; its limits
    /// are per model (requests and input tokens per minute, requests per day). A 429 is
    /// `RESOURCE_EXHAUSTED`, and says how long to wait only in its JSON body
    /// (`RetryInfo.retryDelay`, read by the gate);
    /// reserved output goes to the output-token windows, if the key has any, since its token
    /// limit counts input.
    ///
    /// ```
    /// use tollgate::http::Profile;
    ///
    /// let gemini = Profile::gemini();
    /// assert_eq!(gemini.name(), "gemini");
    /// ```
    pub fn gemini() -> Profile {
        Profile {
            name: Cow::Borrowed("gemini"),
            headers: Vec::new(),
            output: OutputTo::OutputTokens,
            permanent_codes: Vec::new(),
            models: models::gemini(),
            ..Profile::openai()
        }
    }

    /// Groq's OpenAI-compatible API: OpenAI's header names, with resets written like `7.66s`
    /// or `2m59.56s`. Its `x-ratelimit-*-requests` headers count requests per *day* and its
    /// token headers tokens per minute, so give a key both windows (`30/m; 14400/d`) rather
    /// than learning them from the headers, which reads every limit per minute.
    pub fn groq() -> Profile {
        Profile {
            name: Cow::Borrowed("groq"),
            permanent_codes: Vec::new(),
            models: models::groq(),
            ..Profile::openai()
        }
    }

    /// Mistral: OpenAI's bodies and usage, its own header names for the minute windows
    /// (`x-ratelimit-{limit,remaining}-req-minute`, `x-ratelimit-{limit,remaining}-tokens-minute`,
    /// and a reset in seconds from `x-ratelimit-reset-{req,tokens}-minute` where one is sent).
    /// The monthly token headers are not read: give a key its `.../30d` window in its limits.
    pub fn mistral() -> Profile {
        let headers = [(Currency::Requests, "req"), (Currency::Tokens, "tokens")]
            .into_iter()
            .map(|(currency, word)| {
                HeaderNames::new(
                    currency,
                    format!("x-ratelimit-limit-{word}-minute"),
                    format!("x-ratelimit-remaining-{word}-minute"),
                    format!("x-ratelimit-reset-{word}-minute"),
                )
            })
            .collect();
        Profile {
            name: Cow::Borrowed("mistral"),
            headers,
            reset: ResetForm::Seconds,
            permanent_codes: Vec::new(),
            models: models::mistral(),
            // Mistral ends every stream with its usage, and refuses parameters it doesn't know.
            stream_usage: false,
            ..Profile::openai()
        }
    }

    /// Any other service: OpenAI's usage fields and headers until told otherwise, named `name`.
    pub fn generic(name: impl Into<Cow<'static, str>>) -> Profile {
        Profile {
            name: name.into(),
            permanent_codes: Vec::new(),
            models: Vec::new(),
            ..Profile::openai()
        }
    }

    /// The profile's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The estimator (by name, as in [`tollgate_estimators::estimator`]) that counts requests.
    pub fn estimator_name(&self) -> &str {
        &self.estimator
    }

    /// Counts requests with the estimator of this name.
    pub fn estimator(mut self, name: impl Into<Cow<'static, str>>) -> Profile {
        self.estimator = name.into();
        self
    }

    /// The rate-limit headers, one set per currency (none: no header sync).
    pub fn headers(mut self, headers: Vec<HeaderNames>) -> Profile {
        self.headers = headers;
        self
    }

    /// How the reset headers are written.
    pub fn reset_form(mut self, reset: ResetForm) -> Profile {
        self.reset = reset;
        self
    }

    /// Where reserved output is charged.
    pub fn output_to(mut self, output: OutputTo) -> Profile {
        self.output = output;
        self
    }

    /// Whether cache reads (`cache_read_input_tokens`) count against the input limit: Anthropic
    /// leaves them out for most models, and counts them for a few older ones.
    pub fn cache_reads_count(mut self, count: bool) -> Profile {
        self.cache_reads_count = count;
        self
    }

    /// Error codes (`error.code` or `error.type` of a 429's body) that no retry can fix.
    pub fn permanent_codes(mut self, codes: Vec<Cow<'static, str>>) -> Profile {
        self.permanent_codes = codes;
        self
    }

    /// The `remaining` headers are rounded to the nearest multiple of this (Anthropic: 1,000;
    /// 0: exact). A rounded count is read as the most it could be (`remaining` plus half the
    /// rounding, less one), so that rounding never lowers the windows below what is really
    /// left; spending smaller than half the rounding goes unseen.
    pub fn remaining_rounded_to(mut self, rounding: u64) -> Profile {
        self.rounding = rounding;
        self
    }

    /// The models whose figures the gate knows (their most output, their price), replacing the
    /// profile's built-in table ([`tollgate::http::models`](super::models)).
    pub fn models(mut self, models: Vec<Model>) -> Profile {
        self.models = models;
        self
    }

    /// The rate-limit headers the profile reads, per currency.
    pub fn header_names(&self) -> &[HeaderNames] {
        &self.headers
    }

    /// How the profile's `reset` headers write a time.
    pub fn reset_style(&self) -> ResetForm {
        self.reset
    }

    /// The table of models the profile knows: their most output and prices.
    pub fn model_table(&self) -> &[Model] {
        &self.models
    }

    /// The model entry `model` matches (the longest name it starts with at a boundary), if any.
    pub fn model(&self, model: &str) -> Option<&Model> {
        models::find(&self.models, model)
    }

    /// The price `model` is billed at: its own entry's, or that of the model it is a dated
    /// snapshot of (see [`models`]); `None` for a name the table doesn't price.
    pub fn price_of(&self, model: &str) -> Option<Price> {
        models::find_priced(&self.models, model).and_then(|m| m.price)
    }

    /// What one call of the server-side tool `tool` (a request's `tools[].type`) costs, in
    /// micro-dollars, from the profile's table ([`models::openai_tool_fees`],
    /// [`models::anthropic_tool_fees`]); `None`: the tool bills only its tokens, or is the
    /// caller's own.
    pub fn tool_fee(&self, tool: &str) -> Option<u64> {
        models::tool_fee(&self.tool_fees, tool)
    }

    /// The fees of server-side tools, replacing the table's.
    pub fn tool_fees(mut self, fees: Vec<models::ToolFee>) -> Profile {
        self.tool_fees = fees;
        self
    }

    /// What a call that names no `max_tokens` reserves for its output: its model's most
    /// output, or this for a model the table doesn't know (4,096 by default; 0 for Voyage).
    pub fn default_output(mut self, tokens: u64) -> Profile {
        self.default_output = tokens;
        self
    }

    /// The output a call of `model` that names no `max_tokens` reserves.
    pub fn output_without_max_tokens(&self, model: Option<&str>) -> u64 {
        model
            .and_then(|m| self.model(m))
            .map_or(self.default_output, |m| m.max_output)
    }

    /// Whether the gate asks a stream for its usage when the client did not
    /// (`stream_options.include_usage`, on chat and completions calls), and takes the extra
    /// usage chunk out before the client sees it. On for OpenAI, Azure, Groq, Gemini and
    /// generic hosts (vLLM reads it too); off for Mistral (its streams end with usage
    /// anyway), Anthropic and Voyage.
    pub fn stream_usage(mut self, ask: bool) -> Profile {
        self.stream_usage = ask;
        self
    }

    /// The currencies a 429 still costs: what the provider counts of a request it refused.
    /// Every preset keeps the request (OpenAI and Gemini say so; Anthropic's docs are silent,
    /// and its profile does the same): the refused call's tokens come back, its request does
    /// not, and nothing raises a request window after a 429 the provider counted.
    pub fn refusal_costs(mut self, currencies: Currencies) -> Profile {
        self.refusal_costs = currencies;
        self
    }

    /// The currencies a refused call's charge comes back in.
    pub(crate) fn refusal_returns(&self) -> Currencies {
        Currency::ALL
            .into_iter()
            .filter(|c| !self.refusal_costs.contains(*c))
            .collect()
    }

    /// Whether a 429 without `retry-after` (or `retry-after-ms`) is final.
    pub fn permanent_without_retry_after(mut self, permanent: bool) -> Profile {
        self.permanent_without_retry_after = permanent;
        self
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use http::HeaderMap;

    use super::super::headers::rate_headers;
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn groq_resets_with_fractions_and_minutes_are_read() {
        let read = rate_headers(
            &Profile::groq(),
            &headers(&[
                ("x-ratelimit-limit-requests", "14400"),
                ("x-ratelimit-remaining-requests", "14370"),
                ("x-ratelimit-reset-requests", "2m59.56s"),
                ("x-ratelimit-limit-tokens", "18000"),
                ("x-ratelimit-remaining-tokens", "17997"),
                ("x-ratelimit-reset-tokens", "7.66s"),
            ]),
            SystemTime::now(),
        );
        assert_eq!(read.len(), 2);
        assert_eq!(read[0].currency, Currency::Requests);
        assert_eq!(read[0].remaining, Some(14_370));
        assert_eq!(read[0].reset, Some(Duration::from_millis(179_560)));
        assert_eq!(read[1].currency, Currency::Tokens);
        assert_eq!(read[1].limit, Some(18_000));
        assert_eq!(read[1].reset, Some(Duration::from_millis(7_660)));
        assert!(Profile::groq().permanent_codes.is_empty());
    }

    #[test]
    fn mistral_minute_headers_are_read_and_monthly_ones_are_not() {
        let read = rate_headers(
            &Profile::mistral(),
            &headers(&[
                ("x-ratelimit-limit-tokens-minute", "5000000"),
                ("x-ratelimit-remaining-tokens-minute", "4999911"),
                ("x-ratelimit-limit-tokens-month", "100000000"),
                ("x-ratelimit-remaining-tokens-month", "12"),
                ("x-ratelimit-limit-req-minute", "720"),
                ("x-ratelimit-remaining-req-minute", "717"),
                // OpenAI's names mean nothing on Mistral.
                ("x-ratelimit-remaining-tokens", "1"),
            ]),
            SystemTime::now(),
        );
        assert_eq!(read.len(), 2);
        assert_eq!(
            (read[0].currency, read[0].limit, read[0].remaining),
            (Currency::Requests, Some(720), Some(717))
        );
        assert_eq!(
            (read[1].currency, read[1].limit, read[1].remaining),
            (Currency::Tokens, Some(5_000_000), Some(4_999_911))
        );
    }

    #[test]
    fn gemini_has_no_headers_and_charges_output_apart() {
        let gemini = Profile::gemini();
        let read = rate_headers(
            &gemini,
            &headers(&[("x-ratelimit-remaining-tokens", "0")]),
            SystemTime::now(),
        );
        assert!(read.is_empty());
        assert_eq!(gemini.output, OutputTo::OutputTokens);
        assert!(!gemini.permanent_without_retry_after);
    }
}
