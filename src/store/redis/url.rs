//! Showing a Redis URL without its secrets.
//!
//! The URL is read the way redis-rs reads it (through its own parser), and rebuilt from the
//! parts that are not secret: scheme, user, host, port, path, and the values of `db`,
//! `protocol` and `user` in the query. A password, in the userinfo or in any other query value
//! (`pass=` and `password=` on a Unix socket), becomes `***`. A URL that does not parse shows
//! nothing past its scheme, since there is no telling where a secret in it might be. Every
//! message that might echo the URL (a driver's error) is scrubbed of each secret, raw and
//! percent-decoded.

use std::borrow::Cow;

/// A URL as it may be shown, and the secrets to scrub from anything that may echo it.
#[derive(Debug, Clone)]
pub(crate) struct Shown {
    pub(crate) url: String,
    secrets: Vec<String>,
}

/// Query parameters whose values are not secret.
const PLAIN_PARAMETERS: [&str; 3] = ["db", "protocol", "user"];
/// Query parameters whose values are: shown by name only.
const SECRET_PARAMETERS: [&str; 2] = ["pass", "password"];

fn decoded(text: &str) -> String {
    // Percent-decoding by hand: `%XX` pairs, the rest as is; what isn't UTF-8 is kept raw.
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| text.to_owned())
}

/// Whether `raw` could place a secret where it would be shown: a fragment (`#`, which nothing
/// reads, so anything after it, such as the rest of a password, would be printed), or more
/// than one `@` (a password with an `@` in it, whose middle would read as a host).
pub(crate) fn ambiguous(raw: &str) -> bool {
    let rest = raw.split_once("://").map_or(raw, |(_, rest)| rest);
    rest.contains('#') || rest.matches('@').count() > 1
}

/// Whether `host` reads as a host name or an address: anything else may be a piece of a
/// password that ended up there.
fn plausible_host(host: &str) -> bool {
    let inner = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    !inner.is_empty()
        && inner
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':'))
}

