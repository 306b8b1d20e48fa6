//! `#[tollgate::limit]` at run time: shared keys, configuration, retries, and the agent
//! against the provider stand-in. (What it refuses to compile is in `ui/`.)

mod behaviour;
mod config;
mod provider;
