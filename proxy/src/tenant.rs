//! Whose call it is: a tenant from the API key (hashed), from a header a trusted proxy in front
//! sets, or from a virtual key that stands for the upstream's real key. Credentials are read
//! strictly: a call can't escape its tenant, or spend another's, by how it writes them.

use std::collections::HashMap;

use http::HeaderMap;
use sha2::{Digest, Sha256};

use crate::answer::{ErrorKind, Reject};
use crate::config::{KeyPaths, SECRET_HEADER, TenantFrom, Tenants, plain_name};
use crate::route::RouteKind;

/// The headers clients put their API key in: OpenAI's `Authorization: Bearer`, Anthropic's
/// `x-api-key`, Azure's `api-key`, Google's `x-goog-api-key`.
pub(crate) const KEY_HEADERS: [&str; 4] =
    ["authorization", "x-api-key", "api-key", "x-goog-api-key"];

/// Why a call's credentials can't be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// No key, where one is needed.
    NoKey,
    /// A key header that is not one well-formed key: `Authorization` that is not
    /// `Bearer <key>`, a header sent twice, a key with spaces or control characters.
    Malformed,
    /// Two headers carry different keys.
    Disagree,
    /// Virtual keys are configured, and this is not one of them.
    UnknownKey,
    /// Header tenants without the shared secret (or with another).
    NoSecret,
    /// Tenants are configured, the call names none, and there is no default tenant.
    NoTenant,
}

impl Refused {
    /// What the client is told.
    pub(crate) fn message(self) -> &'static str {
        match self {
            Refused::NoKey => {
                "tollgate-proxy: this proxy needs an API key (Authorization: Bearer KEY)"
            }
            Refused::Malformed => {
                "tollgate-proxy: the API key can't be read: send one `Authorization: Bearer KEY` (or one x-api-key)"
            }
            Refused::Disagree => {
                "tollgate-proxy: the request carries two different API keys (Authorization and x-api-key); send one"
            }
            Refused::UnknownKey => "tollgate-proxy: unknown API key",
            Refused::NoSecret => {
                "tollgate-proxy: the tenant header is only taken from the proxy in front of this one"
            }
            Refused::NoTenant => "tollgate-proxy: this call names no tenant",
        }
    }
}

/// The one API key a request presents, read strictly: `None` when it presents none.
pub(crate) fn presented_key(headers: &HeaderMap) -> Result<Option<&str>, Refused> {
    let mut found: Option<&str> = None;
    for name in KEY_HEADERS {
        let mut values = headers.get_all(name).iter();
        let Some(value) = values.next() else {
            continue;
        };
        if values.next().is_some() {
            return Err(Refused::Malformed);
        }
        let value = value.to_str().map_err(|_| Refused::Malformed)?;
        let key = if name == "authorization" {
            // `Bearer` (the scheme is case-insensitive), one space, the key.
            let (scheme, key) = value.split_once(' ').ok_or(Refused::Malformed)?;
            if !scheme.eq_ignore_ascii_case("bearer") {
                return Err(Refused::Malformed);
            }
            key
        } else {
            value
        };
        if key.is_empty()
            || key
                .bytes()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        {
            return Err(Refused::Malformed);
        }
        match found {
            Some(other) if other != key => return Err(Refused::Disagree),
            _ => found = Some(key),
        }
    }
    Ok(found)
}

