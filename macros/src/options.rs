//! The attribute's options, read and checked: every literal is parsed by the library's own
//! grammar now, so that a mistake is a compile error at the literal.

use proc_macro2::{Span, TokenStream};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Token};

const OPTIONS: &str = "key, requests, tokens, output_tokens, estimator, timeout, margin, tokens_from, reserve_output, settle, retries";

/// One `name` or `name = value` in the attribute.
struct Opt {
    name: Ident,
    value: Option<Expr>,
}

impl Parse for Opt {
    fn parse(input: ParseStream) -> syn::Result<Opt> {
        let name: Ident = input.parse()?;
        let value = if input.peek(Token![=]) {
            input.parse::<Token![=]>()?;
            Some(input.parse()?)
        } else {
            None
        };
        Ok(Opt { name, value })
    }
}

/// Everything the attribute said.
#[derive(Default)]
pub(crate) struct Options {
    pub(crate) key: Option<Expr>,
    pub(crate) requests: Option<LitStr>,
    pub(crate) tokens: Option<LitStr>,
    pub(crate) output_tokens: Option<LitStr>,
    pub(crate) estimator: Option<LitStr>,
    /// The timeout's literal and its value: `None` inside for `"none"`.
    pub(crate) timeout: Option<(LitStr, Option<u64>)>,
    /// The estimate margin, in basis points (`"3%"` is 300).
    pub(crate) margin: Option<u32>,
    pub(crate) tokens_from: Option<Vec<Ident>>,
    /// `reserve_output` alone (the body's reservation), or with an expression.
    pub(crate) reserve_output: Option<Option<Expr>>,
    pub(crate) settle: Option<Expr>,
    pub(crate) retries: Option<u32>,
}

fn string_literal(opt: &Opt, what: &str) -> syn::Result<LitStr> {
    match &opt.value {
        Some(Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        })) => Ok(lit.clone()),
        Some(other) => Err(syn::Error::new(
            other.span(),
            format!("`{}` takes a string literal, like {what}", opt.name),
        )),
        None => Err(syn::Error::new(
            opt.name.span(),
            format!("`{}` needs a value, like {} = {what}", opt.name, opt.name),
        )),
    }
}

fn value(opt: &Opt, example: &str) -> syn::Result<Expr> {
    opt.value.clone().ok_or_else(|| {
        syn::Error::new(
            opt.name.span(),
            format!("`{}` needs a value, like {example}", opt.name),
        )
    })
}

/// Reads the attribute's options, refusing unknown ones, repeated ones and bad literals.
pub(crate) fn parse(attr: TokenStream) -> syn::Result<Options> {
    let opts = syn::parse::Parser::parse2(Punctuated::<Opt, Token![,]>::parse_terminated, attr)?;
    let mut options = Options::default();
    let mut seen: Vec<String> = Vec::new();
    for opt in opts {
        let name = opt.name.to_string();
        if seen.contains(&name) {
            return Err(syn::Error::new(
                opt.name.span(),
                format!("`{name}` is given twice"),
            ));
        }
        seen.push(name.clone());
        match name.as_str() {
            "key" => {
                options.key = Some(value(
                    &opt,
                    "key = \"openai\" or key = format!(\"host:{}\", host)",
                )?);
            }
            "requests" => options.requests = Some(rates_literal(&opt, "\"500/m\"")?),
            "tokens" => options.tokens = Some(rates_literal(&opt, "\"200000/m\"")?),
            "output_tokens" => options.output_tokens = Some(rates_literal(&opt, "\"8000/m\"")?),
            "estimator" => {
                let lit = string_literal(&opt, "\"openai\"")?;
                tollgate_grammar::EstimatorName::parse(&lit.value())
                    .map_err(|err| syn::Error::new(lit.span(), err.to_string()))?;
                options.estimator = Some(lit);
            }
            "timeout" => {
                let lit = string_literal(&opt, "\"30s\"")?;
                let timeout = tollgate_grammar::parse_timeout(&lit.value())
                    .map_err(|err| syn::Error::new(lit.span(), err.to_string()))?;
                // A timeout is at most u64::MAX nanoseconds, as the grammar makes it.
                options.timeout = Some((lit, timeout.map(|d| d.as_nanos() as u64)));
            }
            "margin" => {
                let lit = string_literal(&opt, "\"3%\"")?;
                let text = lit.value();
                let percent = text
                    .trim()
                    .strip_suffix('%')
                    .and_then(|n| n.trim().parse::<f64>().ok())
                    .filter(|p| (0.0..=100.0).contains(p))
                    .ok_or_else(|| {
                        syn::Error::new(
                            lit.span(),
                            format!(
                                "margin `{text}`: expected a percentage from 0% to 100%, like \"3%\" or \"0%\""
                            ),
                        )
                    })?;
                options.margin = Some((percent * 100.0).round() as u32);
            }
            "tokens_from" => options.tokens_from = Some(argument_list(&opt)?),
            "reserve_output" => options.reserve_output = Some(opt.value.clone()),
            "settle" => {
                options.settle = Some(value(&opt, "settle = |answer| answer.usage.total_tokens")?);
            }
            "retries" => {
                let bad = |span| {
                    syn::Error::new(span, "`retries` takes a whole number, like retries = 3")
                };
                match &opt.value {
                    Some(Expr::Lit(ExprLit {
                        lit: Lit::Int(n), ..
                    })) => options.retries = Some(n.base10_parse().map_err(|_| bad(n.span()))?),
                    Some(other) => return Err(bad(other.span())),
                    None => return Err(bad(opt.name.span())),
                }
            }
            _ => {
                return Err(syn::Error::new(
                    opt.name.span(),
                    format!("unknown option `{name}`; expected one of {OPTIONS}"),
                ));
            }
        }
    }
    Ok(options)
}

/// A rate string, parsed now so that a bad one is a compile error at the literal.
fn rates_literal(opt: &Opt, example: &str) -> syn::Result<LitStr> {
    let lit = string_literal(opt, example)?;
    lit.value()
        .parse::<tollgate_grammar::Rates>()
        .map_err(|err| syn::Error::new(lit.span(), err.to_string()))?;
    Ok(lit)
}

fn argument_list(opt: &Opt) -> syn::Result<Vec<Ident>> {
    let bad = |span: Span| {
        syn::Error::new(
            span,
            "`tokens_from` takes a list of argument names, like tokens_from = [messages]",
        )
    };
    match &opt.value {
        Some(Expr::Array(array)) => array
            .elems
            .iter()
            .map(|e| match e {
                Expr::Path(path) => path.path.get_ident().cloned().ok_or_else(|| bad(e.span())),
                other => Err(bad(other.span())),
            })
            .collect(),
        Some(other) => Err(bad(other.span())),
        None => Err(bad(opt.name.span())),
    }
}
