//! What the gate knows of a provider's models before any call: how much output a call may
//! write when its request names no `max_tokens`, and what a million tokens cost.
//!
//! The tables are the providers' published figures as of [`PUBLISHED`]; every entry can be
//! overridden (a [`Profile`](super::Profile)'s [`models`](super::Profile::models), or a
//! proxy's configuration). For its most output, a model name matches the longest entry it
//! starts with, at a `-`, `:`, `@` or `.` boundary, so that dated snapshots
//! (`gpt-4o-2024-08-06`) take their family's figures while `gpt-4o-mini` keeps its own. For its
//! price it must be the entry itself or a snapshot of it (a date or version number after it, or
//! `-latest`): `o3-pro` or `gpt-4-32k` is not billed at `o3`'s or `gpt-4`'s price, and a name
//! the table doesn't price is refused under a budget.

use std::borrow::Cow;

/// When the built-in figures were taken from the providers' pages.
pub const PUBLISHED: &str = "2025-10";

/// What a million tokens cost, in micro-dollars (`$2.50` is `2_500_000`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Price {
    /// Input tokens.
    pub input: u64,
    /// Input tokens read from the provider's prompt cache.
    pub cached_input: u64,
    /// Output tokens (reasoning included).
    pub output: u64,
}

/// `tokens` at `per_million` micro-dollars a million, in millionths of a micro-dollar.
fn at(tokens: u64, per_million: u64) -> u128 {
    u128::from(tokens) * u128::from(per_million)
}

/// Millionths of a micro-dollar as micro-dollars, rounded up (a budget never undercounts).
fn micros(millionths: u128) -> u64 {
    u64::try_from(millionths.div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

impl Price {
    /// What a call estimated at `input` tokens that may write `output` costs at most, in
    /// micro-dollars (rounded up): what admission reserves from a spend budget.
    ///
    /// ```
    /// use tollgate::http::models::Price;
    ///
    /// let gpt_4o = Price::dollars(2.50, 1.25, 10.0);
    /// // 1,000 tokens in at $2.50 a million, 500 out at $10: $0.0075.
    /// assert_eq!(gpt_4o.estimate(1_000, 500), 7_500);
    /// ```
    pub fn estimate(&self, input: u64, output: u64) -> u64 {
        micros(at(input, self.input) + at(output, self.output))
    }

    /// What a response's reported usage is billed, in micro-dollars (rounded up). Input read
    /// from the prompt cache is priced at `cached_input`: OpenAI's `cached_tokens` are part of
    /// its `prompt_tokens`; Anthropic's cache reads are counted apart from its `input_tokens`,
    /// and its cache writes cost 1.25× input. A response with only a total is priced at the
    /// dearer of input and output.
    ///
    /// ```
    /// use tollgate::http::Reported;
    /// use tollgate::http::models::Price;
    ///
    /// let price = Price::dollars(2.50, 1.25, 10.0);
    /// let body = br#"{"usage":{"prompt_tokens":2000,"completion_tokens":100,
    ///     "prompt_tokens_details":{"cached_tokens":1024}}}"#;
    /// // 976 fresh at $2.50, 1,024 cached at $1.25, 100 out at $10: $0.00472.
    /// assert_eq!(price.billed(&Reported::read(body, false)), 4_720);
    /// ```
    pub fn billed(&self, reported: &super::Reported) -> u64 {
        let input = reported.input.unwrap_or(0);
        let output = reported.output.unwrap_or(0);
        if reported.input.is_none() && reported.output.is_none() {
            let total = reported.total.unwrap_or(0);
            return micros(at(total, self.input.max(self.output)));
        }
        let anthropic = reported.cache_read.is_some() || reported.cache_write.is_some();
        let total = if anthropic {
            let write = reported.cache_write.unwrap_or(0);
            at(input, self.input)
                + at(write, self.input) * 5 / 4
                + at(reported.cache_read.unwrap_or(0), self.cached_input)
        } else {
            let cached = reported.cached.unwrap_or(0).min(input);
            at(input - cached, self.input) + at(cached, self.cached_input)
        };
        micros(total + at(output, self.output))
    }

    /// A price from dollars per million tokens: input, cached input, output.
    pub const fn dollars(input: f64, cached_input: f64, output: f64) -> Price {
        Price {
            input: (input * 1e6 + 0.5) as u64,
            cached_input: (cached_input * 1e6 + 0.5) as u64,
            output: (output * 1e6 + 0.5) as u64,
        }
    }
}

/// One model's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    /// Its name, or the prefix of a family of names.
    pub name: Cow<'static, str>,
    /// The most output one call may write (what a call that names no `max_tokens` reserves).
    pub max_output: u64,
    /// Its price, when known.
    pub price: Option<Price>,
}

impl Model {
    /// A model with its most output and price.
    pub fn new(name: impl Into<Cow<'static, str>>, max_output: u64, price: Option<Price>) -> Model {
        Model {
            name: name.into(),
            max_output,
            price,
        }
    }
}

const fn m(name: &'static str, max_output: u64, price: Price) -> Model {
    Model {
        name: Cow::Borrowed(name),
        max_output,
        price: Some(price),
    }
}

/// Whether `model` is `name` or one of its family (`name` then a boundary).
fn matches(model: &str, name: &str) -> bool {
    model
        .strip_prefix(name)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['-', ':', '@', '.']))
}

