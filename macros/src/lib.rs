//! `#[tollgate::limit(...)]`: rate-limit an async function with one attribute.
//!
//! Use it through `tollgate::limit`, whose documentation lists the options with examples. The
//! rate, timeout and estimator literals are parsed here by `tollgate-grammar`, the library's
//! own grammar, so that what compiles is what parses.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

use proc_macro::TokenStream;

mod expand;
mod options;
mod signature;

/// Rate-limits an async function: each call pays 1 request and the estimated tokens of its
/// arguments before the body runs. See `tollgate::limit` for the options.
#[proc_macro_attribute]
pub fn limit(attr: TokenStream, item: TokenStream) -> TokenStream {
    match expand::expand(attr.into(), item.into()) {
        Ok(tokens) => tokens.into(),
        Err(err) => err.to_compile_error().into(),
    }
}
