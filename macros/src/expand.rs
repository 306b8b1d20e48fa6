//! The code the attribute writes: a call site that resolves its key once, the count of the
//! arguments, the admission, then the body (run again after a refusal with `retries`, and
//! settled with the real usage with `settle`).

use proc_macro2::TokenStream;
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Ident, ItemFn, Lit, LitStr, ReturnType};

use crate::options::Options;
use crate::signature;

/// `return Err(From::from(__tollgate_error))`: every refusal comes back through the
/// function's own error type.
fn fail() -> TokenStream {
    quote!(return ::core::result::Result::Err(::core::convert::From::from(__tollgate_error)))
}

fn lit_or_empty(lit: &Option<LitStr>) -> TokenStream {
    match lit {
        Some(lit) => lit.to_token_stream(),
        None => quote!(""),
    }
}

/// The static that holds the call site's literals and what it resolves from them.
fn site(func: &ItemFn, options: &Options, key: &Expr) -> TokenStream {
    let name = func.sig.ident.to_string();
    let key_literal = match key {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => quote!(::core::option::Option::Some(#lit)),
        _ => quote!(::core::option::Option::None),
    };
    let requests = lit_or_empty(&options.requests);
    let tokens = lit_or_empty(&options.tokens);
    let output_tokens = lit_or_empty(&options.output_tokens);
    let estimator = match &options.estimator {
        Some(lit) => quote!(::core::option::Option::Some(#lit)),
        None => quote!(::core::option::Option::None),
    };
    let timeout = match &options.timeout {
        None => quote!(::tollgate::__private::Timeout::Default),
        Some((_, None)) => quote!(::tollgate::__private::Timeout::Never),
        Some((_, Some(nanos))) => quote!(::tollgate::__private::Timeout::After(
            ::core::time::Duration::from_nanos(#nanos)
        )),
    };
    let margin = match options.margin {
        None => quote!(::core::option::Option::None),
        Some(bp) => quote!(::core::option::Option::Some(#bp)),
    };
    quote! {
        static __TOLLGATE_SITE: ::tollgate::__private::Site = ::tollgate::__private::Site::new(
            #name, #key_literal, #requests, #tokens, #output_tokens, #estimator, #timeout, #margin,
        );
    }
}

/// Adds each counted argument's tokens to the tally (inside a closure that answers a
/// `Result`), and its bytes of text to the size.
fn tallies(counted: &[(Ident, bool)]) -> (Vec<TokenStream>, Vec<TokenStream>) {
    counted
        .iter()
        .map(|(ident, explicit)| {
            if *explicit {
                // Named in `tokens_from`: it must be `Serialize`, and the error says so here.
                (
                    quote_spanned! {ident.span()=>
                        ::tollgate::__private::CountSerialize::tally_into(
                            &::tollgate::__private::Arg(&#ident),
                            &**__tollgate_estimator,
                            &mut __tollgate_tally,
                        )?;
                    },
                    quote_spanned! {ident.span()=>
                        __tollgate_size += ::tollgate::__private::SizeSerialize::text_len(
                            &::tollgate::__private::Arg(&#ident),
                        );
                    },
                )
            } else {
                // Every argument: autoref picks counting for `Serialize` types, skipping
                // for the others (a client, a connection).
                (
                    quote! {
                        (&::tollgate::__private::Arg(&#ident))
                            .tally_into(&**__tollgate_estimator, &mut __tollgate_tally)?;
                    },
                    quote! {
                        __tollgate_size += (&::tollgate::__private::Arg(&#ident)).text_len();
                    },
                )
            }
        })
        .unzip()
}

/// The admission: resolve the key, count, acquire. Evaluates to `(call, permit)`.
fn admit(options: &Options, key: &Expr, counted: &[(Ident, bool)]) -> TokenStream {
    let fail = fail();
    let key_dynamic = match key {
        Expr::Lit(ExprLit {
            lit: Lit::Str(_), ..
        }) => quote!(::core::option::Option::None),
        expr => {
            quote!(::core::option::Option::Some(::core::convert::AsRef::<str>::as_ref(&(#expr))))
        }
    };
    let (tallies, sizes) = tallies(counted);
    let settles = options.settle.is_some();
    let reserve = match &options.reserve_output {
        None => quote!(0u64),
        Some(None) => quote!(__tollgate_tally.reserved_output),
        Some(Some(expr)) => {
            quote!(::tollgate::__private::ReserveTokens::reserve_tokens(&(#expr)))
        }
    };
    quote! {
        {
            let __tollgate_call = match __TOLLGATE_SITE.resolve(#key_dynamic) {
                ::core::result::Result::Ok(call) => call,
                ::core::result::Result::Err(__tollgate_error) => #fail,
            };
            let mut __tollgate_input: u64 = 0;
            let mut __tollgate_reserve: u64 = 0;
            if __tollgate_call.counts_tokens() {
                let __tollgate_estimator = match __tollgate_call.estimator() {
                    ::core::result::Result::Ok(estimator) => estimator,
                    ::core::result::Result::Err(__tollgate_error) => #fail,
                };
                #[allow(unused_imports)]
                use ::tollgate::__private::{CountSerialize as _, CountSkip as _, SizeSerialize as _};
                let mut __tollgate_size: usize = 0;
                #(#sizes)*
                // Long arguments are counted off the async worker.
                let __tollgate_counted = __tollgate_call.count(__tollgate_size, || {
                    let mut __tollgate_tally = ::tollgate::Estimate::default();
                    #(#tallies)*
                    ::core::result::Result::Ok(__tollgate_tally)
                });
                let __tollgate_tally = match __tollgate_counted {
                    ::core::result::Result::Ok(tally) => tally,
                    ::core::result::Result::Err(__tollgate_error) => #fail,
                };
                __tollgate_input = __tollgate_tally.input_tokens;
                __tollgate_reserve = #reserve;
            }
            match __tollgate_call.acquire(__tollgate_input, __tollgate_reserve, #settles).await {
                ::core::result::Result::Ok(permit) => (__tollgate_call, permit),
                ::core::result::Result::Err(__tollgate_error) => #fail,
            }
        }
    }
}

/// Settles the permit with what `settle` reads from the `Ok` value, if there is one.
fn settle(options: &Options) -> TokenStream {
    match &options.settle {
        None => quote!(drop(__tollgate_permit);),
        Some(expr) => quote_spanned! {expr.span()=>
            if let ::core::result::Result::Ok(__tollgate_value) = &__tollgate_result {
                let __tollgate_usage = ::tollgate::__private::usage_of(__tollgate_value, #expr);
                __tollgate_call.settle(__tollgate_permit, __tollgate_usage).await;
            } else {
                drop(__tollgate_permit);
            }
        },
    }
}

/// Writes the function anew around its body.
pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let func: ItemFn = syn::parse2(item).map_err(|_| {
        syn::Error::new(
            signature::call_site(),
            "#[tollgate::limit] goes on an async fn with a body",
        )
    })?;
    let options = crate::options::parse(attr)?;
    signature::check(&func)?;
    let Some(key) = &options.key else {
        return Err(syn::Error::new(
            signature::call_site(),
            "missing `key`: name the key whose buckets this function shares, like key = \"openai\"",
        ));
    };
    let counted = signature::counted(&func, options.tokens_from.as_deref())?;
    let site = site(&func, &options, key);
    let admit = admit(&options, key, &counted);
    let settle = settle(&options);
    let output = match &func.sig.output {
        ReturnType::Type(_, ty) => ty.to_token_stream(),
        ReturnType::Default => quote!(()),
    };
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = &func;
    let stmts = &block.stmts;
    let body = match (options.retries, &options.settle) {
        (None, None) => quote! {
            let (__tollgate_call, __tollgate_permit) = #admit;
            let _ = (&__tollgate_call, &__tollgate_permit);
            #(#stmts)*
        },
        (None, Some(_)) => quote! {
            let (__tollgate_call, __tollgate_permit) = #admit;
            // The body is a block of its own, so that its value can be settled before it is
            // returned (a `return` in it ends the block, as it would have ended the function).
            let __tollgate_result: #output = async { #(#stmts)* }.await;
            #settle
            __tollgate_result
        },
        (Some(retries), _) => {
            let fail = fail();
            // The body runs again after a refusal, so it is a closure that borrows the
            // arguments: one that moves an argument out is a compile error at that line, and
            // the argument must be cloned there.
            let closure = quote_spanned! {block.span()=>
                ::tollgate::__private::body_runs_again_with_retries(
                    async || -> #output { #(#stmts)* }
                )
            };
            quote! {
                let mut __tollgate_body = #closure;
                let mut __tollgate_attempt: u32 = 0;
                loop {
                    let (__tollgate_call, __tollgate_permit) = #admit;
                    let __tollgate_result: #output = __tollgate_body().await;
                    if let ::core::result::Result::Err(__tollgate_refusal) = &__tollgate_result {
                        if __tollgate_attempt < #retries
                            && ::tollgate::RateLimited::is_rate_limited(__tollgate_refusal)
                        {
                            // The key is paused, and its windows brought to the provider's:
                            // the next admission waits for both, and pays again.
                            let __tollgate_after = ::tollgate::RateLimited::retry_after(__tollgate_refusal);
                            if let ::core::result::Result::Err(__tollgate_error) =
                                __tollgate_call.rate_limited(__tollgate_permit, __tollgate_after).await
                            {
                                #fail;
                            }
                            __tollgate_attempt += 1;
                            continue;
                        }
                    } else {
                        __tollgate_call.answered();
                    }
                    #settle
                    return __tollgate_result;
                }
            }
        }
    };
    Ok(quote! {
        #(#attrs)*
        #vis #sig {
            #site
            #body
        }
    })
}
