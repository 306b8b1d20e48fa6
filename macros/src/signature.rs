//! What the attribute needs of the function it goes on: async, a `Result`, and arguments it
//! can name.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, Pat, ReturnType, Type};

/// Refuses a function that isn't async or plainly doesn't return a `Result`.
pub(crate) fn check(func: &ItemFn) -> syn::Result<()> {
    let name = &func.sig.ident;
    if func.sig.asyncness.is_none() {
        return Err(syn::Error::new(
            func.sig.fn_token.span(),
            format!(
                "#[tollgate::limit] is for async functions: make `{name}` async, or call Limiter::acquire yourself before the work"
            ),
        ));
    }
    if !returns_result(func) {
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
    Ok(())
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

/// The arguments with a plain name (destructured ones can't be named, so they aren't counted).
pub(crate) fn named_arguments(func: &ItemFn) -> Vec<Ident> {
    func.sig
        .inputs
        .iter()
        .filter_map(|arg| match arg {
            FnArg::Typed(typed) => match &*typed.pat {
                Pat::Ident(ident) => Some(ident.ident.clone()),
                _ => None,
            },
            FnArg::Receiver(_) => None,
        })
        .collect()
}

/// The arguments to count: those `tokens_from` names (each must exist), or every named one.
/// The flag says whether the argument was named explicitly (then it must be `Serialize`).
pub(crate) fn counted(
    func: &ItemFn,
    tokens_from: Option<&[Ident]>,
) -> syn::Result<Vec<(Ident, bool)>> {
    let args = named_arguments(func);
    let Some(names) = tokens_from else {
        return Ok(args.into_iter().map(|ident| (ident, false)).collect());
    };
    names
        .iter()
        .map(|wanted| {
            if args.contains(wanted) {
                Ok((wanted.clone(), true))
            } else {
                Err(syn::Error::new(
                    wanted.span(),
                    format!(
                        "`tokens_from` names `{wanted}`, but `{}` has no argument called that",
                        func.sig.ident
                    ),
                ))
            }
        })
        .collect()
}

/// Where an error about the whole attribute points.
pub(crate) fn call_site() -> Span {
    Span::call_site()
}
