//! Which upstream a path goes to, whether it is metered, and the URL it is sent to. Routes
//! match the path as the upstream's server will read it (percent-encoded letters decoded), and
//! fail closed: a path no upstream meters is refused with a hint at the likely mistake, unless
//! the configuration passes such paths on.

use crate::answer::{ErrorKind, Reject};
use crate::config::{Family, OtherPaths, Upstream};

/// Whether a call pays its toll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RouteKind {
    /// A call the profile meters: estimated, admitted, synced, settled.
    Metered,
    /// A call that spends nothing at the provider (Anthropic's `count_tokens`, model lists,
    /// moderation, reading a stored response): sent on as it is.
    Free,
    /// A path no upstream meters, passed on unmetered because `other_paths = "pass"`.
    Passed,
}

/// Where one request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Route {
    /// The upstream's index in the configuration.
    pub(crate) upstream: usize,
    /// Metered, free or passed.
    pub(crate) kind: RouteKind,
    /// The path (and query) to send to the upstream, appended to its base URL's path.
    pub(crate) path: String,
    /// A short name for metrics: `chat`, `responses`, `messages`, ... or `other`.
    pub(crate) name: &'static str,
}

/// Why a path has no route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NoRoute {
    /// No upstream meters it, and other paths are refused: the hint says what was likely
    /// meant, and the family is the shape to answer in.
    Refused { hint: String, family: Family },
    /// `..`, an empty segment, or a percent-encoding of anything but a letter, digit or
    /// `-._~`: never forwarded.
    Malformed,
}

/// The routes of a family, after the mount: metered, free, or neither; with their names.
fn kind_of(family: Family, method: &http::Method, path: &str) -> Option<(RouteKind, &'static str)> {
    use RouteKind::{Free, Metered};
    let post = method == http::Method::POST;
    let read = method == http::Method::GET;
    match family {
        Family::OpenAi => match path {
            "/v1/chat/completions" if post => Some((Metered, "chat")),
            "/v1/responses" if post => Some((Metered, "responses")),
            "/v1/completions" if post => Some((Metered, "completions")),
            "/v1/embeddings" if post => Some((Metered, "embeddings")),
            "/v1/moderations" if post => Some((Free, "moderations")),
            "/v1/models" if read => Some((Free, "models")),
            _ if read && segments_after(path, "/v1/models/") == Some(1) => Some((Free, "models")),
            // Reading a stored response, its input items, or cancelling one spends nothing.
            _ if (read || method == http::Method::DELETE)
                && matches!(segments_after(path, "/v1/responses/"), Some(1)) =>
            {
                Some((Free, "responses"))
            }
            _ if read && path.starts_with("/v1/responses/") && path.ends_with("/input_items") => {
                Some((Free, "responses"))
            }
            _ => None,
        },
        Family::Azure => {
            let (_, rest) = azure_deployment(path)?;
            match rest {
                "/chat/completions" | "/completions" if post => Some((Metered, "chat")),
                "/embeddings" if post => Some((Metered, "embeddings")),
                _ => None,
            }
        }
        Family::Anthropic => match path {
            "/v1/messages" if post => Some((Metered, "messages")),
            "/v1/messages/count_tokens" if post => Some((Free, "count_tokens")),
            "/v1/models" if read => Some((Free, "models")),
            _ if read && segments_after(path, "/v1/models/") == Some(1) => Some((Free, "models")),
            _ => None,
        },
        Family::Voyage => match path {
            "/v1/embeddings" if post => Some((Metered, "embeddings")),
            "/v1/multimodalembeddings" if post => Some((Metered, "embeddings")),
            "/v1/contextualizedembeddings" if post => Some((Metered, "embeddings")),
            "/v1/rerank" if post => Some((Metered, "rerank")),
            _ => None,
        },
    }
}

