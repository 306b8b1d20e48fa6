//! `#[tollgate::limit(...)]`: rate-limit an async function with one attribute.
//!
//! Use it through `tollgate::limit`; the crate docs of `tollgate` describe the options.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{ToTokens, quote, quote_spanned};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, FnArg, Ident, ItemFn, Lit, LitStr, Pat, ReturnType, Token, Type};

const OPTIONS: &str =
    "key, requests, tokens, estimator, timeout, tokens_from, reserve_output, retries";

/// Rate-limits an async function: each call pays 1 request and the estimated tokens of its
/// arguments before the body runs. See the `tollgate` crate docs.
#[proc_macro_attribute]
pub fn limit(attr: TokenStream, item: TokenStream) -> TokenStream {
    match expand(attr.into(), item.into()) {
        Ok(tokens) => tokens.into(),
        Err(err) => err.to_compile_error().into(),
    }
}

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

#[derive(Default)]
struct Options {
    key: Option<Expr>,
    requests: Option<LitStr>,
    tokens: Option<LitStr>,
    estimator: Option<LitStr>,
    timeout: Option<LitStr>,
    tokens_from: Option<Vec<Ident>>,
    reserve_output: Option<Option<Expr>>,
    retries: Option<u32>,
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

fn parse_options(attr: TokenStream2) -> syn::Result<Options> {
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
                let value = opt.value.clone().ok_or_else(|| {
                    syn::Error::new(
                        opt.name.span(),
                        "`key` needs a value, like key = \"openai\" or key = format!(\"host:{}\", host)",
                    )
                })?;
                options.key = Some(value);
            }
            "requests" => options.requests = Some(rates_literal(&opt, "\"500/m\"")?),
            "tokens" => options.tokens = Some(rates_literal(&opt, "\"200000/m\"")?),
            "estimator" => {
                let lit = string_literal(&opt, "\"openai\"")?;
                check_estimator(&lit)?;
                options.estimator = Some(lit);
            }
            "timeout" => {
                let lit = string_literal(&opt, "\"30s\"")?;
                parse_timeout(&lit)?;
                options.timeout = Some(lit);
            }
            "tokens_from" => options.tokens_from = Some(argument_list(&opt)?),
            "reserve_output" => options.reserve_output = Some(opt.value.clone()),
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

fn check_estimator(lit: &LitStr) -> syn::Result<()> {
    tollgate_grammar::EstimatorName::parse(&lit.value())
        .map(|_| ())
        .map_err(|err| syn::Error::new(lit.span(), err.to_string()))
}

/// `"30s"`, `"500ms"`, `"2m"`, `"1h"` or `"none"`: the nanoseconds, or `None` for no deadline.
fn parse_timeout(lit: &LitStr) -> syn::Result<Option<u64>> {
    tollgate_grammar::parse_timeout(&lit.value())
        .map(|timeout| timeout.map(|d| d.as_nanos() as u64))
        .map_err(|err| syn::Error::new(lit.span(), err.to_string()))
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
                Expr::Path(path) if path.path.get_ident().is_some() => {
                    Ok(path.path.get_ident().cloned().expect("checked"))
                }
                other => Err(bad(other.span())),
            })
            .collect(),
        Some(other) => Err(bad(other.span())),
        None => Err(bad(opt.name.span())),
    }
}

/// The named arguments of the function, with whether each is a plain identifier pattern.
fn arguments(func: &ItemFn) -> Vec<(Ident, Type)> {
    func.sig
        .inputs
        .iter()
        .filter_map(|arg| match arg {
            FnArg::Typed(typed) => match &*typed.pat {
                Pat::Ident(ident) => Some((ident.ident.clone(), (*typed.ty).clone())),
                _ => None,
            },
            FnArg::Receiver(_) => None,
        })
        .collect()
}

