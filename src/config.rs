//! Per-key limits from a TOML file.
//!
//! ```toml
//! [default]               # for any key without a section of its own
//! requests = "500/m"
//! tokens = "200000/m"
//! estimator = "openai"
//! timeout = "30s"
//!
//! [keys.anthropic]        # fields left out are taken from [default]
//! requests = "50/m"
//! tokens = "40000/m; 1000000/d"
//! tokens_burst = 20000    # the burst of every token window, instead of writing `burst` in each
//! output_tokens = "8000/m"  # output tokens limited apart, as Anthropic does
//! spend = "$50/d"         # a budget in dollars (calls say their price: Cost::with_spend)
//!
//! [keys."voyage-embed"]
//! tokens = "1000000/m"
//! estimator = "voyageai"
//! ```
//!
//! `#[tollgate::limit(key = "anthropic")]` with no rates takes its limits from the installed
//! configuration ([`install_config`], or the file named by `TOLLGATE_CONFIG`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::error::Error;
use crate::rate::{Currency, Limits, Rate, Rates};

/// The settings of one key, with the defaults filled in.
#[derive(Debug, Clone)]
pub struct KeyConfig {
    /// The key's request and token windows.
    pub limits: Limits,
    /// The estimator's name, if the file gives one.
    pub estimator: Option<String>,
    /// The timeout, if the file gives one (`Some(None)`: `"none"`, no deadline).
    pub timeout: Option<Option<Duration>>,
    resolved: OnceLock<Arc<dyn tollgate_estimators::Estimator>>,
}

impl KeyConfig {
    /// The estimator named here (loaded once), or the default one.
    pub fn estimator(&self) -> Result<&Arc<dyn tollgate_estimators::Estimator>, Error> {
        if let Some(found) = self.resolved.get() {
            return Ok(found);
        }
        let estimator = match &self.estimator {
            Some(name) => crate::counting::estimator_named(name)?,
            None => crate::limiter::default_estimator(),
        };
        Ok(self.resolved.get_or_init(|| estimator))
    }
}

/// Limits for many keys, read from TOML.
#[derive(Debug, Clone, Default)]
pub struct Config {
    default: Option<KeyConfig>,
    keys: HashMap<String, KeyConfig>,
}

/// The field names of each currency's windows and of their burst, in [`crate::Currency::ALL`] order.
const RATE_FIELDS: [(&str, &str); 4] = [
    ("requests", "requests_burst"),
    ("tokens", "tokens_burst"),
    ("output_tokens", "output_tokens_burst"),
    ("spend", "spend_burst"),
];

/// One section as written, before the defaults are merged in.
#[derive(Debug, Default, Clone)]
struct Section {
    /// Each currency's windows and burst, in [`crate::Currency::ALL`] order.
    rates: [Option<Rates>; 4],
    bursts: [Option<u64>; 4],
    estimator: Option<String>,
    timeout: Option<Option<Duration>>,
    /// A field here was refused (and reported): merging says nothing more about the section.
    refused: bool,
}

fn with_burst(rates: &Rates, burst: Option<u64>) -> Result<Rates, String> {
    match burst {
        None => Ok(rates.clone()),
        Some(burst) => rates
            .as_slice()
            .iter()
            .map(|rate| rate.with_burst(burst).map_err(|e| e.to_string()))
            .collect::<Result<Vec<Rate>, _>>()
            .map(Rates::from),
    }
}