/// The entry of `table` that `model` matches most closely.
pub(crate) fn find<'t>(table: &'t [Model], model: &str) -> Option<&'t Model> {
    table
        .iter()
        .filter(|entry| matches(model, &entry.name))
        .max_by_key(|entry| entry.name.len())
}

/// Whether `model` is `name` itself or a snapshot of it: `name` then a date or version number
/// (`-2024-08-06`, `-20250805`, `@20250805`, `-0613`, `-001`) or `-latest`. A family member
/// with a name of its own (`o3-pro`, `gpt-4-32k`, `gpt-4o-audio-preview`) is another model,
/// often at another price.
fn snapshot_of(model: &str, name: &str) -> bool {
    let Some(rest) = model.strip_prefix(name) else {
        return false;
    };
    if rest.is_empty() || rest == "-latest" {
        return true;
    }
    let Some(version) = rest.strip_prefix(['-', '@']) else {
        return false;
    };
    let digits = version.bytes().filter(u8::is_ascii_digit).count();
    digits >= 3 && version.bytes().all(|b| b.is_ascii_digit() || b == b'-')
}

/// The entry of `table` whose price `model` is billed at: its own, or that of the model it is
/// a snapshot of. `None` for a name the table doesn't price (a budget then refuses the call
/// rather than bill it at a cheaper relative's price).
pub(crate) fn find_priced<'t>(table: &'t [Model], model: &str) -> Option<&'t Model> {
    table
        .iter()
        .filter(|entry| snapshot_of(model, &entry.name))
        .max_by_key(|entry| entry.name.len())
}

/// What one call of a server-side tool costs, in micro-dollars, beside the tokens it adds:
/// the provider bills it per call (a search), and the request can't show how many calls the
/// model will make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolFee {
    /// The tool's `type` in a request's `tools` (a prefix: `web_search` also prices
    /// `web_search_preview` and `web_search_20250305`, unless one of those has its own entry).
    pub tool: Cow<'static, str>,
    /// Micro-dollars per call (`$10` a thousand searches is `10_000`).
    pub per_call: u64,
}

const fn fee(tool: &'static str, per_call: u64) -> ToolFee {
    ToolFee {
        tool: Cow::Borrowed(tool),
        per_call,
    }
}

/// OpenAI's built-in tools: web search $10 a thousand calls ($25 for the preview tool and the
/// search models' `web_search_options`), file search $2.50 a thousand, a code interpreter
/// container $0.03.
pub fn openai_tool_fees() -> Vec<ToolFee> {
    vec![
        fee("web_search", 10_000),
        fee("web_search_preview", 25_000),
        fee("web_search_options", 25_000),
        fee("file_search", 2_500),
        fee("code_interpreter", 30_000),
    ]
}

/// Anthropic's server tools: web search $10 a thousand searches; code execution $0.05 an hour,
/// billed at least five minutes a call (about $0.0042). Web fetch bills only its tokens.
pub fn anthropic_tool_fees() -> Vec<ToolFee> {
    vec![fee("web_search", 10_000), fee("code_execution", 4_167)]
}

