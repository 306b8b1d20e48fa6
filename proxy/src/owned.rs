//! A tenant's claim on stored objects (responses, files, batches): every object a call names,
//! in its path or its body, must be the tenant's, and the organisation's lists, which hold
//! every tenant's, are not read. A call that may create objects says so, so that their ids are
//! recorded as the tenant's when its answer comes.

use http::header;

use crate::answer::{ErrorKind, Reject};
use crate::exchange::Exchange;

/// What the check found: whether the call may create objects, and `any_id` when the collection
/// is one the proxy doesn't know (its answer's id is the tenant's whatever its prefix).
pub(crate) type Creates = Option<bool>;

/// The check of an unmetered call, on its body as sent (a metered one is checked on the body
/// the gate decoded, with [`check`], once its toll is paid). Nothing to check without a
/// tenant.
pub(crate) async fn check_unmetered(exchange: &Exchange<'_>) -> Result<Creates, Reject> {
    if exchange.tenant.is_none() || exchange.route.kind == crate::route::RouteKind::Metered {
        return Ok(None);
    }
    let encoded = exchange
        .client
        .headers
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    if encoded && !exchange.body.is_empty() {
        return Err(Reject::new(
            ErrorKind::UnsupportedEncoding,
            "tollgate-proxy: with tenants, a body on this path is read as sent: send it without content-encoding",
        ));
    }
    check(exchange, &exchange.body).await
}

/// Whether the exchange's tenant may make this call with `body`, as far as stored objects go
/// (see the module's docs). Nothing to check without a tenant.
pub(crate) async fn check(exchange: &Exchange<'_>, body: &[u8]) -> Result<Creates, Reject> {
    let Some(tenant) = &exchange.tenant else {
        return Ok(None);
    };
    let shared = exchange.shared;
    let path = crate::route::normalize(exchange.client.uri.path()).unwrap_or_default();
    // Read as the upstream will read it: a body a strict parser refuses (a byte-order mark,
    // UTF-16, a `NaN`) still names the ids it names.
    let value = crate::lenient::read(body);
    let touches = crate::owners::touches(&exchange.client.method, &path, &value);
    if touches.lists {
        return Err(Reject::new(
            ErrorKind::Forbidden,
            "tollgate-proxy: listing stored objects is refused here: the organisation's list holds every tenant's; keep the ids your calls create",
        ));
    }
    for id in &touches.names {
        match shared.owners.owner(id).await {
            Ok(Some(owner)) if owner == tenant.name => {}
            Ok(_) => {
                return Err(Reject::new(
                    ErrorKind::NoSuchObject,
                    format!(
                        "No object found with id '{}'.",
                        crate::answer::printable(id)
                    ),
                ));
            }
            Err(err) => {
                tracing::warn!(error = %err, "the owner of a stored object could not be read");
                return Err(Reject::new(
                    ErrorKind::Unavailable,
                    "tollgate-proxy: the store can't be reached; nothing was sent",
                )
                .counted(&shared.proxy_metrics.store_errors));
            }
        }
    }
    Ok(touches.creates.then_some(touches.any_id))
}
