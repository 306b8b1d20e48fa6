//! The request's head as it goes upstream: on the upstream's URI, without the headers that
//! belong to one connection, without the tenant's header or secret, and with the real key in
//! place of a virtual one.

use http::header::{self, HeaderMap, HeaderName};
use http::{Uri, Version};

use crate::answer::{ErrorKind, Reject};
use crate::relay::strip_hop_by_hop;
use crate::state::{ReadyUpstream, Shared};
use crate::tenant::KEY_HEADERS;

/// The request's head as it goes upstream: its URI on the upstream, no hop-by-hop headers, no
/// tenant header or secret, the real key in place of a virtual one.
pub(crate) fn upstream_head(
    shared: &Shared,
    upstream: &ReadyUpstream,
    mut parts: http::request::Parts,
    path: &str,
) -> Result<http::request::Parts, Reject> {
    let uri = Uri::builder()
        .scheme(upstream.scheme.clone())
        .authority(upstream.authority.clone())
        .path_and_query(path)
        .build()
        .map_err(|_| {
            Reject::new(
                ErrorKind::Invalid,
                "tollgate-proxy: the path can't be forwarded",
            )
        })?;
    parts.uri = uri;
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::HOST);
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(crate::config::SECRET_HEADER);
    if let Some(name) = &shared.tenant_header {
        parts.headers.remove(name);
    }
    if let Some((name, value)) = &upstream.real_key {
        // A header is dropped in any spelling a server may read as it: servers that read
        // headers as CGI variables (`HTTP_OPENAI_ORGANIZATION`) take `OpenAI_Organization` for
        // `OpenAI-Organization`.
        let drop_spellings = |headers: &mut HeaderMap, names: &[&str]| {
            let spelled: Vec<HeaderName> = headers
                .keys()
                .filter(|k| {
                    let k = k.as_str().replace('_', "-");
                    names.contains(&k.as_str())
                })
                .cloned()
                .collect();
            for name in spelled {
                headers.remove(name);
            }
        };
        drop_spellings(&mut parts.headers, &KEY_HEADERS);
        parts.headers.insert(name.clone(), value.clone());
        // Answers come back as written, so that an echo of the real key can be masked.
        parts.headers.remove(header::ACCEPT_ENCODING);
        // The organisation or project a call is billed to is the organisation's to choose,
        // never a tenant's, unless the upstream's configuration lets the tenant choose.
        if !upstream.config.tenant_org_headers {
            drop_spellings(
                &mut parts.headers,
                &["openai-organization", "openai-project"],
            );
        }
    }
    Ok(parts)
}
