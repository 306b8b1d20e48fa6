//! `tollgate::http`: the sans-IO gate by hand, and each adapter with its real client against
//! the provider stand-in.

#[cfg(feature = "async-openai")]
mod async_openai;
mod bound;
mod closed_loop;
mod gate;
mod hostile;
#[cfg(feature = "reqwest-middleware")]
mod reqwest_middleware;
#[cfg(feature = "tower")]
mod tower;