/// The fee of `tool` in `table`: its own entry, else the longest entry it starts with.
pub(crate) fn tool_fee(table: &[ToolFee], tool: &str) -> Option<u64> {
    table
        .iter()
        .filter(|entry| tool.starts_with(entry.tool.as_ref()))
        .max_by_key(|entry| entry.tool.len())
        .map(|entry| entry.per_call)
}

/// OpenAI's models (standard tier).
pub fn openai() -> Vec<Model> {
    vec![
        m("gpt-5", 128_000, Price::dollars(1.25, 0.125, 10.0)),
        m("gpt-5-pro", 272_000, Price::dollars(15.0, 15.0, 120.0)),
        m("gpt-5-mini", 128_000, Price::dollars(0.25, 0.025, 2.0)),
        m("gpt-5-nano", 128_000, Price::dollars(0.05, 0.005, 0.40)),
        m("gpt-4.1", 32_768, Price::dollars(2.0, 0.50, 8.0)),
        m("gpt-4.1-mini", 32_768, Price::dollars(0.40, 0.10, 1.60)),
        m("gpt-4.1-nano", 32_768, Price::dollars(0.10, 0.025, 0.40)),
        m("gpt-4o", 16_384, Price::dollars(2.50, 1.25, 10.0)),
        m("gpt-4o-2024-05-13", 4_096, Price::dollars(5.0, 5.0, 15.0)),
        m("gpt-4o-mini", 16_384, Price::dollars(0.15, 0.075, 0.60)),
        m("gpt-4-turbo", 4_096, Price::dollars(10.0, 10.0, 30.0)),
        m("gpt-4", 8_192, Price::dollars(30.0, 30.0, 60.0)),
        m("gpt-3.5-turbo", 4_096, Price::dollars(0.50, 0.50, 1.50)),
        m("o1", 100_000, Price::dollars(15.0, 7.50, 60.0)),
        m("o1-pro", 100_000, Price::dollars(150.0, 150.0, 600.0)),
        m("o1-mini", 65_536, Price::dollars(1.10, 0.55, 4.40)),
        m("o3", 100_000, Price::dollars(2.0, 0.50, 8.0)),
        m("o3-pro", 100_000, Price::dollars(20.0, 20.0, 80.0)),
        m("o3-mini", 100_000, Price::dollars(1.10, 0.55, 4.40)),
        m("o4-mini", 100_000, Price::dollars(1.10, 0.275, 4.40)),
        m("text-embedding-3-small", 0, Price::dollars(0.02, 0.02, 0.0)),
        m("text-embedding-3-large", 0, Price::dollars(0.13, 0.13, 0.0)),
        m("text-embedding-ada-002", 0, Price::dollars(0.10, 0.10, 0.0)),
    ]
}

/// Anthropic's models. (`cached_input` is the price of a cache read; a cache write costs
/// 1.25× input, which the spend currency charges.)
pub fn anthropic() -> Vec<Model> {
    vec![
        m("claude-opus-4", 32_000, Price::dollars(15.0, 1.50, 75.0)),
        m("claude-opus-4-1", 32_000, Price::dollars(15.0, 1.50, 75.0)),
        m("claude-sonnet-4-5", 64_000, Price::dollars(3.0, 0.30, 15.0)),
        m("claude-haiku-4-5", 64_000, Price::dollars(1.0, 0.10, 5.0)),
        m("claude-sonnet-4", 64_000, Price::dollars(3.0, 0.30, 15.0)),
        m("claude-3-7-sonnet", 64_000, Price::dollars(3.0, 0.30, 15.0)),
        m("claude-3-5-sonnet", 8_192, Price::dollars(3.0, 0.30, 15.0)),
        m("claude-3-5-haiku", 8_192, Price::dollars(0.80, 0.08, 4.0)),
        m("claude-3-opus", 4_096, Price::dollars(15.0, 1.50, 75.0)),
        m("claude-3-haiku", 4_096, Price::dollars(0.25, 0.03, 1.25)),
    ]
}

/// Gemini's models (through its OpenAI-compatible endpoint; prompts up to 200k tokens).
pub fn gemini() -> Vec<Model> {
    vec![
        m("gemini-2.5-pro", 65_536, Price::dollars(1.25, 0.31, 10.0)),
        m(
            "gemini-2.5-flash",
            65_536,
            Price::dollars(0.30, 0.075, 2.50),
        ),
        m(
            "gemini-2.5-flash-lite",
            65_536,
            Price::dollars(0.10, 0.025, 0.40),
        ),
        m("gemini-2.0-flash", 8_192, Price::dollars(0.10, 0.025, 0.40)),
        m(
            "gemini-2.0-flash-lite",
            8_192,
            Price::dollars(0.075, 0.075, 0.30),
        ),
    ]
}

