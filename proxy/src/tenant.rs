//! Whose call it is: a tenant from the API key (hashed) or a header, and virtual keys that
//! stand for the upstream's real key.

use std::collections::HashMap;

use http::HeaderMap;
use sha2::{Digest, Sha256};

use crate::config::{TenantFrom, Tenants};

/// The headers clients put their API key in: OpenAI's `Authorization: Bearer`, Anthropic's
/// `x-api-key`, Azure's `api-key`, Google's `x-goog-api-key`.
pub const KEY_HEADERS: [&str; 4] = ["authorization", "x-api-key", "api-key", "x-goog-api-key"];

/// The API key a request presents, if any.
pub fn presented_key(headers: &HeaderMap) -> Option<&str> {
    KEY_HEADERS.iter().find_map(|name| {
        let value = headers.get(*name)?.to_str().ok()?.trim();
        let key = if *name == "authorization" {
            let (scheme, rest) = value.split_once(' ')?;
            if !scheme.eq_ignore_ascii_case("bearer") {
                return None;
            }
            rest.trim()
        } else {
            value
        };
        (!key.is_empty()).then_some(key)
    })
}

/// A secret as it may be shown: `k` and the first 16 hex digits of its SHA-256.
///
/// ```
/// let shown = tollgate_proxy::tenant::hashed("sk-secret");
/// assert_eq!(shown.len(), 17);
/// assert!(!shown.contains("secret"));
/// ```
pub fn hashed(secret: &str) -> String {
    let digest = Sha256::digest(secret.as_bytes());
    let mut out = String::with_capacity(17);
    out.push('k');
    for byte in &digest[..8] {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// Why a call has no tenant it may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Virtual keys are configured, and the call presented none of them.
    UnknownKey,
}

/// Finds a call's tenant.
#[derive(Debug)]
pub struct Tenancy {
    from: TenantFrom,
    /// SHA-256 of each virtual key → its tenant's name (looked up by hash: no comparison of
    /// the secret itself).
    virtual_keys: HashMap<[u8; 32], String>,
}

impl Tenancy {
    /// From the configuration.
    pub fn new(tenants: &Tenants) -> Tenancy {
        Tenancy {
            from: tenants.from.clone(),
            virtual_keys: tenants
                .virtual_keys
                .iter()
                .map(|(key, name)| (Sha256::digest(key.as_bytes()).into(), name.clone()))
                .collect(),
        }
    }

    /// Whether virtual keys stand for the upstream's key.
    pub fn has_virtual_keys(&self) -> bool {
        !self.virtual_keys.is_empty()
    }

    /// The tenant of a call (`None`: no tenants), or a refusal.
    ///
    /// ```
    /// use tollgate_proxy::config::{TenantFrom, Tenants};
    /// use tollgate_proxy::tenant::Tenancy;
    ///
    /// let mut tenants = Tenants::none();
    /// tenants.from = TenantFrom::Header("x-team".parse().unwrap());
    /// let tenancy = Tenancy::new(&tenants);
    /// let mut headers = http::HeaderMap::new();
    /// headers.insert("x-team", "search".parse().unwrap());
    /// assert_eq!(tenancy.tenant(&headers), Ok(Some("search".to_owned())));
    /// ```
    pub fn tenant(&self, headers: &HeaderMap) -> Result<Option<String>, Refused> {
        if self.has_virtual_keys() {
            let key = presented_key(headers).ok_or(Refused::UnknownKey)?;
            let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
            let name = self.virtual_keys.get(&digest).ok_or(Refused::UnknownKey)?;
            return Ok(Some(name.clone()));
        }
        Ok(match &self.from {
            TenantFrom::None => None,
            TenantFrom::Key => presented_key(headers).map(hashed),
            TenantFrom::Header(name) => headers.get(name).map(|value| match value.to_str() {
                Ok(text) if plain_name(text) => text.to_owned(),
                _ => hashed(&String::from_utf8_lossy(value.as_bytes())),
            }),
        })
    }
}

/// A tenant name shown as it is: 1 to 64 of `A-Z a-z 0-9 . _ -`.
fn plain_name(text: &str) -> bool {
    (1..=64).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn keys_are_found_in_every_providers_header() {
        assert_eq!(
            presented_key(&headers(&[("authorization", "Bearer sk-1")])),
            Some("sk-1")
        );
        assert_eq!(
            presented_key(&headers(&[("authorization", "bearer   sk-2 ")])),
            Some("sk-2")
        );
        assert_eq!(
            presented_key(&headers(&[("x-api-key", "ant-3")])),
            Some("ant-3")
        );
        assert_eq!(
            presented_key(&headers(&[("api-key", "az-4")])),
            Some("az-4")
        );
        assert_eq!(
            presented_key(&headers(&[("authorization", "Basic abc")])),
            None
        );
        assert_eq!(
            presented_key(&headers(&[("authorization", "Bearer ")])),
            None
        );
        assert_eq!(presented_key(&HeaderMap::new()), None);
    }

    #[test]
    fn a_key_tenant_is_its_hash_never_the_key() {
        let mut tenants = Tenants::none();
        tenants.from = TenantFrom::Key;
        let tenancy = Tenancy::new(&tenants);
        let tenant = tenancy
            .tenant(&headers(&[("authorization", "Bearer sk-live-abc")]))
            .unwrap()
            .unwrap();
        // SHA-256("sk-live-abc"), first 8 bytes, computed apart.
        assert_eq!(tenant, hashed("sk-live-abc"));
        assert!(!tenant.contains("abc"));
        assert_ne!(tenant, hashed("sk-live-abd"));
        assert_eq!(tenancy.tenant(&HeaderMap::new()), Ok(None));
    }

    #[test]
    fn sha256_prefix_is_the_known_one() {
        // echo -n abc | sha256sum → ba7816bf8f01cfea...
        assert_eq!(hashed("abc"), "kba7816bf8f01cfea");
    }

    #[test]
    fn header_tenants_with_odd_values_are_hashed() {
        let mut tenants = Tenants::none();
        tenants.from = TenantFrom::Header("x-team".parse().unwrap());
        let tenancy = Tenancy::new(&tenants);
        assert_eq!(
            tenancy.tenant(&headers(&[("x-team", "team_a-1.b")])),
            Ok(Some("team_a-1.b".to_owned()))
        );
        let odd = "a b/c";
        assert_eq!(
            tenancy.tenant(&headers(&[("x-team", odd)])),
            Ok(Some(hashed(odd)))
        );
        let long = "x".repeat(65);
        assert_eq!(
            tenancy.tenant(&headers(&[("x-team", &long)])),
            Ok(Some(hashed(&long)))
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
            tenancy.tenant(&headers(&[("authorization", "Bearer vk-alice")])),
            Ok(Some("alice".to_owned()))
        );
        assert_eq!(
            tenancy.tenant(&headers(&[("authorization", "Bearer vk-alicf")])),
            Err(Refused::UnknownKey)
        );
        assert_eq!(tenancy.tenant(&HeaderMap::new()), Err(Refused::UnknownKey));
    }
}