/// Reads one section, adding a line to `problems` for each bad field.
fn section(name: &str, table: &toml::Table, problems: &mut Vec<String>) -> Section {
    let mut out = Section::default();
    let before = problems.len();
    for (field, value) in table {
        let at = format!("{name}.{field}");
        let text = || value.as_str().map(str::to_owned);
        let rate_field = RATE_FIELDS.iter().position(|(rates, _)| rates == field);
        let burst_field = RATE_FIELDS.iter().position(|(_, burst)| burst == field);
        if let Some(i) = rate_field {
            let parsed = text().map(|t| {
                if i == Currency::Spend.index() {
                    Rates::parse_money(&t)
                } else {
                    t.parse::<Rates>()
                }
            });
            match parsed {
                Some(Ok(rates)) => out.rates[i] = Some(rates),
                Some(Err(err)) => problems.push(format!("{at}: {err}")),
                None => problems.push(format!("{at}: expected a rate string like \"500/m\"")),
            }
            continue;
        }
        if let Some(i) = burst_field {
            if i == Currency::Spend.index() {
                match text().map(|t| tollgate_grammar::parse_dollars(&t)) {
                    Some(Ok(n)) if n > 0 => out.bursts[i] = Some(n),
                    Some(Err(err)) => problems.push(format!("{at}: {err}")),
                    _ => problems.push(format!("{at}: expected a dollar amount like \"$5\"")),
                }
                continue;
            }
            match value.as_integer() {
                Some(n) if n > 0 => out.bursts[i] = Some(n as u64),
                _ => problems.push(format!("{at}: expected a whole number of at least 1")),
            }
            continue;
        }
        match field.as_str() {
            "estimator" => match text() {
                // Checked now, so that a misspelt name fails at load rather than at every call.
                Some(name) => match tollgate_estimators::check_name(&name) {
                    Ok(()) => out.estimator = Some(name),
                    Err(err) => problems.push(format!("{at}: {err}")),
                },
                None => problems.push(format!("{at}: expected an estimator name like \"openai\"")),
            },
            "timeout" => match text().map(|t| tollgate_grammar::parse_timeout(&t)) {
                Some(Ok(timeout)) => out.timeout = Some(timeout),
                Some(Err(err)) => problems.push(format!("{at}: {err}")),
                None => problems.push(format!("{at}: expected a duration like \"30s\" or \"none\"")),
            },
            other => problems.push(format!(
                "{at}: unknown field `{other}`; expected requests, tokens, output_tokens, spend, their _burst, estimator or timeout"
            )),
        }
    }
    out.refused = problems.len() > before;
    out
}

/// A section merged over the defaults, checked whole.
fn merge(
    name: &str,
    own: &Section,
    default: &Section,
    problems: &mut Vec<String>,
) -> Option<KeyConfig> {
    let mut windows: [Rates; 4] = Default::default();
    let mut refused = false;
    for (i, window) in windows.iter_mut().enumerate() {
        let rates = own.rates[i]
            .clone()
            .or_else(|| default.rates[i].clone())
            .unwrap_or_default();
        match with_burst(&rates, own.bursts[i].or(default.bursts[i])) {
            Ok(rates) => *window = rates,
            Err(err) => {
                problems.push(format!("{name}: {err}"));
                refused = true;
            }
        }
    }
    if refused {
        return None;
    }
    let [requests, tokens, output_tokens, spend] = windows;
    let limits = Limits::new(requests, tokens)
        .with_output_tokens(output_tokens)
        .with_spend(spend);
    if limits.is_empty() {
        // A refused rate was reported already; saying the section has none would mislead.
        if !own.refused && !default.refused {
            problems.push(format!(
                "{name}: no requests or tokens here or in [default]; give at least one rate"
            ));
        }
        return None;
    }
    Some(KeyConfig {
        limits,
        estimator: own.estimator.clone().or_else(|| default.estimator.clone()),
        timeout: own.timeout.or(default.timeout),
        resolved: OnceLock::new(),
    })
}