/// How many non-empty segments follow `prefix` in `path`, if it starts with it.
fn segments_after(path: &str, prefix: &str) -> Option<usize> {
    let rest = path.strip_prefix(prefix)?;
    Some(rest.split('/').filter(|s| !s.is_empty()).count())
}

/// An Azure path's deployment name and what follows it:
/// `/openai/deployments/{name}/chat/completions` → (`name`, `/chat/completions`).
pub(crate) fn azure_deployment(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/openai/deployments/")?;
    let (name, rest) = rest.split_at(rest.find('/')?);
    (!name.is_empty()).then_some((name, rest))
}

/// The path as a server reads it: percent-encoded unreserved characters (letters, digits,
/// `-._~`) decoded, as RFC 3986 §6.2.2.2 says and as uvicorn, Starlette and the others do;
/// `None` when any other percent-encoding is left (a slash, a backslash, a control byte, a
/// `%`: a server decodes those into another path than the one routed here), or a `;`.
pub(crate) fn normalize(path: &str) -> Option<String> {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = |b: u8| (b as char).to_digit(16);
                let (Some(hi), Some(lo)) = (
                    bytes.get(i + 1).copied().and_then(hex),
                    bytes.get(i + 2).copied().and_then(hex),
                ) else {
                    return None;
                };
                let decoded = (hi * 16 + lo) as u8;
                if !(decoded.is_ascii_alphanumeric()
                    || matches!(decoded, b'-' | b'.' | b'_' | b'~'))
                {
                    return None;
                }
                out.push(decoded);
                i += 3;
            }
            b';' | b'\\' => return None,
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Whether `path` is under `mount` at a segment boundary; the rest if so.
fn under<'p>(path: &'p str, mount: &str) -> Option<&'p str> {
    let rest = path.strip_prefix(mount)?;
    (rest.is_empty() || rest.starts_with('/')).then_some(rest)
}

/// The shape a client speaks, from its headers: Anthropic's SDKs send `anthropic-version`.
pub(crate) fn speaks(headers: &http::HeaderMap) -> Option<Family> {
    if headers.contains_key("anthropic-version") {
        Some(Family::Anthropic)
    } else if headers.contains_key(http::header::AUTHORIZATION) {
        Some(Family::OpenAi)
    } else {
        None
    }
}

/// One upstream as its routes see it, read from its configuration once.
#[derive(Debug, Clone)]
pub(crate) struct Mount {
    name: String,
    /// The path prefix it is mounted at.
    mount: String,
    family: Family,
    /// The prefix taken off a path before it is forwarded.
    strip: String,
    /// Its base URL's path, without a final slash.
    base: String,
}

/// Every upstream's routes, read from the configuration once, and what becomes of a path no
/// upstream meters.
#[derive(Debug, Clone)]
pub(crate) struct Routes {
    mounts: Vec<Mount>,
    other: OtherPaths,
}

impl Routes {
    /// The routes of `upstreams`, in the configuration's order.
    pub(crate) fn new(upstreams: &[Upstream], other: OtherPaths) -> Routes {
        let mounts = upstreams
            .iter()
            .map(|u| Mount {
                name: u.name.clone(),
                mount: u.mount.clone(),
                family: u.family(),
                strip: u.strip.clone(),
                base: u.url.path().trim_end_matches('/').to_owned(),
            })
            .collect();
        Routes { mounts, other }
    }

    /// The route phase: where the request goes, or why it goes nowhere (answered in the
    /// shape its client speaks).
    pub(crate) fn phase(&self, head: &http::request::Parts) -> Result<Route, Reject> {
        let path_and_query = head.uri.path_and_query().map_or("/", |p| p.as_str());
        self.route(&head.method, &head.headers, path_and_query)
            .map_err(|no| match no {
                NoRoute::Malformed => Reject::new(
                    ErrorKind::Invalid,
                    "tollgate-proxy: this path is never forwarded (`..`, `//`, `;`, or a percent-encoding of anything but a letter, a digit or -._~)",
                )
                .shaped(speaks(&head.headers).unwrap_or(Family::OpenAi)),
                NoRoute::Refused { hint, family } => {
                    Reject::new(ErrorKind::NotFound, hint).shaped(family)
                }
            })
    }