/// True unless the return type is plainly not a `Result`: nothing, a tuple, a reference, or a
/// primitive or std type that isn't one. Other paths pass, so that aliases (`io::Result<T>`,
/// `type Res<T> = Result<T, E>`) work; the compiler checks them.
fn returns_result(func: &ItemFn) -> bool {
    const NOT_RESULT: &[&str] = &[
        "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64", "i128", "isize",
        "f32", "f64", "bool", "char", "str", "String", "Vec", "Option", "Box", "HashMap",
    ];
    match &func.sig.output {
        ReturnType::Type(_, ty) => match &**ty {
            Type::Path(path) => path
                .path
                .segments
                .last()
                .is_some_and(|segment| !NOT_RESULT.iter().any(|n| segment.ident == n)),
            _ => false,
        },
        ReturnType::Default => false,
    }
}

fn expand(attr: TokenStream2, item: TokenStream2) -> syn::Result<TokenStream2> {
    let func: ItemFn = syn::parse2(item.clone()).map_err(|_| {
        syn::Error::new(
            Span::call_site(),
            "#[tollgate::limit] goes on an async fn with a body",
        )
    })?;
    let options = parse_options(attr)?;
    let name = func.sig.ident.to_string();

    if func.sig.asyncness.is_none() {
        return Err(syn::Error::new(
            func.sig.fn_token.span(),
            format!(
                "#[tollgate::limit] is for async functions: make `{name}` async, or call Limiter::acquire yourself before the work"
            ),
        ));
    }
    if !returns_result(&func) {
        let span = match &func.sig.output {
            ReturnType::Type(_, ty) => ty.span(),
            ReturnType::Default => func.sig.ident.span(),
        };
        return Err(syn::Error::new(
            span,
            format!(
                "#[tollgate::limit] needs `{name}` to return Result<T, E> with E: From<tollgate::Error>, so that a timeout, a full queue or a cost above capacity can be returned as an error"
            ),
        ));
    }
    let Some(key) = options.key else {
        return Err(syn::Error::new(
            Span::call_site(),
            "missing `key`: name the key whose buckets this function shares, like key = \"openai\"",
        ));
    };

    let args = arguments(&func);
    let counted: Vec<(Ident, bool)> = match &options.tokens_from {
        Some(names) => names
            .iter()
            .map(|wanted| {
                if args.iter().any(|(ident, _)| ident == wanted) {
                    Ok((wanted.clone(), true))
                } else {
                    Err(syn::Error::new(
                        wanted.span(),
                        format!("`tokens_from` names `{wanted}`, but `{name}` has no argument called that"),
                    ))
                }
            })
            .collect::<syn::Result<_>>()?,
        None => args.iter().map(|(ident, _)| (ident.clone(), false)).collect(),
    };

    let (key_literal, key_dynamic) = match &key {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => (
            quote!(::core::option::Option::Some(#lit)),
            quote!(::core::option::Option::None),
        ),
        expr => (
            quote!(::core::option::Option::None),
            quote!(::core::option::Option::Some(::core::convert::AsRef::<str>::as_ref(&(#expr)))),
        ),
    };
    let lit_or_empty = |lit: &Option<LitStr>| match lit {
        Some(lit) => lit.to_token_stream(),
        None => quote!(""),
    };
    let requests = lit_or_empty(&options.requests);
    let tokens = lit_or_empty(&options.tokens);
    let estimator = match &options.estimator {
        Some(lit) => quote!(::core::option::Option::Some(#lit)),
        None => quote!(::core::option::Option::None),
    };
    let timeout = match &options.timeout {
        None => quote!(::tollgate::__private::Timeout::Default),
        Some(lit) => match parse_timeout(lit)? {
            None => quote!(::tollgate::__private::Timeout::Never),
            Some(nanos) => quote!(::tollgate::__private::Timeout::After(
                ::core::time::Duration::from_nanos(#nanos)
            )),
        },
    };
    let fail =
        quote!(return ::core::result::Result::Err(::core::convert::From::from(__tollgate_error)));
    let tallies = counted.iter().map(|(ident, explicit)| {
        if *explicit {
            quote_spanned! {ident.span()=>
                if let ::core::result::Result::Err(__tollgate_error) =
                    ::tollgate::__private::CountSerialize::tally_into(
                        &::tollgate::__private::Arg(&#ident),
                        &**__tollgate_estimator,
                        &mut __tollgate_tally,
                    )
                {
                    #fail;
                }
            }
        } else {
            quote! {
                if let ::core::result::Result::Err(__tollgate_error) =
                    (&::tollgate::__private::Arg(&#ident))
                        .tally_into(&**__tollgate_estimator, &mut __tollgate_tally)
                {
                    #fail;
                }
            }
        }
    });
    let reserve = match &options.reserve_output {
        None => quote!(0u64),
        Some(None) => quote!(__tollgate_tally.reserved_output),
        Some(Some(expr)) => {
            quote!(::tollgate::__private::ReserveTokens::reserve_tokens(&(#expr)))
        }
    };

    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = func;
    let stmts = &block.stmts;
    let admit = quote! {
        {
            let __tollgate_call = match __TOLLGATE_SITE.resolve(#key_dynamic) {
                ::core::result::Result::Ok(call) => call,
                ::core::result::Result::Err(__tollgate_error) => #fail,
            };
            let mut __tollgate_tokens: u64 = 0;
            if __tollgate_call.counts_tokens() {
                let __tollgate_estimator = match __tollgate_call.estimator() {
                    ::core::result::Result::Ok(estimator) => estimator,
                    ::core::result::Result::Err(__tollgate_error) => #fail,
                };
                let mut __tollgate_tally = ::tollgate::Estimate::default();
                #[allow(unused_imports)]
                use ::tollgate::__private::{CountSerialize as _, CountSkip as _};
                #(#tallies)*
                __tollgate_tokens = __tollgate_tally
                    .input_tokens
                    .saturating_add(#reserve);
            }
            match __tollgate_call.acquire(__tollgate_tokens).await {
                ::core::result::Result::Ok(permit) => (__tollgate_call, permit),
                ::core::result::Result::Err(__tollgate_error) => #fail,
            }
        }
    };
    let site = quote! {
        static __TOLLGATE_SITE: ::tollgate::__private::Site = ::tollgate::__private::Site::new(
            #name, #key_literal, #requests, #tokens, #estimator, #timeout,
        );
    };
    let body = match options.retries {
        None => quote! {
            #site
            let (__tollgate_call, __tollgate_permit) = #admit;
            let _ = (&__tollgate_call, &__tollgate_permit);
            #(#stmts)*
        },
        Some(retries) => {
            let output = match &sig.output {
                ReturnType::Type(_, ty) => ty.to_token_stream(),
                ReturnType::Default => quote!(()),
            };
            quote! {
                #site
                // The body runs again after a refusal, so it is a closure that borrows the
                // arguments rather than consuming them.
                let mut __tollgate_body = async || -> #output { #(#stmts)* };
                let mut __tollgate_attempt: u32 = 0;
                loop {
                    let (__tollgate_call, __tollgate_permit) = #admit;
                    let __tollgate_result: #output = __tollgate_body().await;
                    drop(__tollgate_permit);
                    if let ::core::result::Result::Err(__tollgate_refusal) = &__tollgate_result {
                        if __tollgate_attempt < #retries
                            && ::tollgate::RateLimited::is_rate_limited(__tollgate_refusal)
                        {
                            let __tollgate_after = ::tollgate::RateLimited::retry_after(__tollgate_refusal);
                            if let ::core::result::Result::Err(__tollgate_error) =
                                __tollgate_call.rate_limited(__tollgate_after, __tollgate_attempt).await
                            {
                                #fail;
                            }
                            __tollgate_attempt += 1;
                            continue;
                        }
                    }
                    return __tollgate_result;
                }
            }
        }
    };
    Ok(quote! {
        #(#attrs)*
        #vis #sig {
            #body
        }
    })
}