impl Shown {
    pub(crate) fn new(raw: &str) -> Shown {
        let scheme = raw.split_once("://").map(|(s, _)| s);
        if ambiguous(raw) {
            return Shown::unreadable(raw);
        }
        let Some(url) = redis::parse_redis_url(raw) else {
            // Unreadable: nothing past the scheme is shown, and the whole text is a secret.
            let shown = match scheme {
                Some(scheme)
                    if scheme
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '+') =>
                {
                    format!("{scheme}://(a URL that does not parse; not shown)")
                }
                _ => "(a URL that does not parse; not shown)".to_owned(),
            };
            return Shown::scrubbing(shown, Shown::pieces(raw));
        };
        let unix = matches!(url.scheme(), "unix" | "redis+unix" | "valkey+unix");
        let host = url.host_str().unwrap_or("");
        // Where a password could have been misplaced (a TCP URL without a host, a path that is
        // not a database number, a Unix path with `@` or `:` in it), the URL shows nothing.
        let path_shown = if unix {
            !url.path().contains(['@', ':'])
        } else {
            url.path()
                .strip_prefix('/')
                .unwrap_or(url.path())
                .bytes()
                .all(|b| b.is_ascii_digit())
        };
        if (!unix && !plausible_host(host)) || !path_shown {
            return Shown::scrubbing(
                format!(
                    "{}://(a URL that does not read as one; not shown)",
                    url.scheme()
                ),
                Shown::pieces(raw),
            );
        }
        let mut secrets = Vec::new();
        let mut shown = format!("{}://", url.scheme());
        match (url.username(), url.password()) {
            ("", None) => {}
            // A user and a password, told apart by the colon: the user is shown.
            (user, Some(password)) => {
                shown.push_str(user);
                shown.push_str(":***@");
                secrets.push(password.to_owned());
            }
            // A user alone may be a password written in the wrong place: neither is shown.
            (user, None) => {
                shown.push_str("***@");
                secrets.push(user.to_owned());
            }
        }
        shown.push_str(host);
        if let Some(port) = url.port() {
            shown.push_str(&format!(":{port}"));
        }
        shown.push_str(url.path());
        let mut first = true;
        for (name, value) in url.query_pairs() {
            shown.push(if first { '?' } else { '&' });
            first = false;
            if PLAIN_PARAMETERS.contains(&name.as_ref()) {
                shown.push_str(&format!("{name}={value}"));
            } else if SECRET_PARAMETERS.contains(&name.as_ref()) {
                shown.push_str(&format!("{name}=***"));
                secrets.push(value.into_owned());
            } else {
                // A name nobody reads may be a piece of a password with `&` or `=` in it.
                shown.push_str("***");
                secrets.push(name.into_owned());
                secrets.push(value.into_owned());
            }
        }
        if let Some(query) = url.query() {
            // The raw, still percent-encoded, forms of the values too.
            for pair in query.split('&') {
                let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
                if !PLAIN_PARAMETERS.contains(&name) {
                    secrets.push(value.to_owned());
                    if !SECRET_PARAMETERS.contains(&name) {
                        secrets.push(name.to_owned());
                    }
                }
            }
        }
        Shown::scrubbing(shown, secrets)
    }

    /// A `redis+sentinel://` address: the sentinels and the master's name as written, the
    /// master's credentials as [`Shown::new`] shows them in a `redis://` URL.
    pub(crate) fn sentinel(address: &super::connection::SentinelAddress) -> Shown {
        let node = Shown::new(&address.node);
        let after_scheme = node.url.split_once("://").map_or("", |(_, rest)| rest);
        let userinfo = match after_scheme.split_once('@') {
            Some((userinfo, _)) => format!("{userinfo}@"),
            None => String::new(),
        };
        let hosts: Vec<&str> = address
            .sentinels
            .iter()
            .map(|s| s.strip_prefix("redis://").unwrap_or(s))
            .collect();
        let mut url = format!(
            "redis+sentinel://{userinfo}{}/{}",
            hosts.join(","),
            address.master
        );
        let path = node.url.split('?').next().unwrap_or("");
        if let Some(db) = path.rsplit_once('/').map(|(_, db)| db)
            && !db.is_empty()
            && db.bytes().all(|b| b.is_ascii_digit())
        {
            url.push('/');
            url.push_str(db);
        }
        let url = node.scrub(&url).into_owned();
        Shown::scrubbing(url, node.secrets)
    }

    /// An address of a known scheme that can't be read: nothing past its scheme is shown.
    pub(crate) fn unreadable(raw: &str) -> Shown {
        let scheme = raw
            .split_once("://")
            .map(|(s, _)| s)
            .filter(|s| s.chars().all(|c| c.is_ascii_alphanumeric() || c == '+'))
            .unwrap_or("");
        Shown::scrubbing(
            format!("{scheme}://(an address that does not read as one; not shown)"),
            Shown::pieces(raw),
        )
    }

    /// For a URL that can't be read: the whole text, what follows the scheme, and every piece
    /// between delimiters, since any of them could be the password.
    /// Several URLs (a cluster's seed nodes), shown together.
    pub(crate) fn all(raws: &[String]) -> Shown {
        let parts: Vec<Shown> = raws.iter().map(|raw| Shown::new(raw)).collect();
        let url = parts
            .iter()
            .map(|p| p.url.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        Shown::scrubbing(url, parts.into_iter().flat_map(|p| p.secrets).collect())
    }

    fn pieces(raw: &str) -> Vec<String> {
        let mut secrets = vec![raw.to_owned()];
        let rest = raw.split_once("://").map_or(raw, |(_, rest)| rest);
        secrets.push(rest.to_owned());
        secrets.extend(
            rest.split(['@', '/', '?', '#', ':', '&', '='])
                .filter(|part| part.len() >= 3)
                .map(str::to_owned),
        );
        secrets
    }

    fn scrubbing(url: String, secrets: Vec<String>) -> Shown {
        let mut all: Vec<String> = Vec::new();
        for secret in secrets {
            let plain = decoded(&secret);
            for s in [secret, plain] {
                if !s.is_empty() && !all.contains(&s) {
                    all.push(s);
                }
            }
        }
        // Longest first, so that a secret containing another is removed whole.
        all.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Shown { url, secrets: all }
    }

    /// `text` with every secret replaced by `***`.
    pub(crate) fn scrub<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if !self.secrets.iter().any(|s| text.contains(s.as_str())) {
            return Cow::Borrowed(text);
        }
        let mut out = text.to_owned();
        for secret in &self.secrets {
            out = out.replace(secret.as_str(), "***");
        }
        Cow::Owned(out)
    }

    /// True when `text` holds no secret.
    pub(crate) fn is_clean(&self, text: &str) -> bool {
        !self.secrets.iter().any(|s| text.contains(s.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked_in_every_form() {
        for (raw, shown) in [
            (
                "redis://:hunter2@localhost:6379/0",
                "redis://:***@localhost:6379/0",
            ),
            ("rediss://alice:s3cr%40t@host", "rediss://alice:***@host"),
            ("redis://localhost:6379", "redis://localhost:6379"),
            (
                "redis+unix:///path/r.sock?db=2&pass=secret",
                "redis+unix:///path/r.sock?db=2&pass=***",
            ),
            (
                "unix:///path/r.sock?password=secret&user=bob",
                "unix:///path/r.sock?password=***&user=bob",
            ),
            (
                "valkey://u:pw@10.0.0.1:7000",
                "valkey://u:***@10.0.0.1:7000",
            ),
            (
                "redis://:s3cret/pw@host",
                "redis://(a URL that does not parse; not shown)",
            ),
        ] {
            let s = Shown::new(raw);
            assert_eq!(s.url, shown, "{raw}");
            for secret in ["hunter2", "s3cr%40t", "s3cr@t", "secret", "pw", "s3cret/pw"] {
                if raw.contains(secret) {
                    assert!(!s.scrub(raw).contains(secret), "{raw}: {}", s.scrub(raw));
                }
            }
        }
        assert_eq!(decoded("s3cr%40t"), "s3cr@t");
        assert_eq!(decoded("100%"), "100%");
    }
}