    /// The route of a request.
    pub(crate) fn route(
        &self,
        method: &http::Method,
        headers: &http::HeaderMap,
        path_and_query: &str,
    ) -> Result<Route, NoRoute> {
        let (raw, query) = match path_and_query.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (path_and_query, None),
        };
        let normalized = normalize(raw).ok_or(NoRoute::Malformed)?;
        let path = clean(&normalized)?;
        let (index, kind, name) = self.served(method, headers, path)?;
        let mount = &self.mounts[index];
        same_shape(mount, headers)?;
        Ok(Route {
            upstream: index,
            kind,
            path: forwarded(mount, path, query),
            name,
        })
    }

    /// The upstream that serves `path` (normalized), how, and under what name: the longest
    /// mount that holds the path wins; among upstreams on it, the first that meters the path,
    /// then the first that serves it free, then (where other paths pass) the first.
    fn served(
        &self,
        method: &http::Method,
        headers: &http::HeaderMap,
        path: &str,
    ) -> Result<(usize, RouteKind, &'static str), NoRoute> {
        let refused = || {
            let family = speaks(headers)
                .or_else(|| {
                    self.mounts
                        .iter()
                        .filter(|m| under(path, &m.mount).is_some())
                        .max_by_key(|m| m.mount.len())
                        .map(|m| m.family)
                })
                .unwrap_or(Family::OpenAi);
            NoRoute::Refused {
                hint: hint(&self.mounts, headers, path),
                family,
            }
        };
        let Some(longest) = self
            .mounts
            .iter()
            .filter(|m| under(path, &m.mount).is_some())
            .map(|m| m.mount.len())
            .max()
        else {
            return Err(refused());
        };
        let candidates = || {
            self.mounts
                .iter()
                .enumerate()
                .filter(move |(_, m)| m.mount.len() == longest && under(path, &m.mount).is_some())
        };
        let served = |wanted: RouteKind| {
            candidates().find_map(|(i, m)| {
                let rest = under(path, &m.mount).unwrap_or_default();
                match kind_of(m.family, method, rest) {
                    Some((kind, name)) if kind == wanted => Some((i, kind, name)),
                    _ => None,
                }
            })
        };
        let found = served(RouteKind::Metered).or_else(|| served(RouteKind::Free));
        match (found, self.other) {
            (Some(found), _) => Ok(found),
            (None, OtherPaths::Pass) => {
                let (i, _) = candidates().next().ok_or_else(refused)?;
                Ok((i, RouteKind::Passed, "other"))
            }
            (None, OtherPaths::Refuse) => Err(refused()),
        }
    }
}

/// A normalized path as it is routed: never one that climbs (`..`, `.`) or hides another
/// (`//`); a final slash dropped (`/v1/chat/completions/` is the same call to servers that
/// drop or redirect it).
fn clean(path: &str) -> Result<&str, NoRoute> {
    if !path.starts_with('/')
        || path.split('/').skip(1).any(|s| s == ".." || s == ".")
        || path.contains("//")
    {
        return Err(NoRoute::Malformed);
    }
    Ok(match path.strip_suffix('/') {
        Some(trimmed) if !trimmed.is_empty() => trimmed,
        _ => path,
    })
}