/// A secret as it may be shown: `k` and the first 16 hex digits of its SHA-256.
///
/// ```ignore
/// let shown = hashed("sk-secret");
/// assert_eq!(shown.len(), 17);
/// ```
pub(crate) fn hashed(secret: &str) -> String {
    let digest = Sha256::digest(secret.as_bytes());
    let mut out = String::with_capacity(17);
    out.push('k');
    for byte in &digest[..8] {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// A call's tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tenant {
    /// Its name: a virtual key's tenant, a header's value, the default, or a key's hash.
    pub(crate) name: String,
    /// Named in the configuration (a virtual key's tenant, or the default): its own metrics
    /// label. Others (hashed keys, header values) share one.
    pub(crate) configured: bool,
    /// It came with a virtual key.
    pub(crate) virtual_key: bool,
}

/// Finds a call's tenant.
#[derive(Debug)]
pub(crate) struct Tenancy {
    from: TenantFrom,
    /// SHA-256 of each virtual key → its tenant's name (looked up by hash: no comparison of
    /// the secret itself).
    virtual_keys: HashMap<[u8; 32], String>,
    default: Option<String>,
    /// Tenants given a tier by name: their own metrics label.
    tiered: std::collections::HashSet<String>,
    /// SHA-256 of the header tenants' shared secret.
    secret: Option<[u8; 32]>,
}

impl Tenancy {
    /// From the configuration.
    pub(crate) fn new(tenants: &Tenants) -> Tenancy {
        Tenancy {
            from: tenants.from.clone(),
            virtual_keys: tenants
                .virtual_keys
                .iter()
                .map(|(key, name)| (Sha256::digest(key.as_bytes()).into(), name.clone()))
                .collect(),
            default: tenants.default.clone(),
            tiered: tenants.tier_of.keys().cloned().collect(),
            secret: tenants
                .header_secret
                .as_deref()
                .map(|s| Sha256::digest(s.as_bytes()).into()),
        }
    }

    /// Whether virtual keys stand for the upstream's key.
    pub(crate) fn has_virtual_keys(&self) -> bool {
        !self.virtual_keys.is_empty()
    }

    /// The tenant phase: the call's tenant (`None`: no tenants), and whether it may take a
    /// route of `kind`: a virtual key reaches the routes it is allowed, metered and free ones
    /// by default.
    pub(crate) fn phase(
        &self,
        head: &http::request::Parts,
        kind: RouteKind,
        virtual_key_paths: KeyPaths,
    ) -> Result<Option<Tenant>, Reject> {
        let tenant = self
            .tenant(&head.headers)
            .map_err(|refused| Reject::new(ErrorKind::Unauthorized, refused.message()))?;
        if tenant.as_ref().is_some_and(|t| t.virtual_key)
            && kind == RouteKind::Passed
            && virtual_key_paths == KeyPaths::Metered
        {
            return Err(Reject::new(
                ErrorKind::NotFound,
                format!(
                    "tollgate-proxy: `{}` is not metered, and virtual keys reach only the metered routes (virtual_key_paths = \"any\" allows more)",
                    head.uri.path()
                ),
            ));
        }
        Ok(tenant)
    }

    /// The tenant of a call (`None`: no tenants), or a refusal.
    pub(crate) fn tenant(&self, headers: &HeaderMap) -> Result<Option<Tenant>, Refused> {
        if self.has_virtual_keys() {
            let key = presented_key(headers)?.ok_or(Refused::NoKey)?;
            let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
            let name = self.virtual_keys.get(&digest).ok_or(Refused::UnknownKey)?;
            return Ok(Some(Tenant {
                name: name.clone(),
                configured: true,
                virtual_key: true,
            }));
        }
        let named = match &self.from {
            TenantFrom::None => return Ok(None),
            TenantFrom::Key => presented_key(headers)?.map(|key| Tenant {
                name: hashed(key),
                configured: false,
                virtual_key: false,
            }),
            TenantFrom::Header(name) => {
                if let Some(secret) = &self.secret {
                    let given = headers
                        .get(SECRET_HEADER)
                        .map(|v| <[u8; 32]>::from(Sha256::digest(v.as_bytes())));
                    if given.as_ref() != Some(secret) {
                        return Err(Refused::NoSecret);
                    }
                }
                let mut values = headers.get_all(name).iter();
                let first = values.next();
                if values.next().is_some() {
                    return Err(Refused::Malformed);
                }
                first.map(|value| match value.to_str() {
                    Ok(text) if plain_name(text) => Tenant {
                        name: text.to_owned(),
                        configured: self.tiered.contains(text),
                        virtual_key: false,
                    },
                    _ => Tenant {
                        name: hashed(&String::from_utf8_lossy(value.as_bytes())),
                        configured: false,
                        virtual_key: false,
                    },
                })
            }
        };
        match (named, &self.default) {
            (Some(tenant), _) => Ok(Some(tenant)),
            (None, Some(default)) => Ok(Some(Tenant {
                name: default.clone(),
                configured: true,
                virtual_key: false,
            })),
            (None, None) => Err(Refused::NoTenant),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn keys_are_read_strictly_from_every_providers_header() {
        let key = |pairs: &[(&'static str, &str)]| {
            presented_key(&headers(pairs)).map(|k| k.map(str::to_owned))
        };
        let some = |k: &str| Ok(Some(k.to_owned()));
        assert_eq!(key(&[("authorization", "Bearer sk-1")]), some("sk-1"));
        assert_eq!(key(&[("authorization", "bearer sk-2")]), some("sk-2"));
        assert_eq!(key(&[("x-api-key", "ant-3")]), some("ant-3"));
        assert_eq!(key(&[("api-key", "az-4")]), some("az-4"));
        assert_eq!(key(&[]), Ok(None));
        // The same key twice is one key.
        assert_eq!(
            key(&[("authorization", "Bearer k-5"), ("x-api-key", "k-5")]),
            some("k-5")
        );
        for malformed in [
            vec![("authorization", "Basic abc")],
            vec![("authorization", "Bearer\tsk-1")],
            vec![("authorization", "Bearer  sk-1")],
            vec![("authorization", "Bearer sk-1 ")],
            vec![("authorization", "Bearer ")],
            vec![("authorization", "sk-1")],
            vec![("authorization", "Bearer a"), ("authorization", "Bearer b")],
        ] {
            assert_eq!(key(&malformed), Err(Refused::Malformed), "{malformed:?}");
        }
        assert_eq!(
            key(&[("authorization", "Bearer junk"), ("x-api-key", "real")]),
            Err(Refused::Disagree)
        );
    }

    #[test]
    fn a_key_tenant_is_its_hash_never_the_key_and_a_call_without_one_is_refused() {
        let mut tenants = Tenants::none();
        tenants.from = TenantFrom::Key;
        let tenancy = Tenancy::new(&tenants);
        let tenant = tenancy
            .tenant(&headers(&[("authorization", "Bearer sk-live-abc")]))
            .unwrap()
            .unwrap();
        assert_eq!(tenant.name, hashed("sk-live-abc"));
        assert!(!tenant.name.contains("abc"));
        assert_eq!(tenancy.tenant(&HeaderMap::new()), Err(Refused::NoTenant));
        tenants.default = Some("anonymous".to_owned());
        let tenancy = Tenancy::new(&tenants);
        assert_eq!(
            tenancy.tenant(&HeaderMap::new()).unwrap().unwrap().name,
            "anonymous"
        );
    }

    #[test]
    fn sha256_prefix_is_the_known_one() {
        // echo -n abc | sha256sum → ba7816bf8f01cfea...
        assert_eq!(hashed("abc"), "kba7816bf8f01cfea");
    }

    #[test]
    fn a_header_tenant_needs_the_secret_when_one_is_set() {
        let mut tenants = Tenants::none();
        tenants.from = TenantFrom::Header("x-team".parse().unwrap());
        tenants.header_secret = Some("s3cret-s3cret-s3cret".to_owned());
        let tenancy = Tenancy::new(&tenants);
        assert_eq!(
            tenancy.tenant(&headers(&[("x-team", "bob")])),
            Err(Refused::NoSecret)
        );
        assert_eq!(
            tenancy.tenant(&headers(&[("x-team", "bob"), (SECRET_HEADER, "guess")])),
            Err(Refused::NoSecret)
        );
        let bob = tenancy
            .tenant(&headers(&[
                ("x-team", "bob"),
                (SECRET_HEADER, "s3cret-s3cret-s3cret"),
            ]))
            .unwrap()
            .unwrap();
        assert_eq!(bob.name, "bob");
        let odd = tenancy
            .tenant(&headers(&[
                ("x-team", "a b/c"),
                (SECRET_HEADER, "s3cret-s3cret-s3cret"),
            ]))
            .unwrap()
            .unwrap();
        assert_eq!(odd.name, hashed("a b/c"));
        assert_eq!(
            tenancy.tenant(&headers(&[
                ("x-team", "a"),
                ("x-team", "b"),
                (SECRET_HEADER, "s3cret-s3cret-s3cret")
            ])),
            Err(Refused::Malformed)
        );
    }

    #[test]
    fn only_known_virtual_keys_pass() {
        let mut tenants = Tenants::none();
        tenants
            .virtual_keys
            .insert("vk-alice".to_owned(), "alice".to_owned());
        let tenancy = Tenancy::new(&tenants);
        assert_eq!(
            tenancy
                .tenant(&headers(&[("authorization", "Bearer vk-alice")]))
                .unwrap()
                .unwrap()
                .name,
            "alice"
        );
        assert_eq!(
            tenancy.tenant(&headers(&[("authorization", "Bearer vk-alicf")])),
            Err(Refused::UnknownKey)
        );
        assert_eq!(tenancy.tenant(&HeaderMap::new()), Err(Refused::NoKey));
        assert_eq!(
            tenancy.tenant(&headers(&[
                ("authorization", "Bearer junk"),
                ("x-api-key", "vk-alice")
            ])),
            Err(Refused::Disagree)
        );
    }
}