impl Config {
    /// Parses TOML text. A bad file is one [`Error::Config`] listing every bad entry with its
    /// key.
    ///
    /// ```
    /// let config = tollgate::Config::from_toml(r#"
    ///     [default]
    ///     requests = "500/m"
    ///     [keys.openai]
    ///     tokens = "200000/m"
    /// "#)?;
    /// assert_eq!(config.key("openai").unwrap().limits.to_string(), "requests 500/m, tokens 200000/m");
    /// assert_eq!(config.key("anything-else").unwrap().limits.to_string(), "requests 500/m");
    ///
    /// let err = tollgate::Config::from_toml(r#"
    ///     [keys.a]
    ///     requests = "5/q"
    ///     [keys.b]
    ///     timeout = "soon"
    ///     tokens = "1/s"
    /// "#).unwrap_err();
    /// let lines: Vec<_> = err.to_string().lines().map(str::to_owned).collect();
    /// assert_eq!(lines, [
    ///     "configuration: keys.a.requests: rate `5/q`: unknown unit `q`; expected s, m, h or d (or ms), optionally with a count like `5m`",
    ///     "keys.b.timeout: timeout `soon`: expected a duration like \"30s\", \"500ms\", \"2m\" or \"1h\", or \"none\" to wait as long as it takes",
    /// ]);
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn from_toml(text: &str) -> Result<Config, Error> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| Error::Config {
            problems: vec![format!("not valid TOML: {}", e.message())],
        })?;
        let mut problems = Vec::new();
        let mut default = Section::default();
        let mut keys: Vec<(String, Section)> = Vec::new();
        for (name, value) in &table {
            match (name.as_str(), value.as_table()) {
                ("default", Some(t)) => default = section("default", t, &mut problems),
                ("default", None) => problems
                    .push("default: expected a table of settings, written [default]".to_owned()),
                ("keys", None) => problems.push(
                    "keys: expected tables of settings, one per key, written [keys.<name>]"
                        .to_owned(),
                ),
                ("keys", Some(t)) => {
                    for (key, value) in t {
                        match value.as_table() {
                            Some(t) => keys.push((
                                key.clone(),
                                section(&format!("keys.{key}"), t, &mut problems),
                            )),
                            None => {
                                problems.push(format!("keys.{key}: expected a table of settings"))
                            }
                        }
                    }
                }
                (other, _) => problems.push(format!(
                    "{other}: unknown section; expected [default] or [keys.<name>]"
                )),
            }
        }
        let empty = Section::default();
        let has_default = default.rates.iter().any(Option::is_some);
        let default_config = if has_default {
            merge("default", &default, &empty, &mut problems)
        } else {
            None
        };
        let mut merged = HashMap::new();
        for (key, own) in &keys {
            if let Some(config) = merge(&format!("keys.{key}"), own, &default, &mut problems) {
                merged.insert(key.clone(), config);
            }
        }
        if problems.is_empty() {
            Ok(Config {
                default: default_config,
                keys: merged,
            })
        } else {
            Err(Error::Config { problems })
        }
    }

    /// Reads and parses a TOML file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Config, Error> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::Config {
            problems: vec![format!("{}: {e}", path.display())],
        })?;
        Config::from_toml(&text).map_err(|err| match err {
            Error::Config { problems } => Error::Config {
                problems: problems
                    .into_iter()
                    .map(|p| format!("{}: {p}", path.display()))
                    .collect(),
            },
            other => other,
        })
    }

    /// The settings of `key`: its own section merged over `[default]`, or `[default]` alone.
    pub fn key(&self, key: &str) -> Option<&KeyConfig> {
        self.keys.get(key).or(self.default.as_ref())
    }
}

static GLOBAL: OnceLock<Option<Config>> = OnceLock::new();

/// Makes `config` the process-wide configuration that `#[tollgate::limit(key = "...")]`
/// without rates reads. Once, before the first such call; a second call is an error.
pub fn install_config(config: Config) -> Result<(), Error> {
    let mut config = Some(config);
    GLOBAL.get_or_init(|| config.take());
    match config {
        None => Ok(()),
        Some(_) => Err(Error::Config {
            problems: vec!["the process-wide configuration is already installed (or was already read from TOLLGATE_CONFIG)".to_owned()],
        }),
    }
}

/// The process-wide configuration: the installed one, else the file named by the
/// `TOLLGATE_CONFIG` environment variable (read once; a bad file is reported at every use).
pub(crate) fn global_config() -> Result<Option<&'static Config>, Error> {
    static FROM_ENV: OnceLock<Result<(), Vec<String>>> = OnceLock::new();
    let config = GLOBAL.get_or_init(|| {
        let path = std::env::var_os("TOLLGATE_CONFIG")?;
        match Config::from_file(&path) {
            Ok(config) => Some(config),
            Err(Error::Config { problems }) => {
                let _ = FROM_ENV.set(Err(problems));
                None
            }
            Err(_) => None,
        }
    });
    match FROM_ENV.get() {
        Some(Err(problems)) => Err(Error::Config {
            problems: problems.clone(),
        }),
        _ => Ok(config.as_ref()),
    }
}