/// Refuses a request in the other provider's shape: it never goes on with its key.
fn same_shape(mount: &Mount, headers: &http::HeaderMap) -> Result<(), NoRoute> {
    match (mount.family, speaks(headers)) {
        (Family::Anthropic, Some(Family::OpenAi)) if !headers.contains_key("x-api-key") => {
            Err(NoRoute::Refused {
                hint: format!(
                    "this is an OpenAI-style request (a bearer key, no anthropic-version) at upstream `{}`, which speaks Anthropic's API; it was not forwarded",
                    mount.name
                ),
                family: Family::OpenAi,
            })
        }
        (Family::OpenAi | Family::Azure | Family::Voyage, Some(Family::Anthropic)) => {
            Err(NoRoute::Refused {
                hint: format!(
                    "this is an Anthropic request (anthropic-version) at upstream `{}`, which speaks {} API; it was not forwarded with its key. Point the Anthropic SDK at an anthropic upstream's mount",
                    mount.name,
                    if mount.family == Family::Voyage {
                        "Voyage's"
                    } else {
                        "OpenAI's"
                    }
                ),
                family: Family::Anthropic,
            })
        }
        _ => Ok(()),
    }
}

/// The path (and query) sent to the upstream: its base URL's path, then the routed path under
/// the mount, less the upstream's `strip` prefix.
fn forwarded(mount: &Mount, path: &str, query: Option<&str>) -> String {
    let rest = strip(mount, under(path, &mount.mount).unwrap_or_default());
    let mut forward = String::with_capacity(mount.base.len() + rest.len() + 1);
    forward.push_str(&mount.base);
    forward.push_str(rest);
    if forward.is_empty() {
        forward.push('/');
    }
    if let Some(query) = query {
        forward.push('?');
        forward.push_str(query);
    }
    forward
}

/// The path less the upstream's `strip` prefix.
fn strip<'p>(mount: &Mount, rest: &'p str) -> &'p str {
    match rest.strip_prefix(mount.strip.as_str()) {
        Some(stripped)
            if !mount.strip.is_empty() && (stripped.is_empty() || stripped.starts_with('/')) =>
        {
            stripped
        }
        _ => rest,
    }
}

