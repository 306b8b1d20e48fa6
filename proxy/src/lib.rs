//! `tollgate-proxy`: an OpenAI- and Anthropic-compatible gateway that makes every call pay
//! its toll before it reaches the provider, whatever language the client is written in.
//!
//! Point any SDK at it (`OPENAI_BASE_URL=http://127.0.0.1:8787/v1`); each call is estimated
//! with the provider's tokenizer, waits for its share of the requests and tokens, goes out,
//! brings the key's windows in line with the provider's `remaining` headers, and settles with
//! the usage the answer reports (a stream as it passes). A call that would wait past its
//! deadline is answered 429 in the provider's own shape, with `retry-after`. On a Redis
//! store, every proxy shares every key. See the README beside this crate for the command,
//! the configuration file and the error shapes.
//!
//! The crate is a library as well as the binary, so that a program (or a test) can run the
//! proxy in-process:
//!
//! ```no_run
//! use tollgate_proxy::{Config, Proxy};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = Config::from_toml(r#"
//!     listen = "127.0.0.1:0"
//!     [[upstream]]
//!     url = "https://api.openai.com"
//!     profile = "openai"
//!     requests = "500/m"
//!     tokens = "200000/m"
//! "#)?;
//! let running = Proxy::bind(config).await?.spawn();
//! println!("OPENAI_BASE_URL={}", running.base_url());
//! running.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod accept;
mod admin;
mod admit;
mod answer;
mod attempt;
mod body;
pub mod config;
mod deliver;
mod estimate;
mod exchange;
mod fair;
mod head;
mod health;
mod hidden;
mod keys;
mod lenient;
mod metrics;
mod owned;
mod owners;
mod pipeline;
mod pool;
mod proxy;
mod refusal;
mod relay;
mod route;
mod send;
mod sending;
mod service;
mod settle;
mod state;
mod tally;
mod tenant;
mod upstream;

pub use accept::Drained;
pub use config::{Config, ConfigError};
pub use proxy::{Proxy, Reloader, Running};
pub use relay::Relay;
pub use state::{ReloadError, StartError};