/// Groq's models.
pub fn groq() -> Vec<Model> {
    vec![
        m(
            "llama-3.3-70b-versatile",
            32_768,
            Price::dollars(0.59, 0.59, 0.79),
        ),
        m(
            "llama-3.1-8b-instant",
            131_072,
            Price::dollars(0.05, 0.05, 0.08),
        ),
    ]
}

/// Mistral's models.
pub fn mistral() -> Vec<Model> {
    vec![
        m("mistral-large", 131_072, Price::dollars(2.0, 2.0, 6.0)),
        m("mistral-medium", 131_072, Price::dollars(0.40, 0.40, 2.0)),
        m("mistral-small", 131_072, Price::dollars(0.10, 0.10, 0.30)),
        m("codestral", 256_000, Price::dollars(0.30, 0.30, 0.90)),
    ]
}

/// Voyage AI's embedding models (they write no output).
pub fn voyage() -> Vec<Model> {
    vec![
        m("voyage-3-large", 0, Price::dollars(0.18, 0.18, 0.0)),
        m("voyage-3", 0, Price::dollars(0.06, 0.06, 0.0)),
        m("voyage-3-lite", 0, Price::dollars(0.02, 0.02, 0.0)),
        m("voyage-3.5", 0, Price::dollars(0.06, 0.06, 0.0)),
        m("voyage-3.5-lite", 0, Price::dollars(0.02, 0.02, 0.0)),
        m("voyage-code-3", 0, Price::dollars(0.18, 0.18, 0.0)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_takes_its_closest_family() {
        let table = openai();
        let name = |model: &str| find(&table, model).map(|m| m.name.as_ref().to_owned());
        assert_eq!(name("gpt-4o").as_deref(), Some("gpt-4o"));
        assert_eq!(name("gpt-4o-2024-08-06").as_deref(), Some("gpt-4o"));
        assert_eq!(
            name("gpt-4o-mini-2024-07-18").as_deref(),
            Some("gpt-4o-mini")
        );
        assert_eq!(name("gpt-4.1-nano").as_deref(), Some("gpt-4.1-nano"));
        assert_eq!(name("o1-mini").as_deref(), Some("o1-mini"));
        assert_eq!(name("o10"), None);
        assert_eq!(name("gpt-4ox"), None);
        let priced = |model: &str| find_priced(&table, model).map(|m| m.name.as_ref().to_owned());
        assert_eq!(priced("gpt-4o-2024-08-06").as_deref(), Some("gpt-4o"));
        assert_eq!(
            priced("gpt-4o-2024-05-13").as_deref(),
            Some("gpt-4o-2024-05-13")
        );
        assert_eq!(priced("gpt-4-0613").as_deref(), Some("gpt-4"));
        assert_eq!(priced("o3-pro-2025-06-10").as_deref(), Some("o3-pro"));
        for unpriced in [
            "o3-deep-research",
            "gpt-4.5-preview",
            "gpt-4-32k",
            "gpt-4o-audio-preview",
            "gpt-4o-mini-tts",
            "gpt-4o.",
            "gpt-4o-",
            "gpt-4o:latest",
            "gpt-4-1106-preview",
        ] {
            assert_eq!(priced(unpriced), None, "{unpriced}");
        }
        assert_eq!(name("my-model"), None);
        let claude = anthropic();
        assert_eq!(
            find(&claude, "claude-3-5-sonnet-20241022").map(|m| m.max_output),
            Some(8_192)
        );
        assert_eq!(
            find(&claude, "claude-opus-4-1-20250805").map(|m| m.name.as_ref()),
            Some("claude-opus-4-1")
        );
    }

    #[test]
    fn prices_are_exact_micro_dollars() {
        assert_eq!(
            Price::dollars(2.50, 1.25, 10.0),
            Price {
                input: 2_500_000,
                cached_input: 1_250_000,
                output: 10_000_000
            }
        );
        assert_eq!(Price::dollars(0.075, 0.0, 0.0).input, 75_000);
    }
}