/// What a refused path most likely meant.
fn hint(mounts: &[Mount], headers: &http::HeaderMap, path: &str) -> String {
    let meters = |candidate: &str| {
        mounts.iter().find(|m| {
            under(candidate, &m.mount)
                .is_some_and(|rest| kind_of(m.family, &http::Method::POST, rest).is_some())
        })
    };
    // A doubled /v1: a base URL that ends in /v1 for a client that adds its own (Anthropic's
    // SDK), or the other way round.
    if let Some(rest) = path.strip_prefix("/v1/v1/")
        && meters(&format!("/v1/{rest}")).is_some()
    {
        return format!(
            "`{path}` has /v1 twice: the client's base URL ends in /v1 and the client adds its own. Set the base URL without /v1 (ANTHROPIC_BASE_URL=http://HOST:PORT); OpenAI's SDKs take it with /v1"
        );
    }
    // A missing /v1: OPENAI_BASE_URL without it.
    if !path.starts_with("/v1/") && meters(&format!("/v1{path}")).is_some() {
        return format!(
            "`{path}` has no /v1: set the base URL with it (OPENAI_BASE_URL=http://HOST:PORT/v1) to reach /v1{path}"
        );
    }
    // Anthropic's path where only OpenAI-style upstreams are mounted, or the reverse.
    let anthropic_shape = speaks(headers) == Some(Family::Anthropic) || path.ends_with("/messages");
    if anthropic_shape && !mounts.iter().any(|m| m.family == Family::Anthropic) {
        return format!(
            "`{path}` is Anthropic's API, and no upstream here speaks it: configure an upstream with profile = \"anthropic\""
        );
    }
    let metered: Vec<String> = mounts
        .iter()
        .flat_map(|m| {
            let paths: &[&str] = match m.family {
                Family::OpenAi => &[
                    "/v1/chat/completions",
                    "/v1/responses",
                    "/v1/completions",
                    "/v1/embeddings",
                ],
                Family::Azure => &["/openai/deployments/{name}/chat/completions"],
                Family::Anthropic => &["/v1/messages"],
                Family::Voyage => &["/v1/embeddings", "/v1/rerank"],
            };
            paths.iter().map(move |p| format!("{}{p}", m.mount))
        })
        .collect();
    format!(
        "tollgate-proxy does not meter `{path}`, so it is refused; it meters {}. (other_paths = \"pass\" in the configuration forwards other paths unmetered)",
        metered.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, LimitsFrom};
    use http::{HeaderMap, Method};

    /// The route of a request among `upstreams`.
    fn route(
        upstreams: &[Upstream],
        other: OtherPaths,
        method: &Method,
        headers: &HeaderMap,
        path_and_query: &str,
    ) -> Result<Route, NoRoute> {
        Routes::new(upstreams, other).route(method, headers, path_and_query)
    }

    fn upstreams() -> Vec<Upstream> {
        let mut gemini = Upstream::new(
            "gemini",
            "https://generativelanguage.googleapis.com/v1beta/openai"
                .parse()
                .unwrap(),
            "gemini",
            LimitsFrom::Headers,
        );
        gemini.mount = "/gemini".to_owned();
        gemini.strip = "/v1".to_owned();
        let azure = Upstream::new(
            "azure",
            "https://x.openai.azure.com".parse().unwrap(),
            "azure-openai",
            LimitsFrom::Headers,
        );
        let mut voyage = Upstream::new(
            "voyage",
            "https://api.voyageai.com".parse().unwrap(),
            "voyage",
            LimitsFrom::Headers,
        );
        voyage.mount = "/voyage".to_owned();
        let mut all = Config::public().upstreams;
        all.extend([gemini, azure, voyage]);
        all
    }

    fn route_with(other: OtherPaths, method: Method, path: &str) -> Result<Route, NoRoute> {
        route(&upstreams(), other, &method, &HeaderMap::new(), path)
    }

    fn to(path: &str) -> (usize, RouteKind, String) {
        let route = route_with(OtherPaths::Refuse, Method::POST, path).unwrap();
        (route.upstream, route.kind, route.path)
    }

    #[test]
    fn each_family_meters_its_own_paths() {
        use RouteKind::*;
        let s = String::from;
        assert_eq!(
            to("/v1/chat/completions"),
            (0, Metered, s("/v1/chat/completions"))
        );
        assert_eq!(to("/v1/responses"), (0, Metered, s("/v1/responses")));
        assert_eq!(to("/v1/embeddings"), (0, Metered, s("/v1/embeddings")));
        assert_eq!(to("/v1/messages"), (1, Metered, s("/v1/messages")));
        assert_eq!(
            to("/v1/messages/count_tokens"),
            (1, Free, s("/v1/messages/count_tokens"))
        );
        assert_eq!(
            to("/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21"),
            (
                3,
                Metered,
                s("/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21")
            )
        );
        assert_eq!(
            to("/gemini/v1/chat/completions"),
            (2, Metered, s("/v1beta/openai/chat/completions"))
        );
        assert_eq!(
            to("/voyage/v1/embeddings"),
            (4, Metered, s("/v1/embeddings"))
        );
        assert_eq!(to("/voyage/v1/rerank"), (4, Metered, s("/v1/rerank")));
        // A final slash changes nothing, and is not forwarded.
        assert_eq!(
            to("/v1/chat/completions/?x=1"),
            (0, Metered, s("/v1/chat/completions?x=1"))
        );
        let models = route_with(OtherPaths::Refuse, Method::GET, "/v1/models").unwrap();
        assert_eq!((models.upstream, models.kind), (0, Free));
    }

    #[test]
    fn percent_encoded_letters_route_as_the_server_decodes_them() {
        for path in [
            "/v1/chat/%63ompletions",
            "/v1/chat/completion%73",
            "/v1/%63hat/completions",
            "/%761/chat/completions",
        ] {
            let route = route_with(OtherPaths::Refuse, Method::POST, path).unwrap();
            assert_eq!(
                (route.kind, route.path.as_str()),
                (RouteKind::Metered, "/v1/chat/completions"),
                "{path}"
            );
        }
        // An upper-case letter decodes to itself: not the same path to a case-sensitive
        // router, and not metered here.
        assert!(route_with(OtherPaths::Refuse, Method::POST, "/v1/chat/%43ompletions").is_err());
    }

    #[test]
    fn spending_paths_no_upstream_meters_are_refused_by_default() {
        for path in [
            "/v1/images/generations",
            "/v1/audio/speech",
            "/v1/batches",
            "/v1/messages/batches",
            "/v1/files",
            "/v1/threads/t/runs",
        ] {
            assert!(
                matches!(
                    route_with(OtherPaths::Refuse, Method::POST, path),
                    Err(NoRoute::Refused { .. })
                ),
                "{path}"
            );
        }
        let passed = route_with(OtherPaths::Pass, Method::POST, "/v1/files").unwrap();
        assert_eq!((passed.upstream, passed.kind), (0, RouteKind::Passed));
    }

    #[test]
    fn a_refusal_names_the_likely_mistake() {
        let hint = |path: &str, headers: &[(&str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in headers {
                map.insert(
                    http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    value.parse().unwrap(),
                );
            }
            match route(&upstreams(), OtherPaths::Refuse, &Method::POST, &map, path) {
                Err(NoRoute::Refused { hint, family }) => (hint, family),
                other => panic!("{path}: {other:?}"),
            }
        };
        let (text, family) = hint("/chat/completions", &[("authorization", "Bearer sk-x")]);
        assert!(text.contains("has no /v1"), "{text}");
        assert_eq!(family, Family::OpenAi);
        let (text, family) = hint("/v1/v1/messages", &[("anthropic-version", "2023-06-01")]);
        assert!(text.contains("/v1 twice"), "{text}");
        assert_eq!(family, Family::Anthropic);
        let openai_only = vec![Config::public().upstreams.remove(0)];
        let mut map = HeaderMap::new();
        map.insert("anthropic-version", "2023-06-01".parse().unwrap());
        map.insert("x-api-key", "sk-ant-secret".parse().unwrap());
        match route(
            &openai_only,
            OtherPaths::Refuse,
            &Method::POST,
            &map,
            "/v1/messages",
        ) {
            Err(NoRoute::Refused { hint, family }) => {
                assert!(hint.contains("Anthropic"), "{hint}");
                assert_eq!(family, Family::Anthropic);
            }
            other => panic!("{other:?}"),
        }
        // The Anthropic SDK at an OpenAI path on an OpenAI upstream: never forwarded.
        match route(
            &openai_only,
            OtherPaths::Pass,
            &Method::POST,
            &map,
            "/v1/chat/completions",
        ) {
            Err(NoRoute::Refused { hint, .. }) => assert!(hint.contains("not forwarded"), "{hint}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn paths_that_climb_or_hide_another_path_are_never_forwarded() {
        for bad in [
            "/v1/../admin",
            "/v1/./chat/completions",
            "//evil.example/v1",
            "v1/chat/completions",
            "*",
            "",
            "/v1/%2e%2e/v1/chat/completions",
            "/v1/%2E./admin",
            "/v1%2fchat/completions",
            "/v1/chat%5Ccompletions",
            "/v1\\..\\admin",
            "/v1/chat/completions;x=1",
            "/v1/chat/completions%00",
            "/v1/chat/%2563ompletions",
            "/v1/chat/%6",
        ] {
            assert_eq!(
                route_with(OtherPaths::Pass, Method::POST, bad),
                Err(NoRoute::Malformed),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_mount_matches_whole_segments_only() {
        let mut only = upstreams();
        only.retain(|u| u.name == "voyage");
        assert!(matches!(
            route(
                &only,
                OtherPaths::Pass,
                &Method::POST,
                &HeaderMap::new(),
                "/voyager/v1/embeddings"
            ),
            Err(NoRoute::Refused { .. })
        ));
    }
}
